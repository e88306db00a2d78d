//! The planner: a state machine fed a fleet observation at every metric pull, deciding at
//! every adjustment interval. `tick(now, observation)` returns the replica counts to ask
//! for; connectors (virtual workers in the simulator, local processes, Kubernetes, none)
//! carry them out, and the next observations show whether they have.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use serde::Serialize;
use switchyard_core::WorkerRole;
use switchyard_core::perf::PerfModel;

use crate::config::{InvalidConfig, Mode, PlannerConfig};
use crate::load::{self, Vote};
use crate::observe::{IntervalAccumulator, IntervalSummary, Observation};
use crate::predict::Predictor;
use crate::sla::{self, Correction, Demand, Need, WorkerModel};

/// Ask for this many workers of this role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Action {
    pub role: WorkerRole,
    pub replicas: u32,
}

/// One adjustment, as the decision log records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Seconds since the planner started.
    pub at: f64,
    pub interval: IntervalSummary,
    /// SLA mode: the traffic predicted for the next interval, and the workers it needs.
    pub prediction: Option<Demand>,
    pub need: Option<Need>,
    pub correction: Option<Correction>,
    /// Replicas asked for before this decision.
    pub replicas: BTreeMap<WorkerRole, u32>,
    pub actions: Vec<Action>,
    pub reasons: Vec<String>,
}

/// What one tick produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tick {
    pub actions: Vec<Action>,
    /// Set when this tick ended an adjustment interval.
    pub decision: Option<Decision>,
}

const NO_FLOOR: Demand = Demand {
    rate: 0.0,
    isl: 0.0,
    osl: 0.0,
    hit_rate: 0.0,
};

#[derive(Debug, Clone, Copy, PartialEq)]
struct Pending {
    role: WorkerRole,
    replicas: u32,
    growing: bool,
    since: Duration,
}

/// Queue values kept for the trend.
const TREND_HISTORY: usize = 5;

#[derive(Debug)]
pub struct Planner {
    config: PlannerConfig,
    roles: Vec<WorkerRole>,
    replicas: BTreeMap<WorkerRole, u32>,
    pending: Vec<Pending>,
    /// Said since the last decision (actions completed or abandoned).
    notes: Vec<String>,
    started: Duration,
    interval_start: Duration,
    next_adjustment: Duration,
    accumulator: IntervalAccumulator,
    /// The traffic the predictors learn from: one value per adjustment interval of time,
    /// whatever decisions were taken early in between.
    learning: IntervalAccumulator,
    learning_start: Duration,
    /// Adjustments taken so far.
    intervals: u64,
    queue_history: BTreeMap<WorkerRole, VecDeque<f64>>,
    /// No removal of the role before this interval (a worker was just added).
    grace_until: BTreeMap<WorkerRole, u64>,
    requests: Predictor,
    isl: Predictor,
    osl: Predictor,
    last_hit_rate: f64,
    /// Requests of the last interval the predictors learned.
    last_requests: f64,
    perf: PerfModel,
    /// SLA mode: the counts wanted by the recent decisions that wanted fewer workers.
    smaller_wanted: Vec<BTreeMap<WorkerRole, u32>>,
    /// An early decision plans for at least the rate, and the prompt and output lengths,
    /// seen so far in its interval (zeros otherwise): the predictors still hold the
    /// traffic before the change that set it off, and their mean prompt, from the few
    /// requests of a quiet interval, can size the cache a burst needs too small.
    floor: Demand,
    /// Prompt tokens that arrived per pull over the burst history, oldest first.
    arrivals: VecDeque<u64>,
}

impl Planner {
    /// A planner for `initial` replicas of each planned role (aggregated, or prefill and
    /// decode), sizing with `perf` in SLA mode.
    pub fn new(
        config: PlannerConfig,
        initial: &BTreeMap<WorkerRole, u32>,
        perf: PerfModel,
        now: Duration,
    ) -> Result<Planner, InvalidConfig> {
        config.validate()?;
        if initial.is_empty() || initial.contains_key(&WorkerRole::Encoder) {
            return Err(InvalidConfig {
                key: "roles",
                problem: "plan aggregated, prefill or decode workers (encoders are not planned)"
                    .into(),
            });
        }
        let predictor = &config.sla.predictor;
        Ok(Planner {
            roles: initial.keys().copied().collect(),
            replicas: initial.clone(),
            pending: Vec::new(),
            notes: Vec::new(),
            started: now,
            interval_start: now,
            next_adjustment: now + config.adjustment_interval,
            accumulator: IntervalAccumulator::default(),
            learning: IntervalAccumulator::default(),
            learning_start: now,
            intervals: 0,
            queue_history: BTreeMap::new(),
            grace_until: BTreeMap::new(),
            requests: predictor.build(),
            isl: predictor.build(),
            osl: predictor.build(),
            last_hit_rate: 0.0,
            last_requests: 0.0,
            perf,
            smaller_wanted: Vec::new(),
            floor: NO_FLOOR,
            arrivals: VecDeque::new(),
            config,
        })
    }

    pub fn config(&self) -> &PlannerConfig {
        &self.config
    }

    /// The replicas asked for, per role.
    pub fn replicas(&self) -> &BTreeMap<WorkerRole, u32> {
        &self.replicas
    }

    /// When the next observation is due.
    pub fn next_pull(&self, now: Duration) -> Duration {
        now + self.config.metric_interval
    }

    /// Takes the fleet as pulled at `now`; at the end of an adjustment interval, decides.
    pub fn tick(&mut self, now: Duration, observation: &Observation) -> Tick {
        self.settle(now, observation);
        self.accumulator.add(&self.roles, observation);
        // The predictors learn on the cadence: an early decision's short interval is not
        // a value of their series (fed in, it reads as a fall or a jump), and decisions
        // taken early one after the other in a long burst would otherwise starve them.
        self.learning.add(&[], observation);
        self.arrivals.push_back(observation.traffic.input_tokens);
        while self.arrivals.len() > self.burst_pulls() {
            self.arrivals.pop_front();
        }
        let learned = now.saturating_sub(self.learning_start);
        if learned >= self.config.adjustment_interval {
            let summary = self.learning.finish(learned.as_secs_f64());
            self.learning_start = now;
            self.learn(&summary);
        }
        let panic = self.panic(now, observation);
        if now < self.next_adjustment && panic.is_none() {
            return Tick::default();
        }
        let seconds = now.saturating_sub(self.interval_start).as_secs_f64();
        let summary = self.accumulator.finish(seconds);
        self.interval_start = now;
        if panic.is_some() {
            // The cadence starts over from this early decision.
            self.next_adjustment = now + self.config.adjustment_interval;
        }
        while self.next_adjustment <= now {
            self.next_adjustment += self.config.adjustment_interval;
        }
        if let Some(reason) = &panic {
            self.notes.push(reason.clone());
        }
        self.intervals += 1;
        for &role in &self.roles {
            let history = self.queue_history.entry(role).or_default();
            history.push_back(summary.role(role).queue_per_worker);
            if history.len() > TREND_HISTORY {
                history.pop_front();
            }
        }
        // An early decision plans for at least the traffic seen so far in its interval.
        self.floor = match &panic {
            Some(_) if summary.traffic.requests > 0 => Demand {
                rate: summary.traffic.rate,
                isl: summary.traffic.isl,
                osl: summary.traffic.osl,
                hit_rate: 0.0,
            },
            _ => NO_FLOOR,
        };
        let decision = self.decide(now, summary);
        Tick {
            actions: decision.actions.clone(),
            decision: Some(decision),
        }
    }

    /// SLA mode: a queue this deep, or caches this full, at a pull are not left for the
    /// end of the interval.
    fn panic(&self, now: Duration, observation: &Observation) -> Option<String> {
        let threshold = self.config.sla.panic_queue;
        let kv_threshold = self.config.sla.panic_kv_usage;
        if self.config.mode != Mode::Sla
            || (threshold <= 0.0 && kv_threshold <= 0.0)
            || !self.pending.is_empty()
            // A third of an interval at least: a rate over a few seconds of a bursty trace
            // says little.
            || now.saturating_sub(self.interval_start) < self.config.adjustment_interval / 3
        {
            return None;
        }
        let planned: Vec<_> = observation
            .workers
            .iter()
            .filter(|w| self.roles.contains(&w.role))
            .collect();
        if planned.is_empty() {
            return None;
        }
        let waiting =
            planned.iter().map(|w| f64::from(w.waiting)).sum::<f64>() / planned.len() as f64;
        if threshold > 0.0 && waiting >= threshold {
            return Some(format!(
                "early decision: {waiting:.1} requests waiting per worker (≥ {threshold})"
            ));
        }
        let generating: Vec<f64> = planned
            .iter()
            .filter(|w| w.role.serves_generation())
            .map(|w| w.kv_usage.clamp(0.0, 1.0))
            .collect();
        if kv_threshold <= 0.0 || generating.is_empty() {
            return None;
        }
        let usage = generating.iter().sum::<f64>() / generating.len() as f64;
        (usage >= kv_threshold).then(|| {
            format!(
                "early decision: {:.0} % of the KV cache in use (≥ {:.0} %)",
                usage * 100.0,
                kv_threshold * 100.0
            )
        })
    }

    /// Pulls the burst sizing reads (none when it is off).
    fn burst_pulls(&self) -> usize {
        let sla = &self.config.sla;
        if sla.burst_overflow <= 0.0 {
            return 0;
        }
        let pull = self.config.metric_interval.as_secs_f64();
        (sla.burst_history.as_secs_f64() / pull).ceil() as usize
    }

    /// Workers whose prefill absorbs the bursts of the prompts that arrived, at the
    /// model's prefill rate and the hit rate last seen.
    fn burst_workers(&self, capacity: &sla::Capacity, hit_rate: f64) -> f64 {
        let sla = &self.config.sla;
        let ttft = sla.ttft_target.as_secs_f64();
        let window = (ttft / self.config.metric_interval.as_secs_f64()).round() as usize;
        let uncached = 1.0 - hit_rate.clamp(0.0, 1.0);
        let arrivals: Vec<f64> = self
            .arrivals
            .iter()
            .map(|&tokens| tokens as f64 * uncached)
            .collect();
        sla::burst_workers(
            &arrivals,
            window,
            capacity.prefill_tokens_per_s * ttft,
            sla.burst_overflow,
        )
    }

    /// Ends the scaling actions the fleet now shows done, or that took too long.
    fn settle(&mut self, now: Duration, observation: &Observation) {
        let timeout = self.config.action_timeout;
        let grace = u64::from(self.config.load.decode_grace_intervals);
        let intervals = self.intervals;
        let mut notes = Vec::new();
        let mut graced = Vec::new();
        self.pending.retain(|p| {
            let seen = observation.count(p.role);
            // Past the count is done too: a connector may show a worker more or fewer for
            // a while (a pod replaced, one leaving late), and waiting for the exact count
            // would block decisions until the timeout.
            let done = if p.growing {
                seen >= p.replicas
            } else {
                seen <= p.replicas
            };
            let expired = now.saturating_sub(p.since) >= timeout;
            if done || expired {
                if expired && !done {
                    notes.push(format!(
                        "gave up waiting for {} {} workers after {:?} (seeing {seen})",
                        p.replicas, p.role, timeout
                    ));
                }
                if p.growing {
                    graced.push(p.role);
                }
                false
            } else {
                true
            }
        });
        for role in graced {
            self.grace_until.insert(role, intervals + grace);
        }
        self.notes.extend(notes);
    }

    /// Feeds the predictors with the interval's traffic.
    fn learn(&mut self, summary: &IntervalSummary) {
        let t = &summary.traffic;
        self.requests.observe(t.requests as f64);
        self.last_requests = t.requests as f64;
        if t.requests > 0 {
            self.isl.observe(t.isl);
            self.last_hit_rate = t.hit_rate;
        }
        if t.osl > 0.0 {
            self.osl.observe(t.osl);
        }
    }

    fn decide(&mut self, now: Duration, summary: IntervalSummary) -> Decision {
        let mut decision = Decision {
            at: now.saturating_sub(self.started).as_secs_f64(),
            interval: summary,
            prediction: None,
            need: None,
            correction: None,
            replicas: self.replicas.clone(),
            actions: Vec::new(),
            reasons: std::mem::take(&mut self.notes),
        };
        if let Some(p) = self.pending.first() {
            decision.reasons.push(format!(
                "waiting for {} {} workers (asked {:.0} s ago)",
                p.replicas,
                p.role,
                now.saturating_sub(p.since).as_secs_f64()
            ));
            return decision;
        }
        let mut wanted = match self.config.mode {
            Mode::Load => self.load_targets(&mut decision),
            Mode::Sla => self.sla_targets(&mut decision),
        };
        self.apply_budget(&mut wanted, &mut decision.reasons);
        for (&role, &replicas) in &wanted {
            let current = self.replicas.get(&role).copied().unwrap_or(0);
            if replicas != current {
                decision.actions.push(Action { role, replicas });
                self.pending.push(Pending {
                    role,
                    replicas,
                    growing: replicas > current,
                    since: now,
                });
                self.replicas.insert(role, replicas);
            }
        }
        decision
    }

    fn load_targets(&self, decision: &mut Decision) -> BTreeMap<WorkerRole, u32> {
        let config = &self.config.load;
        let mut wanted = self.replicas.clone();
        for &role in &self.roles {
            let n = self.replicas.get(&role).copied().unwrap_or(0);
            let load = decision.interval.role(role);
            let in_grace = self
                .grace_until
                .get(&role)
                .is_some_and(|&g| self.intervals <= g);
            let history: Vec<f64> = self
                .queue_history
                .get(&role)
                .map(|h| h.iter().copied().collect())
                .unwrap_or_default();
            let kv = || load::kv_vote(config, load.kv_usage, n, in_grace);
            let verdict = match role {
                WorkerRole::Decode if config.decode_queue => {
                    load::combine(kv(), load::queue_vote(config, "decode queue", &history, n))
                }
                WorkerRole::Decode => kv(),
                WorkerRole::Prefill => load::queue_vote(config, "prefill queue", &history, n),
                _ => load::combine(kv(), load::queue_vote(config, "queue", &history, n)),
            };
            let target = match verdict.vote {
                Vote::Up => n + 1,
                Vote::Down => n.saturating_sub(1),
                Vote::Hold => n,
            };
            decision.reasons.push(format!("{role}: {}", verdict.reason));
            wanted.insert(role, target);
        }
        wanted
    }

    fn sla_targets(&mut self, decision: &mut Decision) -> BTreeMap<WorkerRole, u32> {
        let sla = &self.config.sla;
        let model = WorkerModel {
            perf: &self.perf,
            capacity_blocks: sla.capacity_blocks,
            block_size: sla.block_size,
            max_kv_usage: sla.max_kv_usage,
        };
        let seconds = self.config.adjustment_interval.as_secs_f64();
        // Sized for the predicted rate (over the target utilization, or with room for the
        // bursts seen), and never for less than the last interval brought: a trend
        // follower extrapolates a fall below it (on the step trace Holt predicted 0.2
        // req/s while 2 req/s arrived, and the fleet went from 9 workers to 1); fewer
        // workers wait for traffic that has fallen.
        let rate = (1..=sla.lookahead_intervals.max(1))
            .filter_map(|h| self.requests.predict_ahead(h))
            .fold(self.last_requests, f64::max);
        // Lengths not learned yet (an early first decision): this interval's.
        let seen = decision.interval.traffic;
        let demand = Demand {
            rate: (rate / seconds).max(self.floor.rate),
            isl: self.isl.predict().unwrap_or(seen.isl).max(self.floor.isl),
            osl: self.osl.predict().unwrap_or(seen.osl).max(self.floor.osl),
            hit_rate: self.last_hit_rate,
        };
        let square_root = sla.staffing_beta > 0.0;
        let bursts = sla.burst_overflow > 0.0;
        // The utilization headroom: all of it without burst sizing; with it, only decode
        // pools' (their bursts are not measured).
        let utilization = if square_root {
            1.0
        } else {
            sla.target_utilization
        };
        let sized = Demand {
            rate: if bursts {
                demand.rate
            } else {
                demand.rate / utilization
            },
            ..demand
        };
        let t = &decision.interval.traffic;
        let generating: Vec<WorkerRole> = self
            .roles
            .iter()
            .copied()
            .filter(|r| r.serves_generation())
            .collect();
        let running = generating
            .iter()
            .map(|&r| decision.interval.role(r).running_per_worker)
            .fold(0.0, f64::max);
        // The share of their time aggregated workers spent prefilling this interval.
        let prefill_share = if generating.contains(&WorkerRole::Aggregated) && t.isl >= 1.0 {
            let workers = f64::from(
                decision
                    .interval
                    .role(WorkerRole::Aggregated)
                    .workers
                    .max(1),
            );
            let per_prompt = self.perf.prefill_ms(t.isl as u32) / 1000.0;
            t.rate * (1.0 - t.hit_rate) * per_prompt / workers
        } else {
            0.0
        };
        let correction = if sla.correction {
            Correction::observed(
                &model,
                t.isl,
                t.osl,
                running,
                prefill_share,
                t.ttft_ms,
                t.itl_ms,
            )
        } else {
            Correction::default()
        };
        let ttft = sla.ttft_target.as_secs_f64() * 1000.0;
        let itl = sla.itl_target.as_secs_f64() * 1000.0;
        let mut need = sla::need(&model, &sized, ttft, itl, &correction);
        if bursts && sla.time_sharing_utilization < 1.0 {
            // Room on the time-sharing need too (the bursts' room sits beside the decode
            // need, and a large fleet's bursts are small beside its load).
            let busier = Demand {
                rate: sized.rate / sla.time_sharing_utilization,
                ..sized
            };
            need.aggregated = sla::need(&model, &busier, ttft, itl, &correction).aggregated;
        }
        // No traffic coming, no bursts to keep room for.
        if bursts && demand.rate > 0.0 {
            need.burst = self.burst_workers(&need.capacity, demand.hit_rate);
        }
        decision.reasons.push(format!(
            "predicted {:.2} req/s, {:.0} prompt tokens ({:.0} % cached), {:.0} output tokens: \
             {:.2} workers of prefill, {:.2} of decode, {} aggregated, {:.2} for bursts",
            demand.rate,
            demand.isl,
            demand.hit_rate * 100.0,
            demand.osl,
            need.prefill,
            need.decode,
            need.aggregated,
            need.burst
        ));
        if demand.rate > 0.0 && !need.capacity.ttft_reachable {
            decision.reasons.push(format!(
                "a {:.0}-token prompt alone takes longer than the TTFT target",
                demand.isl
            ));
        }
        if demand.rate > 0.0 && !need.capacity.itl_reachable {
            decision
                .reasons
                .push("a batch of one is slower than the ITL target".into());
        }
        let mut wanted = BTreeMap::new();
        for &role in &self.roles {
            let workers = match (role, bursts) {
                (WorkerRole::Prefill, true) => need.prefill.max(need.burst),
                (WorkerRole::Decode, true) => need.decode / utilization,
                (_, true) => need.aggregated.max(need.decode + need.burst),
                (WorkerRole::Prefill, false) => need.prefill,
                (WorkerRole::Decode, false) => need.decode,
                (_, false) => need.aggregated,
            };
            let workers = if square_root && workers > 0.0 {
                workers + sla.staffing_beta * workers.sqrt()
            } else {
                workers
            };
            wanted.insert(role, workers.ceil().min(f64::from(u32::MAX)) as u32);
        }
        decision.prediction = Some(demand);
        decision.need = Some(need);
        decision.correction = Some(correction);
        self.hold_scale_down(wanted, &mut decision.reasons)
    }

    /// Additions at once; a removal only once `scale_down_intervals` decisions in a row
    /// want one, to the largest count they wanted.
    fn hold_scale_down(
        &mut self,
        mut wanted: BTreeMap<WorkerRole, u32>,
        reasons: &mut Vec<String>,
    ) -> BTreeMap<WorkerRole, u32> {
        let min = self.config.budget.min_replicas;
        let fewer = wanted
            .iter()
            .any(|(r, &n)| n.max(min) < self.replicas.get(r).copied().unwrap_or(0));
        let more = wanted
            .iter()
            .any(|(r, &n)| n.max(min) > self.replicas.get(r).copied().unwrap_or(0));
        if !fewer || more {
            self.smaller_wanted.clear();
            // Roles that would shrink alongside a growing one keep their count.
            for (role, n) in wanted.iter_mut() {
                *n = (*n).max(self.replicas.get(role).copied().unwrap_or(0));
            }
            return wanted;
        }
        self.smaller_wanted.push(wanted.clone());
        let needed = self.config.sla.scale_down_intervals.max(1) as usize;
        if self.smaller_wanted.len() < needed {
            reasons.push(format!(
                "fewer workers wanted {} of {needed} decisions in a row: holding",
                self.smaller_wanted.len()
            ));
            return self.replicas.clone();
        }
        let mut target = BTreeMap::new();
        for recent in &self.smaller_wanted[self.smaller_wanted.len() - needed..] {
            for (&role, &n) in recent {
                let t = target.entry(role).or_insert(0);
                *t = (*t).max(n);
            }
        }
        self.smaller_wanted.clear();
        target
    }

    fn gpus(&self, replicas: &BTreeMap<WorkerRole, u32>) -> u64 {
        let per = &self.config.budget.gpus_per_engine;
        replicas
            .iter()
            .map(|(&r, &n)| u64::from(n) * u64::from(per.of(r)))
            .sum()
    }

    /// Keeps every role at its minimum and the total within the GPU budget. A load-based
    /// addition past the budget is refused; an SLA plan past it is scaled down in
    /// proportion; a fleet under the minimum budget grows its generating roles.
    fn apply_budget(&self, wanted: &mut BTreeMap<WorkerRole, u32>, reasons: &mut Vec<String>) {
        let budget = &self.config.budget;
        let per = &budget.gpus_per_engine;
        for n in wanted.values_mut() {
            *n = (*n).max(budget.min_replicas);
        }
        let max = u64::from(budget.max_gpus);
        if self.gpus(wanted) > max {
            match self.config.mode {
                Mode::Load => {
                    for (role, n) in wanted.iter_mut() {
                        let current = self.replicas.get(role).copied().unwrap_or(0);
                        if *n > current {
                            reasons.push(format!(
                                "{role}: no more workers within the budget of {max} GPUs"
                            ));
                            *n = current;
                        }
                    }
                }
                Mode::Sla => {
                    let factor = max as f64 / self.gpus(wanted) as f64;
                    reasons.push(format!(
                        "the plan needs {} GPUs, more than the budget of {max}: scaled by {factor:.2}",
                        self.gpus(wanted)
                    ));
                    for n in wanted.values_mut() {
                        *n = ((f64::from(*n) * factor).floor() as u32).max(budget.min_replicas);
                    }
                }
            }
            // Still over (minimums, rounding, a fleet started over budget): remove from
            // the largest role while it stays above its minimum.
            while self.gpus(wanted) > max {
                let Some((_, n)) = wanted
                    .iter_mut()
                    .filter(|(_, n)| **n > budget.min_replicas)
                    .max_by_key(|(r, n)| u64::from(**n) * u64::from(per.of(**r)))
                else {
                    reasons.push(format!(
                        "the minimum of {} workers per role exceeds the budget of {max} GPUs",
                        budget.min_replicas
                    ));
                    break;
                };
                *n -= 1;
            }
        }
        let min = u64::from(budget.min_gpus);
        let growing: Vec<WorkerRole> = wanted
            .keys()
            .copied()
            .filter(|r| r.serves_generation())
            .collect();
        let mut i = 0;
        while self.gpus(wanted) < min && !growing.is_empty() {
            let role = growing[i % growing.len()];
            if let Some(n) = wanted.get_mut(&role) {
                *n += 1;
            }
            i += 1;
            if i == 1 {
                reasons.push(format!("at least {min} GPUs by the budget"));
            }
        }
    }
}
