//! The event-driven simulator: one timed event queue drives the routing core and the
//! engines in virtual time.
//!
//! Everything that happens is an event at an instant: a request arrives (and is admitted,
//! queued or refused by the routing core, then routed and handed to its engine); an
//! engine's step ends and its tokens are delivered (first tokens end prefill in the router,
//! last tokens free the request and may release queued ones) and its KV events set off for
//! the indexer; a batch of KV events becomes visible after the event delay; a queued
//! request's wait runs out. The queue has room for what comes next (encodes finishing, KV
//! transfers, workers coming and going, faults, planner ticks) without changing the loop,
//! and any interaction between events is modelled in global time order.
//!
//! Order at one instant: arrivals, then KV event deliveries, then engine steps ending (by
//! worker), then the other timed events in the order they were scheduled. So a step ending
//! at the very instant of an arrival is delivered after it. An engine that finishes a step
//! with work left starts the next one at once, before queued requests released by that
//! step's completions are routed, as the servers' step driver does.
//!
//! Engines interact only through routing, and while nothing waits in the admission queue
//! nothing is routed except at arrivals: then the steps of different engines between two
//! arrivals (or other timed events) commute, and each engine is advanced on its own up to
//! the next one, its memory staying in cache, instead of step by step in global order. The
//! result is the same (a test runs both ways and compares); whenever a request waits in the
//! queue, every step is taken in global order, since any completion may release it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::Duration;

use switchyard_core::protocol::FinishReason;
use switchyard_core::{
    KvEvent, MediaSpan, Modality, RequestId, Token, TokenBlocks, WorkerId, WorkerKey, WorkerRole,
};
use switchyard_mocker::config::InvalidArgs;
use switchyard_mocker::tokens::{TokenRules, token_at};
use switchyard_mocker::{EngineArgs, MockEngine, MockRequest, PerfModel, StepOutput};
use switchyard_router::routing::encoders::{EncoderCost, EncoderPolicy, EncoderPool, MediaWork};
use switchyard_router::routing::health::Failure;
use switchyard_router::{
    Admission, Indexer, IndexerConfig, LocalReason, PairDecision, PolicyKind, Rejection,
    RouteQuery, RoutingConfig, RoutingCore, RoutingOverrides, WorkerSpec, WorkerTiming,
};
use thiserror::Error;

use crate::disagg::{DisaggReport, DisaggSim};
use crate::faults::{FailureReport, FaultConfig, FaultKind, ScheduledFault};
use crate::report::{
    LatencyRecorder, LoadSpread, MediaReport, RequestRecord, SimReport, Throughput,
};
use crate::scaling::{PlannerSim, SlaAttainment, SlaTargets};
use crate::workload::PreparedWorkload;

mod scale;

/// Workers tried for one request before it fails (as the servers do).
const MAX_DISPATCH_ATTEMPTS: usize = 3;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub workers: u32,
    pub engine: EngineArgs,
    /// The engines' timing: worker `i` runs `perf[i % perf.len()]` (one model: the same
    /// fleet-wide; several: a heterogeneous fleet). Each worker announces its own to the
    /// router, as workers do when they register.
    pub perf: Vec<PerfModel>,
    /// The routing core's settings (cache views, admission, policy parameters); the policy
    /// is chosen per run.
    pub routing: RoutingConfig,
    /// How long KV events take to reach the indexer.
    pub event_delay: Duration,
    /// Tokens that end a generation early, as the servers pass the tokenizer's
    /// end-of-sequence tokens; none: every request produces its whole output length.
    pub eos_token_ids: Vec<Token>,
    /// Seeds the engines' tokens (the model's seed) and the router's random choices.
    pub seed: u64,
    /// Keep a record of every request in the report.
    pub record_requests: bool,
    /// Advance engines on their own between arrivals while nothing is queued (see the
    /// module docs); off, every step is taken in global order. Same results either way.
    pub lazy_engines: bool,
    /// Worker failures to play, and the cost of moving requests off failed workers.
    pub faults: FaultConfig,
    /// Scale the fleet with a planner (`workers` is then the count it starts with).
    pub planner: Option<PlannerSim>,
    /// Count the requests that meet these latency targets.
    pub sla_targets: Option<SlaTargets>,
    /// Split the fleet into prefill and decode workers (the first `prefill` slots prefill).
    pub disagg: Option<DisaggSim>,
    /// Encoder workers for the requests' media; none: media needs no encoding time.
    pub encoders: Option<EncoderSim>,
}

/// A pool of encoder workers in front of the LLM workers.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderSim {
    pub count: usize,
    pub cost: EncoderCost,
    pub policy: EncoderPolicy,
    /// Joint routing: a request whose media is already cached on a worker (its KV blocks
    /// covering every item) skips the encoders and goes to such a worker; otherwise it is
    /// encoded, then routed on its own.
    pub joint: bool,
    /// Overlap: a request with media goes to its LLM worker at once, which prefills the
    /// text before its first media item while the encoders run (and other requests before
    /// it), then the rest once every item is encoded. Off: the worker gets it encoded.
    pub overlap: bool,
}

impl SimConfig {
    /// The timing model of the worker in `slot`.
    pub fn perf_of(&self, slot: usize) -> &PerfModel {
        const POLYNOMIAL: &PerfModel = &PerfModel::Polynomial;
        if self.perf.is_empty() {
            POLYNOMIAL
        } else {
            &self.perf[slot % self.perf.len()]
        }
    }
}

#[derive(Debug, Clone, PartialEq, Error)]
pub enum SimError {
    #[error("at least one worker is needed")]
    NoWorkers,
    #[error("invalid engine arguments: {0}")]
    Engine(#[from] InvalidArgs),
    #[error("the workload is cut into {workload}-token blocks but the engines use {engine}")]
    BlockSize { workload: u32, engine: u32 },
    #[error("invalid planner settings: {0}")]
    Planner(#[from] switchyard_planner::InvalidConfig),
    #[error(
        "a disaggregated fleet needs at least one prefill and one decode worker, got {prefill} of {workers}"
    )]
    DisaggSplit { prefill: u32, workers: u32 },
}

/// A timed event other than engine steps and KV event deliveries (which have their own
/// queues); room here for what later models add (encodes, transfers, faults, planner).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A queued request's wait is up.
    QueueTimeout(u32),
    /// The fault at this index of the plan strikes.
    Fault(u32),
    /// The frontend notices that the worker in this slot failed.
    Detected(u32),
    /// The worker in this slot is back, fresh.
    Recover(u32),
    /// A moved request's KV has arrived: (request, its move number).
    TransferDone(u32, u32),
    /// The planner pulls the fleet's metrics (and decides, at its interval).
    PlannerPull,
    /// A worker the planner asked for has started and takes requests.
    WorkerReady(u32),
    /// The encoder with this index finished its batch.
    EncodeDone(u32),
}

/// A worker slot's state.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    Up,
    /// Struck by a fault at `since`; `detected` once the frontend has taken it out.
    Failed {
        kind: FaultKind,
        since: Duration,
        detected: bool,
        back_at: Option<Duration>,
    },
    /// Asked for by the planner, starting (costs GPU time, takes no requests).
    Starting,
    /// Removed by the planner: takes nothing new, leaves when its requests finish.
    Draining,
    /// Gone.
    Retired,
}

#[derive(Debug, Clone, Copy, Default)]
struct RequestState {
    worker: Option<WorkerKey>,
    first_token: Option<Duration>,
    last_token: Duration,
    finished: Option<Duration>,
    output_tokens: u32,
    cached_tokens: u32,
    outcome: Outcome,
    /// Times it was sent again after a fault (restarts and migrations).
    moves: u32,
    /// When the fault that caught it struck, until its next token.
    interrupted_at: Option<Duration>,
    /// Moved: the router still counts its prompt as being computed on the new worker.
    prefilling_again: bool,
    /// Being prefilled on the prefill worker in this slot (disaggregated), for the
    /// decode worker in the other.
    remote_prefill: Option<(usize, usize)>,
    /// Its KV is being pulled from the prefill worker in this slot.
    pulling_from: Option<usize>,
    /// When it was last handed to an engine: tokens of an engine step that began before
    /// are from an earlier placement (cancelled, moved) and are dropped.
    placed_at: Duration,
    /// Its media items still being encoded, and since when.
    encoding: u32,
    encoding_since: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Outcome {
    #[default]
    Pending,
    Completed(FinishReason),
    Rejected(Rejection),
    /// No worker could take it.
    Failed,
}

struct Fleet<'a> {
    config: &'a SimConfig,
    workload: &'a PreparedWorkload,
    core: RoutingCore,
    indexer: Indexer,
    /// Whether the core takes each worker's KV events (refreshed when workers change).
    accepted: Vec<bool>,
    engines: Vec<MockEngine>,
    outputs: Vec<StepOutput>,
    /// When each engine's current step ends, if it is stepping.
    step_end: Vec<Option<Duration>>,
    queue: BinaryHeap<Reverse<(Duration, u64, Event)>>,
    next_seq: u64,
    /// KV event batches on their way to the indexer: (visible at, order, slot in
    /// `in_flight_events`), and emptied vectors for reuse.
    deliveries: BinaryHeap<Reverse<(Duration, u64, usize)>>,
    in_flight_events: Vec<Vec<KvEvent>>,
    free_slots: Vec<usize>,
    requests: Vec<RequestState>,
    ttft: LatencyRecorder,
    itl: LatencyRecorder,
    tpot: LatencyRecorder,
    e2e: LatencyRecorder,
    per_worker_requests: Vec<u64>,
    per_worker_prefill: Vec<u64>,
    report: SimReport,
    /// The time of the event being handled (arrivals, timed events, and steps taken in
    /// global order).
    now: Duration,
    /// The last instant a request arrived, got a token or was refused.
    last_event: Duration,
    slots: Vec<Slot>,
    /// The faults to play, by time.
    plan: Vec<ScheduledFault>,
    /// Requests moving with their KV, by index: (move number, target slot, the request).
    transfers: HashMap<u32, (u32, usize, MockRequest)>,
    failures: FailureReport,
    stall: LatencyRecorder,
    moved_e2e: LatencyRecorder,
    untouched_e2e: LatencyRecorder,
    /// The planner and its connector, when the fleet is planned.
    scaling: Option<scale::Scaling>,
    /// Each slot's role.
    roles: Vec<WorkerRole>,
    /// Remote prefills by the id the core tracks them under, to their request.
    prefill_ids: HashMap<RequestId, u32>,
    disagg: DisaggReport,
    transfer_time: LatencyRecorder,
    encoders: Option<EncoderPool>,
    media: MediaReport,
    /// Time to first token by request class (text, image, video, audio: the costliest
    /// modality it carries), kept only when the workload has media.
    ttft_by_class: BTreeMap<&'static str, LatencyRecorder>,
    has_media: bool,
    encode_wait: LatencyRecorder,
}

/// Runs the workload through the fleet with one policy. `progress` is told how many
/// requests have completed, now and then.
pub fn simulate(
    config: &SimConfig,
    workload: &PreparedWorkload,
    policy: PolicyKind,
    progress: &mut dyn FnMut(u64),
) -> Result<SimReport, SimError> {
    if config.workers == 0 {
        return Err(SimError::NoWorkers);
    }
    if workload.block_size != config.engine.block_size {
        return Err(SimError::BlockSize {
            workload: workload.block_size,
            engine: config.engine.block_size,
        });
    }
    if let Some(disagg) = &config.disagg
        && (disagg.prefill == 0 || disagg.prefill >= config.workers)
    {
        return Err(SimError::DisaggSplit {
            prefill: disagg.prefill,
            workers: config.workers,
        });
    }
    let mut fleet = Fleet::new(config, workload, policy)?;
    fleet.run(progress);
    Ok(fleet.finish())
}

impl<'a> Fleet<'a> {
    fn new(
        config: &'a SimConfig,
        workload: &'a PreparedWorkload,
        policy: PolicyKind,
    ) -> Result<Self, SimError> {
        let n = config.workers as usize;
        let mut routing = config.routing;
        routing.router.policy = policy;
        routing.router.seed = config.seed;
        routing.router.block_size = config.engine.block_size;
        let mut core = RoutingCore::new(routing);
        let mut engines = Vec::with_capacity(n);
        for slot in 0..config.workers {
            let key = worker_key(slot);
            let args = config.engine;
            if core
                .add_worker(worker_spec(config, slot, role_of(config, slot)))
                .is_err()
            {
                unreachable!("every simulated worker has the same block size");
            }
            engines.push(MockEngine::new(
                key,
                args,
                config.perf_of(slot as usize).clone(),
                config.seed,
            )?);
        }
        let accepted = (0..config.workers)
            .map(|slot| core.accepts_events(worker_key(slot).worker_id))
            .collect();
        let horizon = workload
            .requests
            .last()
            .map_or(Duration::ZERO, |r| r.arrival);
        let plan = config.faults.plan(config.workers, horizon, config.seed);
        let mut fleet = Fleet {
            config,
            workload,
            core,
            indexer: Indexer::new(IndexerConfig::default()),
            accepted,
            engines,
            outputs: (0..n).map(|_| StepOutput::default()).collect(),
            step_end: vec![None; n],
            queue: BinaryHeap::new(),
            next_seq: 0,
            deliveries: BinaryHeap::new(),
            in_flight_events: Vec::new(),
            free_slots: Vec::new(),
            requests: vec![RequestState::default(); workload.requests.len()],
            ttft: LatencyRecorder::default(),
            itl: LatencyRecorder::default(),
            tpot: LatencyRecorder::default(),
            e2e: LatencyRecorder::default(),
            per_worker_requests: vec![0; n],
            per_worker_prefill: vec![0; n],
            report: SimReport {
                requests: workload.requests.len() as u64,
                ..SimReport::default()
            },
            now: Duration::ZERO,
            last_event: Duration::ZERO,
            slots: vec![Slot::Up; n],
            plan,
            transfers: HashMap::new(),
            failures: FailureReport::default(),
            stall: LatencyRecorder::default(),
            moved_e2e: LatencyRecorder::default(),
            untouched_e2e: LatencyRecorder::default(),
            scaling: None,
            roles: (0..config.workers).map(|s| role_of(config, s)).collect(),
            prefill_ids: HashMap::new(),
            disagg: DisaggReport::default(),
            transfer_time: LatencyRecorder::default(),
            encoders: config
                .encoders
                .as_ref()
                .map(|e| EncoderPool::new(e.count, e.cost.clone(), e.policy)),
            media: MediaReport::default(),
            ttft_by_class: BTreeMap::new(),
            has_media: workload.requests.iter().any(|r| !r.media.is_empty()),
            encode_wait: LatencyRecorder::default(),
        };
        for i in 0..fleet.plan.len() {
            fleet.schedule(fleet.plan[i].at, Event::Fault(i as u32));
        }
        if let Some(planner) = &config.planner {
            fleet.scaling = Some(scale::Scaling::new(planner, config)?);
            fleet.schedule(planner.config.metric_interval, Event::PlannerPull);
        }
        Ok(fleet)
    }

    fn schedule(&mut self, at: Duration, event: Event) {
        self.queue.push(Reverse((at, self.next_seq, event)));
        self.next_seq += 1;
    }

    fn run(&mut self, progress: &mut dyn FnMut(u64)) {
        let arrivals = &self.workload.requests;
        let mut next_arrival = 0;
        let mut reported = 0;
        loop {
            let arrival = arrivals.get(next_arrival).map(|r| r.arrival);
            let timed = self.queue.peek().map(|Reverse((at, _, _))| *at);
            // The next moment something may be routed or may read the engines' state.
            let barrier = match (arrival, timed) {
                (Some(a), Some(t)) => Some(a.min(t)),
                (a, t) => a.or(t),
            };
            // A disaggregated fleet's engines interact through KV transfers too (a prefill
            // ending schedules its transfer): every step in global order.
            if self.config.lazy_engines && self.config.disagg.is_none() && self.core.queued() == 0 {
                self.advance_engines_until(barrier);
                self.deliver_until(barrier);
            } else if let Some(at) = self.next_internal(barrier) {
                // In global order: one delivery or one step before the barrier.
                self.now = at;
                self.take_internal(at);
                continue;
            }
            let arrival_first = match (arrival, timed) {
                (Some(a), Some(t)) => a <= t,
                (a, _) => a.is_some(),
            };
            match (arrival, timed) {
                (Some(a), _) if arrival_first => {
                    self.now = self.now.max(a);
                    self.arrive(next_arrival as u32);
                    next_arrival += 1;
                }
                (_, Some(_)) => {
                    if let Some(Reverse((at, _, event))) = self.queue.pop() {
                        self.now = self.now.max(at);
                        self.timed(event);
                    }
                }
                _ => {
                    if self.step_end.iter().all(Option::is_none) && self.deliveries.is_empty() {
                        break;
                    }
                }
            }
            if self.report.completed >= reported + 256 {
                reported = self.report.completed;
                progress(reported);
            }
        }
        progress(self.report.completed);
    }

    fn timed(&mut self, event: Event) {
        match event {
            Event::QueueTimeout(index) => {
                if self.core.withdraw(RequestId(u64::from(index)), self.now) {
                    self.refuse(index, Rejection::TimedOut);
                }
            }
            Event::Fault(i) => self.strike(i as usize),
            Event::Detected(slot) => self.take_out(slot as usize),
            Event::Recover(slot) => self.bring_back(slot as usize),
            Event::TransferDone(index, moves) => self.transfer_done(index, moves),
            Event::PlannerPull => self.planner_pull(),
            Event::WorkerReady(slot) => self.worker_ready(slot as usize),
            Event::EncodeDone(encoder) => self.encode_done(encoder as usize),
        }
    }

    /// Runs every engine on its own up to `barrier` (exclusive; to the end without one).
    fn advance_engines_until(&mut self, barrier: Option<Duration>) {
        for slot in 0..self.engines.len() {
            while let Some(end) = self.step_end[slot].filter(|&e| barrier.is_none_or(|b| e < b)) {
                self.step_done(slot, end);
            }
        }
    }

    /// Applies the KV events visible before `barrier` (all without one).
    fn deliver_until(&mut self, barrier: Option<Duration>) {
        while let Some(&Reverse((at, _, slot))) = self.deliveries.peek() {
            if barrier.is_some_and(|b| at >= b) {
                break;
            }
            self.deliveries.pop();
            self.deliver(slot);
        }
    }

    fn deliver(&mut self, slot: usize) {
        let mut events = std::mem::take(&mut self.in_flight_events[slot]);
        self.apply_events(&mut events);
        self.in_flight_events[slot] = events;
        self.free_slots.push(slot);
    }

    /// The time of the next delivery or step ending before `barrier`, if any.
    fn next_internal(&self, barrier: Option<Duration>) -> Option<Duration> {
        let delivery = self.deliveries.peek().map(|Reverse((at, _, _))| *at);
        let step = self.step_end.iter().flatten().min().copied();
        let next = match (delivery, step) {
            (Some(d), Some(s)) => Some(d.min(s)),
            (d, s) => d.or(s),
        }?;
        barrier.is_none_or(|b| next < b).then_some(next)
    }

    /// Takes the delivery, or else the first step ending, at `at`.
    fn take_internal(&mut self, at: Duration) {
        if let Some(&Reverse((when, _, slot))) = self.deliveries.peek()
            && when == at
        {
            self.deliveries.pop();
            self.deliver(slot);
            return;
        }
        if let Some(slot) = self.step_end.iter().position(|&e| e == Some(at)) {
            self.step_done(slot, at);
        }
    }

    fn arrive(&mut self, index: u32) {
        self.last_event = self.last_event.max(self.now);
        if let Some(scaling) = &mut self.scaling {
            scaling.traffic.requests += 1;
            scaling.traffic.input_tokens +=
                self.workload.requests[index as usize].prompt.total_tokens() as u64;
        }
        let priority = self.workload.requests[index as usize].priority;
        self.requests[index as usize].last_token = self.now;
        match self
            .core
            .admit(RequestId(u64::from(index)), priority, self.now)
        {
            Admission::Admitted => self.dispatch(index),
            Admission::Queued => {
                self.report.queued += 1;
                let timeout = self.core.queue_timeout(priority);
                self.schedule(self.now + timeout, Event::QueueTimeout(index));
            }
            Admission::Rejected(rejection) => self.refuse(index, rejection),
        }
    }

    fn refuse(&mut self, index: u32, rejection: Rejection) {
        self.last_event = self.last_event.max(self.now);
        self.requests[index as usize].outcome = Outcome::Rejected(rejection);
        self.report.rejected += 1;
        *self
            .report
            .rejected_by_reason
            .entry(rejection.name())
            .or_insert(0) += 1;
    }

    /// Routes an admitted request and hands it to its engine; a request with media goes to
    /// the encoders first (unless, with joint routing, a worker holds its media already).
    fn dispatch(&mut self, index: u32) {
        let request = &self.workload.requests[index as usize];
        if !request.media.is_empty() {
            self.media.requests += 1;
            self.media.items += request.media.len() as u64;
        }
        if self.encoders.is_some() && !request.media.is_empty() {
            let joint = self.config.encoders.as_ref().is_some_and(|e| e.joint);
            if joint && let Some(holders) = self.worth_skipping(index) {
                self.media.skipped += 1;
                self.route_to(index, &holders);
                return;
            }
            let Some(pool) = &mut self.encoders else {
                return;
            };
            let mut started = Vec::new();
            for span in &request.media {
                let work = MediaWork {
                    owner: u64::from(index),
                    modality: span.modality,
                    tokens: span.length,
                };
                if let Some(s) = pool.submit(work, self.now).1 {
                    started.push(s);
                }
            }
            self.requests[index as usize].encoding = request.media.len() as u32;
            self.requests[index as usize].encoding_since = self.now;
            for s in started {
                self.schedule(s.ends, Event::EncodeDone(s.encoder as u32));
            }
            if self.overlaps() {
                self.route_to(index, &[]);
            }
            return;
        }
        self.route_to(index, &[]);
    }

    fn route_to(&mut self, index: u32, only: &[WorkerId]) {
        let prompt = self.workload.requests[index as usize].prompt.clone();
        let output_tokens = self.workload.requests[index as usize].output_tokens;
        if only.is_empty() {
            self.place(index, prompt, output_tokens, 0, 0);
        } else {
            let others = (0..self.engines.len() as u32)
                .map(|slot| worker_key(slot).worker_id)
                .filter(|w| !only.contains(w))
                .collect();
            self.place_excluding(index, prompt, output_tokens, 0, 0, others);
        }
    }

    /// Joint routing: the routing core predicts the first token on every worker, those
    /// holding the request's media starting at once and the others after the encoders
    /// (their predicted finish for its items, plus moving the embeddings); when the
    /// soonest is a holder, the request goes there without encoding.
    fn worth_skipping(&mut self, index: u32) -> Option<Vec<WorkerId>> {
        // A disaggregated fleet routes pairs: restricting both to the holders would leave
        // one side empty. Encode there.
        if self.config.disagg.is_some() {
            return None;
        }
        let request = &self.workload.requests[index as usize];
        let end = request.media.iter().map(MediaSpan::end).max()?;
        let needed = end.div_ceil(u64::from(self.workload.block_size)) as u32;
        if needed as usize > request.prompt.full_blocks() {
            return None;
        }
        let pool = self.encoders.as_ref()?;
        let now = self.now;
        let encoded = request
            .media
            .iter()
            .map(|span| {
                let work = MediaWork {
                    owner: u64::from(index),
                    modality: span.modality,
                    tokens: span.length,
                };
                (0..pool.len())
                    .map(|e| pool.ready_at(e, &work, now))
                    .min()
                    .unwrap_or(now)
            })
            .max()
            .unwrap_or(now)
            .saturating_sub(now);
        let media_tokens: u64 = request.media.iter().map(|s| u64::from(s.length)).sum();
        let encode = encoded + pool.cost().transfer_time(media_tokens);
        let overlaps = self.indexer.find_matches_blocks(&request.prompt);
        let query = RouteQuery {
            id: RequestId(u64::from(index)),
            blocks: &request.prompt,
            overrides: RoutingOverrides::default(),
            exclude: &[],
        };
        match self
            .core
            .joint_media_choice(&query, &overlaps, needed, encode, now)?
        {
            (worker, false) => Some(vec![worker]),
            (_, true) => None,
        }
    }

    /// Whether requests go to their LLM worker while their media is encoded (not in
    /// disaggregated fleets, whose prefill workers hand over finished prompts).
    fn overlaps(&self) -> bool {
        self.config.disagg.is_none() && self.config.encoders.as_ref().is_some_and(|e| e.overlap)
    }

    /// Where a request's prefill stops while its media is encoded: its first media position.
    fn media_gate(&self, index: u32) -> Option<u32> {
        if self.requests[index as usize].encoding == 0 || !self.overlaps() {
            return None;
        }
        self.workload.requests[index as usize]
            .media
            .iter()
            .map(|span| span.offset)
            .min()
    }

    /// The encoder finished a batch: requests whose every item is encoded are routed.
    fn encode_done(&mut self, encoder: usize) {
        let Some(pool) = &mut self.encoders else {
            return;
        };
        let (done, next) = pool.finish(encoder, self.now);
        if let Some(s) = next {
            self.schedule(s.ends, Event::EncodeDone(s.encoder as u32));
        }
        for item in done {
            let index = item.owner as u32;
            let state = &mut self.requests[index as usize];
            state.encoding = state.encoding.saturating_sub(1);
            if state.encoding == 0 && state.outcome == Outcome::Pending {
                self.encode_wait
                    .record(micros(self.now - state.encoding_since));
                if !self.overlaps() {
                    self.route_to(index, &[]);
                    continue;
                }
                // Its worker has it already (or it is on its way over): release its gate.
                let Some(worker) = self.requests[index as usize].worker else {
                    continue;
                };
                let slot = slot_of(worker);
                self.core.media_ready(RequestId(u64::from(index)), self.now);
                if self.engines[slot].media_ready(RequestId(u64::from(index)))
                    && self.step_end[slot].is_none()
                    && self.slots[slot] != Slot::Retired
                {
                    self.start_step(slot, self.now);
                }
            }
        }
    }

    /// Routes a request (new, or moved with `generated` tokens streamed and `kv_tokens`
    /// tokens of KV readable on the worker it leaves) and hands it to an engine; a worker
    /// found crashed is excluded and counted against, and another tried, as the servers do.
    fn place(
        &mut self,
        index: u32,
        prompt: TokenBlocks,
        max_output_tokens: u32,
        generated: u32,
        kv_tokens: u32,
    ) {
        self.place_excluding(
            index,
            prompt,
            max_output_tokens,
            generated,
            kv_tokens,
            Vec::new(),
        );
    }

    /// [`Self::place`], never on the workers in `exclude`.
    fn place_excluding(
        &mut self,
        index: u32,
        prompt: TokenBlocks,
        max_output_tokens: u32,
        generated: u32,
        kv_tokens: u32,
        mut exclude: Vec<WorkerId>,
    ) {
        let id = RequestId(u64::from(index));
        let mut mock = MockRequest {
            id,
            prompt,
            max_output_tokens,
            generated,
            stream_key: id.0,
            stop_token_ids: self.config.eos_token_ids.clone(),
            rules: TokenRules::default(),
            earlier_output: Vec::new(),
            imported_tokens: 0,
            media_gate: self.media_gate(index),
            media: MediaSpan::extent(&self.workload.requests[index as usize].media),
        };
        loop {
            let overlaps = self.indexer.find_matches_blocks(&mock.prompt);
            let query = RouteQuery {
                id,
                blocks: &mock.prompt,
                overrides: RoutingOverrides {
                    media_pending: mock.media_gate.is_some(),
                    max_tokens: Some(mock.max_output_tokens),
                    ..RoutingOverrides::default()
                },
                exclude: &exclude,
            };
            let pair = if self.config.disagg.is_some() && generated == 0 {
                self.core.route_pair(&query, &overlaps, self.now)
            } else {
                self.core.route(&query, &overlaps, self.now).map(|decode| {
                    (
                        PairDecision {
                            decode,
                            prefill: None,
                        },
                        None,
                    )
                })
            };
            let Ok((
                PairDecision {
                    decode: decision,
                    prefill,
                },
                local,
            )) = pair
            else {
                self.fail(index);
                return;
            };
            if let Some(prefill) = prefill {
                match self.start_remote_prefill(index, &mut mock, decision.worker, prefill.worker) {
                    Ok(()) => return,
                    Err(crashed) => {
                        exclude.push(crashed);
                        if exclude.len() >= MAX_DISPATCH_ATTEMPTS {
                            self.fail(index);
                            return;
                        }
                        continue;
                    }
                }
            }
            match local {
                Some(LocalReason::Short) => self.disagg.local_short += 1,
                Some(LocalReason::Saturated) => self.disagg.local_saturated += 1,
                Some(LocalReason::Unavailable) => self.disagg.local_unavailable += 1,
                None => {}
            }
            let slot = slot_of(decision.worker);
            match self.slots[slot] {
                // A crashed worker refuses the connection: counted against it at once.
                Slot::Failed {
                    kind: FaultKind::Crash,
                    ..
                } => {
                    self.core.finish(id);
                    self.core.observe_failure(
                        decision.worker.worker_id,
                        Failure::Unreachable,
                        self.now,
                    );
                    exclude.push(decision.worker.worker_id);
                    if exclude.len() >= MAX_DISPATCH_ATTEMPTS {
                        self.fail(index);
                        return;
                    }
                    continue;
                }
                // A hung worker takes it and does nothing: it moves when the hang is found.
                Slot::Failed { .. } => {
                    self.requests[index as usize].worker = Some(decision.worker);
                    self.per_worker_requests[slot] += 1;
                    return;
                }
                // Neither is registered with the core, which cannot route to them.
                Slot::Starting | Slot::Retired => {
                    unreachable!("routed to a worker the core does not know")
                }
                Slot::Up | Slot::Draining => {}
            }
            if kv_tokens > 0
                && let Some(link) = self.config.faults.link
            {
                // Re-prefill what the target lacks, or send the KV over: the cheaper.
                let bytes = u64::from(kv_tokens) * self.config.faults.kv_bytes_per_token;
                let transfer = link.transfer_time(bytes);
                let recompute = Duration::from_secs_f64(
                    self.config
                        .perf_of(slot)
                        .prefill_ms(decision.prefill_tokens.min(u64::from(u32::MAX)) as u32)
                        / 1e3,
                );
                if transfer < recompute {
                    self.failures.by_transfer += 1;
                    self.failures.transferred_bytes += bytes;
                    mock.imported_tokens = kv_tokens;
                    let moves = self.requests[index as usize].moves;
                    self.requests[index as usize].worker = Some(decision.worker);
                    self.per_worker_requests[slot] += 1;
                    self.transfers.insert(index, (moves, slot, mock));
                    self.schedule(self.now + transfer, Event::TransferDone(index, moves));
                    return;
                }
            }
            if generated > 0 {
                self.failures.by_reprefill += 1;
                self.failures.recomputed_tokens += decision.prefill_tokens;
            }
            let gate = mock
                .media_gate
                .map(|g| (mock.prompt.total_tokens() as u64, u64::from(g)));
            match self.engines[slot].add_request(mock) {
                Ok(()) => {
                    if let Some((tokens, from)) = gate {
                        self.core.media_pending(id, tokens, from);
                    }
                    self.requests[index as usize].placed_at = self.now;
                    self.requests[index as usize].worker = Some(decision.worker);
                    self.per_worker_requests[slot] += 1;
                    if self.step_end[slot].is_none() {
                        self.start_step(slot, self.now);
                    }
                }
                Err(_) => {
                    // Every simulated engine has the same arguments: another one would
                    // refuse it too.
                    self.core.finish(id);
                    self.fail(index);
                }
            }
            return;
        }
    }

    fn fail(&mut self, index: u32) {
        self.requests[index as usize].outcome = Outcome::Failed;
        self.report.failed += 1;
    }

    // ---- disaggregation ----

    /// Hands a request's prompt to its prefill worker (for one token), the routing core
    /// having recorded both workers. A crashed worker of the pair refuses it: both records
    /// go, the failure is counted against it, and it is returned to be excluded.
    fn start_remote_prefill(
        &mut self,
        index: u32,
        mock: &mut MockRequest,
        decode: WorkerKey,
        prefill: WorkerKey,
    ) -> Result<(), WorkerId> {
        let id = RequestId(u64::from(index));
        for worker in [prefill, decode] {
            if let Slot::Failed {
                kind: FaultKind::Crash,
                ..
            } = self.slots[slot_of(worker)]
            {
                self.core.finish(id);
                self.core.prefill_finished(id);
                self.core
                    .observe_failure(worker.worker_id, Failure::Unreachable, self.now);
                return Err(worker.worker_id);
            }
        }
        let (pslot, dslot) = (slot_of(prefill), slot_of(decode));
        let state = &mut self.requests[index as usize];
        state.worker = Some(decode);
        state.remote_prefill = Some((pslot, dslot));
        self.per_worker_requests[dslot] += 1;
        self.prefill_ids.insert(id.prefill_stage(), index);
        self.disagg.remote_prefills += 1;
        if matches!(self.slots[pslot], Slot::Failed { .. }) {
            // Hung: it takes the prompt and does nothing, until the hang is found.
            return Ok(());
        }
        let prompt = MockRequest {
            max_output_tokens: 1,
            ..mock.clone()
        };
        self.requests[index as usize].placed_at = self.now;
        if self.engines[pslot].add_request(prompt).is_err() {
            // Too large for any engine of the fleet (they share their arguments).
            self.requests[index as usize].remote_prefill = None;
            self.prefill_ids.remove(&id.prefill_stage());
            self.core.prefill_finished(id);
            self.core.finish(id);
            self.fail(index);
            return Ok(());
        }
        if self.step_end[pslot].is_none() {
            self.start_step(pslot, self.now);
        }
        Ok(())
    }

    /// A remote prefill produced the request's first token: unless that ends it, its
    /// decode worker pulls the KV blocks it lacks and then generates the rest.
    fn remote_prefill_done(&mut self, index: u32, token: Token, pslot: usize, dslot: usize) {
        let id = RequestId(u64::from(index));
        self.core.prefill_finished(id);
        self.prefill_ids.remove(&id.prefill_stage());
        let request = &self.workload.requests[index as usize];
        let mut prompt = request.prompt.clone();
        let prompt_tokens = prompt.total_tokens() as u32;
        let Some(disagg) = self.config.disagg else {
            return;
        };
        let block_size = self.config.engine.block_size;
        let held = self.engines[dslot]
            .block_manager()
            .cached_prefix(prompt.sequence_hashes()) as u32
            * block_size;
        let held = held.min(prompt_tokens);
        let bytes = u64::from(prompt_tokens - held) * disagg.kv_bytes_per_token;
        let transfer = disagg.link.transfer_time(bytes);
        self.disagg.transferred_bytes += bytes;
        self.disagg.reused_tokens += u64::from(held);
        self.transfer_time.record(micros(transfer));
        prompt.extend(&[token]);
        let mock = MockRequest {
            id,
            prompt,
            max_output_tokens: request.output_tokens - 1,
            generated: 1,
            stream_key: id.0,
            stop_token_ids: self.config.eos_token_ids.clone(),
            rules: TokenRules::default(),
            earlier_output: Vec::new(),
            imported_tokens: prompt_tokens,
            media_gate: None,
            media: None,
        };
        let state = &mut self.requests[index as usize];
        state.remote_prefill = None;
        state.pulling_from = Some(pslot);
        state.prefilling_again = true;
        let moves = state.moves;
        self.transfers.insert(index, (moves, dslot, mock));
        self.schedule(self.now + transfer, Event::TransferDone(index, moves));
    }

    /// The prefill worker in `slot` failed: the decode workers pulling KV from it find it
    /// gone, and those requests are prefilled again elsewhere.
    fn transfers_lost(&mut self, slot: usize) {
        let mut caught: Vec<u32> = self
            .transfers
            .keys()
            .copied()
            .filter(|&i| self.requests[i as usize].pulling_from == Some(slot))
            .collect();
        caught.sort_unstable();
        for index in caught {
            self.disagg.lost_transfers += 1;
            self.requests[index as usize].pulling_from = None;
            self.core.finish(RequestId(u64::from(index)));
            self.move_request(index, FaultKind::Crash, self.now);
        }
    }

    // ---- faults ----

    /// The fault at `i` of the plan strikes its worker.
    fn strike(&mut self, i: usize) {
        let fault = self.plan[i];
        let slot = (fault.worker - 1) as usize;
        if self.slots[slot] != Slot::Up {
            return;
        }
        self.failures.faults += 1;
        *self
            .failures
            .faults_by_kind
            .entry(fault.kind.name())
            .or_insert(0) += 1;
        // Whatever the engine was computing never comes out.
        self.step_end[slot] = None;
        self.slots[slot] = Slot::Failed {
            kind: fault.kind,
            since: self.now,
            detected: false,
            back_at: fault.down_for.map(|d| self.now + d),
        };
        if self.config.disagg.is_some() && !fault.kind.kv_survives() {
            self.transfers_lost(slot);
        }
        let worker = worker_key(slot as u32).worker_id;
        let noticed = match fault.kind {
            FaultKind::Crash => self.config.faults.crash_detection,
            FaultKind::Hang => self.core.stall_timeout(worker),
            FaultKind::Drain => Duration::ZERO,
        };
        if noticed.is_zero() {
            self.take_out(slot);
        } else {
            self.schedule(self.now + noticed, Event::Detected(slot as u32));
        }
    }

    /// The frontend takes the failed worker in `slot` out of routing and moves its
    /// requests elsewhere.
    fn take_out(&mut self, slot: usize) {
        let Slot::Failed {
            kind,
            since,
            detected: false,
            back_at,
        } = self.slots[slot]
        else {
            return;
        };
        self.slots[slot] = Slot::Failed {
            kind,
            since,
            detected: true,
            back_at,
        };
        for id in self.unregister(slot) {
            let index = self.prefill_ids.remove(&id).unwrap_or(id.0 as u32);
            self.move_request(index, kind, since);
        }
        if let Some(at) = back_at {
            self.schedule(at.max(self.now), Event::Recover(slot as u32));
        }
    }

    /// The worker in `slot` leaves the routing core and the index; returns the requests
    /// still bound to it, in order.
    fn unregister(&mut self, slot: usize) -> Vec<RequestId> {
        let key = worker_key(slot as u32);
        let mut caught = self.core.remove_worker(key.worker_id);
        self.indexer.remove_worker(key);
        self.accepted[slot] = false;
        // Its KV events still on their way describe a cache that is gone.
        for events in &mut self.in_flight_events {
            events.retain(|e| e.worker() != key);
        }
        caught.sort_unstable();
        caught
    }

    /// Sends a request caught on a failed worker elsewhere: the prompt and the tokens
    /// streamed so far, for the rest of its output.
    fn move_request(&mut self, index: u32, kind: FaultKind, since: Duration) {
        self.transfers.remove(&index);
        let id = RequestId(u64::from(index));
        if let Some((pslot, _)) = self.requests[index as usize].remote_prefill.take() {
            // Caught mid-prefill (on either worker of its pair): both let it go.
            self.engines[pslot].cancel(id);
            self.core.prefill_finished(id);
            self.core.finish(id);
            self.prefill_ids.remove(&id.prefill_stage());
        }
        self.requests[index as usize].pulling_from = None;
        let state = &mut self.requests[index as usize];
        if state.outcome != Outcome::Pending {
            return;
        }
        self.failures.interrupted += 1;
        state.moves += 1;
        if state.moves > self.config.faults.max_migrations {
            self.failures.failed += 1;
            self.fail(index);
            return;
        }
        let generated = state.output_tokens;
        let workload = self.workload;
        let request = &workload.requests[index as usize];
        let mut prompt = request.prompt.clone();
        if generated == 0 {
            // Nothing reached the client: sent again as it came.
            self.failures.restarted += 1;
            self.place(index, prompt, request.output_tokens, 0, 0);
        } else {
            self.failures.migrations += 1;
            state.interrupted_at = Some(since);
            state.prefilling_again = true;
            let prompt_tokens = prompt.total_tokens() as u32;
            let seed = self.config.seed;
            let streamed: Vec<Token> = (0..generated)
                .map(|i| token_at(seed, u64::from(index), prompt_tokens + i))
                .collect();
            prompt.extend(&streamed);
            // The last streamed token was never fed through the model: its KV is not there.
            let kv_tokens = if kind.kv_survives() {
                prompt_tokens + generated - 1
            } else {
                0
            };
            let remaining = request.output_tokens - generated;
            self.place(index, prompt, remaining, generated, kv_tokens);
        }
        if self.requests[index as usize].outcome == Outcome::Failed {
            self.failures.failed += 1;
        }
    }

    /// A moved request's KV has arrived at its new worker.
    fn transfer_done(&mut self, index: u32, moves: u32) {
        let Some(&(expected, slot, _)) = self.transfers.get(&index) else {
            return;
        };
        if expected != moves {
            return;
        }
        let Some((_, _, mock)) = self.transfers.remove(&index) else {
            return;
        };
        self.requests[index as usize].pulling_from = None;
        if !matches!(self.slots[slot], Slot::Up | Slot::Draining) {
            // Hung: it sits there until the hang is found and it moves again.
            return;
        }
        self.requests[index as usize].placed_at = self.now;
        if self.engines[slot].add_request(mock).is_err() {
            self.core.finish(RequestId(u64::from(index)));
            self.failures.failed += 1;
            self.fail(index);
            return;
        }
        if self.step_end[slot].is_none() {
            self.start_step(slot, self.now);
        }
    }

    /// The worker in `slot` is back: a fresh engine with an empty cache.
    fn bring_back(&mut self, slot: usize) {
        let Slot::Failed {
            since,
            detected: true,
            ..
        } = self.slots[slot]
        else {
            return;
        };
        self.failures.worker_seconds_down += (self.now - since).as_secs_f64();
        let key = worker_key(slot as u32);
        let args = self.config.engine;
        let perf = self.config.perf_of(slot).clone();
        let Ok(engine) = MockEngine::new(key, args, perf, self.config.seed) else {
            unreachable!("the engine arguments were accepted at the start");
        };
        self.engines[slot] = engine;
        self.outputs[slot] = StepOutput::default();
        self.step_end[slot] = None;
        self.register(slot);
    }

    /// The worker in `slot` joins the routing core, up, and queued requests may go to it.
    fn register(&mut self, slot: usize) {
        self.slots[slot] = Slot::Up;
        if self
            .core
            .add_worker(worker_spec(self.config, slot as u32, self.roles[slot]))
            .is_err()
        {
            unreachable!("every simulated worker has the same block size");
        }
        self.accepted[slot] = self.core.accepts_events(worker_key(slot as u32).worker_id);
        self.release_queued();
    }

    /// Routes queued requests while the core releases them.
    fn release_queued(&mut self) {
        while let Some(id) = self.core.next_admitted(self.now) {
            self.dispatch(id.0 as u32);
        }
        for (id, _) in self.core.overdue(self.now) {
            self.refuse(id.0 as u32, Rejection::WaitTooLong);
        }
    }

    fn start_step(&mut self, slot: usize, now: Duration) {
        self.engines[slot].step(now, &mut self.outputs[slot]);
        self.per_worker_prefill[slot] += u64::from(self.outputs[slot].shape.prefill_tokens);
        self.step_end[slot] = Some(self.outputs[slot].finished_at());
    }

    /// The step of engine `slot` ending at `now`: its tokens are delivered, its KV events
    /// set off, and its next step started if it has work.
    fn step_done(&mut self, slot: usize, now: Duration) {
        self.last_event = self.last_event.max(now);
        let mut out = std::mem::take(&mut self.outputs[slot]);
        let mut freed = false;
        // A first token lowers the worker's queued prefill, which may make it not busy.
        let mut prefilled = false;
        for token in &out.tokens {
            let index = token.request.0 as usize;
            // A token of a placement since given up (the request was cancelled here and
            // moved, or is done): not the request's any more.
            let current = &self.requests[index];
            if current.outcome != Outcome::Pending || out.started_at < current.placed_at {
                continue;
            }
            let remote = self.requests[index]
                .remote_prefill
                .filter(|&(pslot, _)| pslot == slot);
            // A remote prefill's token: the request's first; it ends there only on a stop
            // token or a one-token answer.
            let finish = match remote {
                Some(_) if token.finish == Some(FinishReason::Stop) => token.finish,
                Some(_) if self.workload.requests[index].output_tokens <= 1 => {
                    Some(FinishReason::Length)
                }
                Some(_) => None,
                None => token.finish,
            };
            if let Some((pslot, dslot)) = remote {
                if finish.is_some() {
                    self.requests[index].remote_prefill = None;
                    self.core.prefill_finished(token.request);
                    self.prefill_ids.remove(&token.request.prefill_stage());
                } else {
                    self.remote_prefill_done(index as u32, token.token, pslot, dslot);
                }
            }
            let state = &mut self.requests[index];
            if let Some(since) = state.interrupted_at.take() {
                self.stall.record(micros(now - since));
            }
            if state.prefilling_again {
                state.prefilling_again = false;
                self.core.prefill_done(token.request, now);
            }
            if state.first_token.is_none() {
                let arrival = self.workload.requests[index].arrival;
                if let Some(scaling) = &mut self.scaling {
                    scaling.traffic.cached_tokens += u64::from(token.cached_tokens);
                    scaling.traffic.ttft_ms_sum += (now - arrival).as_secs_f64() * 1e3;
                    scaling.traffic.ttft_count += 1;
                }
                self.ttft.record(micros(now - arrival));
                if self.has_media {
                    self.ttft_by_class
                        .entry(media_class(&self.workload.requests[index].media))
                        .or_default()
                        .record(micros(now - arrival));
                }
                self.core.observe_ttft(now - arrival);
                self.core.prefill_done(token.request, now);
                prefilled = true;
                state.first_token = Some(now);
                state.cached_tokens = token.cached_tokens;
                self.report.prompt_tokens +=
                    self.workload.requests[index].prompt.total_tokens() as u64;
                self.report.cached_tokens += u64::from(token.cached_tokens);
            } else {
                if let Some(scaling) = &mut self.scaling {
                    scaling.traffic.itl_ms_sum += (now - state.last_token).as_secs_f64() * 1e3;
                    scaling.traffic.itl_count += 1;
                }
                self.itl.record(micros(now - state.last_token));
            }
            state.last_token = now;
            state.output_tokens += 1;
            self.report.output_tokens += 1;
            if let Some(reason) = finish {
                let arrival = self.workload.requests[index].arrival;
                self.e2e.record(micros(now - arrival));
                if let Some(first) = state.first_token.filter(|_| state.output_tokens > 1) {
                    self.tpot
                        .record(micros((now - first) / (state.output_tokens - 1)));
                }
                if state.moves > 0 {
                    self.moved_e2e.record(micros(now - arrival));
                    self.failures.completed_after_move += 1;
                } else if !self.plan.is_empty() {
                    self.untouched_e2e.record(micros(now - arrival));
                }
                state.finished = Some(now);
                state.outcome = Outcome::Completed(reason);
                if let Some(scaling) = &mut self.scaling {
                    scaling.traffic.output_tokens += u64::from(state.output_tokens);
                    scaling.traffic.finished += 1;
                }
                self.core.finish(token.request);
                self.report.completed += 1;
                if reason == FinishReason::Stop {
                    self.report.stopped_early += 1;
                }
                freed = true;
            }
        }
        if !out.events.is_empty() {
            if self.config.event_delay.is_zero() {
                self.apply_events(&mut out.events);
            } else {
                let slot = match self.free_slots.pop() {
                    Some(free) => free,
                    None => {
                        self.in_flight_events.push(Vec::new());
                        self.in_flight_events.len() - 1
                    }
                };
                std::mem::swap(&mut self.in_flight_events[slot], &mut out.events);
                let at = now + self.config.event_delay;
                self.deliveries.push(Reverse((at, self.next_seq, slot)));
                self.next_seq += 1;
            }
        }
        // A step that did nothing (every request held back by its media) would be followed
        // by another at the same instant: the engine idles until its media or a request
        // comes.
        let idle = out.shape.prefill_tokens == 0
            && out.shape.decode_seqs == 0
            && self.engines[slot].waiting_on_media();
        self.outputs[slot] = out;
        if self.engines[slot].has_work() && !idle {
            self.start_step(slot, now);
        } else {
            self.step_end[slot] = None;
            // A draining worker leaves once nothing is bound to it (requests prefilling
            // elsewhere for it, or with their KV on its way, still are).
            let bound = self.core.load(worker_key(slot as u32)).requests > 0;
            if self.slots[slot] == Slot::Draining && !bound {
                self.retire(slot);
            }
        }
        if freed || (prefilled && self.core.queued() > 0) {
            self.release_queued();
        }
    }

    /// Applies KV events from workers the core sees through events.
    fn apply_events(&mut self, events: &mut Vec<KvEvent>) {
        for event in events.drain(..) {
            if self
                .accepted
                .get(slot_of(event.worker()))
                .copied()
                .unwrap_or(false)
            {
                self.indexer.apply(&event);
            }
        }
    }

    fn finish(mut self) -> SimReport {
        debug_assert!(
            self.requests.iter().all(|r| r.outcome != Outcome::Pending)
                && self.core.active_requests() == 0
                && self.transfers.is_empty(),
            "the run ended with work in flight"
        );
        let end = self.last_event;
        let span = end.as_secs_f64().max(f64::MIN_POSITIVE);
        let r = &mut self.report;
        r.policy = self.core.config().router.policy.name().to_string();
        r.workers = self.config.workers;
        r.ttft_ms = self.ttft.distribution();
        if self.media.requests > 0 {
            let mut media = std::mem::take(&mut self.media);
            media.ttft_ms_by_class = self
                .ttft_by_class
                .iter()
                .map(|(class, rec)| (*class, rec.distribution()))
                .collect();
            if let Some(pool) = &self.encoders {
                let busy: Duration = pool.busy().iter().sum();
                media.encoders = pool.len() as u32;
                media.encoder_utilisation =
                    busy.as_secs_f64() / (span * pool.len() as f64).max(f64::MIN_POSITIVE);
                media.encode_wait_ms = self.encode_wait.distribution();
            }
            r.media = Some(media);
        }
        r.itl_ms = self.itl.distribution();
        r.tpot_ms = self.tpot.distribution();
        r.e2e_ms = self.e2e.distribution();
        r.throughput = Throughput {
            requests_per_sec: r.completed as f64 / span,
            output_tokens_per_sec: r.output_tokens as f64 / span,
        };
        r.cache_hit_rate = if r.prompt_tokens == 0 {
            0.0
        } else {
            r.cached_tokens as f64 / r.prompt_tokens as f64
        };
        r.preemptions = self.engines.iter().map(|e| e.stats().preemptions).sum();
        r.engine_steps = self.engines.iter().map(|e| e.stats().steps).sum();
        r.load_spread =
            LoadSpread::from_counts(&self.per_worker_requests, &self.per_worker_prefill);
        r.simulated_seconds = end.as_secs_f64();
        if let Some(targets) = self.config.sla_targets {
            r.sla = Some(attainment(targets, &self.requests, &self.workload.requests));
        }
        if let Some(disagg) = &self.config.disagg {
            let mut report = std::mem::take(&mut self.disagg);
            report.prefill_workers = disagg.prefill;
            report.decode_workers = self.config.workers - disagg.prefill;
            report.transfer_ms = self.transfer_time.distribution();
            self.report.disagg = Some(report);
        }
        if self.scaling.is_some() {
            let report = self.planner_report(end);
            self.report.planner = Some(report);
        }
        let r = &mut self.report;
        if self.config.faults.any() {
            let mut failures = std::mem::take(&mut self.failures);
            for slot in &self.slots {
                if let Slot::Failed { since, .. } = *slot {
                    failures.worker_seconds_down += end.saturating_sub(since).as_secs_f64();
                }
            }
            failures.stall_ms = self.stall.distribution();
            failures.moved_e2e_ms = self.moved_e2e.distribution();
            // With no fault drawn every request went untouched.
            failures.untouched_e2e_ms = if self.plan.is_empty() {
                self.e2e.distribution()
            } else {
                self.untouched_e2e.distribution()
            };
            r.failures = Some(failures);
        }
        if self.config.record_requests {
            r.request_records = self
                .requests
                .iter()
                .enumerate()
                .map(|(i, s)| RequestRecord {
                    id: i as u64,
                    arrival: self.workload.requests[i].arrival,
                    worker: s.worker,
                    first_token: s.first_token,
                    finished: s.finished,
                    output_tokens: s.output_tokens,
                    cached_tokens: s.cached_tokens,
                    outcome: match s.outcome {
                        Outcome::Pending => "pending",
                        Outcome::Completed(FinishReason::Length) => "length",
                        Outcome::Completed(FinishReason::Stop) => "stop",
                        Outcome::Completed(FinishReason::Cancelled) => "cancelled",
                        Outcome::Rejected(r) => r.name(),
                        Outcome::Failed => "failed",
                    },
                })
                .collect();
        }
        self.report
    }
}

/// The simulated worker in `slot`: ids from 1, as `switchyard serve` numbers its workers.
pub fn worker_key(slot: u32) -> WorkerKey {
    WorkerKey::new(u64::from(slot) + 1, 0)
}

/// What the simulated worker in `slot` announces (as the worker crate's `Mocker` does).
fn worker_spec(config: &SimConfig, slot: u32, role: WorkerRole) -> WorkerSpec {
    let args = &config.engine;
    let perf = config.perf_of(slot as usize);
    WorkerSpec {
        role,
        capacity_blocks: Some(u64::from(args.num_gpu_blocks)),
        max_num_seqs: Some(args.max_num_seqs),
        kv_events: args.enable_prefix_caching,
        timing: Some(WorkerTiming {
            perf: perf.clone(),
            max_batched_tokens: args.max_num_batched_tokens,
            capacity_blocks: u64::from(args.num_gpu_blocks),
        }),
        ..WorkerSpec::new(worker_key(slot).worker_id, args.block_size)
    }
}

/// The role of a worker the fleet starts with: the first `prefill` prefill, the others
/// decode, in a disaggregated fleet.
fn role_of(config: &SimConfig, slot: u32) -> WorkerRole {
    match &config.disagg {
        Some(d) if slot < d.prefill => WorkerRole::Prefill,
        Some(_) => WorkerRole::Decode,
        None => WorkerRole::Aggregated,
    }
}

fn slot_of(worker: WorkerKey) -> usize {
    (worker.worker_id.0 - 1) as usize
}

/// Requests that met the latency targets (their TTFT, and their mean inter-token latency).
fn attainment(
    targets: SlaTargets,
    states: &[RequestState],
    requests: &[crate::workload::PreparedRequest],
) -> SlaAttainment {
    let mut a = SlaAttainment {
        requests: states.len() as u64,
        ..SlaAttainment::default()
    };
    for (state, request) in states.iter().zip(requests) {
        let (Outcome::Completed(_), Some(first), Some(end)) =
            (state.outcome, state.first_token, state.finished)
        else {
            continue;
        };
        let ttft_ok = first.saturating_sub(request.arrival) <= targets.ttft;
        let gaps = state.output_tokens.saturating_sub(1);
        let itl_ok = gaps == 0 || end.saturating_sub(first) / gaps <= targets.itl;
        a.ttft_met += u64::from(ttft_ok);
        a.itl_met += u64::from(itl_ok);
        a.within += u64::from(ttft_ok && itl_ok);
    }
    a.share = if a.requests == 0 {
        1.0
    } else {
        a.within as f64 / a.requests as f64
    };
    a
}

/// A request's class for the per-class latencies: `text` without media, else its costliest
/// modality (video, then audio, then image).
fn media_class(media: &[MediaSpan]) -> &'static str {
    let has = |m: Modality| media.iter().any(|s| s.modality == m);
    if media.is_empty() {
        "text"
    } else if has(Modality::Video) {
        "video"
    } else if has(Modality::Audio) {
        "audio"
    } else {
        "image"
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}
