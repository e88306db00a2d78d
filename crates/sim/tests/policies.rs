//! The simulator on a slice of the Mooncake conversation trace.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::trace::MooncakeRecord;
use switchyard_mocker::{EngineArgs, PerfModel};
use switchyard_router::routing::admission::SERVER_BUSY_KV_THRESHOLD;
use switchyard_router::{CacheViewMode, PolicyKind, RoutingConfig};
use switchyard_sim::{PreparedWorkload, SimConfig, TraceRequest, simulate};

fn slice(rows: usize) -> Vec<TraceRequest> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/mooncake_conversation_head3000.jsonl"
    ))
    .unwrap();
    text.lines()
        .take(rows)
        .map(|l| TraceRequest::from_mooncake(&MooncakeRecord::parse(l).unwrap()))
        .collect()
}

fn config(workers: u32) -> SimConfig {
    SimConfig {
        encoders: None,
        workers,
        engine: EngineArgs::default(),
        perf: vec![PerfModel::Polynomial],
        routing: RoutingConfig {
            admission: switchyard_router::AdmissionConfig::queue_only(),
            ..RoutingConfig::default()
        },
        event_delay: Duration::ZERO,
        eos_token_ids: Vec::new(),
        seed: 1,
        record_requests: false,
        lazy_engines: true,
        faults: Default::default(),
        planner: None,
        sla_targets: None,
        disagg: None,
    }
}

#[test]
fn kv_routing_beats_round_robin_on_cache_hits_and_ttft() {
    let trace = slice(1500);
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 1.0);
    let cfg = config(8);
    let kv = simulate(&cfg, &workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    let rr = simulate(&cfg, &workload, PolicyKind::RoundRobin, &mut |_| {}).unwrap();
    for r in [&kv, &rr] {
        assert_eq!(r.completed, 1500, "{}", r.policy);
        assert_eq!(r.rejected, 0);
    }
    eprintln!(
        "kv: hit {:.3} ttft {:?}\nrr: hit {:.3} ttft {:?}",
        kv.cache_hit_rate, kv.ttft_ms, rr.cache_hit_rate, rr.ttft_ms
    );
    // Reuse in this trace is mostly across conversation turns a minute or more apart, so
    // much of it is evicted whatever the routing; kv routing still keeps far more of it.
    assert!(
        kv.cache_hit_rate > 1.5 * rr.cache_hit_rate,
        "kv {:.3} vs rr {:.3}",
        kv.cache_hit_rate,
        rr.cache_hit_rate
    );
    assert!(
        kv.ttft_ms.mean < rr.ttft_ms.mean,
        "kv {:.1} ms vs rr {:.1} ms",
        kv.ttft_ms.mean,
        rr.ttft_ms.mean
    );
}

#[test]
fn runs_are_deterministic_and_account_for_every_token() {
    let trace = slice(300);
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 1.0);
    let cfg = SimConfig {
        event_delay: Duration::from_millis(20),
        ..config(4)
    };
    let a = simulate(&cfg, &workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    let b = simulate(&cfg, &workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    assert_eq!(a, b);
    assert_eq!((a.completed, a.rejected, a.queued), (300, 0, 0));
    let expected_output: u64 = trace
        .iter()
        .map(|r| u64::from(r.output_tokens.max(1)))
        .sum();
    assert_eq!(a.output_tokens, expected_output);
    assert_eq!(a.prompt_tokens, workload.total_prompt_tokens());
    assert_eq!(
        a.load_spread.requests_mean * 4.0,
        300.0,
        "every request lands on a worker"
    );
    assert!(
        a.simulated_seconds > 0.0
            && a.ttft_ms.p50 <= a.ttft_ms.p99
            && a.e2e_ms.p50 >= a.ttft_ms.p50
    );
    // A different seed only changes random choices; round robin ignores them.
    let rr1 = simulate(&cfg, &workload, PolicyKind::RoundRobin, &mut |_| {}).unwrap();
    let rr2 = simulate(
        &SimConfig {
            seed: 99,
            ..cfg.clone()
        },
        &workload,
        PolicyKind::RoundRobin,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(rr1.load_spread, rr2.load_spread);
}

/// Inter-token latency two ways: over every gap between tokens, and one mean a request
/// (TPOT, aiperf's inter-token latency), which must agree with the requests' own first and
/// last tokens.
#[test]
fn time_per_output_token_is_each_requests_mean_gap() {
    let trace = slice(300);
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 1.0);
    let cfg = SimConfig {
        record_requests: true,
        ..config(4)
    };
    let r = simulate(&cfg, &workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    let mut gaps: Vec<f64> = r
        .request_records
        .iter()
        .filter(|q| q.output_tokens > 1 && q.outcome == "length")
        .map(|q| {
            let span = q.finished.unwrap() - q.first_token.unwrap();
            span.as_secs_f64() * 1e3 / f64::from(q.output_tokens - 1)
        })
        .collect();
    assert!(
        gaps.len() > 250,
        "{} requests of two tokens or more",
        gaps.len()
    );
    gaps.sort_by(f64::total_cmp);
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let p90 = gaps[(gaps.len() * 9).div_ceil(10) - 1];
    let close = |a: f64, b: f64| (a - b).abs() <= 0.01 * b + 0.002;
    let d = r.tpot_ms;
    assert!(close(d.mean, mean), "{} against {mean}", d.mean);
    assert!(close(d.p90, p90), "{} against {p90}", d.p90);
    // Every gap weighs the same in `itl_ms`: a long answer counts once per token there,
    // once here; the two means differ on a trace of mixed lengths.
    assert!(
        (r.itl_ms.mean - d.mean).abs() > 0.01 * d.mean,
        "{} and {}",
        r.itl_ms.mean,
        d.mean
    );
}

#[test]
fn mismatched_block_sizes_and_empty_fleets_are_errors() {
    let workload = PreparedWorkload::prepare(&slice(3), 512, 32, 1.0);
    assert!(
        simulate(&config(2), &workload, PolicyKind::Kv, &mut |_| {})
            .unwrap_err()
            .to_string()
            .contains("32-token blocks")
    );
    let workload = PreparedWorkload::prepare(&slice(3), 512, 16, 1.0);
    assert!(simulate(&config(0), &workload, PolicyKind::Kv, &mut |_| {}).is_err());
}

#[test]
fn the_approximate_view_routes_without_events() {
    let trace = slice(600);
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 1.0);
    let cfg = SimConfig {
        routing: RoutingConfig {
            router: switchyard_router::RouterConfig {
                cache_view: CacheViewMode::Approximate,
                ..Default::default()
            },
            admission: switchyard_router::AdmissionConfig::queue_only(),
            ..RoutingConfig::default()
        },
        ..config(4)
    };
    let aware = simulate(&cfg, &workload, PolicyKind::CacheAware, &mut |_| {}).unwrap();
    let rr = simulate(&cfg, &workload, PolicyKind::RoundRobin, &mut |_| {}).unwrap();
    assert_eq!(aware.completed, 600);
    // Routing by the assumed cache still finds real cache hits.
    assert!(
        aware.cache_hit_rate > rr.cache_hit_rate,
        "{} vs {}",
        aware.cache_hit_rate,
        rr.cache_hit_rate
    );
}

#[test]
fn overload_queues_sheds_and_times_out_like_the_servers() {
    use switchyard_core::Priority;
    use switchyard_router::AdmissionConfig;
    // Four times the trace's rate on two workers: far more than they can hold.
    let trace = slice(400);
    let mut workload = PreparedWorkload::prepare(&trace, 512, 16, 4.0);
    for (i, r) in workload.requests.iter_mut().enumerate() {
        r.priority = match i % 3 {
            0 => Priority::BestEffort,
            1 => Priority::Standard,
            _ => Priority::Premium,
        };
    }
    let cfg = SimConfig {
        routing: RoutingConfig {
            admission: AdmissionConfig {
                queue_timeout: Duration::from_secs(5),
                max_queue: 64,
                ..AdmissionConfig::queue_only()
            },
            ..RoutingConfig::default()
        },
        record_requests: true,
        ..config(2)
    };
    let r = simulate(&cfg, &workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    assert_eq!(
        r.completed + r.rejected + r.failed,
        400,
        "every request accounted for"
    );
    assert!(r.queued > 0 && r.rejected > 0, "{r:?}");
    let shed = r.rejected_by_reason.get("shed").copied().unwrap_or(0);
    assert!(
        shed > 0,
        "best-effort requests are shed: {:?}",
        r.rejected_by_reason
    );
    // Shedding goes by tier: best effort loses far more than premium.
    let rejected_of = |tier: usize| {
        r.request_records
            .iter()
            .filter(|rec| rec.id as usize % 3 == tier && rec.finished.is_none())
            .count()
    };
    assert!(
        rejected_of(0) > rejected_of(2),
        "{} vs {}",
        rejected_of(0),
        rejected_of(2)
    );
    // What completed produced its whole output; the rest produced nothing.
    for rec in &r.request_records {
        let asked = workload.requests[rec.id as usize].output_tokens;
        match rec.outcome {
            "length" => assert_eq!(rec.output_tokens, asked),
            _ => assert_eq!(rec.output_tokens, 0, "{rec:?}"),
        }
    }
    // A queued request that timed out waited exactly the queue timeout: it never ran.
    let timed_out = r.rejected_by_reason.get("timed_out").copied().unwrap_or(0);
    assert_eq!(
        timed_out,
        r.request_records
            .iter()
            .filter(|x| x.outcome == "timed_out")
            .count() as u64
    );
}

#[test]
fn end_of_sequence_tokens_end_requests_early() {
    let trace = slice(200);
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 1.0);
    // Every token below 3,200 ends a stream: a tenth of the vocabulary.
    let cfg = SimConfig {
        eos_token_ids: (0..3200).collect(),
        ..config(4)
    };
    let r = simulate(&cfg, &workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    let asked: u64 = workload
        .requests
        .iter()
        .map(|q| u64::from(q.output_tokens))
        .sum();
    assert_eq!(r.completed, 200);
    assert!(r.stopped_early > 100, "{}", r.stopped_early);
    assert!(
        r.output_tokens < asked / 3,
        "{} of {asked}",
        r.output_tokens
    );
}

#[test]
fn engines_advanced_on_their_own_give_the_same_run_as_global_order() {
    use switchyard_router::AdmissionConfig;
    let trace = slice(500);
    for (speedup, workers, event_delay) in [(1.0, 4, 0), (3.0, 2, 15), (6.0, 3, 0)] {
        let workload = PreparedWorkload::prepare(&trace, 512, 16, speedup);
        let lazy = SimConfig {
            event_delay: Duration::from_millis(event_delay),
            record_requests: true,
            routing: RoutingConfig {
                admission: AdmissionConfig {
                    queue_timeout: Duration::from_secs(20),
                    ..AdmissionConfig::queue_only()
                },
                ..RoutingConfig::default()
            },
            eos_token_ids: vec![5, 77, 3000],
            ..config(workers)
        };
        let exact = SimConfig {
            lazy_engines: false,
            faults: Default::default(),
            ..lazy.clone()
        };
        for policy in [PolicyKind::Kv, PolicyKind::RoundRobin] {
            let a = simulate(&lazy, &workload, policy, &mut |_| {}).unwrap();
            let b = simulate(&exact, &workload, policy, &mut |_| {}).unwrap();
            let first_difference = a
                .request_records
                .iter()
                .zip(&b.request_records)
                .find(|(x, y)| x != y);
            assert_eq!(
                first_difference, None,
                "speedup {speedup}, {workers} workers, {policy}"
            );
            let (mut a, mut b) = (a, b);
            a.request_records.clear();
            b.request_records.clear();
            assert_eq!(a, b, "speedup {speedup}, {workers} workers, {policy}");
            if speedup > 2.0 {
                assert!(a.queued > 0, "the overloaded cases exercise the queue");
            }
        }
    }
}

/// A model `factor` times slower than the polynomial one, as a measured profile.
fn slower(factor: f64) -> PerfModel {
    let poly = PerfModel::Polynomial;
    let isl: Vec<f64> = vec![1.0, 1024.0, 4096.0, 8192.0, 16_384.0, 65_536.0];
    PerfModel::from_profile(switchyard_core::perf::Profile {
        prefill_ttft_ms: isl
            .iter()
            .map(|&t| factor * poly.prefill_ms(t as u32))
            .collect(),
        prefill_isl: isl,
        decode_active_kv_tokens: vec![0.0, 4_000_000.0],
        decode_context_length: vec![1.0, 100_000.0],
        decode_itl: vec![vec![factor * 5.74; 2], vec![factor * 34.0; 2]],
        mixed_step_saving: 0.0,
        prefill_context_ms: 0.0,
    })
    .unwrap()
}

#[test]
fn in_a_mixed_fleet_latency_routing_favours_the_faster_workers() {
    let trace = slice(1500);
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 0.5);
    // Workers 1 and 3 at the polynomial's speed, 2 and 4 three times slower; each tells
    // the router its own model.
    let cfg = SimConfig {
        perf: vec![PerfModel::Polynomial, slower(3.0)],
        record_requests: true,
        ..config(4)
    };
    let kv = simulate(&cfg, &workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    let latency = simulate(&cfg, &workload, PolicyKind::Latency, &mut |_| {}).unwrap();
    let on_fast = |r: &switchyard_sim::SimReport| {
        r.request_records
            .iter()
            .filter(|rec| rec.worker.is_some_and(|w| w.worker_id.0 % 2 == 1))
            .count()
    };
    eprintln!(
        "on fast workers: kv {} latency {}; ttft p90 kv {:.0} latency {:.0}",
        on_fast(&kv),
        on_fast(&latency),
        kv.ttft_ms.p90,
        latency.ttft_ms.p90
    );
    for r in [&kv, &latency] {
        assert_eq!(r.completed, 1500, "{}", r.policy);
    }
    // kv sees only blocks and spreads load evenly; latency knows who is slow (and never
    // overfills a worker's cache for it).
    assert!(on_fast(&latency) > on_fast(&kv) + 50);
    assert!(latency.ttft_ms.p90 < 0.8 * kv.ttft_ms.p90);
    assert!(latency.ttft_ms.mean < 0.8 * kv.ttft_ms.mean);
    assert_eq!(latency.preemptions, 0);
}

#[test]
fn shedding_on_predicted_wait_keeps_admitted_requests_within_the_target() {
    let trace = slice(600);
    // Arrivals sped up 2x on two workers: far beyond what they serve.
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 2.0);
    let target = Duration::from_secs(2);
    let run = |wait_target: Option<Duration>, busy_kv_threshold: f64| {
        let mut cfg = config(2);
        cfg.routing.admission.wait_target = wait_target;
        cfg.routing.admission.busy_kv_threshold = busy_kv_threshold;
        cfg.routing.admission.queue_timeout = Duration::from_secs(60);
        simulate(&cfg, &workload, PolicyKind::Latency, &mut |_| {}).unwrap()
    };
    let queue_only = run(None, 0.95);
    // The servers' admission: the wait target, and workers busy at 80 % of their KV.
    let predicted = run(Some(target), SERVER_BUSY_KV_THRESHOLD);
    let shed = predicted
        .rejected_by_reason
        .get("wait_too_long")
        .copied()
        .unwrap_or(0);
    assert!(shed > 0, "{:?}", predicted.rejected_by_reason);
    assert_eq!(queue_only.rejected_by_reason.get("wait_too_long"), None);
    // What is admitted starts in time: at p90 within the target (what remains of a TTFT is
    // the request's own prompt, up to tens of thousands of tokens here), at p99 within
    // twice it, against a minute when everything queues; and hardly anything is preempted
    // (computed twice) on the way.
    assert!(
        predicted.ttft_ms.p90 <= target.as_secs_f64() * 1e3
            && predicted.ttft_ms.p99 <= 2.0 * target.as_secs_f64() * 1e3,
        "TTFT p90 {} / p99 {} ms with the target, p99 {} ms without",
        predicted.ttft_ms.p90,
        predicted.ttft_ms.p99,
        queue_only.ttft_ms.p99
    );
    assert!(
        predicted.preemptions * 10 < queue_only.preemptions,
        "{} preemptions against {}",
        predicted.preemptions,
        queue_only.preemptions
    );
    println!(
        "queue only: {} completed, TTFT p90 {:.0} / p99 {:.0} ms, {} preemptions; servers' admission: {} completed, {shed} shed, TTFT p90 {:.0} / p99 {:.0} ms, {} preemptions",
        queue_only.completed,
        queue_only.ttft_ms.p90,
        queue_only.ttft_ms.p99,
        queue_only.preemptions,
        predicted.completed,
        predicted.ttft_ms.p90,
        predicted.ttft_ms.p99,
        predicted.preemptions
    );
}
