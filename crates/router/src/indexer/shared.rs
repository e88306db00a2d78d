//! Sharing one indexer between request handlers and event ingestion.
//!
//! Design: left-right, two copies of a plain [`Indexer`]. Lookups read the published copy
//! on the caller's thread, wait-free: they never wait behind ingestion, whatever the event
//! rate, and never take a lock. The writer applies events to the other copy and publishes
//! by swapping the copies, then replays the same events onto the copy it got back. The price
//! is twice the memory and every event applied twice, paid on the ingestion side.
//!
//! Publishing happens after each bounded batch of blocks, so the index lookups see is at
//! most one batch behind the event stream. Gap detection runs on the writer side as events
//! arrive, so callers learn of gaps immediately.
//!
//! A plain read-write lock was measured first and rejected: under sustained ingestion,
//! readers that found the lock taken parked and paid wake-up latencies of 100 µs and more
//! (see docs/benchmarks.md).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use left_right::{Absorb, ReadHandle, ReadHandleFactory, WriteHandle};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use switchyard_core::{KvEvent, LocalBlockHash, WorkerKey};

use super::{EventGap, EventStreams, Indexer, OverlapScores, StreamCheck, WorkerSnapshot};

/// Default bound on the blocks applied between two publishes.
pub const DEFAULT_MAX_BLOCKS_PER_PUBLISH: usize = 4096;

/// A write to the index, as logged for both copies.
#[derive(Debug, Clone)]
pub enum IndexOp {
    Event(KvEvent),
    RemoveWorker(WorkerKey),
    Restore(WorkerSnapshot),
}

impl Indexer {
    fn absorb_op(&mut self, op: &IndexOp) {
        match op {
            IndexOp::Event(event) => {
                self.apply(event);
            }
            IndexOp::RemoveWorker(worker) => {
                self.remove_worker(*worker);
            }
            IndexOp::Restore(snapshot) => self.restore(snapshot),
        }
    }
}

impl Absorb<IndexOp> for Indexer {
    fn absorb_first(&mut self, op: &mut IndexOp, _other: &Self) {
        self.absorb_op(op);
    }

    fn absorb_second(&mut self, op: IndexOp, _other: &Self) {
        self.absorb_op(&op);
    }

    fn sync_with(&mut self, first: &Self) {
        *self = first.clone();
    }
}

struct Writer {
    handle: WriteHandle<Indexer, IndexOp>,
    /// Mirrors the copies' stream bookkeeping, to report gaps as events arrive.
    streams: EventStreams,
}

/// An [`Indexer`] shared between threads: wait-free lookups, one writer at a time.
pub struct SharedIndexer {
    id: u64,
    writer: Mutex<Writer>,
    readers: ReadHandleFactory<Indexer>,
    max_blocks_per_publish: usize,
}

impl std::fmt::Debug for SharedIndexer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedIndexer")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Each thread's read handles, by indexer id: a handle is cheap to use but costly to
    /// make, and cannot be shared between threads.
    static READ_HANDLES: RefCell<FxHashMap<u64, ReadHandle<Indexer>>> = RefCell::new(FxHashMap::default());
}

impl SharedIndexer {
    pub fn new(indexer: Indexer) -> Self {
        Self::with_publish_bound(indexer, DEFAULT_MAX_BLOCKS_PER_PUBLISH)
    }

    pub fn with_publish_bound(indexer: Indexer, max_blocks_per_publish: usize) -> Self {
        let streams = indexer.streams.clone();
        let (handle, reader) = left_right::new_from_empty::<Indexer, IndexOp>(indexer);
        SharedIndexer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            writer: Mutex::new(Writer { handle, streams }),
            readers: reader.factory(),
            max_blocks_per_publish: max_blocks_per_publish.max(1),
        }
    }

    /// Runs `f` on the published copy, on this thread, without waiting for the writer.
    pub fn read<R>(&self, f: impl FnOnce(&Indexer) -> R) -> R {
        READ_HANDLES.with(|handles| {
            let mut handles = handles.borrow_mut();
            let handle = handles
                .entry(self.id)
                .or_insert_with(|| self.readers.handle());
            match handle.enter() {
                Some(guard) => f(&guard),
                // Only when the writer is gone, which cannot happen while `self` lives.
                None => f(&Indexer::default()),
            }
        })
    }

    pub fn find_matches(&self, query: &[LocalBlockHash]) -> OverlapScores {
        self.read(|indexer| indexer.find_matches(query))
    }

    /// Applies events in order, publishing after every bounded batch and at the end.
    /// Returns the gaps detected, for the caller to resynchronise those workers.
    pub fn apply_all(&self, events: impl IntoIterator<Item = KvEvent>) -> Vec<EventGap> {
        let mut gaps = Vec::new();
        let mut writer = self.writer.lock();
        let mut pending = 0usize;
        for event in events {
            if let StreamCheck::Gap(gap) = writer.streams.observe(event.worker(), event.event_id) {
                gaps.push(gap);
            }
            pending += event.block_count().max(1);
            writer.handle.append(IndexOp::Event(event));
            if pending >= self.max_blocks_per_publish {
                writer.handle.publish();
                pending = 0;
            }
        }
        if pending > 0 {
            writer.handle.publish();
        }
        gaps
    }

    pub fn apply(&self, event: KvEvent) -> Option<EventGap> {
        self.apply_all([event]).pop()
    }

    pub fn remove_worker(&self, worker: WorkerKey) {
        let mut writer = self.writer.lock();
        writer.streams.forget(worker);
        writer.handle.append(IndexOp::RemoveWorker(worker));
        writer.handle.publish();
    }

    pub fn restore(&self, snapshot: WorkerSnapshot) {
        let mut writer = self.writer.lock();
        writer.streams.set(snapshot.worker, snapshot.last_event_id);
        writer.handle.append(IndexOp::Restore(snapshot));
        writer.handle.publish();
    }
}
