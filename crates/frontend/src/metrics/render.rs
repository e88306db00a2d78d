//! Rendering the metrics for `/metrics`: the gauges read from live routing state are
//! refreshed first, and the series of workers that left are removed.

use prometheus_client::metrics::counter::Counter;
use switchyard_router::routing::health::Failure;

use super::{FailureLabels, Metrics, WorkerLabels, WorkerRoleLabels, WorkerStateLabels};
use crate::routing::RoutingService;

/// Brings a counter up to `total`, a running total kept elsewhere.
fn catch_up(counter: &Counter, total: u64) {
    let seen = counter.get();
    if total > seen {
        counter.inc_by(total - seen);
    }
}

impl Metrics {
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
