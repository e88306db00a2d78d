//! The discrete-event loop.
//!
//! A request arrives and is routed; an engine finishes a step and its tokens and KV events
//! are delivered; a batch of KV events reaches the indexer after the event delay. An idle
//! engine starts a step as soon as it receives work; a busy one steps again as soon as the
//! previous step ends and work remains.
//!
//! Engines only interact through the router, which is consulted at arrivals. So between
//! two arrivals each engine is advanced on its own, engine after engine, rather than all
//! of them step by step in global time order: the result is the same (every step ending
//! before the arrival is applied before it, each worker's events in order, and the router's
//! state does not depend on how different workers' completions interleave), and an engine's
//! memory stays in cache while it runs. Ties go to the arrival: a step ending at the very
//! instant of an arrival is applied after it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use switchyard_core::{KvEvent, LocalBlockHash, RequestId, TokenBlocks, WorkerKey};
use switchyard_mocker::config::InvalidArgs;
use switchyard_mocker::{EngineArgs, MockEngine, MockRequest, PerfModel, StepOutput};
use switchyard_router::indexer::approx::{ApproxConfig, ApproxIndexer};
use switchyard_router::{
    Indexer, IndexerConfig, OverlapScores, PolicyKind, RouteRequest, Router, RouterConfig,
    RoutingOverrides,
};
use thiserror::Error;

use crate::report::{LatencyRecorder, LoadSpread, SimReport, Throughput};
use crate::workload::PreparedWorkload;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub workers: u32,
    pub engine: EngineArgs,
    pub perf: PerfModel,
    /// Router settings; the policy is chosen per run.
    pub router: RouterConfig,
    /// How long KV events take to reach the indexer.
    pub event_delay: Duration,
    /// What the router knows of the engines' caches.
    pub cache_view: CacheView,
    pub seed: u64,
}

/// Where the router's view of the engines' caches comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheView {
    /// The engines' KV events (Switchyard's way).
    Events,
    /// Routed blocks assumed cached, with a TTL and a cap (SGLang's router, which gets no
    /// events, works this way).
    Approximate(ApproxConfig),
}

impl CacheView {
    /// The view a policy is meant to run with: SGLang's cache-aware policy with SGLang's
    /// approximate tree, everything else with events.
    pub fn natural_for(policy: PolicyKind, approx: ApproxConfig) -> Self {
        match policy {
            PolicyKind::CacheAware => CacheView::Approximate(approx),
            _ => CacheView::Events,
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
}

#[derive(Debug, Clone, Copy)]
struct RequestState {
    arrival: Duration,
    last_token: Duration,
}

struct Fleet<'a> {
    config: &'a SimConfig,
    workload: &'a PreparedWorkload,
    engines: Vec<MockEngine>,
    outputs: Vec<StepOutput>,
    /// When each engine's current step ends, if it is stepping.
    step_end: Vec<Option<Duration>>,
    router: Router,
    indexer: View,
    /// Event batches on their way to the indexer: (visible at, order, batch).
    deliveries: BinaryHeap<Reverse<(Duration, u64, usize)>>,
    next_seq: u64,
    in_flight_events: Vec<Option<Vec<KvEvent>>>,
    requests: Vec<RequestState>,
    ttft: LatencyRecorder,
    itl: LatencyRecorder,
    e2e: LatencyRecorder,
    per_worker_requests: Vec<u64>,
    per_worker_prefill: Vec<u64>,
    report: SimReport,
    last_time: Duration,
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
    let view = match config.cache_view {
        CacheView::Events => View::Events(Indexer::new(IndexerConfig::default())),
        CacheView::Approximate(approx) => View::Approximate(ApproxIndexer::new(approx)),
    };
    run(Fleet::new(config, workload, policy, view)?, progress)
}

fn run(mut fleet: Fleet<'_>, progress: &mut dyn FnMut(u64)) -> Result<SimReport, SimError> {
    let mut reported = 0;
    for i in 0..fleet.workload.requests.len() {
        let now = fleet.workload.requests[i].arrival;
        fleet.advance(now);
        fleet.last_time = fleet.last_time.max(now);
        fleet.arrive(i as u32, now);
        if fleet.report.completed >= reported + 256 {
            reported = fleet.report.completed;
            progress(reported);
        }
    }
    fleet.advance(Duration::MAX);
    progress(fleet.report.completed);
    Ok(fleet.finish())
}

impl<'a> Fleet<'a> {
    fn new(
        config: &'a SimConfig,
        workload: &'a PreparedWorkload,
        policy: PolicyKind,
        indexer: View,
    ) -> Result<Self, SimError> {
        let n = config.workers as usize;
        let mut router = Router::new(RouterConfig {
            policy,
            block_size: config.engine.block_size,
            seed: config.seed,
            ..config.router
        });
        let mut engines = Vec::with_capacity(n);
        for w in 0..config.workers {
            let key = WorkerKey::new(u64::from(w), 0);
            router.add_worker(key);
            engines.push(MockEngine::new(
                key,
                config.engine,
                config.perf.clone(),
                config.seed ^ u64::from(w),
            )?);
        }
        Ok(Fleet {
            config,
            workload,
            engines,
            outputs: (0..n).map(|_| StepOutput::default()).collect(),
            step_end: vec![None; n],
            router,
            indexer,
            deliveries: BinaryHeap::new(),
            next_seq: 0,
            in_flight_events: Vec::new(),
            requests: workload
                .requests
                .iter()
                .map(|r| RequestState {
                    arrival: r.arrival,
                    last_token: r.arrival,
                })
                .collect(),
            ttft: LatencyRecorder::default(),
            itl: LatencyRecorder::default(),
            e2e: LatencyRecorder::default(),
            per_worker_requests: vec![0; n],
            per_worker_prefill: vec![0; n],
            report: SimReport {
                requests: workload.requests.len() as u64,
                ..SimReport::default()
            },
            last_time: Duration::ZERO,
        })
    }

    /// Applies everything that happens strictly before `until`: each engine's steps, then
    /// the KV events that reach the indexer.
    fn advance(&mut self, until: Duration) {
        for w in 0..self.engines.len() {
            while let Some(end) = self.step_end[w].filter(|&end| end < until) {
                self.step_done(w, end);
            }
        }
        while let Some(&Reverse((at, _, slot))) = self.deliveries.peek() {
            if at >= until {
                break;
            }
            self.deliveries.pop();
            if let Some(events) = self.in_flight_events.get_mut(slot).and_then(Option::take) {
                for event in &events {
                    self.indexer.apply(event);
                }
            }
        }
    }

    fn arrive(&mut self, index: u32, now: Duration) {
        let request = &self.workload.requests[index as usize];
        let id = RequestId(u64::from(index));
        let overlaps = self
            .indexer
            .find_matches(request.prompt.local_hashes(), now);
        let route = RouteRequest {
            id,
            isl_tokens: request.prompt.total_tokens() as u64,
            seq_hashes: request.prompt.sequence_hashes(),
            overrides: RoutingOverrides::default(),
        };
        let Ok(decision) = self.router.route(&route, &overlaps, now) else {
            self.report.rejected += 1;
            return;
        };
        self.indexer.routed(decision.worker, &request.prompt, now);
        let w = decision.worker.worker_id.0 as usize;
        let mock = MockRequest {
            id,
            prompt: request.prompt.clone(),
            max_output_tokens: request.output_tokens,
        };
        if self.engines[w].add_request(mock).is_err() {
            self.report.rejected += 1;
            self.router.free(id);
            return;
        }
        self.per_worker_requests[w] += 1;
        if self.step_end[w].is_none() {
            self.start_step(w, now);
        }
    }

    fn start_step(&mut self, w: usize, now: Duration) {
        self.engines[w].step(now, &mut self.outputs[w]);
        self.per_worker_prefill[w] += u64::from(self.outputs[w].shape.prefill_tokens);
        self.step_end[w] = Some(self.outputs[w].finished_at());
    }

    fn step_done(&mut self, w: usize, now: Duration) {
        self.last_time = self.last_time.max(now);
        let mut out = std::mem::take(&mut self.outputs[w]);
        for token in &out.tokens {
            let state = &mut self.requests[token.request.0 as usize];
            if token.index == 0 {
                self.ttft.record(micros(now - state.arrival));
                self.router.mark_prefill_completed(token.request);
                self.report.prompt_tokens += self.workload.requests[token.request.0 as usize]
                    .prompt
                    .total_tokens() as u64;
                self.report.cached_tokens += u64::from(token.cached_tokens);
            } else {
                self.itl.record(micros(now - state.last_token));
            }
            state.last_token = now;
            self.report.output_tokens += 1;
            if token.finished {
                self.e2e.record(micros(now - state.arrival));
                self.router.free(token.request);
                self.report.completed += 1;
            }
        }
        if !out.events.is_empty() {
            if self.config.event_delay.is_zero() {
                for event in &out.events {
                    self.indexer.apply(event);
                }
            } else {
                let slot = self.in_flight_events.len();
                self.in_flight_events
                    .push(Some(std::mem::take(&mut out.events)));
                self.deliveries.push(Reverse((
                    now + self.config.event_delay,
                    self.next_seq,
                    slot,
                )));
                self.next_seq += 1;
            }
        }
        self.outputs[w] = out;
        if self.engines[w].has_work() {
            self.start_step(w, now);
        } else {
            self.step_end[w] = None;
        }
    }

    fn finish(mut self) -> SimReport {
        let span = self.last_time.as_secs_f64().max(f64::MIN_POSITIVE);
        let r = &mut self.report;
        r.policy = self.router.config().policy.name().to_string();
        r.workers = self.config.workers;
        r.ttft_ms = self.ttft.distribution();
        r.itl_ms = self.itl.distribution();
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
        r.simulated_seconds = self.last_time.as_secs_f64();
        self.report
    }
}

/// The router's cache view during a run.
enum View {
    Events(Indexer),
    Approximate(ApproxIndexer),
}

impl View {
    fn apply(&mut self, event: &KvEvent) {
        if let View::Events(indexer) = self {
            indexer.apply(event);
        }
    }

    fn find_matches(&mut self, query: &[LocalBlockHash], now: Duration) -> OverlapScores {
        match self {
            View::Events(indexer) => indexer.find_matches(query),
            View::Approximate(approx) => approx.find_matches(query, now),
        }
    }

    fn routed(&mut self, worker: WorkerKey, prompt: &TokenBlocks, now: Duration) {
        if let View::Approximate(approx) = self {
            approx.record_routed(worker, prompt.local_hashes(), prompt.sequence_hashes(), now);
        }
    }
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}
