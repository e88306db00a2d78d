//! The routing service: what the frontend knows about its workers, and where each request
//! goes.
//!
//! It keeps the KV indexer (shared between request handlers and the event task, see
//! `switchyard_router::indexer::shared`), the router (active sequences and policies, behind
//! a mutex: a decision takes microseconds), the workers discovered for the model, and their
//! last reported load. Two tasks keep it current: one follows discovery, one applies the
//! event plane's KV events and load reports.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use switchyard_core::{HashSeed, LoadSnapshot, RequestId, Token, TokenBlocks, WorkerId, WorkerKey};
use switchyard_router::indexer::shared::SharedIndexer;
use switchyard_router::{
    Indexer, IndexerConfig, RouteDecision, RouteRequest, Router, RouterConfig, RoutingOverrides,
    WorkerLoad,
};
use switchyard_runtime::{EventSubscription, Instances, WorkerEvent, WorkerInstance};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Where a request was sent.
#[derive(Debug, Clone)]
pub struct Routed {
    pub instance: WorkerInstance,
    pub decision: RouteDecision,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteFailure {
    #[error("no worker serves this model")]
    NoWorkers,
    #[error("{0}")]
    Invalid(String),
}

#[derive(Debug)]
pub struct RoutingService {
    model: String,
    started: Instant,
    indexer: SharedIndexer,
    router: Mutex<Router>,
    workers: RwLock<BTreeMap<WorkerId, WorkerInstance>>,
    block_size: RwLock<Option<u32>>,
    engine_loads: RwLock<BTreeMap<WorkerKey, LoadSnapshot>>,
    /// Changes whenever a request ends or the worker set changes: capacity may have freed.
    capacity_changed: tokio::sync::Notify,
}

impl RoutingService {
    pub fn new(model: String, config: RouterConfig) -> Self {
        RoutingService {
            model,
            started: Instant::now(),
            indexer: SharedIndexer::new(Indexer::new(IndexerConfig::default())),
            router: Mutex::new(Router::new(config)),
            workers: RwLock::new(BTreeMap::new()),
            block_size: RwLock::new(None),
            engine_loads: RwLock::new(BTreeMap::new()),
            capacity_changed: tokio::sync::Notify::new(),
        }
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn worker_count(&self) -> usize {
        self.workers.read().len()
    }

    pub fn indexer(&self) -> &SharedIndexer {
        &self.indexer
    }

    /// Brings the worker set in line with discovery.
    pub fn sync_workers(&self, instances: &Instances) {
        let mut workers = self.workers.write();
        let mut router = self.router.lock();
        let mut block_size = self.block_size.write();
        let wanted: BTreeMap<WorkerId, &WorkerInstance> = instances
            .iter()
            .filter(|(_, i)| i.model == self.model)
            .map(|(id, i)| (*id, i))
            .collect();
        let gone: Vec<WorkerId> = workers
            .keys()
            .filter(|id| !wanted.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            if let Some(instance) = workers.remove(&id) {
                for rank in 0..instance.dp_size.max(1) {
                    let key = WorkerKey {
                        worker_id: id,
                        dp_rank: rank,
                    };
                    router.remove_worker(key);
                    self.indexer.remove_worker(key);
                    self.engine_loads.write().remove(&key);
                }
                tracing::info!(worker = %id, "worker left");
            }
        }
        for (id, instance) in wanted {
            if workers.contains_key(&id) {
                continue;
            }
            let size = *block_size.get_or_insert(instance.block_size);
            if instance.block_size != size {
                tracing::warn!(worker = %id, block_size = instance.block_size, expected = size, "ignoring a worker with another block size");
                continue;
            }
            for rank in 0..instance.dp_size.max(1) {
                router.add_worker(WorkerKey {
                    worker_id: id,
                    dp_rank: rank,
                });
            }
            workers.insert(id, instance.clone());
            tracing::info!(worker = %id, "worker joined");
        }
        if workers.is_empty() {
            *block_size = None;
        }
        drop((workers, router, block_size));
        self.capacity_changed.notify_waiters();
    }

    /// Applies one event-plane message.
    pub fn apply_event(&self, event: WorkerEvent) {
        match event {
            WorkerEvent::Kv(events) => {
                for gap in self.indexer.apply_all(events) {
                    tracing::warn!(worker = %gap.worker, expected = gap.expected, received = gap.received, "KV event gap");
                }
            }
            WorkerEvent::Load { worker, load } => {
                self.engine_loads.write().insert(worker, load);
            }
        }
    }

    /// Picks a worker for a prompt and records the request as active on it.
    pub fn route(
        &self,
        id: RequestId,
        tokens: &[Token],
        overrides: RoutingOverrides,
    ) -> Result<Routed, RouteFailure> {
        let block_size = (*self.block_size.read()).ok_or(RouteFailure::NoWorkers)?;
        let blocks = TokenBlocks::new(tokens, block_size, HashSeed::default())
            .map_err(|e| RouteFailure::Invalid(e.to_string()))?;
        let overlaps = self.indexer.find_matches(blocks.local_hashes());
        let request = RouteRequest {
            id,
            isl_tokens: tokens.len() as u64,
            seq_hashes: blocks.sequence_hashes(),
            overrides,
        };
        let now = self.now();
        let decision = {
            let mut router = self.router.lock();
            let candidates = router.candidates(&request, &overlaps);
            let decision = router
                .select(&request, &candidates)
                .map_err(|_| RouteFailure::NoWorkers)?;
            router
                .record(&request, &decision, now)
                .map_err(|e| RouteFailure::Invalid(e.to_string()))?;
            decision
        };
        let instance = self.workers.read().get(&decision.worker.worker_id).cloned();
        match instance {
            Some(instance) => Ok(Routed { instance, decision }),
            None => {
                self.finish(id);
                Err(RouteFailure::NoWorkers)
            }
        }
    }

    /// The request's first token arrived: its prompt is computed.
    pub fn prefill_done(&self, id: RequestId) {
        self.router.lock().mark_prefill_completed(id);
    }

    /// The request ended, however it ended.
    pub fn finish(&self, id: RequestId) {
        self.router.lock().free(id);
        self.capacity_changed.notify_waiters();
    }

    /// Notified whenever capacity may have freed.
    pub fn capacity_notify(&self) -> &tokio::sync::Notify {
        &self.capacity_changed
    }

    /// Whether every worker is at or above its busy threshold: KV blocks of in-flight
    /// requests at `kv_threshold` of capacity, or as many requests as it runs at once.
    pub fn all_busy(&self, kv_threshold: f64) -> bool {
        let workers = self.workers.read();
        if workers.is_empty() {
            return true;
        }
        let router = self.router.lock();
        workers.values().all(|instance| {
            (0..instance.dp_size.max(1)).all(|rank| {
                let load = router.load(WorkerKey {
                    worker_id: instance.worker_id,
                    dp_rank: rank,
                });
                let kv =
                    load.active_blocks as f64 >= kv_threshold * instance.capacity_blocks as f64;
                kv || load.requests >= instance.max_num_seqs
            })
        })
    }

    /// The router's view of every worker's load, and the engines' own last report.
    pub fn loads(&self) -> Vec<(WorkerKey, WorkerLoad, Option<LoadSnapshot>)> {
        let router = self.router.lock();
        let engine = self.engine_loads.read();
        router
            .workers()
            .iter()
            .map(|&k| (k, router.load(k), engine.get(&k).copied()))
            .collect()
    }

    pub fn active_requests(&self) -> usize {
        self.router.lock().active().active_requests()
    }

    /// Frees requests that never ended (their handler vanished without a trace).
    pub fn expire(&self) -> usize {
        let now = self.now();
        let expired = self.router.lock().expire(now);
        expired.len()
    }
}

/// Follows discovery until cancelled.
pub async fn follow_discovery(
    service: Arc<RoutingService>,
    mut instances: watch::Receiver<Instances>,
    cancel: CancellationToken,
) {
    loop {
        let snapshot = instances.borrow_and_update().clone();
        service.sync_workers(&snapshot);
        tokio::select! {
            () = cancel.cancelled() => return,
            changed = instances.changed() => if changed.is_err() { return },
        }
    }
}

/// Applies the event plane's messages until cancelled.
pub async fn follow_events(
    service: Arc<RoutingService>,
    mut events: EventSubscription,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            event = events.recv() => match event {
                Some(event) => service.apply_event(event),
                None => return,
            },
        }
    }
}

/// Frees leaked requests now and then.
pub async fn expire_requests(
    service: Arc<RoutingService>,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {
                let n = service.expire();
                if n > 0 {
                    tracing::warn!(requests = n, "expired requests that never ended");
                }
            }
        }
    }
}
