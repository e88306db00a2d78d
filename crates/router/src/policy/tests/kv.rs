use super::*;

#[test]
fn kv_cost_follows_the_formula() {
    // 160-token prompt (10 blocks). A caches 6 blocks but is busy; B is idle.
    let a = Candidate {
        overlap_blocks: 6,
        active_blocks: 20,
        new_blocks: 4,
        prefill_tokens: 32,
        ..cand(0)
    };
    let b = Candidate {
        new_blocks: 10,
        ..cand(1)
    };
    let policy = KvPolicy::default();
    let overrides = RoutingOverrides::default();
    let s = Selection {
        isl_tokens: 160,
        block_size: 16,
        candidates: &[a, b],
        overrides: &overrides,
        timings: &[],
    };
    // A: prefill (32 + 160 - 96) / 16 = 6, decode 20 + 4 = 24 -> 30.
    // B: prefill 160 / 16 = 10, decode 0 + 10 = 10 -> 20.
    assert_eq!(policy.costs(&s), vec![30.0, 20.0]);
    let mut p = KvPolicy::default();
    assert_eq!(select(&mut p, 160, &[a, b], overrides, 0), 1);
}

#[test]
fn kv_prefers_cache_when_load_is_equal_and_weight_shifts_the_balance() {
    let a = Candidate {
        overlap_blocks: 8,
        active_blocks: 10,
        new_blocks: 2,
        ..cand(0)
    };
    let b = Candidate {
        overlap_blocks: 0,
        active_blocks: 5,
        new_blocks: 10,
        ..cand(1)
    };
    let mut p = KvPolicy::default();
    // A: 2 + 12 = 14; B: 10 + 15 = 25.
    assert_eq!(
        select(&mut p, 160, &[a, b], RoutingOverrides::default(), 0),
        0
    );
    // Decode-heavy weighting (prefill barely counts) favours the less loaded B:
    // A: 0.1 * 2 + 12 = 12.2; B: 0.1 * 10 + 15 = 16 -> still A; lower B's load.
    let b_idle = Candidate {
        active_blocks: 0,
        ..b
    };
    let light = RoutingOverrides {
        overlap_weight: Some(0.1),
        ..RoutingOverrides::default()
    };
    // A: 12.2; B: 1 + 10 = 11 -> B.
    assert_eq!(select(&mut p, 160, &[a, b_idle], light, 0), 1);
    // With full weight A wins again: A 14, B 20.
    assert_eq!(
        select(&mut p, 160, &[a, b_idle], RoutingOverrides::default(), 0),
        0
    );
}

#[test]
fn kv_ties_go_to_the_smaller_tree_then_random() {
    let a = Candidate {
        cached_blocks: 500,
        ..cand(0)
    };
    let b = Candidate {
        cached_blocks: 100,
        ..cand(1)
    };
    let c = Candidate {
        cached_blocks: 100,
        ..cand(2)
    };
    let mut p = KvPolicy::default();
    let mut seen = [0usize; 3];
    for seed in 0..200 {
        seen[select(&mut p, 64, &[a, b, c], RoutingOverrides::default(), seed)] += 1;
    }
    assert_eq!(seen[0], 0);
    assert!(seen[1] > 50 && seen[2] > 50, "{seen:?}");
}

#[test]
fn kv_temperature_samples_cheaper_workers_more_often() {
    let cheap = Candidate {
        active_blocks: 0,
        ..cand(0)
    };
    let dear = Candidate {
        active_blocks: 100,
        ..cand(1)
    };
    let mut p = KvPolicy::default();
    let mut count = |t: f64| {
        let o = RoutingOverrides {
            temperature: Some(t),
            ..RoutingOverrides::default()
        };
        let mut rng = SmallRng::seed_from_u64(7);
        let s = Selection {
            isl_tokens: 64,
            block_size: 16,
            candidates: &[cheap, dear],
            overrides: &o,
            timings: &[],
        };
        (0..2000)
            .filter(|_| p.select(&s, &mut rng) == Some(1))
            .count()
    };
    // Softmax of normalised costs {0, 1}: P(dear) = e^(-1/T) / (1 + e^(-1/T)).
    let hot = count(10.0); // ≈ 0.475
    let cool = count(0.25); // ≈ 0.018
    assert!((850..1050).contains(&hot), "{hot}");
    assert!(cool < 80, "{cool}");
    // Temperature 0 is deterministic.
    assert_eq!(count(0.0), 0);
}
