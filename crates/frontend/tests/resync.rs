//! Resynchronising the index from workers' dumps: on joining, after a gap, after the event
//! plane reconnected; with events arriving while the dump is in flight.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use switchyard_core::{
    KvEvent, KvEventData, LocalBlockHash, SequenceHash, StorageTier, StoredBlock, WorkerId,
};
use switchyard_frontend::routing::RoutingService;
use switchyard_router::{Indexer, IndexerConfig, RoutingConfig, WorkerSnapshot};
use switchyard_runtime::{IndexView, KvSnapshotSource, SnapshotError, WorkerEvent, WorkerInstance};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The workers' true caches, with controls: hold a dump back until released, or fail.
#[derive(Debug)]
struct Workers {
    truth: Mutex<Indexer>,
    /// A worker's next dump is taken when asked for, then returned when this fires.
    hold: Mutex<BTreeMap<WorkerId, oneshot::Receiver<()>>>,
    failures: AtomicUsize,
    dumps: AtomicUsize,
    next_id: Mutex<BTreeMap<WorkerId, u64>>,
}

impl Workers {
    fn new() -> Arc<Self> {
        Arc::new(Workers {
            truth: Mutex::new(Indexer::new(IndexerConfig::default())),
            hold: Mutex::new(BTreeMap::new()),
            failures: AtomicUsize::new(0),
            dumps: AtomicUsize::new(0),
            next_id: Mutex::new(BTreeMap::new()),
        })
    }

    /// The worker's next event: a stored block, or an eviction of an earlier one.
    fn event(&self, worker: u64, data: KvEventData) -> KvEvent {
        let mut ids = self.next_id.lock();
        let id = ids.entry(WorkerId(worker)).or_insert(0);
        *id += 1;
        let event = KvEvent {
            worker_id: WorkerId(worker),
            dp_rank: 0,
            event_id: *id,
            tier: StorageTier::Device,
            data,
        };
        self.truth.lock().apply(&event);
        event
    }

    fn store(&self, worker: u64, hash: u64) -> KvEvent {
        self.event(
            worker,
            KvEventData::Stored {
                parent: None,
                blocks: vec![StoredBlock {
                    seq_hash: SequenceHash(hash),
                    local_hash: LocalBlockHash(hash),
                }],
            },
        )
    }

    fn remove(&self, worker: u64, hash: u64) -> KvEvent {
        self.event(
            worker,
            KvEventData::Removed {
                seq_hashes: vec![SequenceHash(hash)],
            },
        )
    }

    fn view(&self) -> IndexView {
        IndexView::of(&self.truth.lock())
    }
}

#[async_trait]
impl KvSnapshotSource for Workers {
    async fn snapshot(
        &self,
        worker: &WorkerInstance,
    ) -> Result<Vec<WorkerSnapshot>, SnapshotError> {
        if self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(SnapshotError::Other("connection refused".into()));
        }
        self.dumps.fetch_add(1, Ordering::SeqCst);
        let dump: Vec<WorkerSnapshot> = self
            .truth
            .lock()
            .dump()
            .into_iter()
            .filter(|s| s.worker.worker_id == worker.worker_id)
            .collect();
        let hold = self.hold.lock().remove(&worker.worker_id);
        if let Some(hold) = hold {
            let _ = hold.await;
        }
        Ok(dump)
    }
}

fn instance(id: u64) -> WorkerInstance {
    WorkerInstance {
        block_size: Some(16),
        capacity_blocks: Some(1000),
        max_num_seqs: Some(8),
        ..WorkerInstance::new(WorkerId(id), "m")
    }
}

fn instances(ids: &[u64]) -> switchyard_runtime::Instances {
    Arc::new(ids.iter().map(|&id| (WorkerId(id), instance(id))).collect())
}

async fn settled(routing: &RoutingService) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while routing.resyncing() {
        assert!(
            std::time::Instant::now() < deadline,
            "the resync never finished"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn service(workers: &Arc<Workers>) -> Arc<RoutingService> {
    Arc::new(
        RoutingService::new("m".into(), RoutingConfig::default()).with_resync(
            Arc::clone(workers) as Arc<dyn KvSnapshotSource>,
            TaskTracker::new(),
            CancellationToken::new(),
        ),
    )
}

#[tokio::test]
async fn a_late_frontend_rebuilds_without_losing_events_that_race_the_dump() {
    let workers = Workers::new();
    // Before the frontend exists.
    for hash in 1..=5 {
        workers.store(1, hash);
    }
    workers.remove(1, 2);
    let routing = service(&workers);

    // The worker is discovered; its dump is taken but held back while more events arrive.
    let (release, hold) = oneshot::channel();
    workers.hold.lock().insert(WorkerId(1), hold);
    routing.sync_workers(&instances(&[1]));
    while workers.dumps.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    assert!(routing.resyncing());
    let after_dump = vec![workers.store(1, 6), workers.remove(1, 1)];
    routing.apply_event(WorkerEvent::Kv(after_dump));
    assert_eq!(
        routing.index_view(),
        IndexView::default(),
        "buffered, not applied, while syncing"
    );
    // An event from a worker discovery does not list is dropped (its dump will cover it).
    let stray = workers.store(2, 100);
    routing.apply_event(WorkerEvent::Kv(vec![stray]));
    release.send(()).unwrap();
    settled(&routing).await;

    let mut expected = workers.view();
    expected
        .streams
        .retain(|s| s.worker.worker_id == WorkerId(1));
    assert_eq!(routing.index_view(), expected);
    let blocks = &routing.index_view().streams[0].blocks;
    assert_eq!(
        blocks,
        &vec![
            SequenceHash(3),
            SequenceHash(4),
            SequenceHash(5),
            SequenceHash(6)
        ]
    );

    // Worker 2 joins: its dump brings in what was dropped.
    routing.sync_workers(&instances(&[1, 2]));
    settled(&routing).await;
    assert_eq!(routing.index_view(), workers.view());
    assert_eq!(routing.resyncs(), 2);

    // Live events apply directly.
    routing.apply_event(WorkerEvent::Kv(vec![workers.store(2, 101)]));
    assert_eq!(routing.index_view(), workers.view());
    assert!(!routing.resyncing());
}

#[tokio::test]
async fn gaps_and_reconnections_resync_and_failed_dumps_are_retried() {
    let workers = Workers::new();
    let routing = service(&workers);
    routing.sync_workers(&instances(&[1, 2]));
    settled(&routing).await;
    for hash in 1..=3 {
        let event = workers.store(1, hash);
        routing.apply_event(WorkerEvent::Kv(vec![event]));
    }
    assert_eq!(routing.index_view(), workers.view());

    // Event 4 is lost; 5 reveals the gap.
    let _lost = workers.store(1, 4);
    let after = workers.store(1, 5);
    let before = routing.resyncs();
    routing.apply_event(WorkerEvent::Kv(vec![after]));
    settled(&routing).await;
    assert_eq!(routing.resyncs(), before + 1);
    assert_eq!(routing.index_view(), workers.view());

    // Events lost at the tail of both streams, unnoticeable from ids alone: the plane's
    // reconnection resyncs everyone. The first dump attempt fails and is retried.
    let _ = workers.remove(1, 3);
    let _ = workers.store(2, 50);
    workers.failures.store(1, Ordering::SeqCst);
    routing.apply_event(WorkerEvent::EventsLost);
    settled(&routing).await;
    assert_eq!(routing.index_view(), workers.view());
    assert_eq!(routing.resyncs(), before + 3);

    // A worker that leaves mid-resync is simply dropped.
    let (release, hold) = oneshot::channel();
    workers.hold.lock().insert(WorkerId(1), hold);
    let _ = workers.store(1, 60);
    routing.apply_event(WorkerEvent::EventsLost);
    routing.sync_workers(&instances(&[2]));
    settled(&routing).await;
    release.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        routing
            .index_view()
            .streams
            .iter()
            .all(|s| s.worker.worker_id == WorkerId(2)),
        "{:?}",
        routing.index_view()
    );
}
