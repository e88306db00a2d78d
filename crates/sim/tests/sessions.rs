//! Session traces replayed closed loop: a turn is sent once what it waits for has ended.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::trace::MooncakeRecord;
use switchyard_mocker::{EngineArgs, PerfModel};
use switchyard_router::{PolicyKind, RoutingConfig};
use switchyard_sim::{PreparedWorkload, SimConfig, SimReport, TraceRequest, simulate};

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
        record_requests: true,
        lazy_engines: true,
        faults: Default::default(),
        planner: None,
        sla_targets: None,
        disagg: None,
    }
}

/// `sessions` conversations of `turns` turns each, started 40 ms apart: each turn's
/// prompt is the previous one's plus a block, sent `delay` + `tool` ms after it completes.
fn conversations(sessions: u64, turns: u64, delay: f64, tool: f64) -> Vec<MooncakeRecord> {
    let mut rows = Vec::new();
    for turn in 0..turns {
        for s in 0..sessions {
            let blocks = turn + 2;
            rows.push(MooncakeRecord {
                timestamp: if turn == 0 { s * 40 } else { 0 },
                input_length: blocks * 512,
                output_length: 20 + (s * 7 + turn * 13) % 60,
                hash_ids: (0..blocks).map(|b| s * 1000 + b).collect(),
                session_id: Some(format!("conversation-{s}")),
                delay: (turn > 0).then_some(delay),
                tool_wait_ms: (turn > 0).then_some(tool),
                ..MooncakeRecord::default()
            });
        }
    }
    rows
}

fn prepare(rows: &[MooncakeRecord], speedup: f64) -> PreparedWorkload {
    let trace = TraceRequest::from_trace(rows).unwrap();
    PreparedWorkload::prepare(&trace, 512, 16, speedup)
}

fn run(config: &SimConfig, workload: &PreparedWorkload) -> SimReport {
    simulate(config, workload, PolicyKind::Kv, &mut |_| {}).unwrap()
}

#[test]
fn a_turn_is_sent_its_wait_after_the_previous_one_completes() {
    let rows = conversations(12, 4, 150.0, 350.0);
    let report = run(&config(2), &prepare(&rows, 1.0));
    assert_eq!(report.completed, rows.len() as u64);
    let records = &report.request_records;
    // Rows are turn-major: row `turn * 12 + s` is session s's turn.
    let (mut cached, mut reusable) = (0, 0);
    for (index, record) in records.iter().enumerate() {
        let (turn, s) = (index / 12, index % 12);
        if turn == 0 {
            assert_eq!(record.arrival, Duration::from_millis(s as u64 * 40));
            continue;
        }
        let previous = &records[index - 12];
        assert_eq!(
            record.arrival,
            previous.finished.unwrap() + Duration::from_millis(500),
            "session {s} turn {turn}"
        );
        cached += u64::from(record.cached_tokens);
        reusable += rows[index - 12].input_length;
    }
    // Each prompt extends the previous turn's: the cache serves most of that part.
    assert!(
        cached * 2 > reusable,
        "{cached} of {reusable} tokens cached"
    );
    let sessions = report.sessions.as_ref().unwrap();
    assert_eq!(sessions.sessions, 12);
    assert_eq!(sessions.turns_max, 4);
    assert_eq!(sessions.requests_by_turn, [12, 12, 12, 12]);
    assert!((sessions.tool_seconds - 36.0 * 0.35).abs() < 1e-6);
    assert!((sessions.client_seconds - 36.0 * 0.15).abs() < 1e-6);
    let on_fleet: f64 = records
        .iter()
        .map(|r| (r.finished.unwrap() - r.arrival).as_secs_f64())
        .sum();
    assert!((sessions.fleet_seconds - on_fleet).abs() < 1e-6);
    // Halving the waits (a speedup of 2) sends later turns sooner.
    let fast = run(&config(2), &prepare(&rows, 2.0));
    let last = |r: &SimReport| r.request_records.iter().filter_map(|x| x.finished).max();
    assert!(
        last(&fast) < last(&report),
        "{:?} {:?}",
        last(&fast),
        last(&report)
    );
}

#[test]
fn fan_out_siblings_start_together_and_a_join_waits_for_all() {
    let rows: Vec<MooncakeRecord> = [
        r#"{"request_id":"plan","session_id":"main","timestamp":0,"input_length":2048,"output_length":40,"hash_ids":[1,2,3,4]}"#,
        r#"{"request_id":"sub-1","session_id":"s1","wait_for":["plan"],"input_length":2560,"output_length":90,"hash_ids":[1,2,3,4,5]}"#,
        r#"{"request_id":"sub-2","session_id":"s2","wait_for":["plan"],"input_length":2560,"output_length":30,"hash_ids":[1,2,3,4,6]}"#,
        r#"{"request_id":"sub-3","session_id":"s3","wait_for":["plan"],"delay":5,"input_length":2560,"output_length":60,"hash_ids":[1,2,3,4,7]}"#,
        r#"{"request_id":"join","session_id":"main","wait_for":["sub-1","sub-2","sub-3"],"delay":10,"tool_wait_ms":990,"input_length":3072,"output_length":10,"hash_ids":[1,2,3,4,8,9]}"#,
        r#"{"timestamp":20,"input_length":512,"output_length":10,"hash_ids":[77]}"#,
    ]
    .iter()
    .map(|l| MooncakeRecord::parse(l).unwrap())
    .collect();
    let report = run(&config(2), &prepare(&rows, 1.0));
    assert_eq!(report.completed, 6);
    let r = &report.request_records;
    let plan_done = r[0].finished.unwrap();
    assert_eq!(r[1].arrival, plan_done);
    assert_eq!(r[2].arrival, plan_done);
    assert_eq!(r[3].arrival, plan_done + Duration::from_millis(5));
    let last_sub = r[1..4].iter().map(|x| x.finished.unwrap()).max().unwrap();
    assert!(
        last_sub > r[2].finished.unwrap(),
        "the longest sibling ends last"
    );
    assert_eq!(r[4].arrival, last_sub + Duration::from_secs(1));
    assert_eq!(r[5].arrival, Duration::from_millis(20));
}

#[test]
fn lazy_engines_and_global_order_agree_on_sessions() {
    // Enough sessions to keep 3 workers busy, waits short next to a step's length and
    // some of them zero: released turns arrive while engines run.
    for (delay, tool) in [(0.0, 0.0), (2.0, 0.0), (30.0, 400.0)] {
        let rows = conversations(40, 5, delay, tool);
        let workload = prepare(&rows, 1.0);
        let lazy = run(&config(3), &workload);
        let exact = run(
            &SimConfig {
                lazy_engines: false,
                ..config(3)
            },
            &workload,
        );
        assert_eq!(lazy.completed, rows.len() as u64);
        assert_eq!(
            lazy.request_records, exact.request_records,
            "waits {delay} + {tool} ms"
        );
        assert_eq!(lazy.ttft_ms, exact.ttft_ms);
    }
}

#[test]
fn closed_loop_sends_turns_no_sooner_than_their_answers() {
    // The same conversations as a flat trace, each turn at the time its session's previous
    // turn was sent plus 500 ms (a trace recorded from a fast fleet): open loop, a turn can
    // be sent before the answer it follows has come back; closed loop, never.
    let sessions = conversations(30, 4, 0.0, 500.0);
    let mut flat = sessions.clone();
    for (index, row) in flat.iter_mut().enumerate() {
        let (turn, s) = ((index / 30) as u64, (index % 30) as u64);
        row.timestamp = s * 40 + turn * 500;
        row.session_id = None;
        row.delay = None;
        row.tool_wait_ms = None;
    }
    let closed = run(&config(1), &prepare(&sessions, 1.0));
    let open = run(&config(1), &prepare(&flat, 1.0));
    let early = |r: &SimReport| {
        (30..r.request_records.len())
            .filter(|&i| r.request_records[i].arrival < r.request_records[i - 30].finished.unwrap())
            .count()
    };
    assert_eq!(early(&closed), 0);
    assert!(open.sessions.is_none());
    assert!(
        early(&open) > 30,
        "{} turns sent before their answer",
        early(&open)
    );
}
