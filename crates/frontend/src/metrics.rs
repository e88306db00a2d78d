//! Prometheus metrics.

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use switchyard_router::routing::health::Failure;
use switchyard_runtime::TrafficCounters;

use crate::routing::RoutingService;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: &'static str,
    pub status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    pub worker: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerStateLabels {
    pub worker: String,
    pub state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerRoleLabels {
    pub worker: String,
    pub role: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub worker: String,
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureStateLabels {
    pub state: &'static str,
}

/// Which budget of the feature store.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemoryLabels {
    pub memory: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantTokenLabels {
    pub tenant: String,
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    pub reason: &'static str,
}

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

fn exponential(start: f64, factor: f64, n: u16) -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(start, factor, n)
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new("")
    }
}

/// Brings a counter up to `total`, a running total kept elsewhere.
fn catch_up(counter: &Counter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}

impl Metrics {
    /// Every series carries `model` (when not empty): one frontend serves one model, and a
    /// Prometheus scraping several tells them apart.
    pub fn new(model: &str) -> Self {
        let labels =
            (!model.is_empty()).then(|| (Cow::Borrowed("model"), Cow::Owned(model.to_string())));
        let mut registry = Registry::with_prefix_and_labels("switchyard", labels.into_iter());
        let requests = Family::<RouteLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by route and status",
            requests.clone(),
        );
        let in_flight = Gauge::default();
        registry.register(
            "requests_in_flight",
            "Requests being served",
            in_flight.clone(),
        );
        let queued = Gauge::default();
        registry.register(
            "requests_queued",
            "Requests waiting for admission",
            queued.clone(),
        );
        let ttft = Histogram::new(exponential(0.001, 2.0, 18));
        registry.register(
            "time_to_first_token_seconds",
            "Time to first token",
            ttft.clone(),
        );
        let queue_time = Histogram::new(exponential(0.001, 2.0, 16));
        registry.register(
            "queue_time_seconds",
            "Time admitted requests waited in the admission queue",
            queue_time.clone(),
        );
        let itl = Histogram::new(exponential(0.0001, 2.0, 18));
        registry.register(
            "inter_token_latency_seconds",
            "Time between streamed tokens",
            itl.clone(),
        );
        let duration = Histogram::new(exponential(0.001, 2.0, 20));
        registry.register(
            "request_duration_seconds",
            "Request duration",
            duration.clone(),
        );
        let routing_decision = Histogram::new(exponential(0.000_001, 2.0, 20));
        registry.register(
            "router_decision_seconds",
            "Time to choose a worker",
            routing_decision.clone(),
        );
        let input_tokens = Counter::default();
        registry.register("input_tokens", "Prompt tokens", input_tokens.clone());
        let offered_tokens = Counter::default();
        registry.register(
            "offered_prompt_tokens",
            "Prompt tokens of generation requests offered for admission, refused ones included",
            offered_tokens.clone(),
        );
        let output_tokens = Counter::default();
        registry.register("output_tokens", "Generated tokens", output_tokens.clone());
        let tenant_requests = Family::<TenantLabels, Counter>::default();
        registry.register(
            "tenant_requests",
            "Requests with an API key, by tenant and outcome (accepted, refused, unauthorized, over a limit)",
            tenant_requests.clone(),
        );
        let tenant_tokens = Family::<TenantTokenLabels, Counter>::default();
        registry.register(
            "tenant_tokens",
            "Prompt and completion tokens of requests with an API key, by tenant",
            tenant_tokens.clone(),
        );
        let cached_tokens = Counter::default();
        registry.register(
            "cached_tokens",
            "Prompt tokens served from prefix caches",
            cached_tokens.clone(),
        );
        let worker_active_blocks = Family::<WorkerLabels, Gauge>::default();
        registry.register(
            "worker_active_blocks",
            "KV blocks held by in-flight requests, per worker",
            worker_active_blocks.clone(),
        );
        let worker_prefill_tokens = Family::<WorkerLabels, Gauge>::default();
        registry.register(
            "worker_prefill_tokens",
            "Prompt tokens routed and not yet computed, per worker",
            worker_prefill_tokens.clone(),
        );
        let worker_requests = Family::<WorkerLabels, Gauge>::default();
        registry.register(
            "worker_requests",
            "In-flight requests per worker",
            worker_requests.clone(),
        );
        let engine_running = Family::<WorkerLabels, Gauge>::default();
        registry.register(
            "engine_running",
            "Requests running, as the engine last reported",
            engine_running.clone(),
        );
        let engine_waiting = Family::<WorkerLabels, Gauge>::default();
        registry.register(
            "engine_waiting",
            "Requests waiting in the engine, as it last reported",
            engine_waiting.clone(),
        );
        let engine_kv_usage =
            Family::<WorkerLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "engine_kv_usage",
            "Share of KV blocks in use, as the engine last reported",
            engine_kv_usage.clone(),
        );
        let workers = Gauge::default();
        registry.register("workers", "Workers serving the model", workers.clone());
        let indexer_events = Counter::default();
        registry.register(
            "indexer_events_applied",
            "KV events applied by the indexer",
            indexer_events.clone(),
        );
        let indexer_gaps = Counter::default();
        registry.register(
            "indexer_event_gaps",
            "KV event id gaps detected",
            indexer_gaps.clone(),
        );
        let indexer_blocks = Gauge::default();
        registry.register(
            "indexer_blocks",
            "Distinct blocks in the indexer",
            indexer_blocks.clone(),
        );
        let indexer_resyncs = Counter::default();
        registry.register(
            "indexer_resyncs",
            "Workers rebuilt from their dumps (on joining, after a gap or a reconnection)",
            indexer_resyncs.clone(),
        );
        let replica_requests = Gauge::default();
        registry.register(
            "replica_requests",
            "Other frontends' in-flight requests counted in the workers' load",
            replica_requests.clone(),
        );
        let dispatched = Family::<WorkerLabels, Counter>::default();
        registry.register(
            "dispatched_requests",
            "Requests sent to each worker",
            dispatched.clone(),
        );
        let dispatch_failures = Family::<WorkerLabels, Counter>::default();
        registry.register(
            "dispatch_failures",
            "Requests a worker could not be reached for (retried on another)",
            dispatch_failures.clone(),
        );
        let rejected = Family::<RejectionLabels, Counter>::default();
        registry.register(
            "requests_rejected",
            "Requests refused by admission, by reason (no_workers, shed, queue_filling, queue_full, timed_out, wait_too_long, degraded)",
            rejected.clone(),
        );
        let worker_health = Family::<WorkerStateLabels, Gauge>::default();
        registry.register(
            "worker_health",
            "1 for each worker's health state (healthy, suspicious, unhealthy, draining, dead)",
            worker_health.clone(),
        );
        let worker_role = Family::<WorkerRoleLabels, Gauge>::default();
        registry.register(
            "worker_role",
            "1 for each worker's role (aggregated, prefill, decode)",
            worker_role.clone(),
        );
        let worker_breaker = Family::<WorkerStateLabels, Gauge>::default();
        registry.register(
            "worker_breaker",
            "1 for each worker's circuit breaker state (closed, open, half_open)",
            worker_breaker.clone(),
        );
        let worker_failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "worker_failures",
            "Failures counted against each worker, by kind (unreachable, disconnected, stalled, server_error, canary_timeout, latency_spike, wrong_output)",
            worker_failures.clone(),
        );
        let degradation_level = Gauge::default();
        registry.register(
            "degradation_level",
            "0 normal, 1 smaller batches, 2 best-effort shed, 3 latency targets relaxed, 4 new requests refused",
            degradation_level.clone(),
        );
        let disagg_prefills = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "disagg_prefills",
            "Requests for decode workers by where their prompt was computed: remote (a prefill worker), local_short (the uncached part was short), local_saturated (the prefill pool was full), local_unavailable (no prefill worker could take it), local_media (its media were not encoded and only the decode worker holds them), failed (the prefill worker failed it)",
            disagg_prefills.clone(),
        );
        let disagg_handoff = Histogram::new(exponential(0.0005, 1.25, 43));
        registry.register(
            "disagg_handoff_seconds",
            "From a remote prefill's first token to the decode worker's next token (KV transfer and the first decode step)",
            disagg_handoff.clone(),
        );
        let migrations = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "migrations",
            "Requests moved off a failed worker, by the failure that moved them; outcome limit or budget: could not be moved",
            migrations.clone(),
        );
        // 25 % steps from half a millisecond to about 7 s.
        let migration_latency = Histogram::new(exponential(0.0005, 1.25, 43));
        registry.register(
            "migration_latency_seconds",
            "From leaving a failed worker to the next token from the new one",
            migration_latency.clone(),
        );
        let canaries = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "canaries",
            "Canary checks by outcome (passed, or the failure kind)",
            canaries.clone(),
        );
        let media_encodes = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "media_encodes",
            "Requests with media by outcome: encoded, skipped (its media's KV held by the soonest worker), waited (for another request's encoding of its items), failed, timeout, reduced, text_only",
            media_encodes.clone(),
        );
        let encoder_jobs = Counter::default();
        registry.register(
            "encoder_jobs",
            "Encode jobs sent to encoder workers",
            encoder_jobs.clone(),
        );
        let feature_store_hits = Counter::default();
        registry.register(
            "feature_store_hits",
            "Media items whose features were in the feature store (no encoding)",
            feature_store_hits.clone(),
        );
        let feature_store_evictions = Counter::default();
        registry.register(
            "feature_store_evictions",
            "Kept features evicted from the feature store for room",
            feature_store_evictions.clone(),
        );
        let feature_store_waits = Family::<MemoryLabels, Counter>::default();
        registry.register(
            "feature_store_waits",
            "Times a request waited for feature store memory (CPU, or staging)",
            feature_store_waits.clone(),
        );
        let feature_store_bytes = Family::<FeatureStateLabels, Gauge>::default();
        registry.register(
            "feature_store_bytes",
            "Feature store memory by lifecycle state",
            feature_store_bytes.clone(),
        );
        Metrics {
            registry,
            rendering: parking_lot::Mutex::new(()),
            requests,
            tenant_requests,
            tenant_tokens,
            in_flight,
            queued,
            ttft,
            queue_time,
            itl,
            duration,
            routing_decision,
            input_tokens,
            offered_tokens,
            output_tokens,
            cached_tokens,
            worker_active_blocks,
            worker_prefill_tokens,
            worker_requests,
            engine_running,
            engine_waiting,
            engine_kv_usage,
            workers,
            indexer_events,
            indexer_gaps,
            indexer_blocks,
            indexer_resyncs,
            replica_requests,
            dispatched,
            dispatch_failures,
            rejected,
            worker_health,
            worker_role,
            worker_breaker,
            worker_failures,
            degradation_level,
            migrations,
            migration_latency,
            canaries,
            media_encodes,
            encoder_jobs,
            feature_store_hits,
            feature_store_evictions,
            feature_store_waits,
            feature_store_bytes,
            disagg_prefills,
            disagg_handoff,
            generation_requests: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            ttft_sum: Default::default(),
            itl_sum: Default::default(),
            counted_workers: parking_lot::Mutex::new(std::collections::HashSet::new()),
            failed_workers: parking_lot::Mutex::new(std::collections::HashSet::new()),
        }
    }
}

impl Metrics {
    pub fn count_request(&self, route: &'static str, status: u16) {
        self.requests
            .get_or_create(&RouteLabels { route, status })
            .inc();
        if matches!(route, "/v1/completions" | "/v1/chat/completions") {
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

    /// Renders the Prometheus text format, refreshing the gauges read from live state.
    pub fn render(&self, routing: &RoutingService) -> String {
        let _one_at_a_time = self.rendering.lock();
        self.queued
            .set(routing.queued().iter().sum::<usize>() as i64);
        self.workers.set(routing.worker_count() as i64);
        self.worker_active_blocks.clear();
        self.worker_prefill_tokens.clear();
        self.worker_requests.clear();
        self.engine_running.clear();
        self.engine_waiting.clear();
        self.engine_kv_usage.clear();
        let loads = routing.loads();
        // Counter series of workers that left go with them.
        self.counted_workers.lock().retain(|key| {
            let present = loads.iter().any(|(k, _, _)| k == key);
            if !present {
                let labels = WorkerLabels {
                    worker: key.to_string(),
                };
                self.dispatched.remove(&labels);
                self.dispatch_failures.remove(&labels);
            }
            present
        });
        let workers = routing.workers();
        self.failed_workers.lock().retain(|id| {
            let present = workers.iter().any(|w| w.worker_id == *id);
            if !present {
                for kind in Failure::KINDS {
                    self.worker_failures.remove(&FailureLabels {
                        worker: id.to_string(),
                        kind: kind.name(),
                    });
                }
            }
            present
        });
        self.worker_health.clear();
        self.worker_breaker.clear();
        self.worker_role.clear();
        for w in &workers {
            let worker = w.worker_id.to_string();
            self.worker_role
                .get_or_create(&WorkerRoleLabels {
                    worker: worker.clone(),
                    role: w.entry.spec.role.name(),
                })
                .set(1);
            self.worker_health
                .get_or_create(&WorkerStateLabels {
                    worker: worker.clone(),
                    state: w.entry.status(),
                })
                .set(1);
            self.worker_breaker
                .get_or_create(&WorkerStateLabels {
                    worker,
                    state: w.entry.health.breaker.name(),
                })
                .set(1);
        }
        self.degradation_level
            .set(i64::from(routing.degradation_level()));
        for (key, load, engine) in loads {
            let labels = WorkerLabels {
                worker: key.to_string(),
            };
            self.worker_active_blocks
                .get_or_create(&labels)
                .set(load.active_blocks as i64);
            self.worker_prefill_tokens
                .get_or_create(&labels)
                .set(load.prefill_tokens as i64);
            self.worker_requests
                .get_or_create(&labels)
                .set(i64::from(load.requests));
            if let Some(engine) = engine {
                self.engine_running
                    .get_or_create(&labels)
                    .set(i64::from(engine.running));
                self.engine_waiting
                    .get_or_create(&labels)
                    .set(i64::from(engine.waiting));
                self.engine_kv_usage
                    .get_or_create(&labels)
                    .set(engine.kv_usage());
            }
        }
        let (events, gaps, blocks) = routing
            .indexer()
            .read(|i| (i.stats().events_applied, i.stats().gaps, i.block_count()));
        catch_up(&self.indexer_events, events);
        catch_up(&self.indexer_gaps, gaps);
        self.indexer_blocks.set(blocks as i64);
        catch_up(&self.indexer_resyncs, routing.resyncs());
        self.replica_requests.set(routing.replica_requests() as i64);
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
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
