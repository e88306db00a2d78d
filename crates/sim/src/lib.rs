//! The fleet simulator: a workload's requests go through the routing core the servers use
//! ([`switchyard_router::RoutingCore`]: admission, any policy, cache views) to N
//! [`switchyard_mocker`] engines, in virtual time, driven by one timed event queue. KV
//! events reach the indexer after a configurable delay; completions free the router's
//! active sequences and release queued requests. No tokio, no wall clock: a run is a
//! deterministic function of its inputs and seed, and an hour of traffic replays in
//! seconds.
//!
//! - [`workload`]: trace requests, and prompts cut into engine blocks.
//! - [`simulation`]: the event loop.
//! - [`faults`]: worker failures (crash, hang, drain; a schedule or an MTBF) and the cost of
//!   moving requests off failed workers (re-prefill or KV transfer).
//! - [`scaling`]: the planner's virtual connector (workers added with a cold start,
//!   removed by graceful drain) and what a planned run reports.
//! - [`disagg`]: prefill and decode workers, and the KV moved between them.
//! - [`report`]: latency distributions and fleet figures per run.
//! - [`sessions`]: what a session trace's sessions went through (replayed closed loop).

pub mod disagg;
pub mod faults;
pub mod report;
pub mod scaling;
pub mod sessions;
pub mod simulation;
pub mod workload;

pub use disagg::{DisaggReport, DisaggSim, InvalidSplit, Split};
pub use faults::{
    FailureReport, FaultConfig, FaultKind, InvalidLink, InvalidModelShape, Link, ModelShape,
    ScheduledFault,
};
pub use report::{MediaReport, RequestRecord, SimReport};
pub use scaling::{PlannerReport, PlannerSim, SlaAttainment, SlaTargets};
pub use sessions::SessionReport;
pub use simulation::{EncoderSim, SimConfig, SimError, simulate, worker_key};
pub use workload::{PreparedWorkload, PromptRequest, TraceRequest};
