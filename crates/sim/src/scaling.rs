//! The planner in the simulator: its settings for a run, and what the run reports of it.
//!
//! The virtual connector adds and removes simulated workers as the planner asks: a new
//! worker takes `cold_start` to come up (model loading) and costs GPU time from the moment
//! it is asked for; a removed one stops taking requests at once and leaves when its last
//! request finishes (a graceful drain: nothing is dropped), costing GPU time until then.

use std::time::Duration;

use serde::Serialize;
use switchyard_planner::{Decision, PlannerConfig};

/// Scale the fleet during the run with this planner.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerSim {
    pub config: PlannerConfig,
    /// From the planner's request to a worker taking requests.
    pub cold_start: Duration,
}

/// Latency targets a request must meet to count as served within the SLA.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SlaTargets {
    #[serde(with = "humantime_serde")]
    pub ttft: Duration,
    /// Of the request's mean inter-token latency.
    #[serde(with = "humantime_serde")]
    pub itl: Duration,
}

/// How many requests met the targets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SlaAttainment {
    /// Requests (refused and failed ones count as missing the targets).
    pub requests: u64,
    pub within: u64,
    pub ttft_met: u64,
    pub itl_met: u64,
    /// `within / requests`.
    pub share: f64,
}

/// What the planner did in a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PlannerReport {
    /// GPU-hours of every worker from being asked for to leaving (failed ones included).
    pub gpu_hours: f64,
    /// Workers on average over the run, at most, and at the end.
    pub mean_workers: f64,
    pub peak_workers: u32,
    pub final_workers: u32,
    pub workers_added: u32,
    pub workers_removed: u32,
    /// Every adjustment, in order.
    pub decisions: Vec<Decision>,
}
