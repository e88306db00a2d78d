//! `synth generate` against the Mooncake conversation slice: with every multiplier at 1 the
//! synthetic trace keeps the source's statistics, and each knob moves its own statistic.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::OnceLock;

use switchyard_core::trace::MooncakeRecord;
use switchyard_workload::analyze::{Comparison, TraceAnalysis};
use switchyard_workload::prefix::{CoreTree, PrefixTrie};
use switchyard_workload::synth::{Sampling, SynthConfig, SynthError, generate_from_trace};
use switchyard_workload::trace_io::Trace;

fn source() -> &'static (Trace, TraceAnalysis) {
    static SOURCE: OnceLock<(Trace, TraceAnalysis)> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let path: PathBuf = [
            env!("CARGO_MANIFEST_DIR"),
            "../../testdata/mooncake_conversation_head3000.jsonl",
        ]
        .iter()
        .collect();
        let trace = Trace::read(&path).unwrap();
        let analysis = TraceAnalysis::of(&trace.records, 512).unwrap();
        (trace, analysis)
    })
}

fn generate(config: SynthConfig) -> (Vec<MooncakeRecord>, TraceAnalysis) {
    let records = generate_from_trace(&source().0, &config).unwrap();
    let analysis = TraceAnalysis::of(&records, config.block_size).unwrap();
    (records, analysis)
}

fn ratio(synthetic: f64, source: f64) -> f64 {
    synthetic / source
}

fn assert_near(what: &str, value: f64, target: f64, tolerance: f64) {
    let off = (value - target).abs() / target.abs();
    assert!(
        off <= tolerance,
        "{what}: {value} is {:.1}% from {target} (tolerance {:.0}%)",
        off * 100.0,
        tolerance * 100.0
    );
}

const PRESERVED: [&str; 7] = [
    "block reuse ratio",
    "ISL mean",
    "ISL p50",
    "ISL p90",
    "OSL mean",
    "OSL p50",
    "OSL p90",
];

#[test]
fn unscaled_synthesis_matches_the_source_within_five_percent() {
    let source_stats = &source().1;
    for seed in [1, 2, 3] {
        let (records, synthetic) = generate(SynthConfig {
            seed,
            ..SynthConfig::default()
        });
        assert_eq!(records.len(), source_stats.requests);
        let comparison = Comparison::of(source_stats, &synthetic);
        println!("seed {seed}\n{comparison}");
        for name in PRESERVED {
            let row = comparison.row(name).unwrap();
            assert!(
                row.relative_diff <= 0.05,
                "seed {seed}: {name}: source {} synthetic {}",
                row.source,
                row.synthetic
            );
        }
    }
}

#[test]
fn lengths_hold_beyond_the_source_scale_and_under_independent_sampling() {
    let source_stats = &source().1;
    // 1.5x the source: the second round of every stratified sampler is cut short.
    let (_, longer) = generate(SynthConfig {
        num_requests: Some(4_500),
        seed: 9,
        ..SynthConfig::default()
    });
    // Independent draws carry sampling noise, so only the means are held to 5 %.
    let (_, independent) = generate(SynthConfig {
        seed: 9,
        sampling: Sampling::Independent,
        ..SynthConfig::default()
    });
    let longer = Comparison::of(source_stats, &longer);
    let independent = Comparison::of(source_stats, &independent);
    println!("1.5x\n{longer}\nindependent\n{independent}");
    for name in [
        "ISL mean", "ISL p50", "ISL p90", "OSL mean", "OSL p50", "OSL p90",
    ] {
        assert!(
            longer.row(name).unwrap().relative_diff <= 0.05,
            "1.5x: {name}"
        );
    }
    for name in ["ISL mean", "OSL mean"] {
        assert!(
            independent.row(name).unwrap().relative_diff <= 0.05,
            "independent: {name}"
        );
    }
}

#[test]
fn prefix_root_multiplier_makes_disjoint_families() {
    let source_stats = &source().1;
    let requests = 4 * source_stats.requests;
    let (records, synthetic) = generate(SynthConfig {
        num_requests: Some(requests),
        prefix_root_multiplier: 4,
        seed: 4,
        ..SynthConfig::default()
    });
    // Every source request starts with the same system-prompt block, so a family is the set
    // of requests sharing a first id.
    let mut families: HashMap<u64, HashSet<u64>> = HashMap::new();
    for record in &records {
        let family = families.entry(record.hash_ids[0]).or_default();
        family.extend(record.hash_ids.iter().copied());
    }
    assert_eq!(families.len(), 4);
    let mut owner: HashMap<u64, u64> = HashMap::new();
    for (&root, ids) in &families {
        for &id in ids {
            let first = *owner.entry(id).or_insert(root);
            assert_eq!(first, root, "hash id {id} is shared by two families");
        }
    }
    assert_eq!(synthetic.core_tree.roots, 4 * source_stats.core_tree.roots);
    let blocks = ratio(
        synthetic.core_tree.blocks as f64,
        source_stats.core_tree.blocks as f64,
    );
    assert!(
        (3.6..=4.4).contains(&blocks),
        "core blocks grew {blocks:.2}x"
    );
}

#[test]
fn prefix_len_multiplier_scales_the_core_only() {
    let source_stats = &source().1;
    let (_, synthetic) = generate(SynthConfig {
        prefix_len_multiplier: 2.0,
        seed: 5,
        ..SynthConfig::default()
    });
    assert_near(
        "core blocks",
        synthetic.core_tree.blocks as f64,
        2.0 * source_stats.core_tree.blocks as f64,
        0.05,
    );
    assert_near(
        "shared blocks per request",
        synthetic.core_tree.shared_blocks_per_request.mean,
        2.0 * source_stats.core_tree.shared_blocks_per_request.mean,
        0.05,
    );
    assert_near(
        "unique prompt blocks",
        synthetic.unique_prompts.length_blocks.mean,
        source_stats.unique_prompts.length_blocks.mean,
        0.05,
    );
}

#[test]
fn prompt_len_multiplier_scales_unique_prompts_only() {
    let source_stats = &source().1;
    let (_, synthetic) = generate(SynthConfig {
        prompt_len_multiplier: 2.0,
        seed: 6,
        ..SynthConfig::default()
    });
    assert_near(
        "unique prompt blocks",
        synthetic.unique_prompts.length_blocks.mean,
        2.0 * source_stats.unique_prompts.length_blocks.mean,
        0.05,
    );
    assert_near(
        "core blocks",
        synthetic.core_tree.blocks as f64,
        source_stats.core_tree.blocks as f64,
        0.05,
    );
    assert!(synthetic.input_length.mean > 1.3 * source_stats.input_length.mean);
}

#[test]
fn osl_multiplier_scales_output_lengths() {
    let source_stats = &source().1;
    let (_, synthetic) = generate(SynthConfig {
        osl_multiplier: 0.5,
        seed: 7,
        ..SynthConfig::default()
    });
    for (value, target) in [
        (
            synthetic.output_length.mean,
            source_stats.output_length.mean,
        ),
        (synthetic.output_length.p50, source_stats.output_length.p50),
        (synthetic.output_length.p90, source_stats.output_length.p90),
    ] {
        assert_near("OSL", value, 0.5 * target, 0.05);
    }
    assert_near(
        "ISL mean",
        synthetic.input_length.mean,
        source_stats.input_length.mean,
        0.05,
    );
}

#[test]
fn speedup_compresses_time_and_nothing_else() {
    let base = SynthConfig {
        seed: 8,
        ..SynthConfig::default()
    };
    let (normal, normal_stats) = generate(base.clone());
    let (fast, fast_stats) = generate(SynthConfig {
        speedup_ratio: 4.0,
        ..base
    });
    assert_near(
        "duration",
        fast_stats.duration.as_secs_f64(),
        normal_stats.duration.as_secs_f64() / 4.0,
        0.01,
    );
    assert!(fast_stats.mean_rate > 3.9 * normal_stats.mean_rate);
    for (a, b) in normal.iter().zip(&fast) {
        assert_eq!(a.hash_ids, b.hash_ids);
        assert_eq!(a.output_length, b.output_length);
        assert!(b.timestamp.abs_diff(a.timestamp / 4) <= 1);
    }
}

#[test]
fn seed_makes_generation_deterministic() {
    let config = SynthConfig {
        seed: 42,
        num_requests: Some(500),
        ..SynthConfig::default()
    };
    let (a, _) = generate(config.clone());
    let (b, _) = generate(config.clone());
    let (c, _) = generate(SynthConfig { seed: 43, ..config });
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn synthetic_traces_are_trees() {
    let (records, _) = generate(SynthConfig {
        prefix_root_multiplier: 3,
        prefix_len_multiplier: 1.5,
        seed: 10,
        ..SynthConfig::default()
    });
    let trie = PrefixTrie::build(&records).unwrap();
    assert_eq!(trie.check(), Ok(()));
    assert_eq!(CoreTree::from_trie(&trie).check(), Ok(()));
    let source_trie = PrefixTrie::build(&source().0.records).unwrap();
    assert_eq!(source_trie.check(), Ok(()));
    assert_eq!(CoreTree::from_trie(&source_trie).check(), Ok(()));
}

#[test]
fn inconsistent_trace_is_rejected_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\":0,\"input_length\":600,\"output_length\":5,\"hash_ids\":[1,2]}\n\
         \n\
         {\"timestamp\":9,\"input_length\":600,\"output_length\":5,\"hash_ids\":[3,2]}\n",
    )
    .unwrap();
    let trace = Trace::read(&path).unwrap();
    let err = generate_from_trace(&trace, &SynthConfig::default()).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, SynthError::Trace(_)));
    assert!(
        message.contains("bad.jsonl:3: hash id 2 follows hash id 3"),
        "{message}"
    );

    let err = generate_from_trace(
        &trace,
        &SynthConfig {
            block_size: 256,
            ..SynthConfig::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("bad.jsonl:3"), "{err}");
}
