//! The planner: how many workers of each role the fleet should run, decided from what it
//! observes, as a pure state machine (`now` and an observation in, replica counts out) so
//! the simulator, local processes and Kubernetes run the same decisions.
//!
//! - [`config`]: the `[planner]` section of the config tree (modes, intervals, thresholds,
//!   SLA targets, GPU budget).
//! - [`observe`]: fleet observations per metric pull and their per-interval summary.
//! - [`load`]: load-based votes (KV usage, prefill queue, trend, oscillation guard).
//! - [`predict`]: load predictors (constant, moving average, Holt, Kalman, seasonal) and
//!   their evaluation on a series.
//! - [`sla`]: per-worker throughput at latency targets from a performance model, and the
//!   workers a predicted demand needs.
//! - [`planner`]: the state machine tying them together, with blocking while an action is
//!   in progress, grace periods and the budget.

pub mod config;
pub mod load;
pub mod observe;
pub mod planner;
pub mod predict;
pub mod sla;

pub use config::{BudgetConfig, InvalidConfig, LoadConfig, Mode, PlannerConfig, SlaConfig};
pub use observe::{IntervalSummary, Observation, TrafficSample, WorkerSample};
pub use planner::{Action, Decision, Planner, Tick};
pub use predict::{ForecastError, InvalidPredictor, Predictor, PredictorConfig, evaluate};
