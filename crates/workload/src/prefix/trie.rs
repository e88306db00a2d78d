//! The block-level prefix tree of a trace, with traversal counts.

use std::collections::HashMap;

use switchyard_core::trace::MooncakeRecord;

use crate::trace_io::{Parent, RecordError, RecordProblem};

/// Index of a node in a [`PrefixTrie`]; `0` is the root (no block).
pub type NodeId = u32;

/// One distinct block: a hash id at its place in the tree.
#[derive(Debug, Clone)]
pub struct TrieNode {
    /// The trace's hash id (meaningless for the root).
    pub id: u64,
    pub parent: NodeId,
    /// Requests whose path passes through (or ends at) this node.
    pub visits: u32,
    /// Requests whose path ends exactly here.
    pub ends: u32,
    pub children: Vec<NodeId>,
}

/// Every distinct block of a trace once, arranged as the prefix tree of the requests' paths.
#[derive(Debug, Clone)]
pub struct PrefixTrie {
    nodes: Vec<TrieNode>,
    by_id: HashMap<u64, NodeId>,
}

impl PrefixTrie {
    pub const ROOT: NodeId = 0;

    /// Builds the tree, failing at the first id seen under two different parents (then the
    /// ids are not prefix hashes and there is no tree to learn).
    pub fn build(records: &[MooncakeRecord]) -> Result<Self, RecordError> {
        let mut trie = Self {
            nodes: vec![TrieNode {
                id: 0,
                parent: Self::ROOT,
                visits: 0,
                ends: 0,
                children: Vec::new(),
            }],
            by_id: HashMap::new(),
        };
        for (record, request) in records.iter().enumerate() {
            trie.insert(&request.hash_ids)
                .map_err(|problem| RecordError { record, problem })?;
        }
        Ok(trie)
    }

    fn insert(&mut self, path: &[u64]) -> Result<(), RecordProblem> {
        // Check the whole path before counting, so a bad request leaves no partial counts.
        let mut in_path: HashMap<u64, Parent> = HashMap::with_capacity(path.len());
        let mut previous = Parent::Start;
        for &id in path {
            let expected = match self.by_id.get(&id) {
                Some(&node) => Some(self.parent_of(node)),
                // An id repeated within the path must follow what it followed the first time.
                None => in_path.get(&id).copied(),
            };
            if let Some(expected) = expected.filter(|&e| e != previous) {
                return Err(RecordProblem::NotATree {
                    id,
                    expected,
                    found: previous,
                });
            }
            in_path.insert(id, previous);
            previous = Parent::Id(id);
        }
        let mut node = Self::ROOT;
        self.nodes[node as usize].visits += 1;
        for &id in path {
            node = match self.by_id.get(&id) {
                Some(&child) => child,
                None => self.add_child(node, id),
            };
            self.nodes[node as usize].visits += 1;
        }
        self.nodes[node as usize].ends += 1;
        Ok(())
    }

    fn add_child(&mut self, parent: NodeId, id: u64) -> NodeId {
        let child = self.nodes.len() as NodeId;
        self.nodes.push(TrieNode {
            id,
            parent,
            visits: 0,
            ends: 0,
            children: Vec::new(),
        });
        self.nodes[parent as usize].children.push(child);
        self.by_id.insert(id, child);
        child
    }

    fn parent_of(&self, node: NodeId) -> Parent {
        match self.nodes[node as usize].parent {
            Self::ROOT => Parent::Start,
            parent => Parent::Id(self.nodes[parent as usize].id),
        }
    }

    /// The node of hash id `id`, if the trace has it.
    pub fn node_of(&self, id: u64) -> Option<NodeId> {
        self.by_id.get(&id).copied()
    }

    pub fn node(&self, node: NodeId) -> &TrieNode {
        &self.nodes[node as usize]
    }

    /// Distinct blocks (the root excluded).
    pub fn blocks(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Requests the tree was built from.
    pub fn requests(&self) -> u32 {
        self.nodes[0].visits
    }

    /// Splits a path of this trie into its shared part and its unique tail (blocks visited by
    /// one request only), as block counts. Visits never grow along a path, so the shared part
    /// is a prefix.
    pub fn split(&self, path: &[u64]) -> (usize, usize) {
        let shared = path
            .iter()
            .take_while(|id| {
                self.by_id
                    .get(id)
                    .is_some_and(|&n| self.nodes[n as usize].visits >= 2)
            })
            .count();
        (shared, path.len() - shared)
    }

    /// Checks the counting invariants: every node's visits are its ends plus its children's
    /// visits, and parents precede children (so there is no cycle). Returns the first node
    /// that breaks one.
    pub fn check(&self) -> Result<(), NodeId> {
        for (index, node) in self.nodes.iter().enumerate() {
            let below: u32 = node
                .children
                .iter()
                .map(|&c| self.nodes[c as usize].visits)
                .sum();
            let parent_ok = index == 0 || (node.parent as usize) < index;
            if below + node.ends != node.visits || !parent_ok {
                return Err(index as NodeId);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(paths: &[&[u64]]) -> Vec<MooncakeRecord> {
        paths
            .iter()
            .map(|p| MooncakeRecord {
                media: Vec::new(),
                timestamp: 0,
                input_length: p.len() as u64 * 512,
                output_length: 1,
                hash_ids: p.to_vec(),
                ..MooncakeRecord::default()
            })
            .collect()
    }

    #[test]
    fn counts_visits_and_ends() {
        let trie = PrefixTrie::build(&rows(&[&[1, 2, 3], &[1, 2], &[1, 4], &[]])).unwrap();
        assert_eq!(trie.requests(), 4);
        assert_eq!(trie.blocks(), 4);
        assert_eq!(trie.node(PrefixTrie::ROOT).ends, 1);
        let one = trie.node(1);
        assert_eq!((one.id, one.visits, one.ends), (1, 3, 0));
        let two = trie.node(2);
        assert_eq!((two.id, two.visits, two.ends), (2, 2, 1));
        assert_eq!(trie.split(&[1, 2, 3]), (2, 1));
        assert_eq!(trie.split(&[1, 4]), (1, 1));
        assert_eq!(trie.check(), Ok(()));
    }

    #[test]
    fn id_under_two_parents_is_not_a_tree() {
        let err = PrefixTrie::build(&rows(&[&[1, 2], &[3, 2]])).unwrap_err();
        assert_eq!(err.record, 1);
        assert_eq!(
            err.problem,
            RecordProblem::NotATree {
                id: 2,
                expected: Parent::Id(1),
                found: Parent::Id(3)
            }
        );
        assert!(
            err.to_string()
                .starts_with("record 2 of the trace: hash id 2 follows hash id 3")
        );
    }

    #[test]
    fn repeated_id_within_one_path_is_not_a_tree() {
        let err = PrefixTrie::build(&rows(&[&[1, 2, 2]])).unwrap_err();
        assert!(matches!(err.problem, RecordProblem::NotATree { id: 2, .. }));
        let err = PrefixTrie::build(&rows(&[&[7, 8], &[8]])).unwrap_err();
        assert_eq!(
            err.problem,
            RecordProblem::NotATree {
                id: 8,
                expected: Parent::Id(7),
                found: Parent::Start
            }
        );
    }
}
