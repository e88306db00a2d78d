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
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};

use arc_swap::ArcSwap;
use rustc_hash::{FxBuildHasher, FxHashMap};
use switchyard_core::hash::sequence_hash;
use switchyard_core::{LocalBlockHash, SequenceHash, WorkerKey};

use super::arena::{Arena, Pages};
use super::bits::{FreeIds, Ones};

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

/// The half of the index that lookups on other threads read: the nodes, the edges of
/// branching nodes, and per worker slot its key and number of cached blocks.
#[derive(Debug)]
pub(crate) struct Live {
    nodes: Arena<Node>,
    /// Child links by id: no child, the one child's id, or `BRANCH` and the index of the
    /// node's child map. Kept apart from the nodes (16 to a cache line), which leaves a
    /// node's line room for 320 worker slots; in the line or apart, lookups measured the
    /// same.
    links: Arena<AtomicU32>,
    /// The run bitmap, 64 ids a word: bit `i` says node `i`'s only child is node `i + 1`,
    /// held by exactly the workers that hold node `i`, so the match walk takes the child
    /// without intersecting worker sets. Kept by id rather than in the nodes so that a walk
    /// reads a whole run in a word or two. The mark is sound (set only while true: cleared
    /// before a worker bit of either node changes) but not complete: the writer sets it
    /// where checking is cheap, and a missing mark only sends the walk the slow way.
    runs: Arena<AtomicU64>,
    ext: Arena<Ext>,
    /// Edges out of branching nodes, (parent, key) → child; kept only once the tree is
    /// shared (see [`Tree::share`]).
    edges: papaya::HashMap<(NodeId, LocalBlockHash), NodeId, FxBuildHasher>,
    /// Distinct nodes held, by slot.
    pub(crate) cached: Arena<AtomicU64>,
    /// (key, slot), sorted by key.
    pub(crate) by_key: ArcSwap<Vec<(WorkerKey, u32)>>,
    /// Slots in use or vacant: every slot is below this.
    pub(crate) slots: AtomicU32,
}

impl Live {
    fn new() -> Self {
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

/// Free ids in partly used words are reused once they are this fraction (1/n) of the ids
/// handed out: below it, new chains start in words of their own (see [`Tree::take_id`]).
const FRAGMENTS: usize = 8;

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

    /// From now on, keeps `Live::edges` complete so that other threads can walk the tree.
    pub(crate) fn share(&mut self) {
        if self.shared {
            return;
        }
        self.shared = true;
        let edges = self.live.edges.pin();
        for id in 0..self.allocated {
            let link = self.link(id);
            if link != NO_CHILD && link & BRANCH != 0 {
                for (&local, &child) in &self.branches[(link & !BRANCH) as usize] {
                    edges.insert((id, local), child);
                }
            }
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

    /// Once shared, the readers' edges are exactly the branching nodes' children.
    pub(crate) fn check_edges(&self) -> Result<(), String> {
        if !self.shared {
            return Ok(());
        }
        let edges = self.live.edges.pin();
        let mut count = 0;
        for id in 0..self.allocated {
            let link = self.link(id);
            if link == NO_CHILD || link & BRANCH == 0 {
                continue;
            }
            for (&local, &child) in &self.branches[(link & !BRANCH) as usize] {
                if edges.get(&(id, local)) != Some(&child) {
                    return Err(format!("edge {id} -> {child} ({local:?}) is not mirrored"));
                }
                count += 1;
            }
        }
        if edges.len() != count {
            return Err(format!(
                "{} mirrored edges for {count} branching children",
                edges.len()
            ));
        }
        Ok(())
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

    /// The child of `parent` keyed by `local` (the writer's lookup, through its own maps;
    /// a branching node's child is found without reading the child).
    #[inline]
    pub(crate) fn child(&self, parent: NodeId, local: LocalBlockHash) -> Option<NodeId> {
        match self.link(parent) {
            NO_CHILD => None,
            link if link & BRANCH != 0 => self.branches[(link & !BRANCH) as usize]
                .get(&local)
                .copied(),
            only => (self.node(only).local.load(Relaxed) == local.0).then_some(only),
        }
    }

    /// [`Tree::child`] with the child's node.
    #[inline]
    pub(crate) fn child_of(
        &self,
        parent: NodeId,
        local: LocalBlockHash,
    ) -> Option<(NodeId, &Node)> {
        let child = match self.link(parent) {
            NO_CHILD => return None,
            link if link & BRANCH != 0 => *self.branches[(link & !BRANCH) as usize].get(&local)?,
            only => only,
        };
        let node = self.node(child);
        (node.local.load(Relaxed) == local.0).then_some((child, node))
    }

    /// Every child of `parent`, with its key.
    pub(crate) fn children(&self, parent: NodeId) -> Vec<(LocalBlockHash, NodeId)> {
        match self.link(parent) {
            NO_CHILD => Vec::new(),
            link if link & BRANCH != 0 => self.branches[(link & !BRANCH) as usize]
                .iter()
                .map(|(&l, &n)| (l, n))
                .collect(),
            only => vec![(self.local(only), only)],
        }
    }

    /// The child of `parent` keyed by `local`, created if missing. `None` only when the
    /// arena is full (2^31 nodes).
    pub(crate) fn child_or_insert(
        &mut self,
        parent: NodeId,
        local: LocalBlockHash,
    ) -> Option<NodeId> {
        if let Some(id) = self.child(parent, local) {
            return Some(id);
        }
        let id = self.take_id(parent)?;
        let prefix = child_prefix((parent != ROOT).then(|| self.prefix(parent)), local);
        // Freed nodes were cleared; a reader may still be looking at this one under its
        // old key, which the key written here tells apart.
        self.set_link(id, NO_CHILD);
        let node = self.node(id);
        node.parent.store(parent, Relaxed);
        node.prefix.store(prefix, Relaxed);
        node.local.store(local.0, Release);
        // Linking publishes the node (release) to readers that reach it.
        self.attach(parent, local, id);
        Some(id)
    }

    /// An id for a new child of `parent`. A node that will be its parent's only child takes
    /// the next id when it is free, so that a chain grows as a run even when an event extends
    /// one stored earlier (the next turn of a conversation); any other node starts a chain at
    /// the first id of a word of 64 free ids, leaving the chain room to grow. Partly used
    /// words are handed out lowest id first only once their free ids are an eighth of the
    /// arena, which bounds what the room costs; the arena grows by whole words, and only
    /// below that share.
    fn take_id(&mut self, parent: NodeId) -> Option<NodeId> {
        // The arena grows only while few of its ids are free (fewer than a word's, or than
        // 1/FRAGMENTS of them): to at most 1/(FRAGMENTS - 1) more than the most nodes ever
        // live, or a word more, and one word.
        let free = self.free.len();
        let may_grow = free < 64 || free * FRAGMENTS < self.allocated as usize;
        if parent != ROOT && self.link(parent) == NO_CHILD {
            let next = parent + 1;
            if next == self.allocated && may_grow {
                return self.fresh();
            }
            if self.free.remove(next) {
                return Some(next);
            }
        }
        if let Some(id) = self.free.pop_word() {
            return Some(id);
        }
        if !may_grow && let Some(id) = self.free.pop_lowest() {
            return Some(id);
        }
        while !self.allocated.is_multiple_of(64) {
            let id = self.fresh()?;
            self.free.insert(id);
        }
        self.fresh()
    }

    fn fresh(&mut self) -> Option<NodeId> {
        let id = self.allocated;
        self.nodes.ensure(&self.live.nodes, id)?;
        self.links.ensure(&self.live.links, id)?;
        self.runs.ensure(&self.live.runs, id / 64)?;
        self.allocated += 1;
        Some(id)
    }

    fn attach(&mut self, parent: NodeId, local: LocalBlockHash, child: NodeId) {
        match self.link(parent) {
            // A new child holds no worker yet: its parent is left unmarked until it does.
            NO_CHILD => self.set_link(parent, child),
            link if link & BRANCH != 0 => {
                self.branches[(link & !BRANCH) as usize].insert(local, child);
                if self.shared {
                    self.live.edges.pin().insert((parent, local), child);
                }
            }
            only => {
                let only_local = self.local(only);
                let mut map = FxHashMap::default();
                map.insert(only_local, only);
                map.insert(local, child);
                if self.shared {
                    // Both edges before the flag, so a reader that sees the flag finds them.
                    let edges = self.live.edges.pin();
                    edges.insert((parent, only_local), only);
                    edges.insert((parent, local), child);
                }
                let index = match self.free_branches.pop() {
                    Some(i) => {
                        self.branches[i as usize] = map;
                        i
                    }
                    None => {
                        self.branches.push(map);
                        (self.branches.len() - 1) as u32
                    }
                };
                self.set_child_same(parent, false);
                self.set_link(parent, index | BRANCH);
            }
        }
    }

    fn detach(&mut self, parent: NodeId, local: LocalBlockHash) {
        let link = self.link(parent);
        if link == NO_CHILD {
            return;
        }
        if link & BRANCH == 0 {
            if self.local(link) == local {
                self.set_child_same(parent, false);
                self.set_link(parent, NO_CHILD);
            }
            return;
        }
        let index = link & !BRANCH;
        let map = &mut self.branches[index as usize];
        map.remove(&local);
        if self.shared {
            self.live.edges.pin().remove(&(parent, local));
        }
        // Back to a single link when one child is left; the map's memory is released.
        if map.len() <= 1 {
            let remaining = map.iter().next().map(|(&l, &n)| (l, n));
            self.branches[index as usize] = FxHashMap::default();
            self.free_branches.push(index);
            let link = remaining.map_or(NO_CHILD, |(_, n)| n);
            self.set_link(parent, link);
            if let Some((_, only)) = remaining {
                self.set_child_same(
                    parent,
                    parent != ROOT && only == parent + 1 && self.same_holders(only, parent),
                );
            }
            if self.shared
                && let Some((l, _)) = remaining
            {
                self.live.edges.pin().remove(&(parent, l));
            }
        }
    }

    /// Whether the worker in `slot` holds `node`.
    pub(crate) fn holds(&self, node: NodeId, slot: u32) -> bool {
        let (i, bit) = split(slot);
        let node = self.node(node);
        if i < INLINE_WORDS {
            return node.words[i].load(Relaxed) & bit != 0;
        }
        self.live.word(node, i) & bit != 0
    }

    /// The words of `node`'s worker bits: inline, then along its extension chain.
    fn bit_words(&self, node: NodeId) -> impl Iterator<Item = u64> + '_ {
        let n = self.node(node);
        let chain = std::iter::successors(self.ext.get(n.more.load(Relaxed)), |block| {
            self.ext.get(block.next.load(Relaxed))
        });
        n.words
            .iter()
            .chain(chain.flat_map(|block| block.words.iter()))
            .map(|w| w.load(Relaxed))
    }

    /// Whether no worker holds `node`.
    pub(crate) fn is_unheld(&self, node: NodeId) -> bool {
        self.bit_words(node).all(|w| w == 0)
    }

    /// The slots of the workers holding `node`, lowest first.
    pub(crate) fn holders(&self, node: NodeId) -> Vec<u32> {
        self.bit_words(node)
            .enumerate()
            .flat_map(|(i, w)| Ones(w).map(move |b| i as u32 * 64 + b))
            .collect()
    }

    /// Marks `node` held by `slot`; returns whether it was not already.
    pub(crate) fn hold(&mut self, node: NodeId, slot: u32) -> bool {
        !self.holds(node, slot) && self.change_bit(node, slot, true)
    }

    /// Marks `node` no longer held by `slot`; returns whether it was.
    pub(crate) fn unhold(&mut self, node: NodeId, slot: u32) -> bool {
        self.holds(node, slot) && self.change_bit(node, slot, false)
    }

    /// Sets (`held`) or clears `slot`'s bit of `node`, known to differ, with the marks
    /// around it; false only when the arena is full.
    fn change_bit(&mut self, node: NodeId, slot: u32, held: bool) -> bool {
        let (i, bit) = split(slot);
        self.clear_marks_around(node);
        let Some(cell) = self.word_cell(node, i) else {
            return false;
        };
        let old = cell.load(Relaxed);
        cell.store(if held { old | bit } else { old & !bit }, Release);
        self.mark_around(node, slot, held);
        true
    }

    /// Before one worker's bit of `id` changes: the marks it will falsify, its parent's (of
    /// `id`) and its own (of its child), each saying two sets are equal that are about to
    /// differ by that worker. They are cleared first, so a reader never sees a mark
    /// crediting a worker with a block it does not hold.
    fn clear_marks_around(&self, id: NodeId) {
        self.set_child_same(self.parent(id), false);
        self.set_child_same(id, false);
    }

    /// After `slot` was added to (`held`) or removed from `id`: the marks that may now be
    /// true. `id` can only have become equal to its parent if the parent agrees with it
    /// about `slot`, so the full comparison runs only then. Its child's mark is checked
    /// only when the child changed just before (a removal walking up a chain): elsewhere
    /// the child's memory is cold and the mark is left off.
    fn mark_around(&mut self, id: NodeId, slot: u32, held: bool) {
        let parent = self.parent(id);
        if parent != ROOT
            && id == parent + 1
            && self.only_child(parent) == Some(id)
            && self.holds(parent, slot) == held
            && self.same_holders(id, parent)
        {
            self.set_child_same(parent, true);
        }
        if let Some(child) = self.only_child(id)
            && child == self.last_changed
            && child == id + 1
            && self.holds(child, slot) == held
            && self.same_holders(child, id)
        {
            self.set_child_same(id, true);
        }
        self.last_changed = id;
    }

    /// At the end of an event: the mark of the last changed node over its child, which no
    /// change in the event checked (one comparison per event, not per block).
    pub(crate) fn settle(&mut self) {
        let id = std::mem::replace(&mut self.last_changed, ROOT);
        if id != ROOT && !self.child_same(id) && self.may_be_child_same(id) {
            self.set_child_same(id, true);
        }
    }

    /// Sets or clears `id`'s bit in the run bitmap (never the root's). Set only when its
    /// only child is `id + 1`, held by the same workers.
    fn set_child_same(&self, id: NodeId, on: bool) {
        if id == ROOT {
            return;
        }
        let Some(word) = self.runs.get(id / 64) else {
            return;
        };
        let bit = 1u64 << (id % 64);
        let old = word.load(Relaxed);
        let want = if on { old | bit } else { old & !bit };
        if want != old {
            word.store(want, Release);
        }
    }

    fn only_child(&self, id: NodeId) -> Option<NodeId> {
        let link = self.link(id);
        (link != NO_CHILD && link & BRANCH == 0).then_some(link)
    }

    /// Whether `a` and `b` are held by the same workers.
    fn same_holders(&self, a: NodeId, b: NodeId) -> bool {
        let (x, y) = (self.node(a), self.node(b));
        if x.more.load(Relaxed) == NO_EXT && y.more.load(Relaxed) == NO_EXT {
            return x
                .words
                .iter()
                .zip(&y.words)
                .all(|(p, q)| p.load(Relaxed) == q.load(Relaxed));
        }
        let (mut x, mut y) = (self.bit_words(a), self.bit_words(b));
        loop {
            match (x.next(), y.next()) {
                (None, None) => return true,
                (p, q) if p.unwrap_or(0) != q.unwrap_or(0) => return false,
                _ => {}
            }
        }
    }

    /// Whether `id`'s bit is set in the run bitmap.
    pub(crate) fn child_same(&self, id: NodeId) -> bool {
        self.run_word(id / 64) & (1 << (id % 64)) != 0
    }

    /// Whether `id`'s bit may be set in the run bitmap: it is not the root and has one
    /// child, the next id, held by the same workers.
    pub(crate) fn may_be_child_same(&self, id: NodeId) -> bool {
        id != ROOT
            && self
                .only_child(id)
                .is_some_and(|c| c == id + 1 && self.same_holders(c, id))
    }

    /// The word `i` of `node`'s worker bits, adding extension blocks to reach it.
    fn word_cell(&mut self, node: NodeId, i: usize) -> Option<&AtomicU64> {
        let Tree {
            live,
            nodes,
            ext,
            ext_allocated,
            free_ext,
            ..
        } = self;
        let node = nodes.get(node)?;
        if i < INLINE_WORDS {
            return Some(&node.words[i]);
        }
        let k = i - INLINE_WORDS;
        // Follows the chain, extending it where it ends. A block is allocated (its page
        // exists, its bits are clear) before it is linked.
        let mut alloc = |ext: &mut Pages<Ext>| -> Option<u32> {
            if let Some(id) = free_ext.pop() {
                return Some(id);
            }
            ext.ensure(&live.ext, *ext_allocated)?;
            *ext_allocated += 1;
            Some(*ext_allocated - 1)
        };
        let mut id = node.more.load(Relaxed);
        if id == NO_EXT {
            id = alloc(ext)?;
            node.more.store(id, Release);
        }
        for _ in 0..k / EXT_WORDS {
            let mut next = ext.get(id)?.next.load(Relaxed);
            if next == NO_EXT {
                next = alloc(ext)?;
                ext.get(id)?.next.store(next, Release);
            }
            id = next;
        }
        ext.get(id).map(|block| &block.words[k % EXT_WORDS])
    }

    /// Frees `id` and then its ancestors while they hold no worker and have no child.
    pub(crate) fn prune(&mut self, mut id: NodeId) {
        while id != ROOT {
            let node = self.node(id);
            if self.link(id) != NO_CHILD
                || node.words.iter().any(|w| w.load(Relaxed) != 0)
                || (node.more.load(Relaxed) != NO_EXT && !self.is_unheld(id))
            {
                return;
            }
            let (parent, local) = (self.parent(id), self.local(id));
            self.detach(parent, local);
            self.free_node(id);
            id = parent;
        }
    }

    fn free_node(&mut self, id: NodeId) {
        // Its own mark went with its last child; cleared again in case.
        self.set_child_same(id, false);
        let node = self.node(id);
        node.local.store(0, Relaxed);
        node.prefix.store(0, Relaxed);
        node.parent.store(ROOT, Relaxed);
        for w in &node.words {
            w.store(0, Relaxed);
        }
        let mut ext = node.more.load(Relaxed);
        node.more.store(NO_EXT, Relaxed);
        while let Some(block) = self.ext.get(ext) {
            for w in &block.words {
                w.store(0, Relaxed);
            }
            self.free_ext.push(ext);
            ext = block.next.load(Relaxed);
            block.next.store(NO_EXT, Relaxed);
        }
        self.free.insert(id);
    }
}

fn split(slot: u32) -> (usize, u64) {
    ((slot / 64) as usize, 1u64 << (slot % 64))
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
