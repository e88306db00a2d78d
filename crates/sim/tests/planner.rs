//! The planner in the simulator: a burst of traffic on a planned fleet.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_mocker::{EngineArgs, PerfModel};
use switchyard_planner::{Mode, PlannerConfig, PredictorConfig};
use switchyard_router::routing::admission::SERVER_BUSY_KV_THRESHOLD;
use switchyard_router::{AdmissionConfig, PolicyKind, RoutingConfig};
use switchyard_sim::{
    PlannerSim, PreparedWorkload, SimConfig, SimReport, SlaTargets, TraceRequest, simulate,
};

/// 1 request/s for 5 minutes, 8/s for 5 minutes, 1/s for 10 minutes: 2,000-token
/// prompts, 400-token answers.
fn bursty() -> PreparedWorkload {
    step(2000, 400, 8.0)
}

/// 1 request/s for 5 minutes, `burst` a second for 5 minutes, 1/s for 10 minutes.
fn step(input_tokens: u32, output_tokens: u32, burst: f64) -> PreparedWorkload {
    let mut trace = Vec::new();
    let mut t = 0.0;
    while t < 1200.0 {
        trace.push(TraceRequest {
            arrival: Duration::from_secs_f64(t),
            input_tokens,
            output_tokens,
            hash_ids: Vec::new(),
            media: Vec::new(),
            turn: None,
        });
        t += if (300.0..600.0).contains(&t) {
            1.0 / burst
        } else {
            1.0
        };
    }
    PreparedWorkload::prepare(&trace, 512, 16, 1.0)
}

fn config(workers: u32, planner: Option<PlannerSim>) -> SimConfig {
    SimConfig {
        encoders: None,
        workers,
        // A small cache: the burst fills it.
        engine: EngineArgs {
            num_gpu_blocks: 2048,
            ..EngineArgs::default()
        },
        perf: vec![PerfModel::Polynomial],
        routing: RoutingConfig {
            admission: switchyard_router::AdmissionConfig::queue_only(),
            ..RoutingConfig::default()
        },
        event_delay: Duration::ZERO,
        eos_token_ids: Vec::new(),
        seed: 3,
        record_requests: false,
        lazy_engines: true,
        faults: Default::default(),
        planner,
        sla_targets: Some(SlaTargets {
            ttft: Duration::from_secs(2),
            itl: Duration::from_millis(60),
        }),
        disagg: None,
    }
}

fn planner(mode: Mode) -> PlannerSim {
    let mut config = PlannerConfig {
        mode,
        adjustment_interval: Duration::from_secs(10),
        ..PlannerConfig::default()
    };
    config.budget.max_gpus = 16;
    config.sla.ttft_target = Duration::from_secs(2);
    config.sla.itl_target = Duration::from_millis(60);
    config.sla.capacity_blocks = 2048;
    config.sla.block_size = 16;
    config.sla.predictor = PredictorConfig::Constant;
    PlannerSim {
        config,
        cold_start: Duration::from_secs(5),
    }
}

fn run(config: &SimConfig, workload: &PreparedWorkload) -> SimReport {
    simulate(config, workload, PolicyKind::Kv, &mut |_| {}).unwrap()
}

fn workers_over_time(report: &SimReport) -> Vec<(f64, u32)> {
    report
        .planner
        .as_ref()
        .unwrap()
        .decisions
        .iter()
        .map(|d| {
            let asked = d
                .actions
                .first()
                .map_or(d.replicas.values().sum(), |a| a.replicas);
            (d.at, asked)
        })
        .collect()
}

#[test]
fn both_planners_grow_the_fleet_for_a_burst_and_shrink_it_after_losing_nothing() {
    let workload = bursty();
    for mode in [Mode::Load, Mode::Sla] {
        let report = run(&config(1, Some(planner(mode))), &workload);
        let p = report.planner.as_ref().unwrap();
        let timeline = workers_over_time(&report);
        eprintln!(
            "{mode:?}: {:.3} GPU-hours, peak {}, final {}, SLA {:.3}\n{timeline:?}",
            p.gpu_hours,
            p.peak_workers,
            p.final_workers,
            report.sla.unwrap().share
        );
        // Nothing lost to scaling: removals drain.
        assert_eq!(report.completed, report.requests, "{mode:?}");
        assert_eq!(report.failed + report.rejected, 0, "{mode:?}");
        // More workers while the burst lasts, and fewer again after it.
        let before = timeline
            .iter()
            .filter(|(t, _)| *t < 290.0)
            .map(|x| x.1)
            .max();
        let during = timeline
            .iter()
            .filter(|(t, _)| (300.0..620.0).contains(t))
            .map(|x| x.1)
            .max();
        let at_end = timeline.last().unwrap().1;
        assert!(during > before, "{mode:?}: {timeline:?}");
        assert!(at_end < during.unwrap(), "{mode:?}: {timeline:?}");
        assert_eq!(p.peak_workers, during.unwrap().max(p.peak_workers));
        // Cheaper than running the peak all along.
        let span_hours = report.simulated_seconds / 3600.0;
        assert!(
            p.gpu_hours < 0.8 * f64::from(p.peak_workers) * span_hours,
            "{mode:?}: {} vs {} × {span_hours}",
            p.gpu_hours,
            p.peak_workers
        );
    }
}

#[test]
fn a_planned_fleet_meets_the_targets_a_fixed_small_one_misses() {
    let workload = bursty();
    let fixed = run(&config(1, None), &workload);
    let planned = run(&config(1, Some(planner(Mode::Sla))), &workload);
    let (f, p) = (fixed.sla.unwrap(), planned.sla.unwrap());
    eprintln!("fixed {f:?}\nplanned {p:?}");
    assert!(p.share > f.share + 0.1, "fixed {f:?} planned {p:?}");
    assert!(fixed.planner.is_none());
}

#[test]
fn behind_the_servers_admission_a_step_the_planner_lags_is_refused_not_queued() {
    // A 12× step of 8,000-token prompts: the planner needs a few intervals and cold starts
    // to catch up.
    let workload = step(8000, 200, 12.0);
    let run_with = |admission: AdmissionConfig| {
        // Engines with room for many requests: a queue inside them goes unseen.
        let mut planner = planner(Mode::Sla);
        planner.config.sla.capacity_blocks = 16_384;
        let mut config = config(1, Some(planner));
        config.engine.num_gpu_blocks = 16_384;
        config.routing.admission = admission;
        run(&config, &workload)
    };
    // The routing core's defaults: requests go to engines until their caches are nearly
    // full, and wait there behind the backlog.
    let engines_queue = run_with(AdmissionConfig::queue_only());
    // The servers' rules, with the TTFT target as the wait target: what would wait past
    // the target is refused at once, and what is admitted starts in time.
    let frontend_queues = run_with(AdmissionConfig {
        busy_kv_threshold: SERVER_BUSY_KV_THRESHOLD,
        wait_target: Some(Duration::from_secs(2)),
        ..AdmissionConfig::queue_only()
    });
    let (a, b) = (engines_queue.sla.unwrap(), frontend_queues.sla.unwrap());
    eprintln!(
        "engines queue: {a:?}, TTFT p99 {:.0} ms\nfrontend queues: {b:?}, refused {:?}, TTFT p99 {:.0} ms",
        engines_queue.ttft_ms.p99, frontend_queues.rejected_by_reason, frontend_queues.ttft_ms.p99,
    );
    assert_eq!(engines_queue.rejected, 0);
    assert!(engines_queue.ttft_ms.p99 > 2000.0);
    // Nothing lost: what was not refused at once was served, and in time.
    assert_eq!(
        frontend_queues.completed + frontend_queues.rejected,
        frontend_queues.requests
    );
    assert!(frontend_queues.rejected > 0);
    assert_eq!(
        frontend_queues.rejected_by_reason.get("wait_too_long"),
        Some(&frontend_queues.rejected)
    );
    assert!(frontend_queues.ttft_ms.p99 < 2000.0);
    // Refusing what would miss anyway keeps more of the rest within the targets.
    assert!(b.share > a.share, "{a:?} vs {b:?}");
}

#[test]
fn a_planned_run_is_the_same_stepping_engines_lazily_or_in_global_order() {
    let mut trace = bursty();
    trace.requests.truncate(1500);
    let lazy = config(1, Some(planner(Mode::Load)));
    let exact = SimConfig {
        lazy_engines: false,
        ..lazy.clone()
    };
    let a = run(&lazy, &trace);
    let b = run(&exact, &trace);
    // The same requests on the same workers at the same instants; only sums of floats
    // taken in another order (the decisions' mean ITLs) may differ in the last bits.
    assert_eq!(a.ttft_ms, b.ttft_ms);
    assert_eq!(a.itl_ms, b.itl_ms);
    assert_eq!(workers_over_time(&a), workers_over_time(&b));
    let (pa, pb) = (a.planner.unwrap(), b.planner.unwrap());
    assert_eq!(pa.gpu_hours, pb.gpu_hours);
    assert_eq!(
        (pa.peak_workers, pa.workers_added, pa.workers_removed),
        (pb.peak_workers, pb.workers_added, pb.workers_removed)
    );
}

#[test]
fn a_disaggregated_fleet_is_planned_pool_by_pool() {
    use switchyard_core::WorkerRole;
    // Prompts past the local-prefill threshold (the prefill pool works) and long answers
    // (the decode pool's cache fills during the burst).
    let mut trace = Vec::new();
    let mut t = 0.0;
    while t < 900.0 {
        trace.push(TraceRequest {
            arrival: Duration::from_secs_f64(t),
            input_tokens: 2000,
            output_tokens: 1200,
            hash_ids: Vec::new(),
            media: Vec::new(),
            turn: None,
        });
        t += if (200.0..500.0).contains(&t) {
            0.25
        } else {
            2.0
        };
    }
    let workload = PreparedWorkload::prepare(&trace, 512, 16, 1.0);
    for mode in [Mode::Load, Mode::Sla] {
        let mut plan = planner(mode);
        plan.config.budget.gpus_per_engine.prefill = 2;
        let config = SimConfig {
            workers: 2,
            disagg: Some(switchyard_sim::DisaggSim {
                prefill: 1,
                link: "ib".parse().unwrap(),
                kv_bytes_per_token: 131_072,
            }),
            ..config(2, Some(plan))
        };
        let report = run(&config, &workload);
        // Nothing lost to scaling (removals drain); a few requests of the burst's first
        // minute time out in the queue while the pools grow one worker per interval.
        assert_eq!(report.failed, 0, "{mode:?}");
        assert!(
            report.completed * 10 >= report.requests * 9,
            "{mode:?}: {} of {}",
            report.completed,
            report.requests
        );
        let p = report.planner.as_ref().unwrap();
        // Each pool is asked for on its own, and the burst grows the fleet.
        let roles: std::collections::BTreeSet<WorkerRole> = p
            .decisions
            .iter()
            .flat_map(|d| d.replicas.keys().copied())
            .collect();
        assert_eq!(
            roles,
            [WorkerRole::Prefill, WorkerRole::Decode]
                .into_iter()
                .collect(),
            "{mode:?}"
        );
        assert!(p.peak_workers > 2, "{mode:?}: {p:?}");
        let grown: std::collections::BTreeSet<WorkerRole> = p
            .decisions
            .iter()
            .flat_map(|d| d.actions.iter())
            .filter(|a| a.replicas > 1)
            .map(|a| a.role)
            .collect();
        // The load planner grows both (the prefill queue and the decode cache both pass
        // their thresholds); the SLA planner's model finds one prefill worker enough for
        // these prompts and grows the decode pool.
        let expected = match mode {
            Mode::Load => roles.clone(),
            Mode::Sla => [WorkerRole::Decode].into_iter().collect(),
        };
        assert_eq!(grown, expected, "{mode:?}");
        // GPU time counts each role's GPUs: at least the two workers it started with
        // (a prefill worker costs two GPUs here) all along.
        let span_hours = report.simulated_seconds / 3600.0;
        assert!(
            p.gpu_hours >= 3.0 * span_hours * 0.99,
            "{mode:?}: {}",
            p.gpu_hours
        );
        assert!(report.disagg.as_ref().unwrap().remote_prefills > 0);
    }
}
