//! The simulator on a slice of the Mooncake conversation trace.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::trace::MooncakeRecord;
use switchyard_mocker::{EngineArgs, PerfModel};
use switchyard_router::{PolicyKind, RouterConfig};
use switchyard_sim::{CacheView, PreparedWorkload, SimConfig, TraceRequest, simulate};

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
        workers,
        engine: EngineArgs::default(),
        perf: PerfModel::Polynomial,
        router: RouterConfig::default(),
        event_delay: Duration::ZERO,
        cache_view: CacheView::Events,
        seed: 1,
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
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 4.0);
    let cfg = SimConfig {
        event_delay: Duration::from_millis(20),
        ..config(4)
    };
    let a = simulate(&cfg, &workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    let b = simulate(&cfg, &workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    assert_eq!(a, b);
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
    use switchyard_router::indexer::approx::ApproxConfig;
    let trace = slice(600);
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 1.0);
    let approx = ApproxConfig {
        ttl: Duration::from_secs(120),
        max_blocks_per_worker: 16_384,
    };
    let cfg = SimConfig {
        cache_view: CacheView::Approximate(approx),
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
    assert_eq!(
        CacheView::natural_for(PolicyKind::CacheAware, approx),
        CacheView::Approximate(approx)
    );
    assert_eq!(
        CacheView::natural_for(PolicyKind::Kv, approx),
        CacheView::Events
    );
}
