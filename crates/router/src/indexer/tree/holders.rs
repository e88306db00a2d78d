//! Which workers hold a node (bits of dense worker slots, inline and in extension
//! blocks), and the run bitmap marking nodes held like their only child.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Relaxed, Release};

use super::super::arena::Pages;
use super::super::bits::Ones;
use super::{BRANCH, EXT_WORDS, Ext, INLINE_WORDS, NO_CHILD, NO_EXT, NodeId, ROOT, Tree};

impl Tree {
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
    pub(super) fn set_child_same(&self, id: NodeId, on: bool) {
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
    pub(super) fn same_holders(&self, a: NodeId, b: NodeId) -> bool {
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
}

fn split(slot: u32) -> (usize, u64) {
    ((slot / 64) as usize, 1u64 << (slot % 64))
}
