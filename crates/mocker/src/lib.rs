//! The mocker: a simulated inference engine with real scheduling, real block management and a
//! timing model, emitting the KV events a real engine does. Whole fleets run on it without
//! GPUs, in real time (the worker crate's step driver) or in virtual time (the `sim` crate).
//! Nothing here reads a clock: time is an input.
//!
//! - [`blocks`]: the KV block manager (reference-counted active blocks, LRU-evicted cached
//!   blocks, prefix caching, KV events).
//! - [`engine`]: the vLLM-v1-style scheduler as a pure `step(now)` state machine.
//! - [`perf`]: step timing, polynomial or interpolated from a measured profile.
//! - [`config`]: engine arguments with vLLM's defaults.
//! - [`tokens`]: deterministic output tokens.

pub mod blocks;
pub mod config;
pub mod engine;
pub mod logprobs;
pub mod perf;
mod sequence;
pub mod tokens;

pub use config::{DEFAULT_STAGING_TOKENS, EngineArgs, PreemptionMode};
pub use engine::{EngineStats, MockEngine, MockRequest, Rejected, StepOutput};
pub use perf::{PerfModel, StepShape};
pub use switchyard_core::protocol::TokenOutput;
