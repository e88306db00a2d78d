//! The prefix trie and core tree against a naive model: count every id's visits with a map.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use proptest::prelude::*;
use switchyard_core::trace::MooncakeRecord;
use switchyard_workload::analyze::TraceAnalysis;
use switchyard_workload::prefix::{CoreTree, PrefixTrie};
use switchyard_workload::synth::{SynthConfig, SynthModel};

const BLOCK: u32 = 16;

/// Paths that form a tree: each request copies a prefix of an earlier one (or none) and
/// appends ids never used before.
fn paths() -> impl Strategy<Value = Vec<Vec<u64>>> {
    prop::collection::vec((any::<prop::sample::Index>(), 0usize..8, 0usize..4), 1..60).prop_map(
        |specs| {
            let mut paths: Vec<Vec<u64>> = Vec::new();
            let mut next_id = 0u64;
            for (parent, shared, fresh) in specs {
                let mut path = if paths.is_empty() {
                    Vec::new()
                } else {
                    let base = &paths[parent.index(paths.len())];
                    base[..shared.min(base.len())].to_vec()
                };
                for _ in 0..fresh {
                    path.push(next_id);
                    next_id += 1;
                }
                paths.push(path);
            }
            paths
        },
    )
}

fn records(paths: &[Vec<u64>]) -> Vec<MooncakeRecord> {
    paths
        .iter()
        .enumerate()
        .map(|(i, path)| MooncakeRecord {
            media: Vec::new(),
            timestamp: i as u64 * 10,
            input_length: path.len() as u64 * u64::from(BLOCK),
            output_length: 1 + i as u64 % 5,
            hash_ids: path.clone(),
            ..MooncakeRecord::default()
        })
        .collect()
}

proptest! {
    #[test]
    fn trie_and_core_tree_match_naive_counts(paths in paths()) {
        let mut visits: HashMap<u64, usize> = HashMap::new();
        for id in paths.iter().flatten() {
            *visits.entry(*id).or_default() += 1;
        }
        let trie = PrefixTrie::build(&records(&paths)).unwrap();
        prop_assert_eq!(trie.check(), Ok(()));
        prop_assert_eq!(trie.blocks(), visits.len());
        for path in &paths {
            let shared = path.iter().take_while(|id| visits[*id] >= 2).count();
            prop_assert_eq!(trie.split(path), (shared, path.len() - shared));
        }

        let core = CoreTree::from_trie(&trie);
        prop_assert_eq!(core.check(), Ok(()));
        let shared_ids = visits.values().filter(|&&v| v >= 2).count() as u64;
        prop_assert_eq!(core.blocks(), shared_ids);
        // Every shared block visit is one request passing through one core block.
        let walked: u64 = core.nodes().iter().map(|n| n.visits * u64::from(n.len)).sum();
        let shared_visits: usize = visits.values().filter(|&&v| v >= 2).sum();
        prop_assert_eq!(walked, shared_visits as u64);
    }

    #[test]
    fn stratified_synthesis_at_source_scale_keeps_reuse_exactly(paths in paths(), seed in any::<u64>()) {
        let source = records(&paths);
        let model = SynthModel::learn(&source, BLOCK).unwrap();
        let config = SynthConfig { seed, block_size: BLOCK, ..SynthConfig::default() };
        let synthetic = model.generate(&config);
        let (a, b) = (
            TraceAnalysis::of(&source, BLOCK).unwrap(),
            TraceAnalysis::of(&synthetic, BLOCK).unwrap(),
        );
        prop_assert_eq!(a.blocks.total, b.blocks.total);
        prop_assert_eq!(a.blocks.distinct, b.blocks.distinct);
        prop_assert_eq!(a.core_tree.blocks, b.core_tree.blocks);
        prop_assert_eq!(a.duration, b.duration);
    }
}
