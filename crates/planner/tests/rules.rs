//! The planner's rules on scripted metric sequences: a fleet whose workers appear as asked
//! (or not), at loads the test sets.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use switchyard_core::WorkerRole;
use switchyard_core::perf::PerfModel;
use switchyard_planner::{
    Action, Decision, Mode, Observation, Planner, PlannerConfig, TrafficSample, WorkerSample,
};

const AGG: WorkerRole = WorkerRole::Aggregated;
const PREFILL: WorkerRole = WorkerRole::Prefill;
const DECODE: WorkerRole = WorkerRole::Decode;

fn config() -> PlannerConfig {
    PlannerConfig {
        metric_interval: Duration::from_secs(1),
        adjustment_interval: Duration::from_secs(10),
        action_timeout: Duration::from_secs(60),
        ..PlannerConfig::default()
    }
}

/// A scripted fleet: the workers that exist, and the load each role shows.
struct Fleet {
    planner: Planner,
    now: Duration,
    /// Workers that exist, per role; follows the planner's actions unless `frozen`.
    workers: BTreeMap<WorkerRole, u32>,
    frozen: bool,
    kv: BTreeMap<WorkerRole, f64>,
    waiting: BTreeMap<WorkerRole, u32>,
    traffic: TrafficSample,
    /// Traffic per pull in turn, instead of `traffic`, when not empty.
    schedule: Vec<TrafficSample>,
    pulls: usize,
    decisions: Vec<Decision>,
}

impl Fleet {
    fn new(config: PlannerConfig, initial: &[(WorkerRole, u32)]) -> Fleet {
        let initial: BTreeMap<_, _> = initial.iter().copied().collect();
        Fleet {
            planner: Planner::new(config, &initial, PerfModel::Polynomial, Duration::ZERO).unwrap(),
            now: Duration::ZERO,
            workers: initial,
            frozen: false,
            kv: BTreeMap::new(),
            waiting: BTreeMap::new(),
            traffic: TrafficSample::default(),
            schedule: Vec::new(),
            pulls: 0,
            decisions: Vec::new(),
        }
    }

    fn observation(&self) -> Observation {
        let mut workers = Vec::new();
        for (&role, &n) in &self.workers {
            for _ in 0..n {
                workers.push(WorkerSample {
                    role,
                    kv_usage: self.kv.get(&role).copied().unwrap_or(0.0),
                    waiting: self.waiting.get(&role).copied().unwrap_or(0),
                    running: 0,
                });
            }
        }
        Observation {
            workers,
            traffic: self.traffic,
        }
    }

    /// Runs one adjustment interval (pull by pull); returns its decision.
    fn interval(&mut self) -> Decision {
        loop {
            self.now += Duration::from_secs(1);
            if !self.schedule.is_empty() {
                self.traffic = self.schedule[self.pulls % self.schedule.len()];
            }
            self.pulls += 1;
            let observation = self.observation();
            let tick = self.planner.tick(self.now, &observation);
            if !self.frozen {
                for Action { role, replicas } in &tick.actions {
                    self.workers.insert(*role, *replicas);
                }
            }
            if let Some(decision) = tick.decision {
                self.decisions.push(decision.clone());
                return decision;
            }
        }
    }

    fn asked(&self, role: WorkerRole) -> u32 {
        self.planner.replicas()[&role]
    }
}

fn actions(d: &Decision) -> Vec<(WorkerRole, u32)> {
    d.actions.iter().map(|a| (a.role, a.replicas)).collect()
}

#[test]
fn high_kv_usage_adds_one_decode_worker_per_interval() {
    let mut fleet = Fleet::new(config(), &[(PREFILL, 1), (DECODE, 2)]);
    fleet.kv.insert(DECODE, 0.95);
    assert_eq!(actions(&fleet.interval()), [(DECODE, 3)]);
    assert_eq!(actions(&fleet.interval()), [(DECODE, 4)]);
    // Decisions come at the adjustment interval, not at every pull.
    assert_eq!(fleet.now, Duration::from_secs(20));
    fleet.kv.insert(DECODE, 0.7);
    assert!(fleet.interval().actions.is_empty());
}

#[test]
fn no_decode_removal_during_the_grace_after_an_addition() {
    let mut fleet = Fleet::new(config(), &[(DECODE, 3)]);
    fleet.kv.insert(DECODE, 0.95);
    assert_eq!(actions(&fleet.interval()), [(DECODE, 4)]);
    // Load drops at once: three intervals of grace, then a removal.
    fleet.kv.insert(DECODE, 0.1);
    for i in 0..3 {
        let d = fleet.interval();
        assert!(d.actions.is_empty(), "interval {i}: {d:?}");
        assert!(
            d.reasons.iter().any(|r| r.contains("grace")),
            "{:?}",
            d.reasons
        );
    }
    assert_eq!(actions(&fleet.interval()), [(DECODE, 3)]);
}

#[test]
fn the_oscillation_guard_keeps_a_worker_the_rest_could_not_carry() {
    let mut fleet = Fleet::new(config(), &[(DECODE, 2)]);
    // 0.48 < 0.5, but one worker would run at 0.96 > 0.9.
    fleet.kv.insert(DECODE, 0.48);
    let d = fleet.interval();
    assert!(d.actions.is_empty());
    assert!(d.reasons.iter().any(|r| r.contains("would run at 0.96")));
    fleet.kv.insert(DECODE, 0.3);
    assert_eq!(actions(&fleet.interval()), [(DECODE, 1)]);
}

#[test]
fn zero_traffic_scales_to_the_minimum() {
    let mut c = config();
    c.budget.min_replicas = 2;
    let mut fleet = Fleet::new(c, &[(AGG, 5)]);
    // No load at all: no KV samples above zero, no queue.
    for expected in [4, 3, 2] {
        assert_eq!(actions(&fleet.interval()), [(AGG, expected)]);
    }
    assert!(fleet.interval().actions.is_empty());
    assert_eq!(fleet.asked(AGG), 2);
}

#[test]
fn a_role_with_no_worker_reporting_counts_as_idle_not_unknown() {
    let mut fleet = Fleet::new(config(), &[(PREFILL, 3), (DECODE, 1)]);
    // Prefill workers exist but none answers the pulls.
    fleet.frozen = true;
    fleet.workers.insert(PREFILL, 0);
    let d = fleet.interval();
    assert_eq!(d.interval.role(PREFILL).queue_per_worker, 0.0);
    assert_eq!(actions(&d), [(PREFILL, 2)]);
}

#[test]
fn decisions_wait_for_an_action_in_progress_and_give_up_after_the_timeout() {
    let mut c = config();
    c.action_timeout = Duration::from_secs(35);
    let mut fleet = Fleet::new(c, &[(DECODE, 2)]);
    fleet.frozen = true; // the new worker never comes
    fleet.kv.insert(DECODE, 0.95);
    assert_eq!(actions(&fleet.interval()), [(DECODE, 3)]);
    for _ in 0..3 {
        let d = fleet.interval();
        assert!(d.actions.is_empty());
        assert!(
            d.reasons.iter().any(|r| r.contains("waiting for 3 decode")),
            "{:?}",
            d.reasons
        );
    }
    // 35 s after asking, the planner stops waiting and decides again.
    let d = fleet.interval();
    assert!(
        d.reasons.iter().any(|r| r.contains("gave up waiting")),
        "{:?}",
        d.reasons
    );
    assert_eq!(actions(&d), [(DECODE, 4)]);
}

#[test]
fn an_action_is_over_once_the_fleet_shows_its_count_or_past_it() {
    let waiting = |d: &Decision| d.reasons.iter().any(|r| r.contains("waiting for"));
    let mut fleet = Fleet::new(config(), &[(DECODE, 2)]);
    fleet.frozen = true;
    fleet.kv.insert(DECODE, 0.95);
    assert_eq!(actions(&fleet.interval()), [(DECODE, 3)]);
    // One more than asked came up (a pod being replaced, say): the next decision is
    // taken, not held until the timeout.
    fleet.workers.insert(DECODE, 4);
    let d = fleet.interval();
    assert!(!waiting(&d), "{:?}", d.reasons);
    assert_eq!(actions(&d), [(DECODE, 4)]);
    // And a removal once as few remain (or fewer).
    let mut fleet = Fleet::new(config(), &[(PREFILL, 3)]);
    fleet.frozen = true;
    assert_eq!(actions(&fleet.interval()), [(PREFILL, 2)]);
    let d = fleet.interval();
    assert!(waiting(&d), "{:?}", d.reasons);
    fleet.workers.insert(PREFILL, 1);
    let d = fleet.interval();
    assert!(!waiting(&d), "{:?}", d.reasons);
}

#[test]
fn the_gpu_budget_caps_growth_and_counts_gpus_per_engine() {
    let mut c = config();
    c.budget.max_gpus = 6;
    c.budget.gpus_per_engine.decode = 2;
    let mut fleet = Fleet::new(c, &[(PREFILL, 2), (DECODE, 2)]);
    fleet.kv.insert(DECODE, 0.99);
    fleet.waiting.insert(PREFILL, 5);
    // 2·1 + 2·2 = 6 GPUs: nothing more fits.
    let d = fleet.interval();
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(d.reasons.iter().any(|r| r.contains("budget of 6 GPUs")));
}

#[test]
fn a_fleet_below_the_minimum_budget_grows() {
    let mut c = config();
    c.budget.min_gpus = 3;
    let mut fleet = Fleet::new(c, &[(AGG, 1)]);
    assert_eq!(actions(&fleet.interval()), [(AGG, 3)]);
}

#[test]
fn a_prefill_queue_grows_the_prefill_pool_unless_its_trend_is_falling() {
    let mut fleet = Fleet::new(config(), &[(PREFILL, 1), (DECODE, 1)]);
    fleet.kv.insert(DECODE, 0.7);
    fleet.waiting.insert(PREFILL, 2);
    assert_eq!(actions(&fleet.interval()), [(PREFILL, 2)]);
    // Still above 0.5 per worker, but falling 1 per interval: below within 3 intervals.
    fleet.waiting.insert(PREFILL, 1);
    let d = fleet.interval();
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(
        d.reasons.iter().any(|r| r.contains("trend")),
        "{:?}",
        d.reasons
    );
    // Flat from here: as the fall leaves the trend's window, the queue that stays wins.
    let mut added = None;
    for i in 0..5 {
        let d = fleet.interval();
        if !d.actions.is_empty() {
            assert_eq!(actions(&d), [(PREFILL, 3)]);
            added = Some(i);
            break;
        }
    }
    assert!(added.is_some_and(|i| i >= 1), "{added:?}");
}

#[test]
fn requests_queued_for_decode_grow_the_decode_pool_even_below_the_kv_threshold() {
    // Long prompts: the decode caches hold all they can at 0.8 of their blocks, and three
    // requests per decode worker wait for a place.
    let mut fleet = Fleet::new(config(), &[(PREFILL, 1), (DECODE, 2)]);
    fleet.kv.insert(DECODE, 0.8);
    fleet.waiting.insert(DECODE, 3);
    let d = fleet.interval();
    assert_eq!(actions(&d), [(DECODE, 3)]);
    assert!(
        d.reasons
            .iter()
            .any(|r| r.contains("decode queue 3.00 > 0.5")),
        "{:?}",
        d.reasons
    );
    // The queue is gone but the caches stay full: held, not removed.
    fleet.waiting.insert(DECODE, 0);
    for _ in 0..4 {
        assert!(fleet.interval().actions.is_empty());
    }
    // Idle caches, no queue, past the grace: one removed.
    fleet.kv.insert(DECODE, 0.2);
    assert_eq!(actions(&fleet.interval()), [(DECODE, 2)]);
    // Dynamo's rule (KV usage only) sees none of it.
    let mut fleet_dynamo = {
        let mut c = config();
        c.load.decode_queue = false;
        Fleet::new(c, &[(PREFILL, 1), (DECODE, 2)])
    };
    fleet_dynamo.kv.insert(DECODE, 0.8);
    fleet_dynamo.waiting.insert(DECODE, 3);
    let d = fleet_dynamo.interval();
    assert!(d.actions.is_empty(), "{d:?}");
}

/// The SLA planner sizes an aggregated fleet for the predicted traffic (at full
/// utilization, by the throughput model alone, shrinking as soon as it may: `tune`
/// changes that; bursts have their own tests).
fn sla_fleet(rate_per_interval: &[u64], tune: impl Fn(&mut PlannerConfig)) -> Vec<Decision> {
    let mut c = config();
    c.mode = Mode::Sla;
    c.sla.predictor = switchyard_planner::PredictorConfig::Constant;
    c.sla.correction = false;
    c.sla.target_utilization = 1.0;
    c.sla.burst_overflow = 0.0;
    c.sla.scale_down_intervals = 1;
    c.budget.max_gpus = 1000;
    tune(&mut c);
    let mut fleet = Fleet::new(c, &[(AGG, 1)]);
    rate_per_interval
        .iter()
        .map(|&requests| {
            // Spread over the interval's ten pulls.
            fleet.traffic = TrafficSample {
                requests: requests / 10,
                input_tokens: requests / 10 * 3000,
                output_tokens: requests / 10 * 150,
                finished: requests / 10,
                ..TrafficSample::default()
            };
            fleet.interval()
        })
        .collect()
}

#[test]
fn the_sla_planner_scales_with_predicted_demand() {
    let decisions = sla_fleet(&[100, 1000, 2000, 100, 0], |_| ());
    let after: Vec<u32> = decisions
        .iter()
        .map(|d| d.actions.first().map_or(d.replicas[&AGG], |a| a.replicas))
        .collect();
    // More traffic, more workers; twice the traffic, about twice the workers.
    assert!(after[1] > after[0], "{after:?}");
    assert!(
        after[2] >= 2 * after[1] - 1 && after[2] <= 2 * after[1] + 1,
        "{after:?}"
    );
    assert!(after[3] < after[2]);
    // No traffic: the minimum.
    assert_eq!(after[4], 1);
    // The decision records the prediction and the need behind it.
    let d = &decisions[1];
    let p = d.prediction.unwrap();
    assert!((p.rate - 100.0).abs() < 1e-9, "{p:?}");
    assert_eq!(p.isl, 3000.0);
    let need = d.need.unwrap();
    assert_eq!(after[1], need.aggregated as u32);
}

fn asked_over_time(decisions: &[Decision]) -> Vec<u32> {
    decisions
        .iter()
        .map(|d| d.actions.first().map_or(d.replicas[&AGG], |a| a.replicas))
        .collect()
}

#[test]
fn sla_headroom_sizes_for_the_target_utilization() {
    let full = asked_over_time(&sla_fleet(&[3000], |_| ()));
    let headroom = asked_over_time(&sla_fleet(&[3000], |c| c.sla.target_utilization = 0.5));
    assert!(full[0] >= 2, "{full:?}");
    assert!(
        headroom[0] >= 2 * full[0] - 1 && headroom[0] <= 2 * full[0],
        "{full:?} vs {headroom:?}"
    );
}

#[test]
fn square_root_staffing_keeps_more_room_for_a_small_fleet_than_for_a_large_one() {
    let bare = |requests: u64| {
        asked_over_time(&sla_fleet(&[requests], |c| c.sla.target_utilization = 1.0))[0]
    };
    let staffed = |requests: u64| {
        asked_over_time(&sla_fleet(&[requests], |c| {
            c.sla.target_utilization = 0.5; // not applied with square-root staffing
            c.sla.staffing_beta = 1.0;
        }))[0]
    };
    let (small, large) = (bare(600), bare(6000));
    assert!(small >= 1 && large >= 4 * small, "{small} vs {large}");
    for (need, asked) in [(small, staffed(600)), (large, staffed(6000))] {
        let n = f64::from(need);
        assert_eq!(asked, (n + n.sqrt()).ceil() as u32, "need {need}");
    }
    let room = |need: u32, asked: u32| f64::from(asked - need) / f64::from(need);
    assert!(room(small, staffed(600)) > room(large, staffed(6000)));
}

#[test]
fn sla_removals_wait_for_consecutive_decisions_and_additions_do_not() {
    let rates = [2000, 100, 100, 2000, 100, 100, 100, 100];
    let asked = asked_over_time(&sla_fleet(&rates, |c| c.sla.scale_down_intervals = 3));
    let peak = asked[0];
    assert!(peak > 1);
    // Two quiet intervals: held. Busy again: still the peak. Three quiet: down.
    assert_eq!(&asked[..6], &[peak; 6], "{asked:?}");
    assert!(asked[6] < peak, "{asked:?}");
    assert_eq!(asked[6], asked[7], "{asked:?}");
}

#[test]
fn sla_plans_over_budget_are_scaled_in_proportion() {
    let mut c = config();
    c.mode = Mode::Sla;
    c.sla.predictor = switchyard_planner::PredictorConfig::Constant;
    c.sla.correction = false;
    c.budget.max_gpus = 10;
    let mut fleet = Fleet::new(c, &[(PREFILL, 1), (DECODE, 1)]);
    fleet.traffic = TrafficSample {
        requests: 500,
        input_tokens: 500 * 8000,
        output_tokens: 500 * 400,
        finished: 500,
        ..TrafficSample::default()
    };
    let d = fleet.interval();
    let total: u32 = d.actions.iter().map(|a| a.replicas).sum();
    assert!(total <= 10, "{d:?}");
    assert!(d.actions.iter().all(|a| a.replicas >= 1));
    assert!(
        d.reasons
            .iter()
            .any(|r| r.contains("more than the budget of 10"))
    );
}

#[test]
fn a_decision_record_serialises_for_the_log() {
    let mut fleet = Fleet::new(config(), &[(DECODE, 2)]);
    fleet.kv.insert(DECODE, 0.95);
    let d = fleet.interval();
    let line = serde_json::to_value(&d).unwrap();
    assert_eq!(line["at"], 10.0);
    assert_eq!(line["actions"][0]["role"], "decode");
    assert_eq!(line["actions"][0]["replicas"], 3);
    assert_eq!(line["replicas"]["decode"], 2);
    assert!(
        (line["interval"]["roles"]["decode"]["kv_usage"]
            .as_f64()
            .unwrap()
            - 0.95)
            .abs()
            < 1e-9
    );
}

#[test]
fn encoders_and_empty_plans_are_refused() {
    let initial: BTreeMap<_, _> = [(WorkerRole::Encoder, 1)].into_iter().collect();
    let e = Planner::new(config(), &initial, PerfModel::Polynomial, Duration::ZERO).unwrap_err();
    assert_eq!(e.key, "roles");
    assert!(
        Planner::new(
            config(),
            &BTreeMap::new(),
            PerfModel::Polynomial,
            Duration::ZERO
        )
        .is_err()
    );
}

#[test]
fn a_deep_queue_brings_the_sla_decision_forward() {
    let run = |panic_queue: f64| {
        let mut c = config();
        c.mode = Mode::Sla;
        c.sla.panic_queue = panic_queue;
        c.budget.max_gpus = 100;
        let mut fleet = Fleet::new(c, &[(AGG, 2)]);
        fleet.waiting.insert(AGG, 6);
        fleet.traffic = TrafficSample {
            requests: 20,
            input_tokens: 20 * 4000,
            output_tokens: 20 * 200,
            finished: 20,
            ..TrafficSample::default()
        };
        let d = fleet.interval();
        (fleet.now, d)
    };
    // A third of the 10 s interval in: the first pull allowed to decide early.
    let (at, d) = run(4.0);
    assert_eq!(at, Duration::from_secs(4), "{d:?}");
    assert!(
        d.reasons
            .iter()
            .any(|r| r.contains("early decision: 6.0 requests waiting"))
    );
    // Planned for at least the rate seen so far (20 requests a second), though the
    // predictors have not seen an interval yet.
    assert!((d.prediction.unwrap().rate - 20.0).abs() < 1e-9, "{d:?}");
    assert!(d.actions[0].replicas > 2);
    let (at, _) = run(0.0);
    assert_eq!(at, Duration::from_secs(10));
}

#[test]
fn full_caches_bring_the_sla_decision_forward_when_nothing_queues() {
    // Behind the servers' admission nothing queues: the caches fill instead.
    let run = |panic_kv_usage: f64, kv: f64| {
        let mut c = config();
        c.mode = Mode::Sla;
        c.sla.panic_kv_usage = panic_kv_usage;
        c.budget.max_gpus = 100;
        let mut fleet = Fleet::new(c, &[(AGG, 2)]);
        fleet.kv.insert(AGG, kv);
        fleet.traffic = prompts_of(20, 4000);
        let d = fleet.interval();
        (fleet.now, d)
    };
    let (at, d) = run(0.75, 0.8);
    assert_eq!(at, Duration::from_secs(4), "{d:?}");
    assert!(
        d.reasons
            .iter()
            .any(|r| r.contains("early decision: 80 % of the KV cache in use (≥ 75 %)")),
        "{:?}",
        d.reasons
    );
    // Planned for the rate seen so far, as an early decision on a queue is.
    assert!((d.prediction.unwrap().rate - 20.0).abs() < 1e-9, "{d:?}");
    assert!(d.actions[0].replicas > 2);
    // Caches below the threshold, or the trigger off: the decision waits for the interval.
    assert_eq!(run(0.75, 0.7).0, Duration::from_secs(10));
    assert_eq!(run(0.0, 0.8).0, Duration::from_secs(10));
}

#[test]
fn aggregated_fleets_keep_room_on_the_time_sharing_need() {
    // Long prompts and long answers arriving evenly: the time-sharing need (each engine
    // prefilling and decoding within the ITL target) sizes the fleet, not the bursts.
    let run = |requests_per_pull: u64, utilization: f64| {
        let mut c = config();
        c.mode = Mode::Sla;
        c.sla.predictor = switchyard_planner::PredictorConfig::Constant;
        c.sla.correction = false;
        c.sla.ttft_target = Duration::from_secs(2);
        c.sla.time_sharing_utilization = utilization;
        c.budget.max_gpus = 1000;
        let mut fleet = Fleet::new(c, &[(AGG, 1)]);
        fleet.traffic = TrafficSample {
            output_tokens: requests_per_pull * 1000,
            ..prompts_of(requests_per_pull, 8000)
        };
        let last = (0..4).map(|_| fleet.interval()).last().unwrap();
        (last.need.unwrap(), fleet.asked(AGG))
    };
    let (at_one, asked_at_one) = run(17, 1.0);
    let (roomy, asked) = run(17, 0.85);
    // 17 requests a second at 0.85 are the workers of 20 a second at full utilization.
    let (busier, _) = run(20, 1.0);
    assert_eq!(roomy.aggregated, busier.aggregated, "{roomy:?} {busier:?}");
    assert!(roomy.aggregated > at_one.aggregated, "{roomy:?} {at_one:?}");
    assert!(
        at_one.aggregated > (at_one.decode + at_one.burst).ceil(),
        "{at_one:?}"
    );
    assert_eq!(f64::from(asked), roomy.aggregated);
    assert!(asked > asked_at_one);
    // The decode need and the bursts' room do not change with it.
    assert_eq!((roomy.decode, roomy.burst), (at_one.decode, at_one.burst));
}

/// An interval's traffic: `requests` prompts of `isl` tokens, 100 output tokens each.
fn prompts_of(requests: u64, isl: u64) -> TrafficSample {
    TrafficSample {
        requests,
        input_tokens: requests * isl,
        output_tokens: requests * 100,
        finished: requests,
        ..TrafficSample::default()
    }
}

/// An SLA fleet of 2 aggregated workers with a constant predictor, after two intervals of
/// two 1,000-token prompts each, now with 10 requests waiting per worker (so its next
/// decisions are early ones).
fn queued_after_quiet_intervals(tune: impl Fn(&mut PlannerConfig)) -> Fleet {
    let mut c = config();
    c.mode = Mode::Sla;
    c.sla.predictor = switchyard_planner::PredictorConfig::Constant;
    c.budget.max_gpus = 1000;
    tune(&mut c);
    let mut fleet = Fleet::new(c, &[(AGG, 2)]);
    fleet.traffic = prompts_of(2, 1000);
    fleet.interval();
    fleet.interval();
    fleet.waiting.insert(AGG, 10);
    fleet
}

#[test]
fn predictors_learn_every_interval_through_early_decisions() {
    // A burst of longer prompts behind a deep queue: from now on every decision is an
    // early one, a third of an interval after the last.
    let mut fleet = queued_after_quiet_intervals(|_| {});
    fleet.traffic = prompts_of(5, 8000);
    let decisions: Vec<Decision> = (0..8).map(|_| fleet.interval()).collect();
    for d in &decisions {
        assert!(
            d.reasons.iter().any(|r| r.starts_with("early decision")),
            "{:?}",
            d.reasons
        );
    }
    // The predictors still took one value per interval of time: they know the burst's
    // prompts (fed only at regular decisions, they would still predict 1,000 tokens).
    let p = decisions.last().unwrap().prediction.unwrap();
    assert_eq!(p.isl, 8000.0, "{p:?}");
    assert!((p.rate - 5.0).abs() < 1e-9, "{p:?}");
}

#[test]
fn an_early_decision_plans_for_the_prompts_of_its_interval() {
    // Quiet intervals of short prompts, then a queue behind prompts of `isl` tokens: the
    // early decision sizes for them, not for the predicted 1,000 of the quiet intervals.
    let run = |isl: u64| {
        let mut fleet = queued_after_quiet_intervals(|c| c.sla.correction = false);
        fleet.traffic = prompts_of(20, isl);
        let d = fleet.interval();
        assert!(d.reasons.iter().any(|r| r.starts_with("early decision")));
        d
    };
    let long = run(16_000);
    let p = long.prediction.unwrap();
    assert_eq!((p.isl, p.osl), (16_000.0, 100.0), "{p:?}");
    let short = run(1000);
    assert_eq!(short.prediction.unwrap().isl, 1000.0);
    let asked = |d: &Decision| d.actions.iter().map(|a| a.replicas).max().unwrap_or(2);
    assert!(asked(&long) > asked(&short), "{long:?}\n{short:?}");
}

#[test]
fn the_sla_plan_never_falls_below_the_last_interval() {
    let holt = |c: &mut PlannerConfig| {
        c.sla.predictor = switchyard_planner::PredictorConfig::Holt {
            alpha: 0.5,
            beta: 0.3,
        };
    };
    // Holt's trend after a fall predicts 760 requests, then 360, for the next intervals:
    // fewer than the 1,000 that just came.
    let falling = sla_fleet(&[3000, 3000, 2000, 1000, 1000], holt);
    let steady = sla_fleet(&[1000], holt);
    let last = falling.last().unwrap();
    assert!(
        (last.prediction.unwrap().rate - 100.0).abs() < 1e-9,
        "{last:?}"
    );
    assert_eq!(
        asked_over_time(&falling).last(),
        asked_over_time(&steady).last()
    );
}

#[test]
fn bursts_of_arrivals_keep_workers_free_to_prefill_them() {
    let prompts = |requests: u64| TrafficSample {
        requests,
        input_tokens: requests * 8000,
        output_tokens: requests * 100,
        finished: requests,
        ..TrafficSample::default()
    };
    let run = |clumped: bool, overflow: f64| {
        let mut c = config();
        c.mode = Mode::Sla;
        c.sla.predictor = switchyard_planner::PredictorConfig::Constant;
        c.sla.correction = false;
        c.sla.ttft_target = Duration::from_secs(2);
        c.sla.burst_overflow = overflow;
        c.budget.max_gpus = 1000;
        let mut fleet = Fleet::new(c, &[(AGG, 1)]);
        // 40 prompts of 8,000 tokens every 10 s interval: all at once, or 4 a pull.
        fleet.schedule = if clumped {
            let mut s = vec![prompts(40)];
            s.resize(10, TrafficSample::default());
            s
        } else {
            vec![prompts(4); 10]
        };
        let last = (0..4).map(|_| fleet.interval()).last().unwrap();
        (fleet, last)
    };
    let asked = |d: &Decision| d.actions.first().map_or(d.replicas[&AGG], |a| a.replicas);
    let (_, spread) = run(false, 0.08);
    let (mut clumps, clumped) = run(true, 0.08);
    let (s, c) = (spread.need.unwrap(), clumped.need.unwrap());
    // The same rate needs the same throughput; the clumps need room to prefill 320,000
    // tokens within 2 s: 0.92 of it (8 % may be over) at 48,500 tokens/s a worker is
    // 3 workers, five times what the spread-out prompts need.
    assert_eq!(s.aggregated, c.aggregated);
    assert!((c.burst - 5.0 * s.burst).abs() < 1e-6, "{s:?} {c:?}");
    let per_worker = 8000.0 / (PerfModel::Polynomial.prefill_ms(8000) / 1000.0) * 2.0;
    assert!(
        (c.burst - 0.92 * 320_000.0 / per_worker).abs() < 1e-6,
        "{c:?}"
    );
    assert!(asked(&clumped) > asked(&spread), "{clumped:?}");
    // Beside the decode need, not inside the time-sharing one.
    assert_eq!(f64::from(asked(&clumped)), (c.decode + c.burst).ceil());
    // Without burst sizing, the clumps change nothing.
    let (_, spread) = run(false, 0.0);
    let (_, clumped) = run(true, 0.0);
    assert_eq!(clumped.need.unwrap().burst, 0.0);
    assert_eq!(asked(&spread), asked(&clumped));
    // No traffic, no room kept for the bursts that came before: down to the minimum.
    clumps.schedule = vec![TrafficSample::default()];
    let quiet: Vec<Decision> = (0..3).map(|_| clumps.interval()).collect();
    assert_eq!(quiet[2].need.unwrap().burst, 0.0);
    assert_eq!(clumps.asked(AGG), 1);
}
