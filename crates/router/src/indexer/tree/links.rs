//! The tree's shape, as the writer changes it: ids for new nodes, child links and the
//! branching nodes' child maps, their mirror for readers, and pruning.

use std::sync::atomic::Ordering::{Relaxed, Release};

use rustc_hash::FxHashMap;
use switchyard_core::LocalBlockHash;

use super::super::check::Inconsistency;
use super::{BRANCH, NO_CHILD, NO_EXT, Node, NodeId, ROOT, Tree, child_prefix};

/// Free ids in partly used words are reused once they are this fraction (1/n) of the ids
/// handed out: below it, new chains start in words of their own (see [`Tree::take_id`]).
const FRAGMENTS: usize = 8;

impl Tree {
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

    /// Once shared, the readers' edges are exactly the branching nodes' children.
    pub(crate) fn check_edges(&self) -> Result<(), Inconsistency> {
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
                    return Err(Inconsistency::UnmirroredEdge {
                        parent: id,
                        child,
                        local,
                    });
                }
                count += 1;
            }
        }
        if edges.len() != count {
            return Err(Inconsistency::MirroredEdges {
                mirrored: edges.len(),
                branching: count,
            });
        }
        Ok(())
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
