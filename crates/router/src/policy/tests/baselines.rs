use super::*;

#[test]
fn round_robin_cycles() {
    let cs = [cand(0), cand(1), cand(2)];
    let mut p = RoundRobin::default();
    let picks: Vec<usize> = (0..6)
        .map(|i| select(&mut p, 10, &cs, RoutingOverrides::default(), i))
        .collect();
    assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
}

#[test]
fn random_reaches_every_worker() {
    let cs = [cand(0), cand(1), cand(2), cand(3)];
    let mut p = RandomPolicy;
    let mut rng = SmallRng::seed_from_u64(1);
    let o = RoutingOverrides::default();
    let s = Selection {
        isl_tokens: 1,
        block_size: 16,
        candidates: &cs,
        overrides: &o,
        timings: &[],
    };
    let seen: std::collections::HashSet<usize> =
        (0..100).filter_map(|_| p.select(&s, &mut rng)).collect();
    assert_eq!(seen.len(), 4);
}

#[test]
fn least_loaded_and_power_of_two_avoid_load() {
    let cs = [
        Candidate {
            active_blocks: 50,
            ..cand(0)
        },
        Candidate {
            active_blocks: 10,
            active_requests: 3,
            ..cand(1)
        },
        Candidate {
            active_blocks: 10,
            active_requests: 1,
            ..cand(2)
        },
    ];
    assert_eq!(
        select(&mut LeastLoaded, 10, &cs, RoutingOverrides::default(), 0),
        2
    );
    // With two candidates, power-of-two compares both and takes the lighter.
    let two = [cs[0], cs[1]];
    for seed in 0..20 {
        assert_eq!(
            select(&mut PowerOfTwo, 10, &two, RoutingOverrides::default(), seed),
            1
        );
    }
    // With three, it never picks the heaviest unless both samples... it samples two
    // distinct ones, so the heaviest can never win.
    for seed in 0..50 {
        assert_ne!(
            select(&mut PowerOfTwo, 10, &cs, RoutingOverrides::default(), seed),
            0
        );
    }
}

#[test]
fn cache_aware_follows_sglang_rules() {
    let mut p = CacheAware::default();
    // Balanced load, 50% of a 160-token prompt cached on worker 1: route by cache.
    let cs = [
        Candidate {
            cached_blocks: 10,
            active_requests: 5,
            ..cand(0)
        },
        Candidate {
            overlap_blocks: 5,
            cached_blocks: 900,
            active_requests: 6,
            ..cand(1)
        },
    ];
    assert_eq!(select(&mut p, 160, &cs, RoutingOverrides::default(), 0), 1);
    // Only 20% cached (below the 0.3 threshold): the emptiest cache wins.
    let low = [
        cs[0],
        Candidate {
            overlap_blocks: 2,
            ..cs[1]
        },
    ];
    assert_eq!(select(&mut p, 160, &low, RoutingOverrides::default(), 0), 0);
    // Imbalanced (max - min = 100 > 64 and 110 > 1.5 * 10): shortest queue regardless.
    let busy = [
        Candidate {
            active_requests: 10,
            ..cs[0]
        },
        Candidate {
            active_requests: 110,
            ..cs[1]
        },
    ];
    assert_eq!(
        select(&mut p, 160, &busy, RoutingOverrides::default(), 0),
        0
    );
    // A gap over 64 that is not 1.5× is not imbalance: cache wins.
    let wide = [
        Candidate {
            active_requests: 200,
            ..cs[0]
        },
        Candidate {
            active_requests: 270,
            ..cs[1]
        },
    ];
    assert_eq!(
        select(&mut p, 160, &wide, RoutingOverrides::default(), 0),
        1
    );
}

#[test]
fn policies_parse_by_name() {
    for kind in PolicyKind::ALL {
        assert_eq!(kind.name().parse::<PolicyKind>(), Ok(*kind));
    }
    let err = "fastest".parse::<PolicyKind>().unwrap_err();
    assert!(err.to_string().contains("round-robin"));
}
