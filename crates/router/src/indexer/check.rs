//! [`Indexer::validate`]: the tree checked against the per-worker tables, and what a
//! broken invariant looks like ([`Inconsistency`]).

use rustc_hash::FxHashMap;
use switchyard_core::{LocalBlockHash, WorkerKey};
use thiserror::Error;

use super::Indexer;
use super::tree::{NodeId, ROOT, child_prefix};

/// An invariant of the index that does not hold, as [`Indexer::validate`] finds it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Inconsistency {
    #[error("node {node} is linked under {under} but says parent {parent} local {local:?}")]
    Misplaced {
        node: u32,
        under: u32,
        parent: u32,
        local: LocalBlockHash,
    },
    #[error("node {0} is empty but still in the tree")]
    EmptyNode(u32),
    #[error("node {0} has a wrong prefix hash")]
    WrongPrefix(u32),
    #[error("node {0} is marked as held like its child but is not")]
    FalseRunMark(u32),
    /// A branching node's edge that lookups on other threads cannot see.
    #[error("edge {parent} -> {child} ({local:?}) is not mirrored")]
    UnmirroredEdge {
        parent: u32,
        child: u32,
        local: LocalBlockHash,
    },
    #[error("{mirrored} mirrored edges for {branching} branching children")]
    MirroredEdges { mirrored: usize, branching: usize },
    #[error("{reachable} nodes reachable but {allocated} allocated")]
    Unreachable { reachable: usize, allocated: usize },
    #[error("{worker} maps a hash to node {node} without holding it")]
    MappedNotHeld { worker: WorkerKey, node: u32 },
    #[error("{worker} has {refs} refs to node {node} but {extra} extra")]
    ExtraRefs {
        worker: WorkerKey,
        refs: u32,
        node: u32,
        extra: u32,
    },
    #[error("{0} has extra refs to a node it does not map")]
    StrayExtraRefs(WorkerKey),
    #[error("{worker} counts {counted} cached but holds {held}")]
    CachedCount {
        worker: WorkerKey,
        counted: u64,
        held: usize,
    },
    #[error("node {node} holds slot {slot} with no hash mapping to it")]
    UnmappedHolder { node: u32, slot: u32 },
}

impl Indexer {
    /// Checks the tree against the per-worker tables; for tests and debugging.
    ///
    /// Every node is reachable from the root through its parent's child map; its prefix hash
    /// is its path's sequence hash; no node other than the root is empty (no worker, no
    /// child); only nodes held like their only child, the next id, are marked so in the run
    /// bitmap; a node holds a worker's bit exactly when one of the worker's sequence hashes
    /// maps to it, with the extra references counted; and each worker's cached count is its
    /// number of distinct nodes.
    pub fn validate(&self) -> Result<(), Inconsistency> {
        let mut seen = 0usize;
        let mut stack = vec![ROOT];
        let mut held: FxHashMap<(u32, NodeId), u32> = FxHashMap::default();
        while let Some(id) = stack.pop() {
            for (local, child) in self.tree.children(id) {
                let (parent, key) = (self.tree.parent(child), self.tree.local(child));
                if parent != id || key != local {
                    return Err(Inconsistency::Misplaced {
                        node: child,
                        under: id,
                        parent,
                        local: key,
                    });
                }
                if self.tree.is_unheld(child) && !self.tree.has_children(child) {
                    return Err(Inconsistency::EmptyNode(child));
                }
                let prefix = child_prefix((id != ROOT).then(|| self.tree.prefix(id)), local);
                if self.tree.prefix(child) != prefix {
                    return Err(Inconsistency::WrongPrefix(child));
                }
                if self.tree.child_same(child) && !self.tree.may_be_child_same(child) {
                    return Err(Inconsistency::FalseRunMark(child));
                }
                for slot in self.tree.holders(child) {
                    held.insert((slot, child), 0);
                }
                seen += 1;
                stack.push(child);
            }
        }
        self.tree.check_edges()?;
        if seen != self.tree.len() {
            return Err(Inconsistency::Unreachable {
                reachable: seen,
                allocated: self.tree.len(),
            });
        }
        for &(key, slot) in &self.by_key {
            let state = self.state(slot);
            let mut refs: FxHashMap<NodeId, u32> = FxHashMap::default();
            for node in state.blocks.values() {
                *refs.entry(node).or_insert(0) += 1;
            }
            for (&node, &count) in &refs {
                if !self.tree.holds(node, slot) {
                    return Err(Inconsistency::MappedNotHeld { worker: key, node });
                }
                let extra = state.extra_refs.get(&node).copied().unwrap_or(0);
                if extra + 1 != count {
                    return Err(Inconsistency::ExtraRefs {
                        worker: key,
                        refs: count,
                        node,
                        extra,
                    });
                }
                held.remove(&(slot, node));
            }
            if state.extra_refs.keys().any(|n| !refs.contains_key(n)) {
                return Err(Inconsistency::StrayExtraRefs(key));
            }
            if self.cached[slot as usize] != refs.len() as u64 {
                return Err(Inconsistency::CachedCount {
                    worker: key,
                    counted: self.cached[slot as usize],
                    held: refs.len(),
                });
            }
        }
        if let Some(((slot, node), _)) = held.iter().next() {
            return Err(Inconsistency::UnmappedHolder {
                node: *node,
                slot: *slot,
            });
        }
        Ok(())
    }
}
