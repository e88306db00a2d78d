//! The match walk: a query followed down the tree, the set of workers holding every block so
//! far narrowed as it goes, and the answer built from where each worker left.
//!
//! The walk reads the tree through a [`View`]: the writer's own (its child maps), or a lookup's
//! on another thread (the edges mirrored for readers). Along a run of the run bitmap (each
//! node's only child is the next id, held by the same workers) the set cannot change, so the
//! walk takes the run without intersecting worker bits: by comparing the keys of the nodes
//! along it, or, when the query comes with its sequence hashes, by jumping to where the run
//! ends and comparing that node's prefix hash with the query's, searching back when they
//! differ. With sequence hashes, a 5,000-block prompt of 16-token blocks is a few dozen
//! nodes read instead of 5,000.
//!
//! Racing the writer, a lookup only ever reads marks that were true when read (they are
//! cleared before a worker bit changes), and a worker is credited past a run only if it
//! still holds the run's last node when the walk lands there.

use std::sync::atomic::Ordering::Acquire;

use switchyard_core::{LocalBlockHash, SequenceHash, WorkerKey};

use super::OverlapScores;
use super::arena::PAGE_BITS;
use super::bits::Ones;
use super::tree::{self, Live, Node, NodeId, ROOT, Tree};

/// What the match walk reads of a tree.
pub(crate) trait View<'a> {
    fn node(&self, id: NodeId) -> &'a Node;
    /// The page of nodes holding ids `p·4096..`, if allocated.
    fn node_page(&self, p: u32) -> Option<&'a [Node]>;
    /// Word `w` of the run bitmap (ids `64·w..`).
    fn run_word(&self, w: u32) -> u64;
    /// The child of node `id` keyed by `local`, with its node.
    fn child(&self, id: NodeId, local: LocalBlockHash) -> Option<(NodeId, &'a Node)>;
    /// The first `out.len()` words of `node`'s worker bits.
    fn words_into(&self, node: &'a Node, out: &mut [u64]);
}

/// The writer's view: children through its own maps.
impl<'a> View<'a> for &'a Tree {
    #[inline]
    fn node(&self, id: NodeId) -> &'a Node {
        Tree::node(self, id)
    }
    #[inline]
    fn node_page(&self, p: u32) -> Option<&'a [Node]> {
        Tree::node_page(self, p)
    }
    #[inline]
    fn run_word(&self, w: u32) -> u64 {
        Tree::run_word(self, w)
    }
    #[inline]
    fn child(&self, id: NodeId, local: LocalBlockHash) -> Option<(NodeId, &'a Node)> {
        self.child_of(id, local)
    }
    #[inline]
    fn words_into(&self, node: &'a Node, out: &mut [u64]) {
        self.live().words_into(node, out);
    }
}

/// A lookup's view from another thread than the writer's.
pub(crate) struct Reader<'a, G> {
    pub(crate) live: &'a Live,
    pub(crate) guard: G,
}

impl<'a, G: papaya::Guard> View<'a> for Reader<'a, G> {
    #[inline]
    fn node(&self, id: NodeId) -> &'a Node {
        self.live.node(id)
    }
    #[inline]
    fn node_page(&self, p: u32) -> Option<&'a [Node]> {
        self.live.node_page(p)
    }
    #[inline]
    fn run_word(&self, w: u32) -> u64 {
        self.live.run_word(w)
    }
    #[inline]
    fn child(&self, id: NodeId, local: LocalBlockHash) -> Option<(NodeId, &'a Node)> {
        self.live.child(id, local, &self.guard)
    }
    #[inline]
    fn words_into(&self, node: &'a Node, out: &mut [u64]) {
        self.live.words_into(node, out);
    }
}

/// A query: its local hashes and, when the caller has them, its sequence hashes (one per
/// block, Switchyard's chained hashes of the same blocks).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query<'q> {
    pub(crate) locals: &'q [LocalBlockHash],
    pub(crate) seqs: Option<&'q [SequenceHash]>,
}

/// The walk and the answer it builds: per worker its depth, then one pass in key order
/// emits both lists already sorted.
pub(crate) fn collect_matches<'a>(
    view: &impl View<'a>,
    query: Query<'_>,
    slots: usize,
    by_key: &[(WorkerKey, u32)],
    cached: impl Fn(u32) -> u64,
    out: &mut OverlapScores,
) {
    let mut depth_by_slot: smallvec::SmallVec<[u32; 256]> = smallvec::smallvec![0; slots];
    match_walk(view, query, slots.div_ceil(64), |slot, depth| {
        if let Some(d) = depth_by_slot.get_mut(slot) {
            *d = depth;
        }
    });
    out.scores.clear();
    out.cached_blocks.clear();
    out.cached_blocks.reserve(by_key.len());
    for &(key, slot) in by_key {
        let depth = depth_by_slot.get(slot as usize).copied().unwrap_or(0);
        if depth > 0 {
            out.scores.push((key, depth));
        }
        out.cached_blocks.push((key, cached(slot)));
    }
}

/// Follows the query down the tree, narrowing the set of workers that hold every block so
/// far; a worker leaving the set at depth `d` matched `d` blocks. Reports each worker with
/// a match of at least one block.
fn match_walk<'a>(
    view: &impl View<'a>,
    query: Query<'_>,
    words: usize,
    mut report: impl FnMut(usize, u32),
) {
    let mut node = ROOT;
    let mut active: smallvec::SmallVec<[u64; tree::INLINE_WORDS]> = smallvec::smallvec![0; words];
    let mut held = active.clone();
    let mut depth = 0usize;
    while let Some(&local) = query.locals.get(depth) {
        let Some(next) = view.child(node, local) else {
            break;
        };
        if depth == 0 {
            view.words_into(next.1, &mut active);
        } else {
            view.words_into(next.1, &mut held);
            if !narrow(&mut active, &held, depth, &mut report) {
                return;
            }
        }
        depth += 1;
        node = next.0;
        let taken = match query.seqs {
            Some(seqs) => jump(view, next.0, seqs.get(depth..).unwrap_or_default()),
            None => chain_run(view, next.0, &query.locals[depth..]),
        };
        if taken > 0 {
            let id = next.0 + taken as NodeId;
            let last = view.node(id);
            // The marks said the run's last node is held like its first. A worker the
            // writer has taken off it meanwhile is credited up to the first only.
            view.words_into(last, &mut held);
            if !narrow(&mut active, &held, depth, &mut report) {
                return;
            }
            depth += taken;
            node = id;
        }
    }
    for (i, &word) in active.iter().enumerate() {
        for bit in Ones(word) {
            report(i * 64 + bit as usize, depth as u32);
        }
    }
}

/// Keeps in `active` the workers also in `held`, reporting those that leave at `depth`;
/// false when none is left.
#[inline]
fn narrow(
    active: &mut [u64],
    held: &[u64],
    depth: usize,
    report: &mut impl FnMut(usize, u32),
) -> bool {
    let mut any = 0;
    for (i, (word, &held)) in active.iter_mut().zip(held).enumerate() {
        let keep = *word & held;
        for bit in Ones(*word & !keep) {
            report(i * 64 + bit as usize, depth as u32);
        }
        *word = keep;
        any |= keep;
    }
    any != 0
}

/// How many ids after `id` the run bitmap chains to it, at most `max`.
#[inline]
fn run_len<'a>(view: &impl View<'a>, id: NodeId, max: usize) -> usize {
    let mut len = 0;
    let mut at = id;
    while len < max {
        let offset = at % 64;
        let ones = (view.run_word(at / 64) >> offset).trailing_ones();
        len += ones as usize;
        if ones < 64 - offset {
            break;
        }
        at += ones;
    }
    len.min(max)
}

/// How many blocks of `rest` (the query's blocks after node `id`) the walk takes along the
/// run from `id`, comparing keys: each node's key must be the next block and its parent the
/// node before.
#[inline]
pub(crate) fn chain_run<'a>(view: &impl View<'a>, id: NodeId, rest: &[LocalBlockHash]) -> usize {
    let run = run_len(view, id, rest.len());
    let mask = (1 << PAGE_BITS) - 1;
    let mut taken = 0;
    let mut parent = id;
    while taken < run {
        let next = parent + 1;
        let Some(nodes) = view
            .node_page(next >> PAGE_BITS)
            .and_then(|page| page.get((next & mask) as usize..))
        else {
            break;
        };
        if nodes.is_empty() {
            break;
        }
        for (node, want) in nodes.iter().zip(&rest[taken..run]) {
            if node.local.load(Acquire) != want.0 || node.parent.load(Acquire) != parent {
                return taken;
            }
            parent += 1;
            taken += 1;
        }
    }
    taken
}

/// How many blocks of `rest` (the sequence hashes of the query's blocks after node `id`)
/// the walk takes along the run from `id`: it lands where the run (or the query) ends and
/// compares that node's prefix hash with the query's; on a difference (the query leaves the
/// run, or the run changed under a racing writer) it searches back for the last node that
/// agrees. A node agreeing names the query's path up to it, so the nodes the run chained
/// before it are the query's too.
#[inline]
pub(crate) fn jump<'a>(view: &impl View<'a>, id: NodeId, rest: &[SequenceHash]) -> usize {
    let run = run_len(view, id, rest.len());
    let agrees = |j: usize| view.node(id + j as NodeId).prefix.load(Acquire) == rest[j - 1].0;
    if run == 0 || agrees(run) {
        return run;
    }
    // Node `id` (j = 0) agrees; `run` does not.
    let (mut lo, mut hi) = (0, run);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if agrees(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::Arc;
    use switchyard_core::hash::sequence_hashes;

    #[test]
    fn a_chain_held_by_the_same_workers_is_taken_by_keys_or_by_one_hash() {
        let mut tree = Tree::default();
        tree.share();
        let l = LocalBlockHash;
        let mut ids = Vec::new();
        let mut parent = ROOT;
        for i in 1..=10 {
            let id = tree.child_or_insert(parent, l(i)).unwrap();
            tree.hold(id, 0);
            ids.push(id);
            parent = id;
        }
        let query: Vec<_> = (1..=10).map(l).collect();
        let live = Arc::clone(tree.live());
        // Every way of taking the run agrees: by keys or by hashes, as the writer or as a
        // reader on another thread.
        let run = |tree: &Tree, from: usize, query: &[LocalBlockHash]| {
            let reader = Reader {
                live: &live,
                guard: live.guard(),
            };
            let rest = &query[from + 1..];
            let seqs = sequence_hashes(query);
            let by_keys = chain_run(&tree, ids[from], rest);
            assert_eq!(chain_run(&reader, ids[from], rest), by_keys);
            assert_eq!(jump(&tree, ids[from], &seqs[from + 1..]), by_keys);
            assert_eq!(jump(&reader, ids[from], &seqs[from + 1..]), by_keys);
            by_keys
        };
        assert_eq!(
            ids.iter().map(|&id| tree.prefix(id)).collect::<Vec<_>>(),
            sequence_hashes(&query)
                .iter()
                .map(|s| s.0)
                .collect::<Vec<_>>(),
            "a node's prefix hash is the sequence hash of its path"
        );
        assert_eq!(run(&tree, 0, &query), 9);
        assert!(!tree.child_same(ROOT), "never the root");

        // A second worker on the first five blocks: the sets differ after them.
        for &id in &ids[..5] {
            tree.hold(id, 1);
        }
        tree.settle();
        assert_eq!(run(&tree, 0, &query), 4);
        assert_eq!(run(&tree, 4, &query), 0);
        assert_eq!(run(&tree, 5, &query), 4);
        for &id in &ids[..5] {
            tree.unhold(id, 1);
        }
        tree.settle();
        assert_eq!(run(&tree, 0, &query), 9, "the same sets again");

        // A query leaving the chain stops the run where it leaves.
        for leave in 1..10 {
            let mut other = query.clone();
            other[leave] = l(99);
            assert_eq!(run(&tree, 0, &other), leave - 1, "leaving at {leave}");
        }
        assert_eq!(
            run(&tree, 0, &query[..7]),
            6,
            "a query ending inside the run"
        );

        // A branch: the node's children are no longer taken by keys alone.
        let side = tree.child_or_insert(ids[6], l(50)).unwrap();
        tree.hold(side, 0);
        assert_eq!(run(&tree, 5, &query), 1);
        assert!(!tree.child_same(ids[6]));
        tree.unhold(side, 0);
        tree.prune(side);
        assert_eq!(run(&tree, 5, &query), 4, "one child again");

        // A freed node is no longer part of any chain.
        tree.unhold(ids[9], 0);
        tree.prune(ids[9]);
        assert_eq!(run(&tree, 0, &query), 8);
        for &id in &ids {
            assert!(!tree.child_same(id) || tree.may_be_child_same(id));
        }

        // A second worker stores the chain and drops it again, tail first (as an engine
        // evicts): the marks come back where the sets are equal again.
        for &id in &ids[..9] {
            tree.hold(id, 1);
        }
        assert_eq!(run(&tree, 0, &query), 8);
        for &id in ids[..9].iter().rev() {
            tree.unhold(id, 1);
        }
        assert_eq!(run(&tree, 0, &query), 8, "without settling");
    }
}
