//! What a simulation run reports.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use switchyard_core::WorkerKey;

/// A latency distribution in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Distribution {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

/// Records latencies in microseconds (3 significant digits, up to an hour).
#[derive(Debug, Clone)]
pub struct LatencyRecorder {
    histogram: Histogram<u64>,
}

impl Default for LatencyRecorder {
    fn default() -> Self {
        let histogram = Histogram::new_with_bounds(1, 3_600_000_000, 3)
            .unwrap_or_else(|_| unreachable!("valid histogram bounds"));
        LatencyRecorder { histogram }
    }
}

impl LatencyRecorder {
    pub fn record(&mut self, micros: u64) {
        self.histogram.saturating_record(micros.max(1));
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    pub fn distribution(&self) -> Distribution {
        if self.histogram.is_empty() {
            return Distribution::default();
        }
        let ms = |us: u64| us as f64 / 1e3;
        Distribution {
            mean: self.histogram.mean() / 1e3,
            p50: ms(self.histogram.value_at_quantile(0.50)),
            p90: ms(self.histogram.value_at_quantile(0.90)),
            p99: ms(self.histogram.value_at_quantile(0.99)),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Throughput {
    pub requests_per_sec: f64,
    pub output_tokens_per_sec: f64,
}

/// How evenly the work spread over the workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LoadSpread {
    pub requests_min: u64,
    pub requests_max: u64,
    pub requests_mean: f64,
    /// Coefficient of variation (standard deviation / mean) of requests per worker.
    pub requests_cv: f64,
    /// Coefficient of variation of prompt tokens computed (not cached) per worker.
    pub prefill_tokens_cv: f64,
}

impl LoadSpread {
    pub fn from_counts(requests: &[u64], prefill_tokens: &[u64]) -> Self {
        LoadSpread {
            requests_min: requests.iter().copied().min().unwrap_or(0),
            requests_max: requests.iter().copied().max().unwrap_or(0),
            requests_mean: mean(requests),
            requests_cv: cv(requests),
            prefill_tokens_cv: cv(prefill_tokens),
        }
    }
}

fn mean(values: &[u64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<u64>() as f64 / values.len() as f64
    }
}

fn cv(values: &[u64]) -> f64 {
    let m = mean(values);
    if m == 0.0 {
        return 0.0;
    }
    let var = values.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / values.len() as f64;
    var.sqrt() / m
}

/// What became of one request (when the run records them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    pub id: u64,
    pub arrival: Duration,
    pub worker: Option<WorkerKey>,
    pub first_token: Option<Duration>,
    pub finished: Option<Duration>,
    pub output_tokens: u32,
    pub cached_tokens: u32,
    /// `length` or `stop` when completed; the rejection reason; `failed` when no worker
    /// could take it.
    pub outcome: &'static str,
}

/// One run of one policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SimReport {
    pub policy: String,
    /// What the router knew of the caches: "events" or "approx" (set by the caller).
    pub cache_view: &'static str,
    pub workers: u32,
    pub requests: u64,
    pub completed: u64,
    /// Refused by admission (shed, queue full, timed out in the queue).
    pub rejected: u64,
    pub rejected_by_reason: BTreeMap<&'static str, u64>,
    /// Requests that waited in the admission queue.
    pub queued: u64,
    /// Requests whose life gave up (no worker could take them, out of tries or moves).
    pub failed: u64,
    /// Those by why they gave up (see `switchyard_router::GiveUp::name`).
    pub failed_by_reason: BTreeMap<&'static str, u64>,
    /// Completed requests that ended on an end-of-sequence token before their length.
    pub stopped_early: u64,
    pub ttft_ms: Distribution,
    /// Every gap between two tokens of a request: long answers weigh the most.
    pub itl_ms: Distribution,
    /// Time per output token after the first, one value a completed request of two tokens
    /// or more: (last token − first token) / (tokens − 1). `bench` reports it as TPOT;
    /// aiperf and genai-perf report the same figure as inter-token latency.
    pub tpot_ms: Distribution,
    pub e2e_ms: Distribution,
    pub throughput: Throughput,
    /// Share of prompt tokens served from the engines' prefix caches.
    pub cache_hit_rate: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub output_tokens: u64,
    pub preemptions: u64,
    pub engine_steps: u64,
    pub load_spread: LoadSpread,
    /// Virtual time from the first arrival to the last token.
    pub simulated_seconds: f64,
    /// Filled in by the caller, who owns the clock.
    pub wall_seconds: f64,
    /// What faults did, when any were played.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failures: Option<crate::faults::FailureReport>,
    /// Requests within the latency targets, when targets were given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sla: Option<crate::scaling::SlaAttainment>,
    /// Prefill and decode pools, when the fleet was disaggregated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disagg: Option<crate::disagg::DisaggReport>,
    /// What the planner did, when one scaled the fleet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planner: Option<crate::scaling::PlannerReport>,
    /// Media and encoders, when requests carried media.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub media: Option<MediaReport>,
    /// Sessions, when the workload had them (replayed closed loop).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions: Option<crate::sessions::SessionReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub request_records: Vec<RequestRecord>,
}

/// Requests with media, and the encoders that served them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MediaReport {
    /// Requests that carried media, and their items.
    pub requests: u64,
    pub items: u64,
    /// Requests routed straight to a worker holding their media (joint routing).
    pub skipped: u64,
    /// Items found in the feature store (encoded for an earlier request, or being encoded).
    pub cached: u64,
    pub encoders: u32,
    /// Share of the run the encoders spent encoding.
    pub encoder_utilisation: f64,
    /// From admission to the last item encoded, for requests that were encoded.
    pub encode_wait_ms: Distribution,
    /// Time to first token by class: text, image, video, audio.
    pub ttft_ms_by_class: BTreeMap<&'static str, Distribution>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distribution_in_milliseconds() {
        let mut r = LatencyRecorder::default();
        for us in 1..=1000u64 {
            r.record(us * 1000);
        }
        let d = r.distribution();
        assert!((d.mean - 500.5).abs() < 1.0, "{d:?}");
        assert!((d.p50 - 500.0).abs() < 1.0);
        assert!((d.p90 - 900.0).abs() < 1.0);
        assert!((d.p99 - 990.0).abs() < 1.0);
        assert_eq!(
            LatencyRecorder::default().distribution(),
            Distribution::default()
        );
    }

    #[test]
    fn spread_of_even_and_uneven_loads() {
        let even = LoadSpread::from_counts(&[5, 5, 5], &[1, 1, 1]);
        assert_eq!(
            (even.requests_min, even.requests_max, even.requests_cv),
            (5, 5, 0.0)
        );
        let uneven = LoadSpread::from_counts(&[0, 10], &[0, 4]);
        assert!((uneven.requests_cv - 1.0).abs() < 1e-12);
    }
}
