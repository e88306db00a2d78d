//! Hosting an engine: a worker builds its engine, registers it in discovery under a lease,
//! publishes its KV events and load on the event plane, and serves generate requests.
//!
//! - [`engine`]: the seam every engine plugs into: what it can do, its request service,
//!   its event and load streams.
//! - [`driver`]: the step driver for engines that work in batches, timed (simulated engines,
//!   on tokio's clock) or on their own thread (engines that compute for real).
//! - [`mocker`], [`echo`], [`openai`]: the engines: simulated, echoing, and a stock
//!   OpenAI-compatible server (llama.cpp, vLLM, SGLang) with its metrics and KV events.
//! - [`disagg`]: prefill-only and decode requests (disaggregated serving), around an
//!   engine's service.
//! - [`faults`]: fault injection (crash, hang, slow, corrupt, refuse, truncate), on a schedule or
//!   on command.
//! - [`config`]: what engine to run and as which model.
//! - [`host`]: starting a worker on a set of planes.
//! - [`kv_state`]: the worker's record of its cache, served for resynchronisation.

pub mod batcher;
pub mod config;
pub mod disagg;
pub mod driver;
pub mod echo;
pub mod encoder;
pub mod engine;
pub mod faults;
pub mod host;
pub mod kv_state;
pub mod mocker;
pub mod openai;
#[cfg(feature = "encoders")]
pub mod real_encoders;

pub use config::{CandleConfig, EchoConfig, EngineConfig, MockerConfig, WorkerConfig};
pub use encoder::{EncoderConfig, EncoderModels, MockEncoder};
pub use engine::{Engine, EngineCapabilities, RunningEngine, StepService};
pub use host::{Serving, Worker, WorkerError, WorkerPlanes, engine_from_config};
