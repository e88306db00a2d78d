//! Dumping a worker's indexed state as events, and restoring it elsewhere.
//!
//! A snapshot is the event sequence that rebuilds the worker's state from nothing: a
//! `Cleared`, then chains of `Stored` blocks with parents before children. A block whose
//! ancestors the worker no longer holds (a prefix evicted before its tail) is re-created
//! through placeholder blocks that are removed right after, so even such orphans come back
//! exactly and later events that name them as parents still apply.

use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use switchyard_core::{
    KvEventData, LocalBlockHash, SequenceHash, StorageTier, StoredBlock, WorkerKey,
};

use super::Indexer;
use super::table::HashTable;
use super::tree::{NodeId, ROOT};

/// A worker's indexed state as events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerSnapshot {
    pub worker: WorkerKey,
    /// The id of the last event reflected in the snapshot; restoring resumes gap detection
    /// from here.
    pub last_event_id: Option<u64>,
    pub tier: StorageTier,
    pub events: Vec<KvEventData>,
}

impl Indexer {
    /// Every known worker's state.
    pub fn dump(&self) -> Vec<WorkerSnapshot> {
        self.by_key
            .iter()
            .filter_map(|&(key, _)| self.dump_worker(key))
            .collect()
    }

    /// One worker's state, or `None` if the worker is unknown.
    pub fn dump_worker(&self, worker: WorkerKey) -> Option<WorkerSnapshot> {
        let slot = self.slot(worker)?;
        let state = self.state(slot);

        // Sequence hashes per held node, smallest first for determinism.
        let mut held: FxHashMap<NodeId, Vec<SequenceHash>> = FxHashMap::default();
        for (hash, node) in state.blocks.iter() {
            held.entry(node).or_default().push(hash);
        }
        for hashes in held.values_mut() {
            hashes.sort_unstable();
        }

        // Each held node hangs under its nearest held ancestor (or the root).
        let mut below: FxHashMap<NodeId, Vec<NodeId>> = FxHashMap::default();
        for &node in held.keys() {
            let mut anchor = self.tree.parent(node);
            while anchor != ROOT && !held.contains_key(&anchor) {
                anchor = self.tree.parent(anchor);
            }
            below.entry(anchor).or_default().push(node);
        }
        for nodes in below.values_mut() {
            nodes.sort_unstable_by_key(|&n| self.tree.local(n));
        }

        let mut placeholders = Placeholders::new(worker, &state.blocks);
        let mut events = vec![KvEventData::Cleared];
        let mut extras = Vec::new();
        let mut stack: Vec<NodeId> = vec![ROOT];
        while let Some(anchor) = stack.pop() {
            let Some(children) = below.get(&anchor) else {
                continue;
            };
            let parent_hash = held.get(&anchor).map(|h| h[0]);
            for &start in children.iter().rev() {
                let mut blocks = Vec::new();
                let filler = placeholders.path(self, anchor, start);
                blocks.extend(filler.iter().copied());
                // Extend the chain while the last node has exactly one held child that is
                // its direct child.
                let mut node = start;
                loop {
                    let hashes = &held[&node];
                    blocks.push(StoredBlock {
                        seq_hash: hashes[0],
                        local_hash: self.tree.local(node),
                    });
                    extras.extend(hashes[1..].iter().map(|&h| (node, h)));
                    match below.get(&node).map(Vec::as_slice) {
                        Some([only]) if self.tree.parent(*only) == node => node = *only,
                        _ => break,
                    }
                }
                stack.push(node);
                events.push(KvEventData::Stored {
                    parent: parent_hash,
                    blocks,
                });
                if !filler.is_empty() {
                    events.push(KvEventData::Removed {
                        seq_hashes: filler.iter().map(|b| b.seq_hash).collect(),
                    });
                }
            }
        }

        // Second and later hashes of a node: stored again under the node's parent.
        for (node, hash) in extras {
            let mut anchor = self.tree.parent(node);
            while anchor != ROOT && !held.contains_key(&anchor) {
                anchor = self.tree.parent(anchor);
            }
            let filler = placeholders.path(self, anchor, node);
            let mut blocks = filler.clone();
            blocks.push(StoredBlock {
                seq_hash: hash,
                local_hash: self.tree.local(node),
            });
            events.push(KvEventData::Stored {
                parent: held.get(&anchor).map(|h| h[0]),
                blocks,
            });
            if !filler.is_empty() {
                events.push(KvEventData::Removed {
                    seq_hashes: filler.iter().map(|b| b.seq_hash).collect(),
                });
            }
        }

        Some(WorkerSnapshot {
            worker,
            last_event_id: self.streams.last(worker),
            tier: self.config.tier,
            events,
        })
    }

    /// Replaces a worker's state with a snapshot's.
    pub fn restore(&mut self, snapshot: &WorkerSnapshot) {
        let slot = self.slot_or_insert(snapshot.worker);
        self.clear_slot(slot);
        for data in &snapshot.events {
            self.apply_data(slot, data);
        }
        self.streams.set(snapshot.worker, snapshot.last_event_id);
    }
}

/// Sequence hashes for placeholder blocks, never equal to a hash the worker really holds.
struct Placeholders<'a> {
    taken: &'a HashTable,
    used: FxHashSet<SequenceHash>,
    next: u64,
}

impl<'a> Placeholders<'a> {
    fn new(worker: WorkerKey, taken: &'a HashTable) -> Self {
        let seed =
            worker.worker_id.0.rotate_left(17) ^ u64::from(worker.dp_rank) ^ 0x5157_6974_6368_5944;
        Placeholders {
            taken,
            used: FxHashSet::default(),
            next: seed,
        }
    }

    fn fresh(&mut self) -> SequenceHash {
        loop {
            self.next = self
                .next
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let hash = SequenceHash(self.next);
            if !self.taken.contains_key(hash) && self.used.insert(hash) {
                return hash;
            }
        }
    }

    /// Placeholder blocks for the nodes strictly between `anchor` and `node`.
    fn path(&mut self, indexer: &Indexer, anchor: NodeId, node: NodeId) -> Vec<StoredBlock> {
        let mut locals: Vec<LocalBlockHash> = Vec::new();
        let mut cursor = indexer.tree.parent(node);
        while cursor != anchor {
            locals.push(indexer.tree.local(cursor));
            cursor = indexer.tree.parent(cursor);
        }
        locals.reverse();
        locals
            .into_iter()
            .map(|local_hash| StoredBlock {
                seq_hash: self.fresh(),
                local_hash,
            })
            .collect()
    }
}
