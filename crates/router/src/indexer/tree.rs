//! The node arena of the radix tree, read by lookups on other threads while one writer
//! changes it.
//!
//! Nodes live in fixed-size pages and refer to each other by index, so a chain stored in one
//! event is laid out contiguously and the match walk reads memory mostly in order. Pages are
//! never moved or freed while the tree lives: growing the arena allocates a page instead of
//! copying every node (which on a large index would stall ingestion for tens of
//! milliseconds), and a reader holding a node id can always read that node. A new chain
//! starts in a word of 64 free ids and grows into the ids after it, also when a later event
//! extends it (see [`Tree::take_id`]).
//!
//! Every field a reader looks at is an atomic, written by the one writer (the owner of the
//! [`Tree`], through `&mut`) and read by anyone holding the [`Live`] half. On x86 and ARM
//! these are plain loads and stores. A reader racing the writer sees each event applied
//! block by block, and may read a node that was freed and reused under it; it then gets a
//! slightly wrong overlap for that one lookup (as it would from an event that arrived a
//! moment later), never undefined behaviour or a panic.
//!
//! A node is one cache line: its key, prefix hash, parent and the bits of the first 320
//! worker slots; its child link is kept apart, in an array of links by id, which leaves the
//! line room for those slots. A chain gets consecutive ids as far as its room allows, and a
//! node whose only child is the next id, held by the same workers, has its bit set in the
//! run bitmap (one bit per id); the match walk takes such a run without intersecting worker
//! bits, and with the query's sequence hashes without reading the nodes along it (see
//! `walk.rs`). Most nodes have zero or one child (the unique tail of a prompt), so the child
//! link is one `u32`: no child, the one child's id, or a flag saying the node branches. The
//! writer keeps each branching node's children in a map of its own; once the tree is shared,
//! it also mirrors those edges into one concurrent map (`papaya`, lock-free reads) for the
//! readers. The workers holding a node are bits of dense worker slots: 320 inline, more in
//! chained extension blocks.

use std::sync::Arc;
use std::sync::atomic::Ordering::{Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustc_hash::FxHashMap;
use switchyard_core::hash::sequence_hash;
use switchyard_core::{LocalBlockHash, SequenceHash};

use super::arena::Pages;
use super::bits::FreeIds;

mod holders;
mod links;
mod live;

pub(crate) use live::Live;

pub(crate) type NodeId = u32;
pub(crate) const ROOT: NodeId = 0;

/// A child link: no child (the root is nobody's child, and a fresh page reads as this).
const NO_CHILD: u32 = 0;
/// A child link with this bit set: the rest indexes `Tree::branches`.
const BRANCH: u32 = 1 << 31;
/// `Node::more` / `Ext::next`: no extension block.
const NO_EXT: u32 = u32::MAX;
/// Worker-slot words kept in the node itself (320 slots).
pub(crate) const INLINE_WORDS: usize = 5;
/// Words per extension block.
const EXT_WORDS: usize = 7;

/// A node: one cache line. Its child link is kept apart (see [`Live::links`]).
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Node {
    /// The local hash of the node's block.
    pub(crate) local: AtomicU64,
    /// Switchyard's sequence hash of the node's path (see `switchyard_core::hash`): the
    /// chained hash of every local hash from the root to the node, computed once when the
    /// node is made, whatever hashes the engines publish. A lookup that knows its query's
    /// sequence hashes checks a node it jumped to by this alone.
    pub(crate) prefix: AtomicU64,
    pub(crate) parent: AtomicU32,
    /// The first extension block of worker bits, or `NO_EXT`.
    more: AtomicU32,
    words: [AtomicU64; INLINE_WORDS],
}

impl Node {
    const fn empty() -> Self {
        Node {
            local: AtomicU64::new(0),
            prefix: AtomicU64::new(0),
            parent: AtomicU32::new(ROOT),
            more: AtomicU32::new(NO_EXT),
            words: [const { AtomicU64::new(0) }; INLINE_WORDS],
        }
    }
}

impl Default for Node {
    fn default() -> Self {
        Node::empty()
    }
}

/// The prefix hash of the child keyed `local` of a node whose prefix hash is `parent`
/// (`None` for the root).
#[inline]
pub(crate) fn child_prefix(parent: Option<u64>, local: LocalBlockHash) -> u64 {
    sequence_hash(parent.map(SequenceHash), local).0
}

/// What a lookup reads for an id it cannot resolve (never happens for the writer).
static VACANT: Node = Node::empty();

/// More worker bits of a node, for slots past the inline ones.
#[derive(Debug)]
#[repr(align(64))]
struct Ext {
    words: [AtomicU64; EXT_WORDS],
    next: AtomicU32,
}

impl Default for Ext {
    fn default() -> Self {
        Ext {
            words: [const { AtomicU64::new(0) }; EXT_WORDS],
            next: AtomicU32::new(NO_EXT),
        }
    }
}

/// The writer's side of the tree: the [`Live`] arena plus what only the writer needs
/// (free lists, the branching nodes' child maps).
#[derive(Debug)]
pub(crate) struct Tree {
    live: Arc<Live>,
    nodes: Pages<Node>,
    links: Pages<AtomicU32>,
    runs: Pages<AtomicU64>,
    ext: Pages<Ext>,
    cached: Pages<AtomicU64>,
    /// Ids below this have been handed out (the root is id 0).
    allocated: u32,
    /// Free ids below `allocated` (see [`Tree::take_id`]).
    free: FreeIds,
    /// Child maps of branching nodes.
    branches: Vec<FxHashMap<LocalBlockHash, NodeId>>,
    free_branches: Vec<u32>,
    ext_allocated: u32,
    free_ext: Vec<u32>,
    /// Whether branching edges are mirrored into `Live::edges` for other threads.
    shared: bool,
    /// The node whose workers changed last: when the next change is to its parent, the
    /// child's mark is checked too (its memory is at hand).
    last_changed: NodeId,
}

impl Default for Tree {
    fn default() -> Self {
        let live = Arc::new(Live::new());
        let mut nodes = Pages::new();
        nodes.ensure(&live.nodes, ROOT);
        let mut links = Pages::new();
        links.ensure(&live.links, ROOT);
        let mut runs = Pages::new();
        runs.ensure(&live.runs, ROOT);
        Tree {
            live,
            nodes,
            links,
            runs,
            ext: Pages::new(),
            cached: Pages::new(),
            allocated: 1,
            free: FreeIds::default(),
            branches: Vec::new(),
            free_branches: Vec::new(),
            ext_allocated: 0,
            free_ext: Vec::new(),
            shared: false,
            last_changed: ROOT,
        }
    }
}

/// A deep copy; the copy is not shared (its edges are not mirrored until [`Tree::share`]).
impl Clone for Tree {
    fn clone(&self) -> Self {
        let mut copy = Tree::default();
        for id in 0..self.allocated {
            let from = self.node(id);
            if let Some(to) = copy.links.ensure(&copy.live.links, id) {
                to.store(self.link(id), Relaxed);
            }
            if id % 64 == 0
                && let (Some(from), Some(to)) = (
                    self.runs.get(id / 64),
                    copy.runs.ensure(&copy.live.runs, id / 64),
                )
            {
                to.store(from.load(Relaxed), Relaxed);
            }
            if let Some(to) = copy.nodes.ensure(&copy.live.nodes, id) {
                to.local.store(from.local.load(Relaxed), Relaxed);
                to.prefix.store(from.prefix.load(Relaxed), Relaxed);
                to.parent.store(from.parent.load(Relaxed), Relaxed);
                to.more.store(from.more.load(Relaxed), Relaxed);
                for (t, f) in to.words.iter().zip(&from.words) {
                    t.store(f.load(Relaxed), Relaxed);
                }
            }
        }
        for id in 0..self.ext_allocated {
            if let (Some(from), Some(to)) = (self.ext.get(id), copy.ext.ensure(&copy.live.ext, id))
            {
                to.next.store(from.next.load(Relaxed), Relaxed);
                for (t, f) in to.words.iter().zip(&from.words) {
                    t.store(f.load(Relaxed), Relaxed);
                }
            }
        }
        let slots = self.live.slots.load(Relaxed);
        for slot in 0..slots {
            copy.ensure_slot(slot);
            if let Some(to) = copy.cached.get(slot) {
                to.store(self.cached(slot), Relaxed);
            }
        }
        copy.live.slots.store(slots, Relaxed);
        copy.live.by_key.store(self.live.by_key.load_full());
        copy.allocated = self.allocated;
        copy.free = self.free.clone();
        copy.branches = self.branches.clone();
        copy.free_branches = self.free_branches.clone();
        copy.ext_allocated = self.ext_allocated;
        copy.free_ext = self.free_ext.clone();
        copy
    }
}

impl Tree {
    pub(crate) fn live(&self) -> &Arc<Live> {
        &self.live
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

    /// Word `w` of the run bitmap (ids `64·w..`).
    #[inline]
    pub(crate) fn run_word(&self, w: u32) -> u64 {
        self.runs.get(w).map_or(0, |word| word.load(Relaxed))
    }

    /// Reads `id`'s node, child link and word of the run bitmap, so that their memory is
    /// at hand for what follows (see `Indexer::apply_data`).
    #[inline]
    pub(crate) fn touch(&self, id: NodeId) -> u64 {
        self.node(id).more.load(Relaxed) as u64 ^ u64::from(self.link(id)) ^ self.run_word(id / 64)
    }

    /// The child link of `id`.
    #[inline]
    pub(crate) fn link(&self, id: NodeId) -> u32 {
        self.links
            .get(id)
            .map_or(NO_CHILD, |link| link.load(Relaxed))
    }

    fn set_link(&self, id: NodeId, link: u32) {
        if let Some(cell) = self.links.get(id) {
            cell.store(link, Release);
        }
    }

    /// The prefix hash of `id` (see [`Node::prefix`]).
    #[inline]
    pub(crate) fn prefix(&self, id: NodeId) -> u64 {
        self.node(id).prefix.load(Relaxed)
    }

    /// Blocks cached by the worker in `slot`.
    #[inline]
    pub(crate) fn cached(&self, slot: u32) -> u64 {
        self.cached.get(slot).map_or(0, |c| c.load(Relaxed))
    }

    /// Sets the slot's cached count, for this thread and others.
    #[inline]
    pub(crate) fn set_cached(&self, slot: u32, count: u64) {
        if let Some(c) = self.cached.get(slot) {
            c.store(count, Release);
        }
    }

    /// Makes room for the counts of slots up to `slot`.
    pub(crate) fn ensure_slot(&mut self, slot: u32) {
        self.cached.ensure(&self.live.cached, slot);
    }

    pub(crate) fn local(&self, id: NodeId) -> LocalBlockHash {
        LocalBlockHash(self.node(id).local.load(Relaxed))
    }

    pub(crate) fn parent(&self, id: NodeId) -> NodeId {
        self.node(id).parent.load(Relaxed)
    }

    pub(crate) fn has_children(&self, id: NodeId) -> bool {
        self.link(id) != NO_CHILD
    }

    /// Number of nodes other than the root.
    pub(crate) fn len(&self) -> usize {
        self.allocated as usize - self.free.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn a_node_and_an_extension_block_are_one_cache_line_each() {
        assert_eq!(std::mem::size_of::<Node>(), 64);
        assert_eq!(std::mem::size_of::<Ext>(), 64);
    }

    #[test]
    fn links_grow_into_branches_and_shrink_back() {
        for shared in [false, true] {
            let mut tree = Tree::default();
            if shared {
                tree.share();
            }
            let l = |i| LocalBlockHash(i);
            let ids: Vec<_> = (1..=3)
                .map(|i| tree.child_or_insert(ROOT, l(i)).unwrap())
                .collect();
            let (a, b, c) = (ids[0], ids[1], ids[2]);
            for id in [a, b, c] {
                tree.hold(id, 0);
            }
            let live = Arc::clone(tree.live());
            let guard = live.guard();
            assert_eq!(tree.child(ROOT, l(2)), Some(b));
            assert_eq!(
                live.child(ROOT, l(2), &guard).map(|c| c.0),
                shared.then_some(b)
            );
            assert_eq!(tree.children(ROOT).len(), 3);
            for id in [b, c] {
                tree.unhold(id, 0);
                tree.prune(id);
            }
            assert_eq!(tree.child(ROOT, l(1)), Some(a));
            assert_eq!(
                live.child(ROOT, l(1), &guard).map(|c| c.0),
                Some(a),
                "a single link again"
            );
            assert_eq!(tree.child(ROOT, l(3)), None);
            assert_eq!(live.child(ROOT, l(3), &guard).map(|c| c.0), None);
            assert_eq!(tree.children(ROOT), vec![(l(1), a)]);
            assert_eq!(tree.free_branches.len(), 1);
            assert_eq!(live.edges.len(), 0, "no edge is left behind");
            tree.unhold(a, 0);
            tree.prune(a);
            assert!(!tree.has_children(ROOT));
            assert_eq!(tree.len(), 0);
        }
    }

    #[test]
    fn a_chain_extended_later_continues_its_run() {
        let mut tree = Tree::default();
        let chain = |tree: &mut Tree, parent: NodeId, keys: std::ops::Range<u64>| {
            let mut ids = Vec::new();
            let mut node = parent;
            for k in keys {
                node = tree.child_or_insert(node, LocalBlockHash(k)).unwrap();
                ids.push(node);
            }
            ids
        };
        let first = chain(&mut tree, ROOT, 1..11);
        let other = chain(&mut tree, ROOT, 100..120);
        assert!(first.windows(2).all(|w| w[1] == w[0] + 1));
        assert!(
            other[0] > first[9] + 1,
            "a new chain leaves room after the first"
        );
        let end = *first.last().unwrap();
        let more = chain(&mut tree, end, 11..31);
        assert_eq!(more[0], end + 1, "the extension continues the run");
        assert!(more.windows(2).all(|w| w[1] == w[0] + 1));
        // A branch is no extension: it starts a chain of its own.
        let side = chain(&mut tree, first[4], 200..201);
        assert_ne!(side[0], first[4] + 1);
    }

    proptest! {
        /// Worker bits, inline and in extension blocks, behave like a set per node, and
        /// freeing a node clears them for its next use.
        #[test]
        fn worker_bits_behave_like_sets(
            ops in proptest::collection::vec((0u8..3, 0u32..2, 0u32..900), 0..300)
        ) {
            let mut tree = Tree::default();
            let mut nodes: Vec<NodeId> = (0..2u64)
                .map(|i| tree.child_or_insert(ROOT, LocalBlockHash(i + 1)).unwrap())
                .collect();
            let mut model = [BTreeSet::new(), BTreeSet::new()];
            for (op, n, slot) in ops {
                let (node, set) = (nodes[n as usize], &mut model[n as usize]);
                match op {
                    0 => prop_assert_eq!(tree.hold(node, slot), set.insert(slot)),
                    1 => prop_assert_eq!(tree.unhold(node, slot), set.remove(&slot)),
                    _ => {
                        // Free the node and make a fresh one in its place.
                        for s in std::mem::take(set) {
                            tree.unhold(node, s);
                        }
                        tree.prune(node);
                        let fresh = tree.child_or_insert(ROOT, LocalBlockHash(u64::from(n) + 1)).unwrap();
                        prop_assert!(tree.is_unheld(fresh));
                        nodes[n as usize] = fresh;
                    }
                }
                // Freed extension blocks are reused: two nodes never need more than two
                // blocks each for slots below 900.
                prop_assert!(tree.ext_allocated <= 4, "{} blocks", tree.ext_allocated);
                let node = nodes[n as usize];
                let set = &model[n as usize];
                prop_assert_eq!(tree.is_unheld(node), set.is_empty());
                prop_assert_eq!(tree.holders(node), set.iter().copied().collect::<Vec<_>>());
                for s in [slot, slot ^ 1, slot + 64] {
                    prop_assert_eq!(tree.holds(node, s), set.contains(&s));
                }
            }
        }

        /// Chains stored and evicted at random: the arena never holds more ids than a
        /// seventh, or a word, above the most nodes ever live, and one word, the room new
        /// chains are given included.
        #[test]
        fn room_for_chains_stays_bounded(
            ops in proptest::collection::vec((any::<bool>(), 0usize..64, 1u64..200), 1..200)
        ) {
            let mut tree = Tree::default();
            let mut chains: Vec<Vec<NodeId>> = Vec::new();
            let (mut next_key, mut peak) = (1u64, 0usize);
            for (store, pick, len) in ops {
                if store || chains.is_empty() {
                    // A new chain, or an extension of a stored one's end.
                    let extend = !chains.is_empty() && pick % 2 == 0;
                    let mut node = if extend { *chains[pick % chains.len()].last().unwrap() } else { ROOT };
                    let mut ids = Vec::new();
                    for _ in 0..len {
                        node = tree.child_or_insert(node, LocalBlockHash(next_key)).unwrap();
                        next_key += 1;
                        tree.hold(node, 0);
                        ids.push(node);
                    }
                    if extend {
                        let i = pick % chains.len();
                        chains[i].extend(ids);
                    } else {
                        chains.push(ids);
                    }
                } else {
                    // Evict a chain from its tail, as a worker's removals come.
                    let ids = chains.swap_remove(pick % chains.len());
                    for &id in ids.iter().rev() {
                        tree.unhold(id, 0);
                        tree.prune(id);
                    }
                }
                peak = peak.max(tree.len() + 1);
                prop_assert_eq!(tree.len(), chains.iter().map(Vec::len).sum::<usize>());
                prop_assert!(
                    tree.allocated as usize <= (peak * 8 / 7).max(peak + 64) + 64,
                    "{} ids for at most {} nodes", tree.allocated, peak
                );
            }
        }
    }
}
