//! Keeping the routing service current: discovery, the event plane, resynchronisation.
//!
//! With a [`KvSnapshotSource`] the index resynchronises: a worker that joins, whose event
//! stream shows a gap, or whose events may have been lost (the event plane reconnected, or
//! this subscriber fell behind), is rebuilt from its dump. Its events are buffered from the
//! moment the resync starts; once the dump arrives it replaces the worker's entries and the
//! buffered events newer than the dump are replayed, so nothing between is lost.
//!
//! Events are kept only from workers the core accepts them from (registered, still listed,
//! seen through events): late events of a worker that left would otherwise stay in the
//! index for good, early events of one that is joining are in the dump taken when it
//! joins, and a worker given the approximate view is not seen through events at all.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{KvEvent, WorkerId, WorkerKey};
use switchyard_router::{WorkerSnapshot, WorkerSpec};
use switchyard_runtime::{
    EventSubscription, Instances, KvSnapshotSource, WorkerEvent, WorkerInstance,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::RoutingService;

/// Most events buffered for a worker being resynchronised; past this the buffer restarts
/// (the next dump covers what it held, and a gap in the replay triggers another round).
const MAX_BUFFERED_EVENTS: usize = 1 << 20;

/// What resynchronisation needs: where dumps come from, and where its tasks run.
#[derive(Debug, Clone)]
pub(super) struct Resync {
    pub(super) source: Arc<dyn KvSnapshotSource>,
    pub(super) tracker: TaskTracker,
    pub(super) cancel: CancellationToken,
}

/// What the routing core needs of a discovery record.
pub fn spec_of(instance: &WorkerInstance) -> WorkerSpec {
    WorkerSpec {
        id: instance.worker_id,
        incarnation: instance.incarnation,
        role: instance.role,
        dp_size: instance.dp_size.max(1),
        block_size: instance.block_size,
        capacity_blocks: instance.capacity_blocks,
        max_num_seqs: instance.max_num_seqs,
        kv_events: instance.kv_events,
        timing: instance.perf.clone().map(|perf| {
            let defaults = switchyard_router::WorkerTiming::default();
            switchyard_router::WorkerTiming {
                perf,
                max_batched_tokens: instance
                    .max_batched_tokens
                    .unwrap_or(defaults.max_batched_tokens),
                capacity_blocks: instance.capacity_blocks.unwrap_or(defaults.capacity_blocks),
            }
        }),
    }
}

impl RoutingService {
    /// Brings the worker set in line with discovery.
    pub fn sync_workers(self: &Arc<Self>, instances: &Instances) {
        let mine: Vec<&WorkerInstance> = instances
            .values()
            .filter(|i| i.model == self.model)
            .collect();
        let mut syncing = self.syncing.lock();
        let changes = {
            let mut core = self.core.lock();
            core.sync_workers(mine.iter().map(|i| spec_of(i)))
        };
        for id in &changes.left {
            syncing.remove(id);
            let gone = self.instances.write().remove(id);
            if let Some(instance) = gone {
                for rank in 0..instance.dp_size.max(1) {
                    let key = WorkerKey {
                        worker_id: *id,
                        dp_rank: rank,
                    };
                    self.indexer.remove_worker(key);
                    self.engine_loads.write().remove(&key);
                }
            }
            // Streams still on it keep running (a worker that drains finishes them); only
            // an outage moves them.
            self.outages.lock().remove(id);
            self.progress.lock().remove(id);
            tracing::info!(worker = %id, "worker left");
        }
        for refused in &changes.refused {
            tracing::warn!(reason = %refused, "ignoring a worker");
        }
        for id in &changes.joined {
            if let Some(instance) = mine.iter().find(|i| i.worker_id == *id) {
                self.instances.write().insert(*id, (*instance).clone());
            }
            tracing::info!(worker = %id, "worker joined");
            if self.core.lock().accepts_events(*id) {
                self.start_resync(&mut syncing, *id);
            }
        }
        drop(syncing);
        self.fleet_changed.notify_waiters();
        self.pump();
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
            let instance = self.instances.read().get(&worker).cloned();
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
        if !self.core.lock().accepts_events(worker) {
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

    /// Resynchronises every worker seen through events: events may have been lost.
    pub fn resync_all(self: &Arc<Self>) {
        let mut syncing = self.syncing.lock();
        let workers: Vec<WorkerId> = {
            let core = self.core.lock();
            self.instances
                .read()
                .keys()
                .copied()
                .filter(|&w| core.accepts_events(w))
                .collect()
        };
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

    /// Applies one event-plane message.
    pub fn apply_event(self: &Arc<Self>, event: WorkerEvent) {
        match event {
            WorkerEvent::Kv(events) => {
                let mut syncing = self.syncing.lock();
                let live: Vec<KvEvent> = {
                    let core = self.core.lock();
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
                            None => core.accepts_events(event.worker_id).then_some(event),
                        })
                        .collect()
                };
                for gap in self.indexer.apply_all(live) {
                    tracing::warn!(worker = %gap.worker, expected = gap.expected, received = gap.received, "KV event gap");
                    self.start_resync(&mut syncing, gap.worker.worker_id);
                }
            }
            WorkerEvent::EventsLost => {
                tracing::info!("KV events may have been lost; resynchronising every worker");
                self.resync_all();
            }
            WorkerEvent::Load { worker, load } => {
                if self.instances.read().contains_key(&worker.worker_id) {
                    self.engine_loads.write().insert(worker, load);
                }
            }
        }
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
