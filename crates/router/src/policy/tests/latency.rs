use super::*;

fn latency_select(
    candidates: &[Candidate],
    timings: &[WorkerTiming],
    isl: u64,
    itl_weight: f64,
) -> (usize, Vec<f64>) {
    let overrides = RoutingOverrides::default();
    let s = Selection {
        isl_tokens: isl,
        block_size: 16,
        candidates,
        overrides: &overrides,
        timings,
    };
    let mut policy = LatencyPolicy {
        config: LatencyPolicyConfig {
            itl_weight,
            ..LatencyPolicyConfig::default()
        },
    };
    let ttfts = candidates.iter().map(|c| policy.predict(&s, c).0).collect();
    let mut rng = SmallRng::seed_from_u64(1);
    (policy.select(&s, &mut rng).unwrap(), ttfts)
}

#[test]
fn latency_predicts_prefill_queue_and_decode_from_the_model() {
    let m = PerfModel::Polynomial;
    let timings = [WorkerTiming::default()];
    // Idle: exactly the prefill of the uncached tokens.
    let idle = cand(1);
    let cached = Candidate {
        overlap_blocks: 50,
        ..cand(2)
    };
    let (chosen, ttft) = latency_select(&[idle, cached], &timings, 1600, 0.0);
    assert_eq!(chosen, 1, "the cache hit is faster");
    assert!((ttft[0] - m.prefill_ms(1600)).abs() < 1e-9);
    assert!((ttft[1] - m.prefill_ms(800)).abs() < 1e-9);
    // The cache hit behind 20,000 queued prompt tokens (three chunks of 8,192 and a
    // rest, each step also decoding the 4 running requests) loses to an idle worker.
    let busy = Candidate {
        prefill_tokens: 20_000,
        active_requests: 5,
        active_blocks: 1_000,
        ..cached
    };
    let (chosen, ttft) = latency_select(&[idle, busy], &timings, 1600, 0.0);
    assert_eq!(chosen, 0);
    let decode = m.decode_ms(&StepShape {
        decode_seqs: 4,
        decode_kv_tokens: 16_000,
        active_blocks: 1_000,
        capacity_blocks: 16_384,
        ..StepShape::default()
    });
    let expected = 2.0 * m.prefill_ms(8192) + m.prefill_ms(20_800 - 16_384) + 3.0 * decode;
    assert!(
        (ttft[1] - expected).abs() < 1e-6,
        "{} vs {expected}",
        ttft[1]
    );
}

#[test]
fn a_long_answer_weighs_the_workers_decode_step_when_output_weight_is_set() {
    let timings = [WorkerTiming::default()];
    // A: idle for prefill but decoding a large batch over many blocks (a slow step);
    // B: a short prefill queued, a light batch.
    let a = Candidate {
        active_requests: 200,
        active_blocks: 12_000,
        ..cand(1)
    };
    let b = Candidate {
        prefill_tokens: 3_000,
        active_requests: 2,
        active_blocks: 100,
        ..cand(2)
    };
    let choose = |output_weight: f64, max_tokens: Option<u32>| {
        let overrides = RoutingOverrides {
            max_tokens,
            ..RoutingOverrides::default()
        };
        let candidates = [a, b];
        let s = Selection {
            isl_tokens: 1_000,
            block_size: 16,
            candidates: &candidates,
            overrides: &overrides,
            timings: &timings,
        };
        let mut policy = LatencyPolicy {
            config: LatencyPolicyConfig {
                itl_weight: 0.0,
                output_weight,
                decode_tail_weight: 0.0,
                ..LatencyPolicyConfig::default()
            },
        };
        policy.select(&s, &mut SmallRng::seed_from_u64(1)).unwrap()
    };
    // By time to first token alone, A.
    assert_eq!(choose(0.0, Some(2_000)), 0);
    // A long answer is worth B's queue; a short one is not.
    assert_eq!(choose(0.05, Some(2_000)), 1);
    assert_eq!(choose(0.05, Some(4)), 0);
    // Without max_tokens the term is not counted.
    assert_eq!(choose(0.05, None), 0);
}

/// The latency policy's choice among `candidates` and their costs, with `config`.
fn latency_costs(
    config: LatencyPolicyConfig,
    candidates: &[Candidate],
    isl: u64,
) -> (usize, Vec<f64>) {
    let timings = [WorkerTiming::default()];
    let overrides = RoutingOverrides::default();
    let s = Selection {
        isl_tokens: isl,
        block_size: 16,
        candidates,
        overrides: &overrides,
        timings: &timings,
    };
    let mut policy = LatencyPolicy { config };
    let costs = candidates.iter().map(|c| policy.predict(&s, c).1).collect();
    let chosen = policy.select(&s, &mut SmallRng::seed_from_u64(1)).unwrap();
    (chosen, costs)
}

#[test]
fn latency_counts_the_delay_a_request_adds_to_the_prefill_queued_before_it() {
    let m = PerfModel::Polynomial;
    // A: idle, 1,504 tokens to compute. B: 496 tokens just queued, then 896 of this
    // request's own, sooner by its own time to first token (one step of 1,392 tokens).
    let a = Candidate {
        overlap_blocks: 56,
        ..cand(1)
    };
    let b = Candidate {
        overlap_blocks: 94,
        prefill_tokens: 496,
        active_requests: 1,
        ..cand(2)
    };
    let without = LatencyPolicyConfig {
        queue_delay_weight: 0.0,
        ..LatencyPolicyConfig::default()
    };
    let (chosen, costs) = latency_costs(without, &[a, b], 2_400);
    assert_eq!(chosen, 1);
    assert!((costs[1] - m.prefill_ms(1_392)).abs() < 1e-9);
    // But its 896 tokens join the queued request's step, whose first token then comes
    // later by the time they take.
    let config = LatencyPolicyConfig::default();
    let (chosen, with) = latency_costs(config, &[a, b], 2_400);
    assert_eq!(chosen, 0);
    let delay = m.prefill_ms(1_392) - m.prefill_ms(496);
    assert!((with[1] - costs[1] - config.queue_delay_weight * delay).abs() < 1e-9);
    assert!((with[0] - costs[0]).abs() < 1e-9, "nothing queued on A");
    // A queue whose last step is full, or one already done, is not delayed.
    for queue in [
        Candidate {
            prefill_tokens: 8_192,
            ..b
        },
        Candidate {
            prefill_elapsed_ms: 1_000.0,
            ..b
        },
    ] {
        let (_, without) = latency_costs(
            LatencyPolicyConfig {
                queue_delay_weight: 0.0,
                ..config
            },
            &[queue],
            2_400,
        );
        let (_, with) = latency_costs(config, &[queue], 2_400);
        assert!((with[0] - without[0]).abs() < 1e-9, "{queue:?}");
    }
}

#[test]
fn latency_keeps_requests_off_a_worker_whose_decode_step_would_lead_the_fleet() {
    // A holds most of the prompt and is the soonest to a first token, but decodes on
    // 3,000 of its 16,384 blocks while B and C are idle.
    let a = Candidate {
        overlap_blocks: 150,
        active_blocks: 3_000,
        new_blocks: 50,
        active_requests: 1,
        ..cand(1)
    };
    let idle = |i| Candidate {
        new_blocks: 200,
        ..cand(i)
    };
    let without = LatencyPolicyConfig {
        decode_tail_weight: 0.0,
        ..LatencyPolicyConfig::default()
    };
    let candidates = [a, idle(2), idle(3)];
    assert_eq!(latency_costs(without, &candidates, 3_200).0, 0);
    let (chosen, _) = latency_costs(LatencyPolicyConfig::default(), &candidates, 3_200);
    assert_ne!(chosen, 0, "A's step would be well above the fleet's");
    // Where every worker decodes as much, A's step is the fleet's: the cache wins.
    let busy = |i| Candidate {
        active_blocks: 3_000,
        active_requests: 1,
        ..idle(i)
    };
    let candidates = [a, busy(2), busy(3)];
    assert_eq!(
        latency_costs(LatencyPolicyConfig::default(), &candidates, 3_200).0,
        0
    );
}

#[test]
fn latency_counts_the_queue_work_already_done() {
    let m = PerfModel::Polynomial;
    let timings = [WorkerTiming::default()];
    let fresh = Candidate {
        prefill_tokens: 8_192,
        active_requests: 1,
        ..cand(1)
    };
    let queue_ms = m.prefill_ms(8_192);
    // Half-way through the queue: half of it is left to wait for.
    let half = Candidate {
        prefill_elapsed_ms: queue_ms / 2.0,
        ..fresh
    };
    // Longer than predicted: the queue is done, and its request decodes alongside.
    let overdue = Candidate {
        prefill_elapsed_ms: queue_ms * 10.0,
        ..fresh
    };
    let (chosen, ttft) = latency_select(&[fresh, half, overdue], &timings, 1_600, 0.0);
    assert_eq!(chosen, 2);
    let own = m.prefill_ms(1_600);
    assert!((ttft[0] - (queue_ms + own)).abs() < 1e-6);
    assert!((ttft[1] - (queue_ms / 2.0 + own)).abs() < 1e-6);
    let decode_one = m.decode_ms(&StepShape {
        decode_seqs: 1,
        capacity_blocks: 16_384,
        ..StepShape::default()
    });
    assert!(
        (ttft[2] - (own + decode_one)).abs() < 1e-6,
        "{} vs {own} + {decode_one}",
        ttft[2]
    );
    // A short prefill under way: the step running it must end before this request's
    // tokens start, so an idle worker is sooner whatever the elapsed time.
    for elapsed in [1.0, 5.0, 16.0, 100.0] {
        let short = Candidate {
            prefill_tokens: 20,
            active_requests: 1,
            prefill_elapsed_ms: elapsed,
            ..cand(3)
        };
        let (chosen, _) = latency_select(&[short, cand(4)], &timings, 200, 0.1);
        assert_eq!(chosen, 1, "after {elapsed} ms");
    }
}

#[test]
fn latency_uses_each_workers_own_model_and_protects_running_decodes() {
    let slow = WorkerTiming::default();
    let fast = WorkerTiming {
        perf: PerfModel::from_profile(switchyard_core::perf::Profile {
            prefill_isl: vec![0.0, 10_000.0],
            prefill_ttft_ms: vec![1.0, 100.0],
            decode_active_kv_tokens: vec![0.0, 100_000.0],
            decode_context_length: vec![1.0, 10_000.0],
            decode_itl: vec![vec![2.0, 2.0], vec![4.0, 4.0]],
            mixed_step_saving: 0.0,
            prefill_context_ms: 0.0,
        })
        .unwrap(),
        ..WorkerTiming::default()
    };
    let on_slow = cand(1);
    let on_fast = Candidate {
        timing: 1,
        ..cand(2)
    };
    let (chosen, ttft) = latency_select(&[on_slow, on_fast], &[slow, fast], 4000, 0.0);
    assert_eq!(chosen, 1);
    assert!((ttft[1] - 40.6).abs() < 1e-9, "{ttft:?}");
    // A worker decoding 100 requests: a little faster for this request's first token,
    // but its prefill would stall all of them; with an ITL weight the idle one wins.
    let crowded = Candidate {
        active_requests: 100,
        active_blocks: 200,
        overlap_blocks: 40,
        ..cand(3)
    };
    let idle = cand(4);
    let timings = [WorkerTiming::default()];
    assert_eq!(latency_select(&[crowded, idle], &timings, 4000, 0.0).0, 0);
    assert_eq!(latency_select(&[crowded, idle], &timings, 4000, 0.01).0, 1);
}

#[test]
fn latency_avoids_a_worker_whose_cache_would_overflow() {
    let timings = [WorkerTiming::default()];
    // The cache hit sits on a worker at 95 % of its blocks: the idle one is chosen,
    // unless every worker is that full, then the least full.
    let full = Candidate {
        overlap_blocks: 100,
        active_blocks: 15_600,
        ..cand(1)
    };
    let idle = cand(2);
    assert_eq!(latency_select(&[full, idle], &timings, 1600, 0.1).0, 1);
    let fuller = Candidate {
        active_blocks: 16_000,
        ..cand(3)
    };
    assert_eq!(latency_select(&[fuller, full], &timings, 1600, 0.1).0, 1);
}
