//! Hosting an engine: a worker builds its engine, registers it in discovery under a lease,
//! publishes its KV events and load on the event plane, and serves generate requests.
//!
//! - [`engine`]: the seam every engine plugs into: what it can do, its request service,
//!   its event and load streams.
//! - [`registry`]: the engines by name, each built from its configuration; a binary
//!   registers its own beside this crate's.
//! - [`driver`]: the step driver for engines that work in batches, timed (simulated engines,
//!   on tokio's clock) or on their own thread (engines that compute for real).
//! - [`mocker`], [`echo`], [`upstream`]: the engines: simulated, echoing, and forwarding to a
//!   stock OpenAI-compatible server (llama.cpp, vLLM, SGLang) with its metrics and KV events.
//! - [`encoder`]: the media encoder engine (role `encoder`), timed by a cost model or real.
//! - `real_encoders` (feature `encoders`): the real encoders behind it (a DINOv2 vision
//!   tower, Whisper's audio encoder).
//! - [`batcher`]: batching for real encoders: jobs of different requests in one forward pass.
//! - [`disagg`]: prefill-only and decode requests (disaggregated serving), around an
//!   engine's service.
//! - [`faults`]: fault injection (crash, hang, slow, corrupt, refuse, truncate), on a schedule or
//!   on command.
//! - [`config`]: what engine to run and as which model.
//! - [`error`]: why a worker or its engine cannot start, and the configuration checks.
//! - [`host`]: starting a worker on a set of planes.
//! - [`kv_state`]: the worker's record of its cache, served for resynchronisation.

pub mod batcher;
pub mod config;
pub mod disagg;
pub mod driver;
pub mod echo;
pub mod encoder;
pub mod engine;
pub mod error;
pub mod faults;
pub mod host;
pub mod kv_state;
pub mod mocker;
#[cfg(feature = "encoders")]
pub mod real_encoders;
pub mod registry;
pub mod upstream;

pub use config::{CandleConfig, EchoConfig, EngineConfig, MockerConfig, WorkerConfig};
pub use encoder::{EncoderConfig, EncoderModels, MockEncoder};
pub use engine::{Engine, EngineCapabilities, RunningEngine, StepService};
pub use error::{InvalidConfig, UpstreamConfigError, WorkerError};
pub use host::{Serving, Worker, WorkerPlanes};
pub use registry::{EngineFactory, EngineRegistry};
