//! The radix-tree indexer: which worker holds which cached prefix.
//!
//! The tree is keyed by *local* block hashes, so a frontend can match a prompt it has only
//! hashed block by block. Events name blocks by the engine's *sequence* hashes, which are
//! opaque per-worker identifiers; a per-worker lookup table maps them to tree nodes.
//!
//! A worker holds a node while at least one of its live sequence hashes maps to it. A
//! worker's match for a query is the number of consecutive query blocks, from the first,
//! whose nodes it holds.
//!
//! Real event streams are messy; each anomaly below is counted in [`IndexerStats`] and none
//! corrupts the tree:
//! - a store of a block the worker already has under the same hash: a no-op;
//! - a store reusing a sequence hash for a different prefix: the hash moves to the new node;
//! - a removal of a block the worker does not have: ignored;
//! - a store whose parent the worker does not have: the whole event is dropped, since its
//!   position in the tree is unknown (the caller should resynchronise the worker);
//! - event ids that skip ahead: applied, and reported as an [`EventGap`] so the caller can ask
//!   for a replay or a dump; ids at or below the last applied one: skipped as stale.

mod arena;
mod bits;
mod check;
mod dump;
mod streams;
mod table;
mod tree;
mod walk;

pub mod approx;
pub mod shared;

use rustc_hash::FxHashMap;
use serde::Serialize;
use switchyard_core::{
    KvEvent, KvEventData, LocalBlockHash, SequenceHash, StorageTier, StoredBlock, TokenBlocks,
    WorkerKey,
};

use std::sync::Arc;
use std::sync::atomic::Ordering::{Acquire, Release};

pub use check::Inconsistency;
pub use dump::WorkerSnapshot;
pub use streams::{EventStreams, StreamCheck};
use table::HashTable;
use tree::{Live, NodeId, ROOT, Tree};
use walk::{Query, Reader, collect_matches};

/// Counters of what the indexer has seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IndexerStats {
    pub events_applied: u64,
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    pub clears: u64,
    pub duplicate_stores: u64,
    pub remapped_stores: u64,
    pub unknown_removals: u64,
    pub unknown_parent_events: u64,
    pub unknown_parent_blocks: u64,
    pub stale_events: u64,
    pub gaps: u64,
    pub other_tier_events: u64,
}

/// Events were missed on a worker's stream: ids `expected..received` never arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EventGap {
    pub worker: WorkerKey,
    pub expected: u64,
    pub received: u64,
}

/// What [`Indexer::apply`] did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyOutcome {
    Applied,
    /// Applied, but earlier events of the stream are missing.
    AppliedAfterGap(EventGap),
    /// Skipped: its id is not above the last applied id of its stream.
    Stale {
        last_event_id: u64,
    },
    /// Skipped: it concerns a storage tier this indexer does not track (its id still counts).
    OtherTier,
}

impl ApplyOutcome {
    pub fn gap(&self) -> Option<EventGap> {
        match self {
            ApplyOutcome::AppliedAfterGap(gap) => Some(*gap),
            _ => None,
        }
    }
}

/// The answer to a match query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlapScores {
    /// Workers matching at least one block: (worker, consecutive blocks matched), by key.
    pub scores: Vec<(WorkerKey, u32)>,
    /// Every known worker's number of cached blocks, by key.
    pub cached_blocks: Vec<(WorkerKey, u64)>,
}

impl OverlapScores {
    /// Blocks matched by `worker` (0 when it matched nothing or is unknown).
    pub fn score(&self, worker: WorkerKey) -> u32 {
        self.scores
            .binary_search_by_key(&worker, |e| e.0)
            .map_or(0, |i| self.scores[i].1)
    }

    /// Blocks cached by `worker` (0 when unknown).
    pub fn cached(&self, worker: WorkerKey) -> u64 {
        self.cached_blocks
            .binary_search_by_key(&worker, |e| e.0)
            .map_or(0, |i| self.cached_blocks[i].1)
    }

    /// The highest score of any worker.
    pub fn best(&self) -> u32 {
        self.scores.iter().map(|e| e.1).max().unwrap_or(0)
    }
}

/// Indexer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexerConfig {
    /// The storage tier whose blocks are indexed; events of other tiers are skipped.
    pub tier: StorageTier,
}

#[derive(Debug, Clone)]
struct WorkerState {
    blocks: HashTable,
    /// Nodes this worker references under more than one sequence hash: the extra count.
    extra_refs: FxHashMap<NodeId, u32>,
}

impl WorkerState {
    fn new() -> Self {
        WorkerState {
            blocks: HashTable::default(),
            extra_refs: FxHashMap::default(),
        }
    }
}

/// The radix-tree indexer. Single-threaded; see [`shared::SharedIndexer`] for concurrent use.
#[derive(Debug, Clone, Default)]
pub struct Indexer {
    config: IndexerConfig,
    tree: Tree,
    /// Workers by dense slot; a slot is the worker's bit in every node's worker set.
    workers: Vec<Option<WorkerState>>,
    free_slots: Vec<u32>,
    /// Distinct nodes held, by slot (kept apart from the worker state so that building
    /// the per-lookup list of counts reads one small array). Published to lookups on
    /// other threads once per event, not per block, so that their cache lines are not
    /// taken from the readers at every block.
    cached: Vec<u64>,
    /// (key, slot), sorted by key: the order of every per-worker list. Published to
    /// lookups on other threads as `Live::by_key` whenever it changes.
    by_key: Vec<(WorkerKey, u32)>,
    /// key -> slot, for the per-event lookup.
    slots: FxHashMap<WorkerKey, u32>,
    streams: EventStreams,
    stats: IndexerStats,
    /// Reused between events (nodes of a removal batch).
    scratch: Vec<NodeId>,
    /// The emptied tables of removed workers, for the next workers to reuse: a fleet that
    /// replaces workers does not grow every new worker's table from nothing.
    spare_tables: Vec<HashTable>,
}

impl Indexer {
    pub fn new(config: IndexerConfig) -> Self {
        Indexer {
            config,
            ..Indexer::default()
        }
    }

    pub fn stats(&self) -> &IndexerStats {
        &self.stats
    }

    /// Distinct blocks in the tree.
    pub fn block_count(&self) -> usize {
        self.tree.len()
    }

    /// Sum over workers of the blocks each holds.
    pub fn worker_block_count(&self) -> u64 {
        self.by_key
            .iter()
            .map(|&(_, slot)| self.cached[slot as usize])
            .sum()
    }

    /// Known workers, by key.
    pub fn workers(&self) -> impl Iterator<Item = WorkerKey> + '_ {
        self.by_key.iter().map(|e| e.0)
    }

    /// Blocks cached by `worker` (0 when unknown).
    pub fn cached_blocks(&self, worker: WorkerKey) -> u64 {
        self.slot(worker).map_or(0, |s| self.cached[s as usize])
    }

    /// The sequence hashes `worker` holds, in no particular order.
    pub fn worker_hashes(&self, worker: WorkerKey) -> Vec<SequenceHash> {
        self.slot(worker)
            .map_or_else(Vec::new, |s| self.state(s).blocks.keys().collect())
    }

    /// The id of the last event applied for `worker`.
    pub fn last_event_id(&self, worker: WorkerKey) -> Option<u64> {
        self.streams.last(worker)
    }

    /// Applies one event.
    pub fn apply(&mut self, event: &KvEvent) -> ApplyOutcome {
        self.apply_reporting_gap(event).0
    }

    /// [`Indexer::apply`], also returning a gap in the event ids even when the event itself
    /// is of another tier.
    pub(crate) fn apply_reporting_gap(
        &mut self,
        event: &KvEvent,
    ) -> (ApplyOutcome, Option<EventGap>) {
        let worker = event.worker();
        let slot = self.slot_or_insert(worker);
        let (outcome, gap) = match self.streams.observe(worker, event.event_id) {
            StreamCheck::Stale { last_event_id } => {
                self.stats.stale_events += 1;
                return (ApplyOutcome::Stale { last_event_id }, None);
            }
            StreamCheck::Gap(gap) => {
                self.stats.gaps += 1;
                (ApplyOutcome::AppliedAfterGap(gap), Some(gap))
            }
            StreamCheck::InOrder => (ApplyOutcome::Applied, None),
        };
        if event.tier != self.config.tier {
            self.stats.other_tier_events += 1;
            return (ApplyOutcome::OtherTier, gap);
        }
        self.apply_data(slot, &event.data);
        (outcome, gap)
    }

    fn apply_data(&mut self, slot: u32, data: &KvEventData) {
        self.stats.events_applied += 1;
        match data {
            KvEventData::Stored { parent, blocks } => self.store(slot, *parent, blocks),
            KvEventData::Removed { seq_hashes } => {
                // The table first, then the tree: the table removals do not depend on each
                // other or on the tree, so their cache misses overlap instead of each waiting
                // behind the previous block's tree work. (Same result: releasing reads no
                // table entry.)
                let mut nodes = std::mem::take(&mut self.scratch);
                let table = &mut self.state_mut(slot).blocks;
                nodes.extend(seq_hashes.iter().filter_map(|&hash| table.remove(hash)));
                self.stats.unknown_removals += (seq_hashes.len() - nodes.len()) as u64;
                self.stats.blocks_removed += nodes.len() as u64;
                // The same for the nodes themselves, before the tree work reads them.
                for &node in &nodes {
                    std::hint::black_box(self.tree.touch(node));
                }
                for &node in &nodes {
                    self.release(slot, node);
                }
                nodes.clear();
                self.scratch = nodes;
            }
            KvEventData::Cleared => {
                self.stats.clears += 1;
                self.clear_slot(slot);
            }
        }
        self.tree.settle();
        self.tree.set_cached(slot, self.cached[slot as usize]);
    }

    fn store(&mut self, slot: u32, parent: Option<SequenceHash>, blocks: &[StoredBlock]) {
        let mut node = match parent {
            None => ROOT,
            Some(parent) => match self.state(slot).blocks.get(parent) {
                Some(node) => node,
                None => {
                    self.stats.unknown_parent_events += 1;
                    self.stats.unknown_parent_blocks += blocks.len() as u64;
                    return;
                }
            },
        };
        // The table entries this event will add, looked up first: the lookups do not depend
        // on each other, so their cache misses overlap instead of each waiting behind a
        // block's tree work, and the inserts below find their lines at hand.
        let table = &self.state(slot).blocks;
        for block in blocks {
            std::hint::black_box(table.get(block.seq_hash));
        }
        for block in blocks {
            let Some(child) = self.tree.child_or_insert(node, block.local_hash) else {
                // The arena is full (2^31 nodes): the rest of the event cannot be indexed.
                self.stats.unknown_parent_blocks += 1;
                return;
            };
            match self.state_mut(slot).blocks.insert(block.seq_hash, child) {
                None => {
                    self.stats.blocks_stored += 1;
                    self.acquire(slot, child);
                }
                Some(old) if old == child => self.stats.duplicate_stores += 1,
                Some(old) => {
                    self.stats.remapped_stores += 1;
                    self.acquire(slot, child);
                    self.release(slot, old);
                }
            }
            node = child;
        }
    }

    /// Records one more reference from `slot` to `node`.
    fn acquire(&mut self, slot: u32, node: NodeId) {
        if self.tree.hold(node, slot) {
            self.cached[slot as usize] += 1;
        } else {
            *self.state_mut(slot).extra_refs.entry(node).or_insert(0) += 1;
        }
    }

    /// Drops one reference from `slot` to `node`, pruning the node when nothing needs it.
    fn release(&mut self, slot: u32, node: NodeId) {
        let state = self.state_mut(slot);
        // Extra references are rare (a hash reused for another prefix): skip the lookup.
        if !state.extra_refs.is_empty()
            && let Some(extra) = state.extra_refs.get_mut(&node)
        {
            *extra -= 1;
            if *extra == 0 {
                state.extra_refs.remove(&node);
            }
            return;
        }
        self.cached[slot as usize] -= 1;
        self.tree.unhold(node, slot);
        self.tree.prune(node);
    }

    fn clear_slot(&mut self, slot: u32) {
        let state = self.state_mut(slot);
        let mut nodes: Vec<NodeId> = state.blocks.values().collect();
        // Emptied, not dropped: the worker's next blocks go into a table already at its
        // working size.
        state.blocks.clear();
        state.extra_refs.clear();
        self.cached[slot as usize] = 0;
        self.tree.set_cached(slot, 0);
        // Highest ids first: a chain's nodes were mostly allocated in order, so this releases
        // each chain from its tail up, the order in which the tree re-marks a chain whose
        // workers become the same again (see `Tree::settle`).
        nodes.sort_unstable_by(|a, b| b.cmp(a));
        for node in nodes {
            // A node referenced twice appears twice; the second removal is a no-op.
            if self.tree.unhold(node, slot) {
                self.tree.prune(node);
            }
        }
        self.tree.settle();
    }

    /// Forgets a worker entirely: its blocks and its event-id history.
    pub fn remove_worker(&mut self, worker: WorkerKey) -> bool {
        let Some(slot) = self.slot(worker) else {
            return false;
        };
        self.clear_slot(slot);
        if let Some(state) = self.workers[slot as usize].take() {
            self.spare_tables.push(state.blocks);
        }
        self.free_slots.push(slot);
        self.streams.forget(worker);
        self.slots.remove(&worker);
        if let Ok(i) = self.by_key.binary_search_by_key(&worker, |e| e.0) {
            self.by_key.remove(i);
            self.publish_workers();
        }
        true
    }

    /// For each worker, how many of `query`'s blocks it holds consecutively from the first.
    pub fn find_matches(&self, query: &[LocalBlockHash]) -> OverlapScores {
        let mut out = OverlapScores::default();
        self.find_matches_into(query, &mut out);
        out
    }

    /// [`Indexer::find_matches`] into a caller's buffers, to reuse their allocations.
    pub fn find_matches_into(&self, query: &[LocalBlockHash], out: &mut OverlapScores) {
        self.collect(query_of(query, None), out);
    }

    /// [`Indexer::find_matches`] for a query whose sequence hashes the caller has
    /// (`TokenBlocks::sequence_hashes`: Switchyard's chained hashes of the same blocks,
    /// whatever hashes the engines publish). Same answer, faster on long prompts: the walk
    /// jumps along chains of blocks held alike and checks where it lands by one hash,
    /// instead of comparing every block.
    pub fn find_matches_hashed(
        &self,
        query: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
    ) -> OverlapScores {
        let mut out = OverlapScores::default();
        self.find_matches_hashed_into(query, seq_hashes, &mut out);
        out
    }

    /// [`Indexer::find_matches_hashed`] into a caller's buffers.
    pub fn find_matches_hashed_into(
        &self,
        query: &[LocalBlockHash],
        seq_hashes: &[SequenceHash],
        out: &mut OverlapScores,
    ) {
        self.collect(query_of(query, Some(seq_hashes)), out);
    }

    /// [`Indexer::find_matches_hashed`] for a prompt's blocks.
    pub fn find_matches_blocks(&self, blocks: &TokenBlocks) -> OverlapScores {
        self.find_matches_hashed(blocks.local_hashes(), blocks.sequence_hashes())
    }

    fn collect(&self, query: Query<'_>, out: &mut OverlapScores) {
        let cached = |slot: u32| self.cached[slot as usize];
        collect_matches(
            &&self.tree,
            query,
            self.workers.len(),
            &self.by_key,
            cached,
            out,
        );
    }

    /// The half of the index that lookups on other threads read, from now on kept whole
    /// for them (see [`shared::SharedIndexer`]).
    pub(crate) fn share(&mut self) -> Arc<Live> {
        self.tree.share();
        Arc::clone(self.tree.live())
    }

    /// Publishes the worker list to lookups on other threads.
    fn publish_workers(&self) {
        let live = self.tree.live();
        live.slots.store(self.workers.len() as u32, Release);
        live.by_key.store(Arc::new(self.by_key.clone()));
    }

    fn slot(&self, worker: WorkerKey) -> Option<u32> {
        self.slots.get(&worker).copied()
    }

    fn slot_or_insert(&mut self, worker: WorkerKey) -> u32 {
        if let Some(&slot) = self.slots.get(&worker) {
            return slot;
        }
        match self.by_key.binary_search_by_key(&worker, |e| e.0) {
            Ok(i) => self.by_key[i].1,
            Err(i) => {
                let slot = match self.free_slots.pop() {
                    Some(slot) => slot,
                    None => {
                        self.workers.push(None);
                        self.cached.push(0);
                        self.tree.ensure_slot(self.workers.len() as u32 - 1);
                        (self.workers.len() - 1) as u32
                    }
                };
                let mut state = WorkerState::new();
                if let Some(table) = self.spare_tables.pop() {
                    state.blocks = table;
                }
                self.workers[slot as usize] = Some(state);
                self.cached[slot as usize] = 0;
                self.tree.set_cached(slot, 0);
                self.by_key.insert(i, (worker, slot));
                self.slots.insert(worker, slot);
                self.publish_workers();
                slot
            }
        }
    }

    fn state(&self, slot: u32) -> &WorkerState {
        match &self.workers[slot as usize] {
            Some(state) => state,
            None => unreachable!("slot {slot} is mapped but vacant"),
        }
    }

    fn state_mut(&mut self, slot: u32) -> &mut WorkerState {
        match &mut self.workers[slot as usize] {
            Some(state) => state,
            None => unreachable!("slot {slot} is mapped but vacant"),
        }
    }
}

impl Live {
    /// [`Indexer::find_matches_into`] for a lookup on another thread than the writer's,
    /// without waiting for it.
    pub(crate) fn find_matches_into(&self, query: Query<'_>, out: &mut OverlapScores) {
        let by_key = self.by_key.load();
        let slots = self.slots.load(Acquire) as usize;
        let view = Reader {
            live: self,
            guard: self.guard(),
        };
        collect_matches(&view, query, slots, &by_key, |slot| self.cached(slot), out);
    }
}

/// A query with its sequence hashes when they are one per block (otherwise the walk compares
/// keys, as without them).
pub(crate) fn query_of<'q>(
    locals: &'q [LocalBlockHash],
    seqs: Option<&'q [SequenceHash]>,
) -> Query<'q> {
    debug_assert!(
        seqs.is_none_or(|s| s.len() == locals.len()),
        "one sequence hash per block"
    );
    Query {
        locals,
        seqs: seqs.filter(|s| s.len() == locals.len()),
    }
}
