//! The prefix structure of a hash-id trace.
//!
//! Every request's `hash_ids` is a path from a common root. [`PrefixTrie`] holds every distinct
//! block once with how many requests passed through it (and checks that the ids really form a
//! tree: one parent per id). [`CoreTree`] keeps only the blocks that two or more requests share,
//! contracted into radix nodes with a length; blocks visited once are the unique user prompts.

mod core_tree;
mod trie;

pub use core_tree::{CoreNode, CoreTree, Step};
pub use trie::{NodeId, PrefixTrie, TrieNode};
