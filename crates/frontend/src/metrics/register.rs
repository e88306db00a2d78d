//! Every series the frontend exports, named and described in one registry.

use std::borrow::Cow;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{
    FailureLabels, FeatureStateLabels, MemoryLabels, Metrics, OutcomeLabels, RejectionLabels,
    RouteLabels, TenantLabels, TenantTokenLabels, WorkerLabels, WorkerRoleLabels,
    WorkerStateLabels,
};

fn exponential(start: f64, factor: f64, n: u16) -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(start, factor, n)
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
        let tokenized_tokens = Counter::default();
        registry.register(
            "tokenized_prompt_tokens",
            "Prompt tokens the frontend's tokenizer produced (a continued response's known prefix is not tokenized again)",
            tokenized_tokens.clone(),
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
            tokenized_tokens,
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
