//! Sharing one indexer between request handlers and event ingestion.
//!
//! Design: a read-mostly lock around a plain [`Indexer`]. Lookups take the read lock and
//! run on the caller's thread (no channel hop, no queue), many at once. Ingestion takes the
//! write lock for a bounded batch (at most `max_blocks_per_lock` blocks), then releases it
//! *fairly*, handing the lock to waiting readers before taking it again. A lookup therefore
//! waits at most one bounded batch behind ingestion, however long the event burst, and
//! ingestion amortises locking over many events. `parking_lot`'s lock spins briefly before
//! parking, which suits critical sections of a few microseconds.

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use switchyard_core::{KvEvent, LocalBlockHash, WorkerKey};

use super::{ApplyOutcome, EventGap, Indexer, OverlapScores, WorkerSnapshot};

/// Default bound on the blocks applied under one write-lock hold (a few tens of µs of work).
pub const DEFAULT_MAX_BLOCKS_PER_LOCK: usize = 1024;

/// An [`Indexer`] shared between threads.
#[derive(Debug)]
pub struct SharedIndexer {
    inner: RwLock<Indexer>,
    max_blocks_per_lock: usize,
}

impl SharedIndexer {
    pub fn new(indexer: Indexer) -> Self {
        Self::with_batch_bound(indexer, DEFAULT_MAX_BLOCKS_PER_LOCK)
    }

    pub fn with_batch_bound(indexer: Indexer, max_blocks_per_lock: usize) -> Self {
        SharedIndexer {
            inner: RwLock::new(indexer),
            max_blocks_per_lock: max_blocks_per_lock.max(1),
        }
    }

    pub fn find_matches(&self, query: &[LocalBlockHash]) -> OverlapScores {
        self.inner.read().find_matches(query)
    }

    /// Applies events in order, yielding to readers between bounded batches. Returns the gaps
    /// detected, for the caller to resynchronise those workers.
    pub fn apply_all<'a>(&self, events: impl IntoIterator<Item = &'a KvEvent>) -> Vec<EventGap> {
        let mut gaps = Vec::new();
        let mut guard: Option<RwLockWriteGuard<'_, Indexer>> = None;
        let mut budget = self.max_blocks_per_lock;
        for event in events {
            let cost = event.block_count().max(1);
            if budget < cost {
                if let Some(held) = guard.take() {
                    RwLockWriteGuard::unlock_fair(held);
                }
                budget = self.max_blocks_per_lock;
            }
            let indexer = guard.get_or_insert_with(|| self.inner.write());
            if let ApplyOutcome::AppliedAfterGap(gap) = indexer.apply(event) {
                gaps.push(gap);
            }
            budget = budget.saturating_sub(cost);
        }
        gaps
    }

    pub fn apply(&self, event: &KvEvent) -> ApplyOutcome {
        self.inner.write().apply(event)
    }

    pub fn remove_worker(&self, worker: WorkerKey) -> bool {
        self.inner.write().remove_worker(worker)
    }

    pub fn restore(&self, snapshot: &WorkerSnapshot) {
        self.inner.write().restore(snapshot)
    }

    /// Read access for anything else (stats, dumps).
    pub fn read(&self) -> RwLockReadGuard<'_, Indexer> {
        self.inner.read()
    }
}
