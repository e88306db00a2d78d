//! Sharing one indexer between request handlers and event ingestion.
//!
//! Design: one tree, one writer, lock-free readers. Ingestion applies events to the plain
//! [`Indexer`] under a mutex (one writer at a time); lookups walk the same tree on the
//! caller's thread through its live half (`tree::Live`: nodes whose fields are atomics,
//! pages that never move, branching edges mirrored in a lock-free map, the worker list
//! behind an `ArcSwap`). A lookup never takes a lock and never waits for ingestion,
//! whatever the event rate; ingestion applies each event once, to the only copy.
//!
//! What a lookup gives up is atomicity: it sees a batch, even an event, applied block by
//! block, and may for that one lookup count a block a moment early or late, exactly as if
//! the event had reached the index a moment earlier or later. Routing takes such answers
//! anyway (events are always somewhat behind the engines).
//!
//! Two earlier designs were measured and replaced (see docs/benchmarks.md): a read-write
//! lock, whose readers parked behind ingestion (p99 of 100 µs and more), and left-right
//! (two copies, every event applied twice), whose lookups never waited but which carried
//! half the event rate of one copy at twice the memory.

use std::sync::Arc;

use parking_lot::Mutex;
use switchyard_core::{KvEvent, LocalBlockHash, SequenceHash, TokenBlocks, WorkerKey};

use super::tree::Live;
use super::{EventGap, Indexer, OverlapScores, WorkerSnapshot, query_of};

/// An [`Indexer`] shared between threads: lock-free lookups, one writer at a time.
pub struct SharedIndexer {
    writer: Mutex<Indexer>,
    live: Arc<Live>,
}

impl std::fmt::Debug for SharedIndexer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedIndexer").finish_non_exhaustive()
    }
}

impl SharedIndexer {
    pub fn new(mut indexer: Indexer) -> Self {
        let live = indexer.share();
        SharedIndexer {
            writer: Mutex::new(indexer),
            live,
        }
    }

    /// Runs `f` on the whole index (its per-worker tables included), waiting for the
    /// writer: for inspection (statistics, dumps, views), not for the lookup path.
    pub fn read<R>(&self, f: impl FnOnce(&Indexer) -> R) -> R {
        f(&self.writer.lock())
    }

    /// For each worker, how many of `query`'s blocks it holds consecutively from the
    /// first; lock-free.
    pub fn find_matches(&self, query: &[LocalBlockHash]) -> OverlapScores {
        let mut out = OverlapScores::default();
        self.find_matches_into(query, &mut out);
        out
    }

    /// [`SharedIndexer::find_matches`] into a caller's buffers.
    pub fn find_matches_into(&self, query: &[LocalBlockHash], out: &mut OverlapScores) {
        self.live.find_matches_into(query_of(query, None), out);
    }

    /// [`Indexer::find_matches_hashed`], lock-free.
    pub fn find_matches_hashed(
        &self,
        query: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
    ) -> OverlapScores {
        let mut out = OverlapScores::default();
        self.find_matches_hashed_into(query, seq_hashes, &mut out);
        out
    }

    /// [`SharedIndexer::find_matches_hashed`] for a prompt's blocks.
    pub fn find_matches_blocks(&self, blocks: &TokenBlocks) -> OverlapScores {
        self.find_matches_hashed(blocks.local_hashes(), blocks.sequence_hashes())
    }

    /// [`SharedIndexer::find_matches_hashed`] into a caller's buffers.
    pub fn find_matches_hashed_into(
        &self,
        query: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
        out: &mut OverlapScores,
    ) {
        self.live
            .find_matches_into(query_of(query, Some(seq_hashes)), out);
    }

    /// Applies events in order. Returns the gaps detected, for the caller to
    /// resynchronise those workers.
    pub fn apply_all(&self, events: impl IntoIterator<Item = KvEvent>) -> Vec<EventGap> {
        let mut writer = self.writer.lock();
        events
            .into_iter()
            .filter_map(|event| writer.apply_reporting_gap(&event).1)
            .collect()
    }

    pub fn apply(&self, event: KvEvent) -> Option<EventGap> {
        self.apply_all([event]).pop()
    }

    pub fn remove_worker(&self, worker: WorkerKey) {
        self.writer.lock().remove_worker(worker);
    }

    pub fn restore(&self, snapshot: WorkerSnapshot) {
        self.writer.lock().restore(&snapshot);
    }
}
