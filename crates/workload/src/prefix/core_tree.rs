//! The core prefix tree: shared blocks only, unary chains contracted into radix nodes.

use std::collections::HashMap;

use serde::Serialize;

use super::trie::{NodeId, PrefixTrie};
use crate::stats::Cdf;

/// Where a request goes next from a core node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Step {
    /// Into this child core node.
    Child(usize),
    /// The request's prompt ends inside the core tree, here.
    End,
    /// The request continues with a unique prompt nobody else sent.
    Unique,
}

/// A radix node: a run of shared blocks that every visiting request traverses whole.
#[derive(Debug, Clone)]
pub struct CoreNode {
    /// Blocks in the run; zero for the root.
    pub len: u32,
    pub visits: u64,
    /// Requests whose prompt ends at the end of this node.
    pub ends: u64,
    /// Requests that leave this node into a unique prompt.
    pub unique: u64,
    pub children: Vec<usize>,
    /// Blocks from the root to the end of this node.
    pub depth_blocks: u64,
    /// Radix nodes from the root to this one (root = 0).
    pub depth_nodes: u32,
}

/// The blocks of a trace that two or more requests share, as a radix tree.
#[derive(Debug, Clone)]
pub struct CoreTree {
    nodes: Vec<CoreNode>,
    /// The core node ending at each trie node that ends one.
    ending_at: HashMap<NodeId, usize>,
}

impl CoreTree {
    pub const ROOT: usize = 0;

    /// Keeps the trie's blocks visited at least twice and contracts every chain whose inner
    /// blocks all requests pass straight through (one shared child, nobody ending or
    /// branching off into a unique prompt) into one node.
    pub fn from_trie(trie: &PrefixTrie) -> Self {
        let root = trie.node(PrefixTrie::ROOT);
        let mut nodes = vec![CoreNode {
            len: 0,
            visits: u64::from(root.visits),
            ends: u64::from(root.ends),
            unique: unique_children(trie, PrefixTrie::ROOT),
            children: Vec::new(),
            depth_blocks: 0,
            depth_nodes: 0,
        }];
        let mut pending: Vec<(NodeId, usize)> = core_children(trie, PrefixTrie::ROOT)
            .map(|c| (c, Self::ROOT))
            .collect();
        // Reverse so nodes are numbered in the trie's child order (deterministic sampling).
        pending.reverse();
        let mut ending_at = HashMap::new();
        while let Some((start, parent)) = pending.pop() {
            let mut last = start;
            let mut len = 1u32;
            loop {
                let node = trie.node(last);
                let mut shared = core_children(trie, last);
                let (Some(only), None) = (shared.next(), shared.next()) else {
                    break;
                };
                if node.ends != 0 || unique_children(trie, last) != 0 {
                    break;
                }
                last = only;
                len += 1;
            }
            let index = nodes.len();
            let (depth_blocks, depth_nodes) = {
                let up = &nodes[parent];
                (up.depth_blocks + u64::from(len), up.depth_nodes + 1)
            };
            nodes.push(CoreNode {
                len,
                visits: u64::from(trie.node(start).visits),
                ends: u64::from(trie.node(last).ends),
                unique: unique_children(trie, last),
                children: Vec::new(),
                depth_blocks,
                depth_nodes,
            });
            nodes[parent].children.push(index);
            ending_at.insert(last, index);
            let mut below: Vec<_> = core_children(trie, last).map(|c| (c, index)).collect();
            below.reverse();
            pending.extend(below);
        }
        Self { nodes, ending_at }
    }

    /// The core node whose last block is trie node `node`; `None` for a block inside a
    /// node or outside the core.
    pub fn node_ending_at(&self, node: NodeId) -> Option<usize> {
        self.ending_at.get(&node).copied()
    }

    pub fn node(&self, index: usize) -> &CoreNode {
        &self.nodes[index]
    }

    pub fn nodes(&self) -> &[CoreNode] {
        &self.nodes
    }

    /// The next-step distribution at `index`: children by their visits, then the two
    /// sentinels (end here, continue with a unique prompt).
    pub fn transitions(&self, index: usize) -> Cdf<Step> {
        let node = &self.nodes[index];
        let children = node
            .children
            .iter()
            .map(|&c| (Step::Child(c), self.nodes[c].visits));
        Cdf::from_counts(children.chain([(Step::End, node.ends), (Step::Unique, node.unique)]))
    }

    /// Shared blocks in the tree.
    pub fn blocks(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.len)).sum()
    }

    /// Radix nodes, the root excluded.
    pub fn radix_nodes(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Distinct first shared runs: separate prefix families.
    pub fn roots(&self) -> usize {
        self.nodes[Self::ROOT].children.len()
    }

    pub fn max_depth_blocks(&self) -> u64 {
        self.nodes.iter().map(|n| n.depth_blocks).max().unwrap_or(0)
    }

    pub fn max_depth_nodes(&self) -> u32 {
        self.nodes.iter().map(|n| n.depth_nodes).max().unwrap_or(0)
    }

    /// Checks that every node's visits are accounted for by its children and sentinels, and
    /// that every non-root node has at least one block. Returns the first node that fails.
    pub fn check(&self) -> Result<(), usize> {
        for (index, node) in self.nodes.iter().enumerate() {
            let below: u64 = node.children.iter().map(|&c| self.nodes[c].visits).sum();
            if below + node.ends + node.unique != node.visits || (index != 0 && node.len == 0) {
                return Err(index);
            }
        }
        Ok(())
    }
}

fn core_children(trie: &PrefixTrie, node: NodeId) -> impl Iterator<Item = NodeId> + '_ {
    trie.node(node)
        .children
        .iter()
        .copied()
        .filter(|&c| trie.node(c).visits >= 2)
}

/// Requests leaving `node` into a block nobody else visits.
fn unique_children(trie: &PrefixTrie, node: NodeId) -> u64 {
    trie.node(node)
        .children
        .iter()
        .filter(|&&c| trie.node(c).visits == 1)
        .count() as u64
}

#[cfg(test)]
mod tests {
    use switchyard_core::trace::MooncakeRecord;

    use super::*;

    fn tree(paths: &[&[u64]]) -> CoreTree {
        let rows: Vec<_> = paths
            .iter()
            .map(|p| MooncakeRecord {
                media: Vec::new(),
                timestamp: 0,
                input_length: 1,
                output_length: 1,
                hash_ids: p.to_vec(),
                ..MooncakeRecord::default()
            })
            .collect();
        CoreTree::from_trie(&PrefixTrie::build(&rows).unwrap())
    }

    #[test]
    fn unary_chains_contract_and_singletons_are_stripped() {
        // 0-1-2 is shared by all three, then 3 by two of them; 9, 8 and 7 are unique.
        let core = tree(&[&[0, 1, 2, 3, 9], &[0, 1, 2, 3, 8], &[0, 1, 2, 7]]);
        assert_eq!(core.radix_nodes(), 2);
        assert_eq!(core.blocks(), 4);
        assert_eq!(core.roots(), 1);
        let top = core.node(1);
        assert_eq!((top.len, top.visits, top.ends, top.unique), (3, 3, 0, 1));
        let below = core.node(2);
        assert_eq!((below.len, below.visits, below.unique), (1, 2, 2));
        assert_eq!((core.max_depth_blocks(), core.max_depth_nodes()), (4, 2));
        assert_eq!(core.check(), Ok(()));
    }

    #[test]
    fn a_request_ending_mid_chain_splits_it() {
        let core = tree(&[&[0, 1, 2], &[0, 1, 2], &[0, 1]]);
        assert_eq!(core.radix_nodes(), 2);
        assert_eq!(core.node(1).len, 2);
        assert_eq!(core.node(1).ends, 1);
        assert_eq!(core.node(2).ends, 2);
        let steps: Vec<_> = core.transitions(1).probabilities().collect();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].0, Step::Child(2));
        assert!((steps[0].1 - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(steps[1].0, Step::End);
    }

    #[test]
    fn root_counts_unique_first_blocks() {
        let core = tree(&[&[1], &[2], &[3, 4], &[3, 5]]);
        let root = core.node(CoreTree::ROOT);
        assert_eq!((root.visits, root.unique, root.children.len()), (4, 2, 1));
        assert_eq!(core.check(), Ok(()));
    }
}
