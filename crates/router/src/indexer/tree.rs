//! The node arena of the radix tree.
//!
//! Nodes live in fixed-size pages and refer to each other by index, so a chain stored in one
//! event is laid out contiguously and the match walk reads memory mostly in order. Pages
//! never move: growing the arena allocates a page instead of copying every node, which on a
//! large index would stall ingestion for tens of milliseconds. Freed nodes are recycled
//! through a free list.
//!
//! A node fills exactly one cache line. Most nodes have zero or one child (the unique tail
//! of a prompt), so the child link is one `u32`: no child, the one child's id, or the index
//! of a map in a side table for the few branching nodes.

use rustc_hash::FxHashMap;
use switchyard_core::LocalBlockHash;

use super::bits::WorkerBits;

pub(crate) type NodeId = u32;
pub(crate) const ROOT: NodeId = 0;

/// `Node::children`: no child.
const NO_CHILD: u32 = u32::MAX;
/// `Node::children` with this bit set: the rest indexes `Tree::branches`.
const BRANCH: u32 = 1 << 31;

#[derive(Debug, Clone)]
#[repr(align(64))]
pub(crate) struct Node {
    pub(crate) local: LocalBlockHash,
    pub(crate) parent: NodeId,
    children: u32,
    pub(crate) workers: WorkerBits,
}

impl Node {
    fn empty() -> Self {
        Node {
            local: LocalBlockHash(0),
            parent: ROOT,
            children: NO_CHILD,
            workers: WorkerBits::default(),
        }
    }

    pub(crate) fn has_children(&self) -> bool {
        self.children != NO_CHILD
    }
}

const PAGE_BITS: u32 = 12;
const PAGE_SIZE: usize = 1 << PAGE_BITS;
const PAGE_MASK: u32 = (1 << PAGE_BITS) - 1;

#[derive(Debug, Clone)]
pub(crate) struct Tree {
    pages: Vec<Vec<Node>>,
    allocated: usize,
    free: Vec<NodeId>,
    /// Child maps of branching nodes.
    branches: Vec<FxHashMap<LocalBlockHash, NodeId>>,
    free_branches: Vec<u32>,
}

impl Default for Tree {
    fn default() -> Self {
        let mut page = Vec::with_capacity(PAGE_SIZE);
        page.push(Node::empty());
        Tree {
            pages: vec![page],
            allocated: 1,
            free: Vec::new(),
            branches: Vec::new(),
            free_branches: Vec::new(),
        }
    }
}

impl Tree {
    #[inline]
    pub(crate) fn node(&self, id: NodeId) -> &Node {
        &self.pages[(id >> PAGE_BITS) as usize][(id & PAGE_MASK) as usize]
    }

    #[inline]
    pub(crate) fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.pages[(id >> PAGE_BITS) as usize][(id & PAGE_MASK) as usize]
    }

    /// Number of nodes other than the root.
    pub(crate) fn len(&self) -> usize {
        self.allocated - self.free.len() - 1
    }

    /// The child of `parent` keyed by `local`.
    #[inline]
    pub(crate) fn child(&self, parent: NodeId, local: LocalBlockHash) -> Option<NodeId> {
        match self.node(parent).children {
            NO_CHILD => None,
            link if link & BRANCH != 0 => self.branches[(link & !BRANCH) as usize]
                .get(&local)
                .copied(),
            only => (self.node(only).local == local).then_some(only),
        }
    }

    /// Every child of `parent`, with its key.
    pub(crate) fn children(&self, parent: NodeId) -> Vec<(LocalBlockHash, NodeId)> {
        match self.node(parent).children {
            NO_CHILD => Vec::new(),
            link if link & BRANCH != 0 => self.branches[(link & !BRANCH) as usize]
                .iter()
                .map(|(&l, &n)| (l, n))
                .collect(),
            only => vec![(self.node(only).local, only)],
        }
    }

    pub(crate) fn child_or_insert(&mut self, parent: NodeId, local: LocalBlockHash) -> NodeId {
        if let Some(id) = self.child(parent, local) {
            return id;
        }
        let node = Node {
            local,
            parent,
            children: NO_CHILD,
            workers: WorkerBits::default(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                *self.node_mut(id) = node;
                id
            }
            None => {
                if self.pages.last().is_none_or(|p| p.len() == PAGE_SIZE) {
                    self.pages.push(Vec::with_capacity(PAGE_SIZE));
                }
                if let Some(page) = self.pages.last_mut() {
                    page.push(node);
                }
                self.allocated += 1;
                (self.allocated - 1) as NodeId
            }
        };
        self.link(parent, local, id);
        id
    }

    fn link(&mut self, parent: NodeId, local: LocalBlockHash, child: NodeId) {
        match self.node(parent).children {
            NO_CHILD => self.node_mut(parent).children = child,
            link if link & BRANCH != 0 => {
                self.branches[(link & !BRANCH) as usize].insert(local, child);
            }
            only => {
                let mut map = FxHashMap::default();
                map.insert(self.node(only).local, only);
                map.insert(local, child);
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
                self.node_mut(parent).children = index | BRANCH;
            }
        }
    }

    fn unlink(&mut self, parent: NodeId, local: LocalBlockHash) {
        let link = self.node(parent).children;
        if link == NO_CHILD {
            return;
        }
        if link & BRANCH == 0 {
            if self.node(link).local == local {
                self.node_mut(parent).children = NO_CHILD;
            }
            return;
        }
        let index = link & !BRANCH;
        let map = &mut self.branches[index as usize];
        map.remove(&local);
        // Back to a single link when one child is left; the map's memory is released.
        if map.len() <= 1 {
            let remaining = map.values().next().copied().unwrap_or(NO_CHILD);
            self.branches[index as usize] = FxHashMap::default();
            self.free_branches.push(index);
            self.node_mut(parent).children = remaining;
        }
    }

    /// Frees `id` and then its ancestors while they hold no worker and have no child.
    pub(crate) fn prune(&mut self, mut id: NodeId) {
        while id != ROOT {
            let node = self.node(id);
            if !node.workers.is_empty() || node.has_children() {
                return;
            }
            let (parent, local) = (node.parent, node.local);
            self.unlink(parent, local);
            *self.node_mut(id) = Node::empty();
            self.free.push(id);
            id = parent;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Node>(), 64);
        assert_eq!(std::mem::align_of::<Node>(), 64);
    }

    #[test]
    fn links_grow_into_branches_and_shrink_back() {
        let mut tree = Tree::default();
        let l = |i| LocalBlockHash(i);
        let a = tree.child_or_insert(ROOT, l(1));
        let b = tree.child_or_insert(ROOT, l(2));
        let c = tree.child_or_insert(ROOT, l(3));
        assert_eq!(tree.child(ROOT, l(2)), Some(b));
        assert_eq!(tree.children(ROOT).len(), 3);
        tree.prune(b);
        tree.prune(c);
        assert_eq!(tree.child(ROOT, l(1)), Some(a));
        assert_eq!(tree.child(ROOT, l(3)), None);
        assert_eq!(tree.children(ROOT), vec![(l(1), a)]);
        assert_eq!(tree.free_branches.len(), 1);
        tree.prune(a);
        assert!(!tree.node(ROOT).has_children());
        assert_eq!(tree.len(), 0);
    }
}
