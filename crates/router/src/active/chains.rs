//! The union of a worker's active chains, as a compressed trie.
//!
//! Every in-flight request holds a whole chain of blocks from the first, named by sequence
//! hashes. A node holds a run of hashes (the edge into it) borrowed from the chain of the
//! request that created it, and how many active requests cover the whole run. Adding or
//! removing a request walks its chain comparing runs element by element (memory read in
//! order) and looks up children only where chains branch, so its cost is a few lookups
//! rather than one hash-table operation per block. A run is split where a new chain leaves
//! it, so every chain ends on a node boundary.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use switchyard_core::SequenceHash;

const ROOT: u32 = 0;
/// Children kept in a list up to this many; a map beyond.
const FEW: usize = 8;

#[derive(Debug, Clone)]
enum Children {
    Few(SmallVec<[(SequenceHash, u32); 2]>),
    Many(FxHashMap<SequenceHash, u32>),
}

impl Default for Children {
    fn default() -> Self {
        Children::Few(SmallVec::new())
    }
}

impl Children {
    fn get(&self, first: SequenceHash) -> Option<u32> {
        match self {
            Children::Few(list) => list.iter().find(|(h, _)| *h == first).map(|&(_, n)| n),
            Children::Many(map) => map.get(&first).copied(),
        }
    }

    fn insert(&mut self, first: SequenceHash, node: u32) {
        match self {
            Children::Few(list) if list.len() < FEW => list.push((first, node)),
            Children::Few(list) => {
                let mut map: FxHashMap<SequenceHash, u32> = list.drain(..).collect();
                map.insert(first, node);
                *self = Children::Many(map);
            }
            Children::Many(map) => {
                map.insert(first, node);
            }
        }
    }

    fn remove(&mut self, first: SequenceHash) {
        match self {
            Children::Few(list) => list.retain(|(h, _)| *h != first),
            Children::Many(map) => {
                map.remove(&first);
            }
        }
    }

    fn nodes(&self) -> Vec<u32> {
        match self {
            Children::Few(list) => list.iter().map(|&(_, n)| n).collect(),
            Children::Many(map) => map.values().copied().collect(),
        }
    }
}

#[derive(Debug, Clone)]
struct Node {
    /// The run is `chain[start..end]`.
    chain: Arc<[SequenceHash]>,
    start: u32,
    end: u32,
    parent: u32,
    /// Active requests whose chain covers the whole run.
    count: u32,
    children: Children,
}

impl Node {
    fn run(&self) -> &[SequenceHash] {
        &self.chain[self.start as usize..self.end as usize]
    }
}

/// Active chains of one worker.
#[derive(Debug, Clone)]
pub(crate) struct ChainSet {
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Distinct blocks held: the sum of the runs' lengths.
    distinct: u64,
}

impl Default for ChainSet {
    fn default() -> Self {
        ChainSet {
            nodes: vec![Node {
                chain: Arc::from(Vec::new()),
                start: 0,
                end: 0,
                parent: ROOT,
                count: 0,
                children: Children::default(),
            }],
            free: Vec::new(),
            distinct: 0,
        }
    }
}

/// How many leading elements two runs share.
fn common(a: &[SequenceHash], b: &[SequenceHash]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl ChainSet {
    pub(crate) fn distinct(&self) -> u64 {
        self.distinct
    }

    /// How many leading blocks of `chain` some active request holds.
    pub(crate) fn held_prefix(&self, chain: &[SequenceHash]) -> usize {
        let (mut node, mut pos) = (ROOT, 0);
        while pos < chain.len() {
            let Some(child) = self.nodes[node as usize].children.get(chain[pos]) else {
                break;
            };
            let run = self.nodes[child as usize].run();
            let k = common(run, &chain[pos..]);
            pos += k;
            if k < run.len() {
                break;
            }
            node = child;
        }
        pos
    }

    /// Adds one request's chain.
    pub(crate) fn add(&mut self, chain: &Arc<[SequenceHash]>) {
        let (mut node, mut pos) = (ROOT, 0);
        let n = chain.len();
        while pos < n {
            let Some(child) = self.nodes[node as usize].children.get(chain[pos]) else {
                let leaf = self.alloc(Node {
                    chain: Arc::clone(chain),
                    start: pos as u32,
                    end: n as u32,
                    parent: node,
                    count: 1,
                    children: Children::default(),
                });
                self.nodes[node as usize].children.insert(chain[pos], leaf);
                self.distinct += (n - pos) as u64;
                return;
            };
            let k = common(self.nodes[child as usize].run(), &chain[pos..]);
            if k < self.nodes[child as usize].run().len() {
                self.split(child, k);
            }
            self.nodes[child as usize].count += 1;
            pos += k;
            node = child;
        }
    }

    /// Removes one request's chain (added before).
    pub(crate) fn remove(&mut self, chain: &[SequenceHash]) {
        let mut path: SmallVec<[u32; 8]> = SmallVec::new();
        let (mut node, mut pos) = (ROOT, 0);
        while pos < chain.len() {
            let Some(child) = self.nodes[node as usize].children.get(chain[pos]) else {
                break;
            };
            let len = self.nodes[child as usize].run().len();
            if common(self.nodes[child as usize].run(), &chain[pos..]) < len {
                break;
            }
            path.push(child);
            pos += len;
            node = child;
        }
        for &id in path.iter().rev() {
            let node = &mut self.nodes[id as usize];
            node.count = node.count.saturating_sub(1);
            if node.count == 0 {
                let (parent, first, len) = (node.parent, node.run()[0], node.run().len());
                self.nodes[parent as usize].children.remove(first);
                self.distinct -= len as u64;
                self.release(id);
            }
        }
    }

    /// Cuts `id`'s run after `k` elements: `id` keeps the top, a new node below takes the
    /// rest with `id`'s children and count.
    fn split(&mut self, id: u32, k: usize) {
        let node = &mut self.nodes[id as usize];
        let cut = node.start + k as u32;
        let lower = Node {
            chain: Arc::clone(&node.chain),
            start: cut,
            end: node.end,
            parent: id,
            count: node.count,
            children: std::mem::take(&mut node.children),
        };
        node.end = cut;
        let first = lower.run()[0];
        let grandchildren = lower.children.nodes();
        let lower = self.alloc(lower);
        for child in grandchildren {
            self.nodes[child as usize].parent = lower;
        }
        // The parent's link to `id` is keyed by `id`'s first element, which is unchanged.
        self.nodes[id as usize].children.insert(first, lower);
    }

    fn alloc(&mut self, node: Node) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn release(&mut self, id: u32) {
        let node = &mut self.nodes[id as usize];
        node.chain = Arc::from(Vec::new());
        node.children = Children::default();
        node.count = 0;
        self.free.push(id);
    }

    /// How many active requests hold `block` (a scan: for inspection and tests).
    pub(crate) fn refcount(&self, block: SequenceHash) -> u32 {
        let live = |id: usize| id == ROOT as usize || !self.free.contains(&(id as u32));
        self.nodes
            .iter()
            .enumerate()
            .filter(|(id, n)| *id != ROOT as usize && live(*id) && n.run().contains(&block))
            .map(|(_, n)| n.count)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use switchyard_core::LocalBlockHash;
    use switchyard_core::hash::sequence_hashes;

    fn chain(path: &[u8]) -> Arc<[SequenceHash]> {
        let locals: Vec<LocalBlockHash> =
            path.iter().map(|&l| LocalBlockHash(u64::from(l))).collect();
        Arc::from(sequence_hashes(&locals))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

        // Against a multiset of chains: distinct blocks, held prefixes and refcounts agree
        // after every operation, with wide fan-out (lists grow into maps) and deep splits.
        #[test]
        fn chain_set_matches_a_multiset_of_chains(
            ops in prop::collection::vec(
                (any::<bool>(), prop::collection::vec(0u8..12, 0..14), any::<u8>()),
                1..120,
            ),
        ) {
            let mut set = ChainSet::default();
            let mut live: Vec<Arc<[SequenceHash]>> = Vec::new();
            for (add, path, pick) in ops {
                if add || live.is_empty() {
                    let c = chain(&path);
                    set.add(&c);
                    live.push(c);
                } else {
                    let c = live.swap_remove(usize::from(pick) % live.len());
                    set.remove(&c);
                }
                let distinct: std::collections::HashSet<SequenceHash> =
                    live.iter().flat_map(|c| c.iter().copied()).collect();
                prop_assert_eq!(set.distinct(), distinct.len() as u64);
                for probe in live.iter().take(3).cloned().chain([chain(&path)]) {
                    let held = probe.iter().take_while(|b| distinct.contains(b)).count();
                    prop_assert_eq!(set.held_prefix(&probe), held);
                }
                for block in distinct.iter().take(8) {
                    let count = live.iter().filter(|c| c.contains(block)).count();
                    prop_assert_eq!(set.refcount(*block) as usize, count);
                }
            }
            for c in live.drain(..) {
                set.remove(&c);
            }
            prop_assert_eq!(set.distinct(), 0);
            prop_assert_eq!(set.nodes.len() - 1, set.free.len(), "every node is freed");
        }
    }
}
