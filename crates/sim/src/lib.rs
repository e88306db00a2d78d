//! The fleet simulator: a trace's arrivals go through the real [`switchyard_router`] (any
//! policy) to N [`switchyard_mocker`] engines, in virtual time. KV events reach the indexer
//! after a configurable delay; completions free the router's active sequences. No tokio, no
//! wall clock: a run is a deterministic function of its inputs and seed, and an hour of
//! traffic replays in seconds.
//!
//! - [`workload`]: trace requests and their prompts cut into engine blocks.
//! - [`simulation`]: the event loop.
//! - [`report`]: latency distributions and fleet figures per run.

pub mod report;
pub mod simulation;
pub mod workload;

pub use report::SimReport;
pub use simulation::{CacheView, SimConfig, SimError, simulate};
pub use workload::{PreparedWorkload, TraceRequest};
