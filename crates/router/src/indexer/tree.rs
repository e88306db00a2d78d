//! The node arena of the radix tree.
//!
//! Nodes live in fixed-size pages and refer to each other by index, so a chain stored in one
//! event is laid out contiguously and the match walk reads memory mostly in order. Pages
//! never move: growing the arena allocates a page instead of copying every node, which on a
//! large index would stall ingestion for tens of milliseconds. Freed nodes are recycled
//! through a free list.

use rustc_hash::FxHashMap;
use switchyard_core::LocalBlockHash;

use super::bits::WorkerBits;

pub(crate) type NodeId = u32;
pub(crate) const ROOT: NodeId = 0;

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) local: LocalBlockHash,
    pub(crate) parent: NodeId,
    pub(crate) children: Children,
    pub(crate) workers: WorkerBits,
}

/// Most nodes have zero or one child (the unique tail of a prompt); only branching points
/// pay for a map.
#[derive(Debug, Clone, Default)]
pub(crate) enum Children {
    #[default]
    None,
    One(LocalBlockHash, NodeId),
    Many(Box<FxHashMap<LocalBlockHash, NodeId>>),
}

impl Children {
    #[inline]
    pub(crate) fn get(&self, local: LocalBlockHash) -> Option<NodeId> {
        match self {
            Children::None => None,
            Children::One(h, id) => (*h == local).then_some(*id),
            Children::Many(map) => map.get(&local).copied(),
        }
    }

    fn insert(&mut self, local: LocalBlockHash, id: NodeId) {
        match self {
            Children::None => *self = Children::One(local, id),
            Children::One(h, existing) => {
                let mut map = FxHashMap::default();
                map.insert(*h, *existing);
                map.insert(local, id);
                *self = Children::Many(Box::new(map));
            }
            Children::Many(map) => {
                map.insert(local, id);
            }
        }
    }

    fn remove(&mut self, local: LocalBlockHash) {
        match self {
            Children::None => {}
            Children::One(h, _) => {
                if *h == local {
                    *self = Children::None;
                }
            }
            Children::Many(map) => {
                map.remove(&local);
                if map.len() == 1 {
                    if let Some((&h, &id)) = map.iter().next() {
                        *self = Children::One(h, id);
                    }
                } else if map.is_empty() {
                    *self = Children::None;
                }
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        matches!(self, Children::None)
    }

    pub(crate) fn ids(&self) -> Vec<(LocalBlockHash, NodeId)> {
        match self {
            Children::None => Vec::new(),
            Children::One(h, id) => vec![(*h, *id)],
            Children::Many(map) => map.iter().map(|(h, id)| (*h, *id)).collect(),
        }
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
}

impl Default for Tree {
    fn default() -> Self {
        let root = Node {
            local: LocalBlockHash(0),
            parent: ROOT,
            children: Children::None,
            workers: WorkerBits::default(),
        };
        let mut page = Vec::with_capacity(PAGE_SIZE);
        page.push(root);
        Tree {
            pages: vec![page],
            allocated: 1,
            free: Vec::new(),
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

    pub(crate) fn child_or_insert(&mut self, parent: NodeId, local: LocalBlockHash) -> NodeId {
        if let Some(id) = self.node(parent).children.get(local) {
            return id;
        }
        let node = Node {
            local,
            parent,
            children: Children::None,
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
        self.node_mut(parent).children.insert(local, id);
        id
    }

    /// Frees `id` and then its ancestors while they hold no worker and have no child.
    pub(crate) fn prune(&mut self, mut id: NodeId) {
        while id != ROOT {
            let node = self.node(id);
            if !node.workers.is_empty() || !node.children.is_empty() {
                return;
            }
            let (parent, local) = (node.parent, node.local);
            self.node_mut(parent).children.remove(local);
            *self.node_mut(id) = Node {
                local: LocalBlockHash(0),
                parent: ROOT,
                children: Children::None,
                workers: WorkerBits::default(),
            };
            self.free.push(id);
            id = parent;
        }
    }
}
