//! `switchyard planner`'s Prometheus metrics, on `--metrics-port`: what it asks for, what
//! it sees, and how its decisions went.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use switchyard_planner::Decision;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    role: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug)]
pub struct PlannerMetrics {
    registry: Registry,
    replicas: Family<RoleLabels, Gauge>,
    workers: Family<RoleLabels, Gauge>,
    kv_usage: Family<RoleLabels, Gauge<f64, AtomicU64>>,
    queue: Family<RoleLabels, Gauge<f64, AtomicU64>>,
    decisions: Family<OutcomeLabels, Counter>,
    predicted_rate: Gauge<f64, AtomicU64>,
    scaling_errors: Counter,
}

impl Default for PlannerMetrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let replicas = Family::<RoleLabels, Gauge>::default();
        registry.register(
            "switchyard_planner_replicas",
            "Workers the planner asks for, per role",
            replicas.clone(),
        );
        let workers = Family::<RoleLabels, Gauge>::default();
        registry.register(
            "switchyard_planner_workers",
            "Workers the planner saw serving at the last adjustment, per role",
            workers.clone(),
        );
        let kv_usage = Family::<RoleLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "switchyard_planner_kv_usage",
            "Mean KV-cache usage over the last adjustment interval, per role",
            kv_usage.clone(),
        );
        let queue = Family::<RoleLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "switchyard_planner_queue_per_worker",
            "Mean waiting requests per worker over the last adjustment interval, per role",
            queue.clone(),
        );
        let decisions = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "switchyard_planner_decisions",
            "Adjustments by outcome: scale_up, scale_down, hold, waiting (an action in progress)",
            decisions.clone(),
        );
        let predicted_rate = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "switchyard_planner_predicted_request_rate",
            "Requests per second predicted for the next interval (SLA mode)",
            predicted_rate.clone(),
        );
        let scaling_errors = Counter::default();
        registry.register(
            "switchyard_planner_scaling_errors",
            "Scaling actions the connector could not carry out",
            scaling_errors.clone(),
        );
        PlannerMetrics {
            registry,
            replicas,
            workers,
            kv_usage,
            queue,
            decisions,
            predicted_rate,
            scaling_errors,
        }
    }
}

impl PlannerMetrics {
    pub fn record(&self, decision: &Decision) {
        let role = |r: &switchyard_core::WorkerRole| RoleLabels {
            role: r.to_string(),
        };
        for (r, load) in &decision.interval.roles {
            self.workers
                .get_or_create(&role(r))
                .set(i64::from(load.workers));
            self.kv_usage.get_or_create(&role(r)).set(load.kv_usage);
            self.queue
                .get_or_create(&role(r))
                .set(load.queue_per_worker);
        }
        for (r, &n) in &decision.replicas {
            self.replicas.get_or_create(&role(r)).set(i64::from(n));
        }
        for a in &decision.actions {
            self.replicas
                .get_or_create(&role(&a.role))
                .set(i64::from(a.replicas));
        }
        let outcome = if decision
            .reasons
            .iter()
            .any(|r| r.starts_with("waiting for"))
        {
            "waiting"
        } else if decision.actions.iter().any(|a| {
            decision
                .replicas
                .get(&a.role)
                .is_some_and(|&n| a.replicas > n)
        }) {
            "scale_up"
        } else if decision.actions.is_empty() {
            "hold"
        } else {
            "scale_down"
        };
        self.decisions
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        if let Some(p) = &decision.prediction {
            self.predicted_rate.set(p.rate);
        }
    }

    pub fn scaling_failed(&self) {
        self.scaling_errors.inc();
    }

    pub fn render(&self) -> String {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

/// Serves `/metrics` on `listener` until `stop`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<PlannerMetrics>,
    stop: tokio_util::sync::CancellationToken,
) {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = Arc::clone(&metrics);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    metrics.render(),
                )
            }
        }),
    );
    let shutdown = async move { stop.cancelled().await };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::warn!("the planner's metrics listener stopped: {e}");
    }
}
