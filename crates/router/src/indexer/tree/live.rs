//! The readers' half of the tree: what a lookup on another thread reads, without a lock
//! and without waiting for the writer.

use std::sync::atomic::Ordering::Acquire;
use std::sync::atomic::{AtomicU32, AtomicU64};

use arc_swap::ArcSwap;
use rustc_hash::FxBuildHasher;
use switchyard_core::{LocalBlockHash, WorkerKey};

use super::super::arena::Arena;
use super::{BRANCH, EXT_WORDS, Ext, INLINE_WORDS, NO_CHILD, Node, NodeId, VACANT};

/// The half of the index that lookups on other threads read: the nodes, the edges of
/// branching nodes, and per worker slot its key and number of cached blocks.
#[derive(Debug)]
pub(crate) struct Live {
    pub(super) nodes: Arena<Node>,
    /// Child links by id: no child, the one child's id, or `BRANCH` and the index of the
    /// node's child map. Kept apart from the nodes (16 to a cache line), which leaves a
    /// node's line room for 320 worker slots; in the line or apart, lookups measured the
    /// same.
    pub(super) links: Arena<AtomicU32>,
    /// The run bitmap, 64 ids a word: bit `i` says node `i`'s only child is node `i + 1`,
    /// held by exactly the workers that hold node `i`, so the match walk takes the child
    /// without intersecting worker sets. Kept by id rather than in the nodes so that a walk
    /// reads a whole run in a word or two. The mark is sound (set only while true: cleared
    /// before a worker bit of either node changes) but not complete: the writer sets it
    /// where checking is cheap, and a missing mark only sends the walk the slow way.
    pub(super) runs: Arena<AtomicU64>,
    pub(super) ext: Arena<Ext>,
    /// Edges out of branching nodes, (parent, key) → child; kept only once the tree is
    /// shared (see [`Tree::share`]).
    pub(super) edges: papaya::HashMap<(NodeId, LocalBlockHash), NodeId, FxBuildHasher>,
    /// Distinct nodes held, by slot.
    pub(crate) cached: Arena<AtomicU64>,
    /// (key, slot), sorted by key.
    pub(crate) by_key: ArcSwap<Vec<(WorkerKey, u32)>>,
    /// Slots in use or vacant: every slot is below this.
    pub(crate) slots: AtomicU32,
}

impl Live {
    pub(super) fn new() -> Self {
        Live {
            nodes: Arena::new(),
            links: Arena::new(),
            runs: Arena::new(),
            ext: Arena::new(),
            edges: papaya::HashMap::with_hasher(FxBuildHasher),
            cached: Arena::new(),
            by_key: ArcSwap::from_pointee(Vec::new()),
            slots: AtomicU32::new(0),
        }
    }

    #[inline]
    pub(crate) fn node(&self, id: NodeId) -> &Node {
        self.nodes.get(id).unwrap_or(&VACANT)
    }

    /// The page of nodes holding ids `p·4096..`, if allocated.
    #[inline]
    pub(crate) fn node_page(&self, p: u32) -> Option<&[Node]> {
        self.nodes.page(p)
    }

    /// Word `w` of the run bitmap (ids `64·w..`); 0 past the allocated ones.
    #[inline]
    pub(crate) fn run_word(&self, w: u32) -> u64 {
        self.runs.get(w).map_or(0, |word| word.load(Acquire))
    }

    /// Blocks cached by the worker in `slot`.
    #[inline]
    pub(crate) fn cached(&self, slot: u32) -> u64 {
        self.cached.get(slot).map_or(0, |c| c.load(Acquire))
    }

    /// Word `i` of the worker bits of `node`.
    #[inline]
    pub(crate) fn word(&self, node: &Node, i: usize) -> u64 {
        if i < INLINE_WORDS {
            return node.words[i].load(Acquire);
        }
        let k = i - INLINE_WORDS;
        let mut ext = node.more.load(Acquire);
        for _ in 0..k / EXT_WORDS {
            match self.ext.get(ext) {
                Some(block) => ext = block.next.load(Acquire),
                None => return 0,
            }
        }
        self.ext
            .get(ext)
            .map_or(0, |block| block.words[k % EXT_WORDS].load(Acquire))
    }

    /// The first `out.len()` words of the worker bits of `node`.
    #[inline]
    pub(crate) fn words_into(&self, node: &Node, out: &mut [u64]) {
        for (i, word) in out.iter_mut().enumerate() {
            *word = match node.words.get(i) {
                Some(w) => w.load(Acquire),
                None => self.word(node, i),
            };
        }
    }

    /// The child link of `id`.
    #[inline]
    pub(crate) fn link(&self, id: NodeId) -> u32 {
        self.links
            .get(id)
            .map_or(NO_CHILD, |link| link.load(Acquire))
    }

    /// The child of node `id` keyed by `local`, as a reader on another thread finds it.
    #[inline]
    pub(crate) fn child(
        &self,
        id: NodeId,
        local: LocalBlockHash,
        guard: &impl papaya::Guard,
    ) -> Option<(NodeId, &Node)> {
        let child = match self.link(id) {
            NO_CHILD => return None,
            link if link & BRANCH != 0 => *self.edges.get(&(id, local), guard)?,
            only => only,
        };
        // A node freed and reused meanwhile is told apart by its key and its parent.
        let node = self.node(child);
        (node.local.load(Acquire) == local.0 && node.parent.load(Acquire) == id)
            .then_some((child, node))
    }

    pub(crate) fn guard(&self) -> impl papaya::Guard + '_ {
        self.edges.guard()
    }
}
