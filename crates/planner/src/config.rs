//! The planner's settings: one section of the config tree (`[planner]`), with Dynamo's
//! planner defaults where it has them.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::WorkerRole;
use thiserror::Error;

use crate::predict::PredictorConfig;

/// Which rule set sizes the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// React to KV-cache utilization and prefill queues, one worker at a time.
    #[default]
    Load,
    /// Predict the next interval's traffic and size the fleet from a performance model
    /// so the latency targets hold.
    Sla,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlannerConfig {
    pub mode: Mode,
    /// How often the fleet's metrics are gathered.
    #[serde(with = "humantime_serde")]
    pub metric_interval: Duration,
    /// How often a scaling decision is taken, from the metrics gathered since the last.
    #[serde(with = "humantime_serde")]
    pub adjustment_interval: Duration,
    /// How long a scaling action may take before the planner stops waiting for it (so a
    /// worker that never comes up cannot block decisions for ever).
    #[serde(with = "humantime_serde")]
    pub action_timeout: Duration,
    pub load: LoadConfig,
    pub sla: SlaConfig,
    pub budget: BudgetConfig,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            mode: Mode::Load,
            metric_interval: Duration::from_secs(1),
            adjustment_interval: Duration::from_secs(30),
            action_timeout: Duration::from_secs(600),
            load: LoadConfig::default(),
            sla: SlaConfig::default(),
            budget: BudgetConfig::default(),
        }
    }
}

/// Thresholds of load-based scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoadConfig {
    /// Mean KV-cache utilization (decode and aggregated workers) above which one is added.
    pub kv_usage_up: f64,
    /// ... and below which one is removed.
    pub kv_usage_down: f64,
    /// Mean waiting requests per prefill (or aggregated, or decode: `decode_queue`) worker
    /// above which one is added.
    pub prefill_queue_up: f64,
    /// ... and below which one is removed.
    pub prefill_queue_down: f64,
    /// Adjustment intervals after a decode worker is added during which none is removed.
    pub decode_grace_intervals: u32,
    /// No prefill worker is added when the queue's trend falls below the up threshold
    /// within this many adjustment intervals.
    pub prefill_trend_intervals: u32,
    /// Decode workers vote on the requests waiting for them too (in their engines and in
    /// front of them), at the prefill-queue thresholds: one is added when either signal
    /// says so and removed only when both do, as for aggregated workers. With long prompts
    /// a decode cache is full well below `kv_usage_up` (a 16k-token sequence is 6 % of a
    /// 16,384-block cache of 16-token blocks), so KV usage alone never adds one while
    /// requests queue for a place. Off: Dynamo's decode rule, KV usage only.
    pub decode_queue: bool,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            kv_usage_up: 0.9,
            kv_usage_down: 0.5,
            prefill_queue_up: 0.5,
            prefill_queue_down: 0.2,
            decode_grace_intervals: 3,
            prefill_trend_intervals: 3,
            decode_queue: true,
        }
    }
}

/// Targets and models of SLA-based scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SlaConfig {
    /// Time to first token to hold.
    #[serde(with = "humantime_serde")]
    pub ttft_target: Duration,
    /// Inter-token latency to hold.
    #[serde(with = "humantime_serde")]
    pub itl_target: Duration,
    /// How the next interval's request count, input and output lengths are predicted.
    pub predictor: PredictorConfig,
    /// Correct the performance model by the ratio of observed to predicted TTFT and ITL.
    pub correction: bool,
    /// KV blocks per worker and tokens per block, for the decode model's cache usage.
    pub capacity_blocks: u64,
    pub block_size: u32,
    /// Share of the KV cache the decode batch may fill: the rest takes the prompts being
    /// admitted (a batch sized to a full cache leaves every new request waiting).
    pub max_kv_usage: f64,
    /// Utilization to size for: workers = need / this. Below 1 so bursts within an
    /// interval, and the interval it takes to see them, find room.
    pub target_utilization: f64,
    /// Square-root staffing when above 0: workers = R + β·√R for the R workers the
    /// predicted traffic needs at full utilization (`target_utilization` is then not
    /// applied). The room grows with the square root of the load, so a small fleet keeps
    /// proportionally more of it (bursts of a few long prompts fill two workers, not
    /// twenty) and a large one less (the Halfin–Whitt rule of call centres).
    pub staffing_beta: f64,
    /// A smaller fleet is asked for only after this many consecutive decisions want one
    /// (the largest of their counts): removing a worker loses its cache, and one noisy
    /// interval should not cost it. Additions are immediate.
    pub scale_down_intervals: u32,
    /// Plan for the busiest of the next this-many intervals (as predicted): what is asked
    /// for now arrives after a cold start and must last until the next decision's workers
    /// do, so with a cold start as long as the interval, 2.
    pub lookahead_intervals: u32,
    /// Decide at once, not at the interval's end, when this many requests wait per
    /// worker at a pull (a burst the interval's average would show too late); 0: never.
    pub panic_queue: f64,
    /// Decide at once, too, when the workers that generate hold this share of their KV
    /// cache on average at a pull; 0: never. Behind the servers' admission (a worker busy
    /// at 80 % of its blocks, requests that would wait past a target refused) queues stay
    /// short, so a step in traffic shows in the caches before it shows in a queue
    /// (measured at 0.75 in docs/benchmarks.md: it fires at each step, and buys as much
    /// attainment as it costs GPU-hours, so it is off by default).
    pub panic_kv_usage: f64,
    /// Size for bursts of arrivals when above 0. Prompts arriving together (within a
    /// TTFT target of one another) are prefilled within the target only by workers free
    /// to do it, so aggregated workers are the decode need plus the workers whose prefill
    /// absorbs the bursts, and a prefill pool is at least the latter: the fewest that
    /// leave this share of the prompt tokens arrived over `burst_history` beyond what they
    /// prefill within a TTFT target. Aggregated and prefill workers are then sized by
    /// their bursts instead of `target_utilization` (which still sizes decode pools).
    pub burst_overflow: f64,
    /// With burst sizing, an aggregated fleet is also at least the workers that prefill
    /// and decode the predicted traffic on one engine each within the ITL target at this
    /// utilization. Sized at 1, a fleet of a dozen or more workers, where the bursts are
    /// small beside the load, runs at the edge where a little more traffic fills the
    /// caches, lengthens every request and collapses into a queue.
    pub time_sharing_utilization: f64,
    /// How far back the arrivals the burst sizing reads go.
    #[serde(with = "humantime_serde")]
    pub burst_history: Duration,
}

impl Default for SlaConfig {
    fn default() -> Self {
        SlaConfig {
            ttft_target: Duration::from_millis(500),
            itl_target: Duration::from_millis(50),
            predictor: PredictorConfig::default(),
            correction: true,
            capacity_blocks: 16_384,
            block_size: 64,
            max_kv_usage: 0.85,
            target_utilization: 0.65,
            staffing_beta: 0.0,
            scale_down_intervals: 3,
            lookahead_intervals: 2,
            panic_queue: 4.0,
            panic_kv_usage: 0.0,
            burst_overflow: 0.08,
            time_sharing_utilization: 0.82,
            burst_history: Duration::from_secs(300),
        }
    }
}

/// What the fleet may cost: GPUs in total, GPUs per engine of each role, and the fewest
/// workers of each role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    pub min_gpus: u32,
    pub max_gpus: u32,
    pub min_replicas: u32,
    pub gpus_per_engine: GpusPerEngine,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            min_gpus: 1,
            max_gpus: 64,
            min_replicas: 1,
            gpus_per_engine: GpusPerEngine::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpusPerEngine {
    pub aggregated: u32,
    pub prefill: u32,
    pub decode: u32,
}

impl Default for GpusPerEngine {
    fn default() -> Self {
        GpusPerEngine {
            aggregated: 1,
            prefill: 1,
            decode: 1,
        }
    }
}

impl GpusPerEngine {
    pub fn of(&self, role: WorkerRole) -> u32 {
        match role {
            WorkerRole::Prefill => self.prefill,
            WorkerRole::Decode => self.decode,
            // Encoders are not planned; counted like aggregated engines if ever asked.
            WorkerRole::Aggregated | WorkerRole::Encoder => self.aggregated,
        }
    }
}

/// A setting that cannot work, named by its key in the config tree.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("planner.{key}: {problem}")]
pub struct InvalidConfig {
    pub key: &'static str,
    pub problem: String,
}

fn invalid(key: &'static str, problem: impl Into<String>) -> InvalidConfig {
    InvalidConfig {
        key,
        problem: problem.into(),
    }
}

impl PlannerConfig {
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.metric_interval.is_zero() {
            return Err(invalid("metric_interval", "must be more than zero"));
        }
        if self.adjustment_interval < self.metric_interval {
            return Err(invalid(
                "adjustment_interval",
                "must be at least the metric interval",
            ));
        }
        if self.action_timeout.is_zero() {
            return Err(invalid("action_timeout", "must be more than zero"));
        }
        let l = &self.load;
        for (key, value) in [
            ("load.kv_usage_up", l.kv_usage_up),
            ("load.kv_usage_down", l.kv_usage_down),
            ("load.prefill_queue_up", l.prefill_queue_up),
            ("load.prefill_queue_down", l.prefill_queue_down),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(key, format!("{value} is not a number ≥ 0")));
            }
        }
        if l.kv_usage_down >= l.kv_usage_up {
            return Err(invalid(
                "load.kv_usage_down",
                format!(
                    "{} must be below load.kv_usage_up ({})",
                    l.kv_usage_down, l.kv_usage_up
                ),
            ));
        }
        if l.prefill_queue_down >= l.prefill_queue_up {
            return Err(invalid(
                "load.prefill_queue_down",
                format!(
                    "{} must be below load.prefill_queue_up ({})",
                    l.prefill_queue_down, l.prefill_queue_up
                ),
            ));
        }
        if self.sla.ttft_target.is_zero() {
            return Err(invalid("sla.ttft_target", "must be more than zero"));
        }
        if self.sla.itl_target.is_zero() {
            return Err(invalid("sla.itl_target", "must be more than zero"));
        }
        if self.sla.capacity_blocks == 0 {
            return Err(invalid("sla.capacity_blocks", "must be more than zero"));
        }
        if self.sla.block_size == 0 {
            return Err(invalid("sla.block_size", "must be more than zero"));
        }
        for (key, value) in [
            ("sla.panic_queue", self.sla.panic_queue),
            ("sla.staffing_beta", self.sla.staffing_beta),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(key, format!("{value} is not a number ≥ 0")));
            }
        }
        if !(self.sla.burst_overflow >= 0.0 && self.sla.burst_overflow < 1.0) {
            return Err(invalid(
                "sla.burst_overflow",
                format!("{} is not a share in [0, 1)", self.sla.burst_overflow),
            ));
        }
        if !(self.sla.panic_kv_usage >= 0.0 && self.sla.panic_kv_usage <= 1.0) {
            return Err(invalid(
                "sla.panic_kv_usage",
                format!("{} is not a share in [0, 1]", self.sla.panic_kv_usage),
            ));
        }
        if self.sla.burst_overflow > 0.0 && self.sla.burst_history < self.metric_interval {
            return Err(invalid(
                "sla.burst_history",
                "must be at least the metric interval",
            ));
        }
        for (key, value) in [
            ("sla.max_kv_usage", self.sla.max_kv_usage),
            ("sla.target_utilization", self.sla.target_utilization),
            (
                "sla.time_sharing_utilization",
                self.sla.time_sharing_utilization,
            ),
        ] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(invalid(key, format!("{value} is not a share in (0, 1]")));
            }
        }
        self.sla
            .predictor
            .validate()
            .map_err(|problem| invalid("sla.predictor", problem.to_string()))?;
        let b = &self.budget;
        if b.min_replicas == 0 {
            return Err(invalid(
                "budget.min_replicas",
                "must be at least 1 (a role with no worker cannot serve)",
            ));
        }
        if b.min_gpus > b.max_gpus {
            return Err(invalid(
                "budget.min_gpus",
                format!("{} is above budget.max_gpus ({})", b.min_gpus, b.max_gpus),
            ));
        }
        let g = &b.gpus_per_engine;
        if g.aggregated == 0 || g.prefill == 0 || g.decode == 0 {
            return Err(invalid(
                "budget.gpus_per_engine",
                "every role needs at least one GPU per engine",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_dynamos_and_valid() {
        let config = PlannerConfig::default();
        config.validate().unwrap();
        assert_eq!(config.adjustment_interval, Duration::from_secs(30));
        assert_eq!(config.load.kv_usage_up, 0.9);
        assert_eq!(config.load.prefill_queue_down, 0.2);
    }

    #[test]
    fn a_file_section_reads_with_durations_and_a_tagged_predictor() {
        let config: PlannerConfig = serde_json::from_value(serde_json::json!({
            "mode": "sla",
            "adjustment_interval": "10s",
            "sla": {"ttft_target": "300ms", "predictor": {"kind": "holt", "alpha": 0.4}},
            "budget": {"max_gpus": 8, "gpus_per_engine": {"decode": 2}},
        }))
        .unwrap();
        config.validate().unwrap();
        assert_eq!(config.mode, Mode::Sla);
        assert_eq!(config.adjustment_interval, Duration::from_secs(10));
        assert_eq!(config.sla.ttft_target, Duration::from_millis(300));
        assert_eq!(config.budget.gpus_per_engine.of(WorkerRole::Decode), 2);
        assert_eq!(config.budget.gpus_per_engine.of(WorkerRole::Prefill), 1);
    }

    #[test]
    fn unusable_settings_are_named() {
        let mut config = PlannerConfig::default();
        config.load.kv_usage_down = 0.95;
        let e = config.validate().unwrap_err();
        assert_eq!(e.key, "load.kv_usage_down");
        assert!(
            e.to_string()
                .starts_with("planner.load.kv_usage_down: 0.95")
        );

        let mut config = PlannerConfig::default();
        config.budget.min_gpus = 10;
        config.budget.max_gpus = 4;
        assert_eq!(config.validate().unwrap_err().key, "budget.min_gpus");

        let config = PlannerConfig {
            adjustment_interval: Duration::from_millis(100),
            ..PlannerConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().key, "adjustment_interval");

        let mut config = PlannerConfig::default();
        config.sla.burst_overflow = 1.0;
        assert_eq!(config.validate().unwrap_err().key, "sla.burst_overflow");
        config.sla.burst_overflow = 0.1;
        config.sla.burst_history = Duration::from_millis(100);
        assert_eq!(config.validate().unwrap_err().key, "sla.burst_history");
        config.sla.burst_overflow = 0.0;
        config.validate().unwrap();

        let mut config = PlannerConfig::default();
        config.sla.time_sharing_utilization = 0.0;
        assert_eq!(
            config.validate().unwrap_err().key,
            "sla.time_sharing_utilization"
        );
        config.sla.time_sharing_utilization = SlaConfig::default().time_sharing_utilization;
        config.sla.panic_kv_usage = 1.5;
        assert_eq!(config.validate().unwrap_err().key, "sla.panic_kv_usage");

        let unknown = serde_json::from_value::<PlannerConfig>(
            serde_json::json!({"load": {"kv_usage_upp": 0.8}}),
        );
        assert!(unknown.unwrap_err().to_string().contains("kv_usage_upp"));
    }
}
