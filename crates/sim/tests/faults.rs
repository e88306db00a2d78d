//! Worker failures in the simulator: what is caught moves and completes, at a cost.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::trace::MooncakeRecord;
use switchyard_mocker::{EngineArgs, PerfModel};
use switchyard_router::{PolicyKind, RoutingConfig};
use switchyard_sim::{
    FailureReport, FaultConfig, Link, PreparedWorkload, SimConfig, SimReport, TraceRequest,
    simulate,
};

fn workload(rows: usize, speedup: f64) -> PreparedWorkload {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/mooncake_conversation_head3000.jsonl"
    ))
    .unwrap();
    let trace: Vec<TraceRequest> = text
        .lines()
        .take(rows)
        .map(|l| TraceRequest::from_mooncake(&MooncakeRecord::parse(l).unwrap()))
        .collect();
    PreparedWorkload::prepare(&trace, 512, 16, speedup)
}

fn config(faults: FaultConfig) -> SimConfig {
    SimConfig {
        encoders: None,
        workers: 6,
        engine: EngineArgs::default(),
        perf: vec![PerfModel::Polynomial],
        routing: RoutingConfig {
            admission: switchyard_router::AdmissionConfig::queue_only(),
            ..RoutingConfig::default()
        },
        event_delay: Duration::ZERO,
        eos_token_ids: Vec::new(),
        seed: 3,
        record_requests: true,
        lazy_engines: true,
        faults,
        planner: None,
        sla_targets: None,
        disagg: None,
    }
}

fn faults(schedule: &[&str], link: Option<&str>) -> FaultConfig {
    FaultConfig {
        schedule: schedule.iter().map(|s| s.parse().unwrap()).collect(),
        link: link.map(|l| l.parse().unwrap()),
        ..FaultConfig::default()
    }
}

fn run(workload: &PreparedWorkload, faults: FaultConfig) -> (SimReport, FailureReport) {
    run_with(workload, config(faults))
}

fn run_with(workload: &PreparedWorkload, config: SimConfig) -> (SimReport, FailureReport) {
    let report = simulate(&config, workload, PolicyKind::Kv, &mut |_| {}).unwrap();
    let failures = report.failures.clone().unwrap();
    (report, failures)
}

/// Every request completed with its whole output, each token counted once.
fn all_complete(report: &SimReport, workload: &PreparedWorkload) {
    assert_eq!(report.completed, report.requests, "{report:#?}");
    assert_eq!((report.failed, report.rejected), (0, 0));
    for (record, request) in report.request_records.iter().zip(&workload.requests) {
        assert_eq!(record.outcome, "length", "{record:?}");
        assert_eq!(record.output_tokens, request.output_tokens, "{record:?}");
    }
    let expected: u64 = workload
        .requests
        .iter()
        .map(|r| u64::from(r.output_tokens))
        .sum();
    assert_eq!(report.output_tokens, expected);
}

#[test]
fn crashed_workers_requests_move_by_reprefill_and_all_complete() {
    let w = workload(600, 1.0);
    let clean = simulate(
        &config(FaultConfig::default()),
        &w,
        PolicyKind::Kv,
        &mut |_| {},
    )
    .unwrap();
    assert!(clean.failures.is_none());
    all_complete(&clean, &w);
    let (report, f) = run(
        &w,
        // A crash loses the KV: even a fast link cannot help.
        faults(
            &["2:crash@20s+10s", "3:crash@40s", "2:crash@70s+5s"],
            Some("nvlink"),
        ),
    );
    all_complete(&report, &w);
    assert_eq!(f.faults, 3);
    assert_eq!(f.faults_by_kind.get("crash"), Some(&3));
    assert!(f.migrations > 0 && f.interrupted >= f.migrations, "{f:#?}");
    assert_eq!(f.interrupted, f.migrations + f.restarted);
    assert_eq!((f.by_transfer, f.transferred_bytes), (0, 0));
    assert_eq!(f.by_reprefill, f.migrations);
    assert!(f.recomputed_tokens > 0);
    assert_eq!(f.completed_after_move, f.interrupted, "{f:#?}");
    // A moved stream waits at least until the crash is noticed.
    assert!(f.stall_ms.p50 >= 20.0, "{:?}", f.stall_ms);
    assert!(f.moved_e2e_ms.mean > f.untouched_e2e_ms.mean, "{f:#?}");
    // Worker 2 away 10 s and 5 s; worker 3 from 40 s to the end.
    let end = report.simulated_seconds;
    let expected_down = 15.0 + (end - 40.0);
    assert!(
        (f.worker_seconds_down - expected_down).abs() < 0.5,
        "{f:#?} end {end}"
    );
    // Nothing goes to a worker after it is taken out and before it is back.
    for record in &report.request_records {
        let arrival = record.arrival.as_secs_f64();
        if let Some(worker) = record.worker
            && worker.worker_id.0 == 3
        {
            assert!(arrival < 40.2, "{record:?}");
        }
    }
}

#[test]
fn a_hang_is_found_after_the_stall_timeout_and_moves_kv_when_the_link_is_faster() {
    let w = workload(600, 1.0);
    let (report, f) = run(&w, faults(&["1:hang@30s+20s"], Some("nvlink")));
    all_complete(&report, &w);
    assert!(f.migrations > 0, "{f:#?}");
    // Over NVLink sending KV beats computing it for any prompt of some length.
    assert!(f.by_transfer > 0, "{f:#?}");
    assert_eq!(f.by_transfer + f.by_reprefill, f.migrations);
    assert!(f.transferred_bytes >= f.by_transfer * 131_072);
    // Found after the stall timeout (1 s by default): no moved stream waits less.
    assert!(f.stall_ms.p50 >= 1000.0, "{:?}", f.stall_ms);
    // The same hang with no link: everything is computed again, and streams wait longer.
    let (slow, g) = run(&w, faults(&["1:hang@30s+20s"], None));
    all_complete(&slow, &w);
    assert_eq!((g.by_transfer, g.transferred_bytes), (0, 0));
    assert_eq!(g.by_reprefill, g.migrations);
    assert!(g.recomputed_tokens > f.recomputed_tokens);
}

#[test]
fn the_cheaper_of_transfer_and_reprefill_is_taken() {
    let w = workload(600, 1.0);
    // A drain moves at once, KV readable. Over a very slow link, recomputing wins.
    let (report, crawl) = run(&w, faults(&["2:drain@30s+30s"], Some("0.001")));
    all_complete(&report, &w);
    assert!(crawl.migrations > 0);
    assert_eq!(crawl.by_transfer, 0, "{crawl:#?}");
    let (report, fast) = run(&w, faults(&["2:drain@30s+30s"], Some("nvlink")));
    all_complete(&report, &w);
    assert_eq!(fast.migrations, crawl.migrations);
    assert!(fast.by_transfer > crawl.by_transfer, "{fast:#?}");
    // A drain is noticed at once: the stall is the move itself, well under a second.
    assert!(fast.stall_ms.p50 < 1000.0, "{:?}", fast.stall_ms);
    assert!(
        fast.stall_ms.mean < crawl.stall_ms.mean,
        "{fast:#?} {crawl:#?}"
    );
    // A link of this bandwidth: the transfer time is bytes / bandwidth.
    let link: Link = "ib".parse().unwrap();
    assert_eq!(link.transfer_time(50_000_000), Duration::from_millis(1));
}

#[test]
fn requests_out_of_moves_fail_and_everything_is_accounted_for() {
    let w = workload(600, 1.0);
    let mut no_moves = config(faults(&["2:crash@20s+10s"], None));
    no_moves.routing.migration.max_migrations = 0;
    let (report, f) = run_with(&w, no_moves);
    assert!(f.interrupted > 0);
    assert_eq!(f.failed, f.interrupted, "{f:#?}");
    assert_eq!(report.failed, f.failed);
    assert_eq!(
        report.completed + report.failed + report.rejected,
        report.requests
    );
    assert_eq!(f.completed_after_move, 0);
    // A failed request streamed part of its output, never more.
    for (record, request) in report.request_records.iter().zip(&w.requests) {
        assert!(record.output_tokens <= request.output_tokens);
        if record.outcome == "failed" {
            assert!(record.output_tokens < request.output_tokens);
        }
    }
}

#[test]
fn an_mtbf_draws_failures_deterministically() {
    let w = workload(900, 1.0);
    let mtbf = FaultConfig {
        mtbf: Some(Duration::from_secs(45)),
        repair: Duration::from_secs(20),
        ..FaultConfig::default()
    };
    let (report, f) = run(&w, mtbf.clone());
    // About a third of the fleet is away at any time: some requests are refused or run
    // out of moves, but every one is accounted for and every completed one is whole.
    assert!(f.faults >= 4, "{f:#?}");
    assert_eq!(
        report.completed + report.failed + report.rejected,
        report.requests
    );
    assert_eq!(report.failed, f.failed);
    assert!(f.failed <= f.interrupted);
    for (record, request) in report.request_records.iter().zip(&w.requests) {
        if record.outcome == "length" {
            assert_eq!(record.output_tokens, request.output_tokens);
        }
    }
    let (again, g) = run(&w, mtbf);
    assert_eq!(f, g);
    assert_eq!(report.request_records, again.request_records);
}

#[test]
fn dispatch_attempts_follow_the_configured_limit_and_refusals_open_the_breaker() {
    // Worker 2 crashes and the frontend would not notice for ten minutes; round-robin
    // keeps sending it requests, which it refuses (counted against it) until its breaker
    // opens after `failure_threshold` refusals and its streams move at once.
    let w = workload(600, 1.0);
    let run_attempts = |attempts: u32| {
        let mut c = config(FaultConfig {
            crash_detection: Duration::from_secs(600),
            ..faults(&["2:crash@20s"], None)
        });
        c.routing.migration.max_dispatch_attempts = attempts;
        let report = simulate(&c, &w, PolicyKind::RoundRobin, &mut |_| {}).unwrap();
        let failures = report.failures.clone().unwrap();
        (report, failures)
    };
    let (one, f) = run_attempts(1);
    let threshold = u64::from(RoutingConfig::default().health.failure_threshold);
    assert_eq!(
        one.failed_by_reason.get("exhausted"),
        Some(&threshold),
        "{:?}",
        one.failed_by_reason
    );
    // Found by its refusals, not after ten minutes: the moved streams waited seconds.
    assert!(f.interrupted > 0 && f.stall_ms.p99 < 60_000.0, "{f:#?}");
    let (three, _) = run_attempts(3);
    assert_eq!(three.failed, 0, "{:?}", three.failed_by_reason);
    assert_eq!(three.completed, three.requests);
}

#[test]
fn the_fleet_wide_migration_budget_bounds_the_moves_of_one_failure() {
    // Three times the trace's rate: the crash catches many streams.
    let w = workload(600, 3.0);
    let mut c = config(faults(&["2:crash@20s"], None));
    c.routing.migration.budget_max = 2.0;
    c.routing.migration.budget_ratio = 0.0;
    let (report, f) = run_with(&w, c);
    assert!(f.interrupted > 2, "{f:#?}");
    assert_eq!(f.migrations + f.restarted, 2, "{f:#?}");
    assert_eq!(
        report.failed_by_reason.get("move_budget").copied(),
        Some(f.interrupted - 2)
    );
    // The default budget moves them all.
    let (all, g) = run(&w, faults(&["2:crash@20s"], None));
    assert_eq!(all.failed, 0);
    assert_eq!(g.migrations + g.restarted, g.interrupted);
}
