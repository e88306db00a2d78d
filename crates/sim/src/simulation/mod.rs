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
//! Each request's life (tries, exclusions, backoffs, moves, the migration budget, waiting
//! for a worker, media before a remote prefill) is decided by the same
//! [`switchyard_router::RequestLife`] the servers' pipeline drives; this loop keeps only
//! the time and the engines.
//!
//! Files: [`place`] (admission, routing and placement of a request), [`media`] (encoders,
//! joint routing, media gates), [`steps`] (engine steps and KV events), [`faults`]
//! (failures and moves), [`disagg`] (remote prefill and KV pulls), [`outcome`] (the
//! report), [`scale`] (the planner's connector).
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

use rand::SeedableRng;
use rand::rngs::SmallRng;
use switchyard_core::protocol::FinishReason;
use switchyard_core::{
    KvEvent, MediaSpan, Modality, RequestId, Token, WorkerId, WorkerKey, WorkerRole,
};
use switchyard_mocker::config::InvalidArgs;
use switchyard_mocker::{EngineArgs, MockEngine, MockRequest, PerfModel, StepOutput};
use switchyard_multimodal::store::AfterPrefill;
use switchyard_router::routing::encoders::{EncoderCost, EncoderPolicy};
use switchyard_router::{
    Admission, Indexer, IndexerConfig, PolicyKind, Rejection, RequestLife, RoutingConfig,
    RoutingCore, WorkerSpec, WorkerTiming,
};
use thiserror::Error;

use crate::disagg::{DisaggReport, DisaggSim};
use crate::faults::{FailureReport, FaultConfig, FaultKind, ScheduledFault};
use crate::report::{LatencyRecorder, MediaReport, SimReport};
use crate::scaling::{PlannerSim, SlaTargets};
use crate::workload::PreparedWorkload;

mod disagg;
mod faults;
mod media;
mod outcome;
mod place;
mod scale;
mod sessions;
mod steps;

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
    /// Seeds the engines' tokens (the model's seed), the faults drawn and the backoffs'
    /// jitter; the router's own seed is `routing.router.seed`.
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
    /// covering every item) skips the encoders and goes to such a worker when it is
    /// predicted to give the first token soonest; otherwise it is encoded.
    pub joint: bool,
    /// Overlap: a request with media goes to its LLM worker at once, which prefills the
    /// text before its first media item while the encoders run (and other requests before
    /// it), then the rest once every item is encoded (a remote prefill waits for them).
    /// Off: the worker gets it encoded.
    pub overlap: bool,
    /// The frontend's feature store: encoded items are kept (up to this many bytes) while
    /// a request holds them, and after as `after_prefill` says; an item held needs no
    /// encoding, one being encoded for another request is waited for.
    pub store_bytes: u64,
    pub after_prefill: AfterPrefill,
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
    /// A request's backoff after a failed try is over: it is tried again.
    Retry(u32),
    /// A request waiting for a worker to join or recover waited as long as it may.
    WaitOver(u32),
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
    /// When it was sent (its trace arrival, or when its session released it).
    arrived: Duration,
    /// When it ended: completed, refused or failed.
    ended: Option<Duration>,
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
    /// Caught by a fault at least once.
    caught: bool,
    /// Being prefilled on the prefill worker in this slot (disaggregated), for the
    /// decode worker in the other.
    remote_prefill: Option<(usize, usize)>,
    /// The worker holding its media's KV (joint routing: they were not encoded), which
    /// it is pinned to.
    holder: Option<WorkerId>,
    /// It waits for its media to be encoded before it is routed (its pair had a remote
    /// prefill, which needs them).
    route_when_encoded: bool,
    /// It waits for a worker to join or recover.
    waiting_for_worker: bool,
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
    /// Its life gave up (the reason's name).
    Failed(&'static str),
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
    /// The encoders and the frontend's feature store and ledger, with encoders.
    media_life: Option<media::MediaLife>,
    media: MediaReport,
    /// Time to first token by request class (text, image, video, audio: the costliest
    /// modality it carries), kept only when the workload has media.
    ttft_by_class: BTreeMap<&'static str, LatencyRecorder>,
    has_media: bool,
    encode_wait: LatencyRecorder,
    /// Each request's life, by index.
    lives: Vec<RequestLife>,
    /// The backoffs' jitter (seeded: runs repeat).
    rng: SmallRng,
    /// Workers found unhealthy by the failures counted against them, to be dealt with once
    /// the event at hand is done.
    outages: Vec<WorkerId>,
    /// Requests waiting for a worker to join or recover, in order.
    waiting: Vec<u32>,
    /// The next request sent at its own arrival (open loop; with sessions, theirs).
    next_arrival: usize,
    /// Requests released by others' completions (a session trace).
    sessions: Option<sessions::Sessions>,
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
            .iter()
            .map(|r| r.arrival)
            .max()
            .unwrap_or_default();
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
            media_life: config.encoders.as_ref().map(media::MediaLife::new),
            media: MediaReport::default(),
            ttft_by_class: BTreeMap::new(),
            has_media: workload.requests.iter().any(|r| !r.media.is_empty()),
            encode_wait: LatencyRecorder::default(),
            lives: workload
                .requests
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    RequestLife::new(
                        RequestId(i as u64),
                        &routing,
                        r.output_tokens,
                        config.eos_token_ids.clone(),
                    )
                })
                .collect(),
            rng: SmallRng::seed_from_u64(config.seed ^ 0x6261_636b_6f66),
            outages: Vec::new(),
            waiting: Vec::new(),
            next_arrival: 0,
            sessions: sessions::Sessions::new(&workload.requests),
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

    pub(super) fn schedule(&mut self, at: Duration, event: Event) {
        self.queue.push(Reverse((at, self.next_seq, event)));
        self.next_seq += 1;
    }

    /// The next request to arrive: (when, which).
    fn next_arrival(&self) -> Option<(Duration, u32)> {
        let requests = &self.workload.requests;
        match &self.sessions {
            Some(sessions) => sessions.peek(requests),
            None => requests
                .get(self.next_arrival)
                .map(|r| (r.arrival, self.next_arrival as u32)),
        }
    }

    fn run(&mut self, progress: &mut dyn FnMut(u64)) {
        let mut reported = 0;
        loop {
            let next = self.next_arrival();
            let arrival = next.map(|(at, _)| at);
            let timed = self.queue.peek().map(|Reverse((at, _, _))| *at);
            // The next moment something may be routed or may read the engines' state.
            let barrier = match (arrival, timed) {
                (Some(a), Some(t)) => Some(a.min(t)),
                (a, t) => a.or(t),
            };
            // No completion may release a request before the horizon (see `sessions`).
            let horizon = self.sessions.as_ref().and_then(|s| s.horizon(self.now));
            let within_horizon = horizon.is_none_or(|h| barrier.is_some_and(|b| b <= h));
            // A disaggregated fleet's engines interact through KV transfers too (a prefill
            // ending schedules its transfer): every step in global order.
            if self.config.lazy_engines
                && self.config.disagg.is_none()
                && self.core.queued() == 0
                && within_horizon
            {
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
                    let index = next.map_or(0, |(_, i)| i);
                    match &mut self.sessions {
                        Some(sessions) => sessions.pop(&self.workload.requests),
                        None => self.next_arrival += 1,
                    }
                    self.arrive(index);
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
            self.deal_with_outages();
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
            Event::Detected(slot) => self.found(slot as usize),
            Event::Recover(slot) => self.bring_back(slot as usize),
            Event::TransferDone(index, moves) => self.transfer_done(index, moves),
            Event::PlannerPull => self.planner_pull(),
            Event::WorkerReady(slot) => self.worker_ready(slot as usize),
            Event::EncodeDone(encoder) => self.encode_done(encoder as usize),
            Event::Retry(index) => self.retry(index),
            Event::WaitOver(index) => self.wait_over(index),
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

    pub(super) fn arrive(&mut self, index: u32) {
        self.last_event = self.last_event.max(self.now);
        if let Some(scaling) = &mut self.scaling {
            scaling.traffic.requests += 1;
            scaling.traffic.input_tokens +=
                self.workload.requests[index as usize].prompt.total_tokens() as u64;
        }
        let priority = self.workload.requests[index as usize].priority;
        self.requests[index as usize].last_token = self.now;
        self.requests[index as usize].arrived = self.now;
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

    pub(super) fn refuse(&mut self, index: u32, rejection: Rejection) {
        self.last_event = self.last_event.max(self.now);
        self.requests[index as usize].outcome = Outcome::Rejected(rejection);
        self.ended(index, self.now);
        self.report.rejected += 1;
        *self
            .report
            .rejected_by_reason
            .entry(rejection.name())
            .or_insert(0) += 1;
    }

    /// Request `index` ended at `at` (completed, refused or failed): the turns waiting for
    /// it may be released.
    pub(super) fn ended(&mut self, index: u32, at: Duration) {
        self.requests[index as usize].ended.get_or_insert(at);
        if let Some(sessions) = &mut self.sessions {
            sessions.ended(index, at);
        }
    }

    /// Routes queued requests while the core releases them.
    pub(super) fn release_queued(&mut self) {
        while let Some(id) = self.core.next_admitted(self.now) {
            self.dispatch(id.0 as u32);
        }
        for (id, _) in self.core.overdue(self.now) {
            self.refuse(id.0 as u32, Rejection::WaitTooLong);
        }
    }
}

/// The simulated worker in `slot`: ids from 1, as `switchyard serve` numbers its workers.
pub fn worker_key(slot: u32) -> WorkerKey {
    WorkerKey::new(u64::from(slot) + 1, 0)
}

/// What the simulated worker in `slot` announces (as the worker crate's `Mocker` does).
pub(super) fn worker_spec(config: &SimConfig, slot: u32, role: WorkerRole) -> WorkerSpec {
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
pub(super) fn role_of(config: &SimConfig, slot: u32) -> WorkerRole {
    match &config.disagg {
        Some(d) if slot < d.prefill => WorkerRole::Prefill,
        Some(_) => WorkerRole::Decode,
        None => WorkerRole::Aggregated,
    }
}

pub(super) fn slot_of(worker: WorkerKey) -> usize {
    (worker.worker_id.0 - 1) as usize
}

/// A request's class for the per-class latencies: `text` without media, else its costliest
/// modality (video, then audio, then image).
pub(super) fn media_class(media: &[MediaSpan]) -> &'static str {
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

pub(super) fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}
