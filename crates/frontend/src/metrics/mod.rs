//! Prometheus metrics: the frontend's series ([`Metrics`]), counted where things happen
//! and rendered for `/metrics`.
//!
//! - [`labels`]: the label sets of the metric families.
//! - [`register`]: every series, named and described, in one registry.
//! - [`render`]: the text format, with the gauges read from live routing state.

mod labels;
mod register;
mod render;

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use switchyard_runtime::TrafficCounters;

pub use labels::{
    FailureLabels, FeatureStateLabels, MemoryLabels, OutcomeLabels, RejectionLabels, RouteLabels,
    TenantLabels, TenantTokenLabels, WorkerLabels, WorkerRoleLabels, WorkerStateLabels,
};

#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// One render at a time: each clears and refills the per-worker gauges.
    rendering: parking_lot::Mutex<()>,
    pub requests: Family<RouteLabels, Counter>,
    pub in_flight: Gauge,
    pub queued: Gauge,
    pub ttft: Histogram,
    pub queue_time: Histogram,
    pub itl: Histogram,
    pub duration: Histogram,
    pub routing_decision: Histogram,
    pub input_tokens: Counter,
    /// Prompt tokens of every generation request offered for admission, refused ones
    /// included: the demand a planner sizes for (`input_tokens` counts what was served).
    pub offered_tokens: Counter,
    pub output_tokens: Counter,
    pub tenant_requests: Family<TenantLabels, Counter>,
    pub tenant_tokens: Family<TenantTokenLabels, Counter>,
    pub cached_tokens: Counter,
    /// Prompt tokens the tokenizer produced: a continued response's known prefix is not
    /// tokenized again, so this grows by what is new per turn.
    pub tokenized_tokens: Counter,
    pub worker_active_blocks: Family<WorkerLabels, Gauge>,
    pub worker_prefill_tokens: Family<WorkerLabels, Gauge>,
    pub worker_requests: Family<WorkerLabels, Gauge>,
    pub engine_running: Family<WorkerLabels, Gauge>,
    pub engine_waiting: Family<WorkerLabels, Gauge>,
    pub engine_kv_usage: Family<WorkerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub workers: Gauge,
    pub indexer_events: Counter,
    pub indexer_gaps: Counter,
    pub indexer_blocks: Gauge,
    pub indexer_resyncs: Counter,
    pub replica_requests: Gauge,
    pub dispatched: Family<WorkerLabels, Counter>,
    pub dispatch_failures: Family<WorkerLabels, Counter>,
    pub rejected: Family<RejectionLabels, Counter>,
    pub worker_health: Family<WorkerStateLabels, Gauge>,
    pub worker_role: Family<WorkerRoleLabels, Gauge>,
    pub worker_breaker: Family<WorkerStateLabels, Gauge>,
    pub worker_failures: Family<FailureLabels, Counter>,
    pub degradation_level: Gauge,
    pub migrations: Family<OutcomeLabels, Counter>,
    pub migration_latency: Histogram,
    pub canaries: Family<OutcomeLabels, Counter>,
    /// Requests with media by what happened to it: encoded on an encoder worker, skipped
    /// (joint routing found its KV on the soonest worker), failed (no encoder took it).
    pub media_encodes: Family<OutcomeLabels, Counter>,
    /// Encode jobs sent to encoder workers (one per pool a request's items need).
    pub encoder_jobs: Counter,
    /// Media items found encoded in the feature store (not sent to an encoder).
    pub feature_store_hits: Counter,
    pub feature_store_evictions: Counter,
    pub feature_store_waits: Family<MemoryLabels, Counter>,
    /// The store's memory by lifecycle state.
    pub feature_store_bytes: Family<FeatureStateLabels, Gauge>,
    /// Where requests for decode workers were prefilled.
    pub disagg_prefills: Family<OutcomeLabels, Counter>,
    /// From a remote prefill's first token to the decode worker's first (the KV transfer).
    pub disagg_handoff: Histogram,
    /// Workers with per-worker counter series, so those of departed workers can be removed.
    /// For [`Metrics::traffic`] (the histograms do not give their sums and counts back):
    /// generation requests (completions and chat completions), requests finished, and
    /// TTFT and ITL summed in microseconds with their counts.
    generation_requests: AtomicU64,
    finished: AtomicU64,
    ttft_sum: [AtomicU64; 2],
    itl_sum: [AtomicU64; 2],
    counted_workers: parking_lot::Mutex<std::collections::HashSet<switchyard_core::WorkerKey>>,
    failed_workers: parking_lot::Mutex<std::collections::HashSet<switchyard_core::WorkerId>>,
}

/// Adds a duration to a (sum in microseconds, count) pair.
fn add(pair: &[AtomicU64; 2], d: Duration) {
    pair[0].fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Relaxed);
    pair[1].fetch_add(1, Relaxed);
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new("")
    }
}

impl Metrics {
    pub fn count_request(&self, route: &'static str, status: u16) {
        self.requests
            .get_or_create(&RouteLabels { route, status })
            .inc();
        if matches!(
            route,
            "/v1/completions" | "/v1/chat/completions" | "/v1/responses"
        ) {
            self.generation_requests.fetch_add(1, Relaxed);
        }
    }

    /// The traffic so far, as planners watching the planes read it (`queued`: the
    /// requests in the admission queue now).
    pub fn traffic(&self, queued: u64) -> TrafficCounters {
        TrafficCounters {
            requests: self.generation_requests.load(Relaxed),
            // Per request offered, as `requests` counts them: refusals lower neither.
            input_tokens: self.offered_tokens.get(),
            cached_tokens: self.cached_tokens.get(),
            output_tokens: self.output_tokens.get(),
            finished: self.finished.load(Relaxed),
            ttft_us_sum: self.ttft_sum[0].load(Relaxed),
            ttft_count: self.ttft_sum[1].load(Relaxed),
            itl_us_sum: self.itl_sum[0].load(Relaxed),
            itl_count: self.itl_sum[1].load(Relaxed),
            queued,
        }
    }

    /// A request with an API key (`tenant` empty: no valid key).
    pub fn count_tenant(&self, tenant: &str, outcome: &'static str) {
        self.tenant_requests
            .get_or_create(&TenantLabels {
                tenant: tenant.to_string(),
                outcome,
            })
            .inc();
    }

    pub fn count_tenant_tokens(&self, tenant: &str, kind: &'static str, tokens: u64) {
        self.tenant_tokens
            .get_or_create(&TenantTokenLabels {
                tenant: tenant.to_string(),
                kind,
            })
            .inc_by(tokens);
    }

    pub fn count_rejection(&self, rejection: switchyard_router::Rejection) {
        self.rejected
            .get_or_create(&RejectionLabels {
                reason: rejection.name(),
            })
            .inc();
    }

    pub fn count_dispatch(&self, worker: switchyard_core::WorkerKey, reached: bool) {
        self.counted_workers.lock().insert(worker);
        let labels = WorkerLabels {
            worker: worker.to_string(),
        };
        let family = if reached {
            &self.dispatched
        } else {
            &self.dispatch_failures
        };
        family.get_or_create(&labels).inc();
    }

    pub fn count_migration(&self, outcome: &'static str) {
        self.migrations
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub fn count_prefill(&self, outcome: &'static str) {
        self.disagg_prefills
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub fn count_canary(&self, outcome: &'static str) {
        self.canaries
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub fn count_media_encode(&self, outcome: &'static str) {
        self.media_encodes
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    pub fn count_failure(&self, worker: switchyard_core::WorkerId, kind: &'static str) {
        self.failed_workers.lock().insert(worker);
        self.worker_failures
            .get_or_create(&FailureLabels {
                worker: worker.to_string(),
                kind,
            })
            .inc();
    }

    pub fn observe_ttft(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
        add(&self.ttft_sum, d);
    }

    pub fn observe_itl(&self, d: Duration) {
        self.itl.observe(d.as_secs_f64());
        add(&self.itl_sum, d);
    }

    /// A request's whole time, from arrival to its end.
    pub fn observe_duration(&self, d: Duration) {
        self.duration.observe(d.as_secs_f64());
        self.finished.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_counts_generation_requests_and_sums_latencies_in_microseconds() {
        let m = Metrics::default();
        m.count_request("/v1/completions", 200);
        m.count_request("/v1/chat/completions", 429);
        m.count_request("/v1/models", 200);
        m.count_request("/metrics", 200);
        // Both requests were offered (200 prompt tokens each); one was served.
        m.offered_tokens.inc_by(400);
        m.input_tokens.inc_by(200);
        m.cached_tokens.inc_by(64);
        m.output_tokens.inc_by(12);
        m.observe_ttft(Duration::from_millis(150));
        m.observe_ttft(Duration::from_micros(2_500));
        m.observe_itl(Duration::from_micros(7_250));
        m.observe_duration(Duration::from_secs(1));
        let t = m.traffic(3);
        assert_eq!(
            t,
            TrafficCounters {
                requests: 2,
                input_tokens: 400,
                cached_tokens: 64,
                output_tokens: 12,
                finished: 1,
                ttft_us_sum: 152_500,
                ttft_count: 2,
                itl_us_sum: 7_250,
                itl_count: 1,
                queued: 3,
            }
        );
        // The histograms see the same observations.
        let text = {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &m.registry).unwrap();
            out
        };
        assert!(
            text.contains("switchyard_time_to_first_token_seconds_count 2"),
            "{text}"
        );
    }
}
