//! Disaggregated prefill and decode in the simulator: prompts computed on prefill workers,
//! KV moved to decode workers, every request completed with its whole output.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::trace::MooncakeRecord;
use switchyard_mocker::{EngineArgs, PerfModel};
use switchyard_router::{DisaggConfig, PolicyKind, RoutingConfig};
use switchyard_sim::{
    DisaggSim, FaultConfig, Link, PreparedWorkload, SimConfig, SimError, SimReport, TraceRequest,
    simulate,
};

const BYTES_PER_TOKEN: u64 = 131_072;

fn workload(rows: usize) -> PreparedWorkload {
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
    PreparedWorkload::prepare(&trace, 512, 16, 1.0)
}

fn config(prefill: Option<u32>, link: &str, disagg: DisaggConfig) -> SimConfig {
    SimConfig {
        encoders: None,
        workers: 6,
        engine: EngineArgs::default(),
        perf: vec![PerfModel::Polynomial],
        routing: RoutingConfig {
            disagg,
            admission: switchyard_router::AdmissionConfig::queue_only(),
            ..RoutingConfig::default()
        },
        event_delay: Duration::ZERO,
        eos_token_ids: Vec::new(),
        seed: 5,
        record_requests: true,
        lazy_engines: true,
        faults: FaultConfig::default(),
        planner: None,
        sla_targets: None,
        disagg: prefill.map(|prefill| DisaggSim {
            prefill,
            link: link.parse::<Link>().unwrap(),
            kv_bytes_per_token: BYTES_PER_TOKEN,
        }),
    }
}

fn run(config: &SimConfig, workload: &PreparedWorkload) -> SimReport {
    simulate(config, workload, PolicyKind::Kv, &mut |_| {}).unwrap()
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
fn long_prompts_are_prefilled_remotely_and_their_kv_moves_to_the_decode_workers() {
    let w = workload(300);
    let report = run(&config(Some(2), "ib", DisaggConfig::default()), &w);
    all_complete(&report, &w);
    let d = report.disagg.clone().unwrap();
    assert_eq!((d.prefill_workers, d.decode_workers), (2, 4));
    assert_eq!(
        d.remote_prefills + d.local_short + d.local_saturated + d.local_unavailable,
        report.requests,
        "every request is either prefilled remotely or locally, once: {d:?}"
    );
    assert!(d.remote_prefills > report.requests / 2, "{d:?}");
    // What moved is the prompts' KV the decode workers lacked: at most every remotely
    // prefilled prompt whole.
    assert!(d.transferred_bytes > 0);
    let prompts: u64 = w
        .requests
        .iter()
        .map(|r| r.prompt.total_tokens() as u64)
        .sum();
    assert!(d.transferred_bytes + d.reused_tokens * BYTES_PER_TOKEN <= prompts * BYTES_PER_TOKEN);
    assert!(d.transfer_ms.p50 > 0.0);
    // Requests end on decode workers (slots 3..=6), never on a prefill worker.
    for record in &report.request_records {
        assert!(record.worker.unwrap().worker_id.0 > 2, "{record:?}");
    }
    // A run repeats exactly.
    assert_eq!(
        run(&config(Some(2), "ib", DisaggConfig::default()), &w),
        report
    );
}

#[test]
fn short_prompts_and_a_saturated_prefill_pool_stay_on_the_decode_worker() {
    let w = workload(120);
    let local = DisaggConfig {
        local_prefill_tokens: u64::MAX,
        ..DisaggConfig::default()
    };
    let report = run(&config(Some(2), "ib", local), &w);
    all_complete(&report, &w);
    let d = report.disagg.unwrap();
    assert_eq!(d.remote_prefills, 0);
    assert_eq!(d.local_short, report.requests);
    assert_eq!(d.transferred_bytes, 0);

    let saturated = DisaggConfig {
        local_prefill_tokens: 0,
        max_prefill_queue_tokens: 1,
    };
    let report = run(&config(Some(2), "ib", saturated), &w);
    all_complete(&report, &w);
    let d = report.disagg.unwrap();
    // The first prompt finds an empty queue; while one is queued the pool is saturated.
    assert!(d.remote_prefills > 0 && d.local_saturated > 0, "{d:?}");
}

#[test]
fn a_prefill_worker_lost_mid_transfer_costs_a_prefill_not_a_request() {
    let w = workload(200);
    // A slow link (0.5 GB/s): transfers take seconds, so a crash catches some.
    let mut cfg = config(Some(2), "0.5", DisaggConfig::default());
    cfg.faults = FaultConfig {
        schedule: vec!["1:crash@20s+30s".parse().unwrap()],
        ..FaultConfig::default()
    };
    let report = run(&cfg, &w);
    all_complete(&report, &w);
    let d = report.disagg.clone().unwrap();
    assert!(d.lost_transfers > 0, "{d:?}");
    let failures = report.failures.unwrap();
    assert_eq!(failures.faults, 1);
    assert!(failures.interrupted >= d.lost_transfers);
}

#[test]
fn a_fleet_needs_both_pools() {
    let w = workload(10);
    for prefill in [0, 6, 9] {
        let err = simulate(
            &config(Some(prefill), "ib", DisaggConfig::default()),
            &w,
            PolicyKind::Kv,
            &mut |_| {},
        )
        .unwrap_err();
        assert_eq!(
            err,
            SimError::DisaggSplit {
                prefill,
                workers: 6
            }
        );
    }
}

#[test]
fn decode_workers_failing_while_their_requests_prefill_elsewhere_lose_nothing() {
    // Found by a sweep of fault times: a crash at 5 s catches a request whose prefill
    // finished in the very step its decode worker's failure cancelled it (without care,
    // that stale token completed it early, and its second placement completed it again).
    let w = workload(400);
    for fault in ["4:crash@5s+20s", "4:crash@71s+20s", "3:hang@25s+10s"] {
        let mut cfg = config(Some(2), "ib", DisaggConfig::default());
        cfg.faults = FaultConfig {
            schedule: vec![fault.parse().unwrap()],
            ..FaultConfig::default()
        };
        let report = run(&cfg, &w);
        // Every request once, with its whole output, each token counted once (a token
        // of a prefill given up when its decode worker failed is not delivered).
        all_complete(&report, &w);
        assert_eq!(report.failures.unwrap().faults, 1, "{fault}");
    }
}
