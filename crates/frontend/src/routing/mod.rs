//! The routing service: what the frontend knows about its workers, and where each request
//! goes.
//!
//! It keeps the KV indexer (shared between request handlers and the event task, see
//! `switchyard_router::indexer::shared`), the router (active sequences and policies, behind
//! a mutex: a decision takes microseconds), the workers discovered for the model, and their
//! last reported load. Two tasks keep it current: one follows discovery, one applies the
//! event plane's KV events and load reports.
//!
//! With a [`KvSnapshotSource`] (distributed mode) the index also resynchronises: a worker
//! that joins, whose event stream shows a gap, or whose events may have been lost while the
//! event plane reconnected, is rebuilt from its dump. Its events are buffered from the
//! moment the resync starts; once the dump arrives it replaces the worker's entries and the
//! buffered events newer than the dump are replayed, so nothing between is lost.
//!
//! Events from workers discovery does not list are dropped, in either mode: late events of
//! a worker that left would otherwise stay in the index for good, and early events of one
//! that is joining are in the dump taken when it joins.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use switchyard_core::{
    HashSeed, KvEvent, LoadSnapshot, RequestId, Token, TokenBlocks, WorkerId, WorkerKey,
};
use switchyard_router::indexer::shared::SharedIndexer;
use switchyard_router::{
    Indexer, IndexerConfig, RouteDecision, RouteRequest, Router, RouterConfig, RoutingOverrides,
    WorkerLoad, WorkerSnapshot,
};
use switchyard_runtime::{
    EventSubscription, IndexView, Instances, KvSnapshotSource, WorkerEvent, WorkerInstance,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod replicas;

use replicas::Replicas;
pub use replicas::{ReplicaSettings, follow_replicas, publish_replicas};

/// Most events buffered for a worker being resynchronised; past this the buffer restarts
/// (the next dump covers what it held, and a gap in the replay triggers another round).
const MAX_BUFFERED_EVENTS: usize = 1 << 20;

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
    resync: Option<Resync>,
    /// Workers being resynchronised, with their events since it began. Lock order: this,
    /// then `workers`.
    syncing: Mutex<HashMap<WorkerId, Vec<KvEvent>>>,
    resyncs: std::sync::atomic::AtomicU64,
    /// Sharing routing state with the model's other frontends.
    replicas: Option<Replicas>,
}

/// What resynchronisation needs: where dumps come from, and where its tasks run.
#[derive(Debug, Clone)]
struct Resync {
    source: Arc<dyn KvSnapshotSource>,
    tracker: TaskTracker,
    cancel: CancellationToken,
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
            resync: None,
            syncing: Mutex::new(HashMap::new()),
            resyncs: std::sync::atomic::AtomicU64::new(0),
            replicas: None,
        }
    }

    /// Resynchronises workers from `source` (see the module docs); its tasks run on
    /// `tracker` until `cancel`.
    pub fn with_resync(
        mut self,
        source: Arc<dyn KvSnapshotSource>,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        self.resync = Some(Resync {
            source,
            tracker,
            cancel,
        });
        self
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
    pub fn sync_workers(self: &Arc<Self>, instances: &Instances) {
        let mut syncing = self.syncing.lock();
        let mut workers = self.workers.write();
        let mut router = self.router.lock();
        let mut block_size = self.block_size.write();
        let wanted: BTreeMap<WorkerId, &WorkerInstance> = instances
            .iter()
            .filter(|(_, i)| i.model == self.model)
            .map(|(id, i)| (*id, i))
            .collect();
        // Gone, or restarted under the same id (then it leaves and joins again: its cache
        // and event ids started afresh).
        let gone: Vec<WorkerId> = workers
            .iter()
            .filter(|(id, known)| wanted.get(id).is_none_or(|now| now != known))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            syncing.remove(&id);
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
        // With every worker gone, the next ones may bring another block size.
        if workers.is_empty() {
            *block_size = None;
        }
        for (id, instance) in wanted {
            if workers.contains_key(&id) {
                continue;
            }
            let size = match *block_size {
                Some(size) => size,
                None => {
                    router.set_block_size(instance.block_size);
                    *block_size.insert(instance.block_size)
                }
            };
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
            self.start_resync(&mut syncing, id);
        }
        drop((syncing, workers, router, block_size));
        self.capacity_changed.notify_waiters();
    }

    /// Starts rebuilding `worker` from its dump, unless already under way (or there is no
    /// dump source).
    fn start_resync(
        self: &Arc<Self>,
        syncing: &mut HashMap<WorkerId, Vec<KvEvent>>,
        worker: WorkerId,
    ) {
        let Some(resync) = &self.resync else { return };
        if syncing.contains_key(&worker) {
            return;
        }
        syncing.insert(worker, Vec::new());
        resync
            .tracker
            .spawn(Arc::clone(self).resync_worker(worker, resync.clone()));
    }

    async fn resync_worker(self: Arc<Self>, worker: WorkerId, resync: Resync) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let instance = self.workers.read().get(&worker).cloned();
            let Some(instance) = instance else {
                self.syncing.lock().remove(&worker);
                return;
            };
            match resync.source.snapshot(&instance).await {
                Ok(snapshots) => {
                    self.finish_resync(&instance, snapshots);
                    return;
                }
                Err(e) => {
                    tracing::warn!(%worker, error = %e, "cannot fetch the worker's KV state; retrying")
                }
            }
            tokio::select! {
                () = resync.cancel.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// Replaces the worker's entries with its dump and replays what arrived meanwhile.
    fn finish_resync(self: &Arc<Self>, instance: &WorkerInstance, snapshots: Vec<WorkerSnapshot>) {
        let worker = instance.worker_id;
        let mut syncing = self.syncing.lock();
        let Some(buffered) = syncing.remove(&worker) else {
            return;
        };
        if !self.workers.read().contains_key(&worker) {
            return;
        }
        let mut last: HashMap<WorkerKey, u64> = HashMap::new();
        let mut blocks = 0;
        for rank in 0..instance.dp_size.max(1) {
            let key = WorkerKey {
                worker_id: worker,
                dp_rank: rank,
            };
            if !snapshots.iter().any(|s| s.worker == key) {
                self.indexer.remove_worker(key);
            }
        }
        for snapshot in snapshots
            .into_iter()
            .filter(|s| s.worker.worker_id == worker)
        {
            if let Some(id) = snapshot.last_event_id {
                last.insert(snapshot.worker, id);
            }
            blocks += snapshot.events.len();
            self.indexer.restore(snapshot);
        }
        let replay: Vec<KvEvent> = buffered
            .into_iter()
            .filter(|e| last.get(&e.worker()).is_none_or(|&l| e.event_id > l))
            .collect();
        let replayed = replay.len();
        self.resyncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let gaps = self.indexer.apply_all(replay);
        tracing::info!(%worker, dump_events = blocks, replayed, "resynchronised the worker's KV state");
        if let Some(gap) = gaps.first() {
            tracing::warn!(worker = %gap.worker, expected = gap.expected, received = gap.received, "KV event gap after a resync");
            self.start_resync(&mut syncing, worker);
        }
    }

    /// Resynchronises every worker: events may have been lost.
    pub fn resync_all(self: &Arc<Self>) {
        let mut syncing = self.syncing.lock();
        let workers: Vec<WorkerId> = self.workers.read().keys().copied().collect();
        for worker in workers {
            self.start_resync(&mut syncing, worker);
        }
    }

    /// Workers rebuilt from their dumps so far.
    pub fn resyncs(&self) -> u64 {
        self.resyncs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether any worker is being resynchronised.
    pub fn resyncing(&self) -> bool {
        !self.syncing.lock().is_empty()
    }

    /// The index, for comparison with the workers'.
    pub fn index_view(&self) -> IndexView {
        self.indexer.read(IndexView::of)
    }

    /// Applies one event-plane message.
    pub fn apply_event(self: &Arc<Self>, event: WorkerEvent) {
        match event {
            WorkerEvent::Kv(events) => {
                let mut syncing = self.syncing.lock();
                let live: Vec<KvEvent> = {
                    let workers = self.workers.read();
                    events
                        .into_iter()
                        .filter_map(|event| match syncing.get_mut(&event.worker_id) {
                            Some(buffer) => {
                                if buffer.len() >= MAX_BUFFERED_EVENTS {
                                    buffer.clear();
                                }
                                buffer.push(event);
                                None
                            }
                            None => workers.contains_key(&event.worker_id).then_some(event),
                        })
                        .collect()
                };
                for gap in self.indexer.apply_all(live) {
                    tracing::warn!(worker = %gap.worker, expected = gap.expected, received = gap.received, "KV event gap");
                    self.start_resync(&mut syncing, gap.worker.worker_id);
                }
            }
            WorkerEvent::Reconnected => {
                tracing::info!("the event plane reconnected; resynchronising every worker");
                self.resync_all();
            }
            WorkerEvent::Load { worker, load } => {
                if self.workers.read().contains_key(&worker.worker_id) {
                    self.engine_loads.write().insert(worker, load);
                }
            }
        }
    }

    /// Picks a worker for a prompt, other than those in `exclude` (workers that just failed
    /// it), and records the request as active on it.
    pub fn route(
        &self,
        id: RequestId,
        tokens: &[Token],
        overrides: RoutingOverrides,
        exclude: &[WorkerId],
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
            let mut candidates = router.candidates(&request, &overlaps);
            candidates.retain(|c| !exclude.contains(&c.worker.worker_id));
            let decision = router
                .select(&request, &candidates)
                .map_err(|_| RouteFailure::NoWorkers)?;
            router
                .record(&request, &decision, now)
                .map_err(|e| RouteFailure::Invalid(e.to_string()))?;
            // Under the router's lock: the other frontends see events in the order the
            // router took them.
            if let Some(replicas) = &self.replicas {
                replicas.routed(id, &decision, request.seq_hashes);
            }
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
        let mut router = self.router.lock();
        if router.mark_prefill_completed(id)
            && let Some(replicas) = &self.replicas
        {
            replicas.prefill_done(id);
        }
    }

    /// The request ended, however it ended.
    pub fn finish(&self, id: RequestId) {
        {
            let mut router = self.router.lock();
            if router.free(id).is_some()
                && let Some(replicas) = &self.replicas
            {
                replicas.finished(id);
            }
        }
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
