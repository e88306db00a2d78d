//! The routing core: everything the router decides, as one state machine with no I/O and
//! no clock (`now` is an argument). The servers' async shell and the simulator drive this
//! same code, so what the simulator says about routing is true of the servers.
//!
//! It holds:
//! - the worker [`registry`]: role, health, draining, block-size agreement;
//! - each worker's cache view: KV events (looked up by the caller in its own indexer, which
//!   may be shared between threads, and passed in as [`OverlapScores`]) or, for workers
//!   without events, the approximate view kept here from the routing decisions;
//! - the [`Router`]: active sequences and the policies;
//! - [`admission`]: the priority queue in front of routing.
//!
//! A request's life: [`RoutingCore::admit`] (admitted, queued or refused); if queued,
//! released later by [`RoutingCore::next_admitted`]; [`RoutingCore::route`] picks a worker
//! (excluding those that already failed it) and records it; [`RoutingCore::prefill_done`]
//! at its first token; [`RoutingCore::finish`] however it ends. After anything that may free
//! capacity (a request ending, a worker joining) the caller asks `next_admitted` again.

pub mod admission;
pub mod degradation;
pub mod encoders;
pub mod health;
pub mod registry;

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use switchyard_core::{Priority, RequestId, SequenceHash, Token, TokenBlocks, WorkerId, WorkerKey};

use crate::active::WorkerLoad;
use crate::indexer::OverlapScores;
use crate::indexer::approx::{ApproxConfig, ApproxIndexer};
use crate::policy::RoutingOverrides;
use crate::router::{RouteDecision, RouteError, RouteRequest, Router, RouterConfig};
use admission::{Admission, AdmissionConfig, AdmissionQueue, Fleet};
use degradation::{Degradation, DegradationConfig};
use health::{Failure, HealthChange, HealthConfig};
use registry::{
    CacheView, CacheViewMode, HealthState, JoinRefused, Registry, WorkerEntry, WorkerSpec,
};

/// Settings of the routing core.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RoutingConfig {
    /// Policies, seed, request TTL; its block size is used until a worker announces one.
    pub router: RouterConfig,
    pub cache_view: CacheViewMode,
    /// The approximate view's TTL and per-worker cap.
    pub approx: ApproxConfig,
    pub admission: AdmissionConfig,
    pub health: HealthConfig,
    pub degradation: DegradationConfig,
    pub disagg: DisaggConfig,
}

/// When a request served by a decode worker has its prompt computed on a prefill worker
/// (conditional disaggregation, as Dynamo decides it): only when the part of the prompt the
/// decode worker lacks is long enough to be worth a transfer, and the prefill pool is not
/// saturated. Otherwise the decode worker prefills it itself.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DisaggConfig {
    /// Uncached prompt tokens (on the decode worker) up to which it prefills locally.
    pub local_prefill_tokens: u64,
    /// The prefill pool is saturated when the chosen prefill worker already has this many
    /// prompt tokens routed to it and not yet computed: then prefill locally.
    pub max_prefill_queue_tokens: u64,
}

impl Default for DisaggConfig {
    fn default() -> Self {
        DisaggConfig {
            local_prefill_tokens: 512,
            max_prefill_queue_tokens: 131_072,
        }
    }
}

/// Where a request goes: its decode (or aggregated) worker, and the prefill worker that
/// computes its prompt first, when it is disaggregated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairDecision {
    /// The worker that generates the tokens (and prefills, when `prefill` is none), as
    /// recorded: with a remote prefill it computes none of the prompt.
    pub decode: RouteDecision,
    /// The remote prefill, tracked under [`RequestId::prefill_stage`] until
    /// [`RoutingCore::prefill_finished`].
    pub prefill: Option<RouteDecision>,
}

/// Why a request that could have been disaggregated was prefilled on its decode worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalReason {
    /// The uncached part of the prompt is short.
    Short,
    /// The chosen prefill worker is busy past the queue limit.
    Saturated,
    /// No prefill worker may take it (none is routable, or all failed it).
    Unavailable,
}

/// A request to route.
#[derive(Debug, Clone, Copy)]
pub struct RouteQuery<'a> {
    pub id: RequestId,
    /// The prompt cut into the model's blocks ([`switchyard_core::blocks_for`] at
    /// [`RoutingCore::block_size`]).
    pub blocks: &'a TokenBlocks,
    pub overrides: RoutingOverrides,
    /// Workers that must not get it (they failed it already).
    pub exclude: &'a [WorkerId],
}

/// The router's view of a query.
fn route_request<'q>(query: &RouteQuery<'q>) -> RouteRequest<'q> {
    RouteRequest {
        id: query.id,
        isl_tokens: query.blocks.total_tokens() as u64,
        seq_hashes: query.blocks.sequence_hashes(),
        overrides: query.overrides,
    }
}

/// How the registry changed to match discovery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerChanges {
    pub joined: Vec<WorkerId>,
    /// Workers that left (or restarted as a new incarnation); their cache entries are
    /// stale. Those still running requests drain first.
    pub left: Vec<WorkerId>,
    pub refused: Vec<JoinRefused>,
}

/// The routing core. See the module docs.
#[derive(Debug)]
pub struct RoutingCore {
    config: RoutingConfig,
    registry: Registry,
    router: Router,
    approx: ApproxIndexer,
    approx_workers: usize,
    admission: AdmissionQueue,
    degradation: Degradation,
    /// The latest time any call brought, for what comes without one (workers joining).
    now: Duration,
    /// Breaker jitter and the weighting of suspicious workers (seeded: runs repeat).
    rng: SmallRng,
}

impl RoutingCore {
    pub fn new(config: RoutingConfig) -> Self {
        RoutingCore {
            config,
            registry: Registry::default(),
            router: Router::new(config.router),
            approx: ApproxIndexer::new(config.approx),
            approx_workers: 0,
            admission: AdmissionQueue::new(config.admission),
            degradation: Degradation::new(config.degradation),
            now: Duration::ZERO,
            rng: SmallRng::seed_from_u64(config.router.seed ^ 0x6865_616c_7468),
        }
    }

    /// Moves the core's notion of now forward (every call that takes `now` does).
    pub fn tick(&mut self, now: Duration) {
        self.now = self.now.max(now);
    }

    pub fn config(&self) -> &RoutingConfig {
        &self.config
    }

    /// Tokens per block prompts are cut into: the workers' agreed size, or the configured
    /// one while no worker has announced any.
    pub fn block_size(&self) -> u32 {
        self.registry
            .block_size()
            .unwrap_or(self.config.router.block_size)
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    pub fn worker(&self, id: WorkerId) -> Option<&WorkerEntry> {
        self.registry.get(id)
    }

    /// Workers that may take new requests.
    pub fn routable_workers(&self) -> usize {
        self.registry.iter().filter(|e| e.serving()).count()
    }

    // ---- the registry ----

    /// Registers a worker and its ranks.
    pub fn add_worker(&mut self, spec: WorkerSpec) -> Result<(), JoinRefused> {
        let keys: Vec<WorkerKey> = spec.keys().collect();
        let view = self.config.cache_view.view_for(&spec);
        let id = spec.id;
        let serving = spec.role.serves_generation();
        let timing = spec.timing.clone();
        self.registry.add(spec, self.config.cache_view, self.now)?;
        if serving {
            self.degradation.worker_added(id, self.now);
        }
        if view == CacheView::Approximate {
            self.approx_workers += 1;
        }
        self.router.set_block_size(self.block_size());
        for key in keys {
            self.router.add_worker(key);
            if let Some(timing) = &timing {
                self.router.set_timing(key, timing.clone());
            }
        }
        Ok(())
    }

    /// The worker left discovery. With requests in flight it drains (no new requests, its
    /// load still counted) until they end; otherwise it is removed at once. Returns whether
    /// it is gone for good.
    pub fn worker_left(&mut self, id: WorkerId) -> bool {
        let Some(entry) = self.registry.get_mut(id) else {
            return true;
        };
        let busy = entry
            .spec
            .keys()
            .any(|key| self.router.load(key).requests > 0);
        if busy {
            entry.departed = true;
            // Its cache view is of no more use: nothing new goes there.
            if entry.view == CacheView::Approximate {
                for key in entry.spec.keys() {
                    self.approx.remove_worker(key);
                }
            }
            return false;
        }
        self.remove_worker(id);
        true
    }

    /// Unregisters a worker at once, dropping its requests from the load (they are lost, or
    /// moved elsewhere by the caller). Returns their ids.
    pub fn remove_worker(&mut self, id: WorkerId) -> Vec<RequestId> {
        let Some(entry) = self.registry.remove(id) else {
            return Vec::new();
        };
        if entry.spec.role.serves_generation() {
            self.degradation.worker_removed(
                id,
                degradation::capacity(&entry.spec),
                entry.health.state != HealthState::Healthy,
                entry.health.last_activity(),
                self.now,
            );
        }
        if entry.view == CacheView::Approximate {
            self.approx_workers -= 1;
        }
        let mut dropped = Vec::new();
        for key in entry.spec.keys() {
            dropped.extend(self.router.remove_worker(key));
            if entry.view == CacheView::Approximate {
                self.approx.remove_worker(key);
            }
        }
        dropped
    }

    /// Brings the registry in line with the workers discovery lists.
    pub fn sync_workers(&mut self, listed: impl IntoIterator<Item = WorkerSpec>) -> WorkerChanges {
        let listed: std::collections::BTreeMap<WorkerId, WorkerSpec> =
            listed.into_iter().map(|s| (s.id, s)).collect();
        let mut changes = WorkerChanges::default();
        let gone: Vec<WorkerId> = self
            .registry
            .iter()
            .filter(|e| {
                !e.departed
                    && listed
                        .get(&e.spec.id)
                        .is_none_or(|s| s.incarnation != e.spec.incarnation)
            })
            .map(|e| e.spec.id)
            .collect();
        for id in gone {
            let restarted = listed.contains_key(&id);
            if restarted {
                // A new incarnation: the old one's requests died with it.
                self.remove_worker(id);
            } else {
                self.worker_left(id);
            }
            changes.left.push(id);
        }
        for (id, spec) in listed {
            match self.registry.get(id) {
                Some(entry) if !entry.departed => continue,
                // It came back under the same incarnation while draining: serve it again.
                Some(entry) if entry.spec.incarnation == spec.incarnation => {
                    if let Some(entry) = self.registry.get_mut(id) {
                        entry.departed = false;
                    }
                    changes.joined.push(id);
                    continue;
                }
                Some(_) => {
                    self.remove_worker(id);
                }
                None => {}
            }
            match self.add_worker(spec) {
                Ok(()) => changes.joined.push(id),
                Err(refused) => changes.refused.push(refused),
            }
        }
        changes
    }

    /// Marks a worker draining (or not). Returns whether it is registered.
    pub fn set_draining(&mut self, id: WorkerId, draining: bool) -> bool {
        self.registry
            .get_mut(id)
            .map(|e| e.draining = draining)
            .is_some()
    }

    /// Sets a worker's health state by hand (an operator's decision, a test). Returns
    /// whether it is registered.
    pub fn set_health(&mut self, id: WorkerId, health: HealthState) -> bool {
        self.registry
            .get_mut(id)
            .map(|e| e.health.state = health)
            .is_some()
    }

    // ---- health ----

    pub fn health_config(&self) -> &HealthConfig {
        &self.config.health
    }

    /// A failure of the worker's own making (see [`health`]). Returns the change of state,
    /// if any: a worker that became unhealthy must have its in-flight requests moved.
    pub fn observe_failure(
        &mut self,
        worker: WorkerId,
        failure: Failure,
        now: Duration,
    ) -> Option<HealthChange> {
        self.tick(now);
        let config = self.config.health;
        let room = self.room_to_take_out(worker);
        self.registry
            .get_mut(worker)?
            .health
            .fail(failure, room, &config, now, &mut self.rng)
    }

    /// Whether soft failures may take `worker` out: fewer than
    /// `health.max_unhealthy_fraction` (at least one) of the registered workers in its role
    /// (the pool its load would move to) are out already.
    fn room_to_take_out(&self, worker: WorkerId) -> bool {
        let Some(role) = self.registry.get(worker).map(|e| e.spec.role) else {
            return true;
        };
        let (mut fleet, mut out) = (0usize, 0usize);
        for entry in self
            .registry
            .iter()
            .filter(|e| !e.departed && e.spec.role == role)
        {
            fleet += 1;
            out += usize::from(entry.health.state == HealthState::Unhealthy);
        }
        let allowed = (fleet as f64 * self.config.health.max_unhealthy_fraction).floor() as usize;
        out < allowed.max(1)
    }

    /// A request that completed on the worker.
    pub fn observe_success(&mut self, worker: WorkerId, now: Duration) -> Option<HealthChange> {
        self.tick(now);
        let config = self.config.health;
        self.registry
            .get_mut(worker)?
            .health
            .succeed(&config, now, false)
    }

    /// A gap between two tokens streamed from the worker.
    pub fn observe_gap(&mut self, worker: WorkerId, gap: Duration, now: Duration) {
        self.tick(now);
        let config = self.config.health;
        if let Some(entry) = self.registry.get_mut(worker) {
            entry.health.observe_gap(gap, &config, now);
        }
    }

    /// How long a stream on `worker` may go without a token before it counts as stalled.
    pub fn stall_timeout(&self, worker: WorkerId) -> Duration {
        self.registry
            .get(worker)
            .map_or(self.config.health.stall_floor, |e| {
                e.health.stall_timeout(&self.config.health)
            })
    }

    /// How much longer `worker` is predicted to be busy with the prefill routed to it (the
    /// longest of its ranks): a stream there may wait that long beyond its stall timeout.
    pub fn queued_prefill_time(&self, worker: WorkerId, now: Duration) -> Duration {
        self.registry.get(worker).map_or(Duration::ZERO, |e| {
            e.spec
                .keys()
                .map(|key| self.router.queued_prefill_time(key, now))
                .max()
                .unwrap_or_default()
        })
    }

    /// Moves open breakers whose time is up to half-open; returns the workers due a canary
    /// now, marked as being checked.
    pub fn due_canaries(&mut self, now: Duration) -> Vec<WorkerId> {
        self.tick(now);
        let config = self.config.health;
        let mut due = Vec::new();
        for id in self.registry.iter().map(|e| e.spec.id).collect::<Vec<_>>() {
            let loaded = self.has_requests(id);
            if let Some(entry) = self.registry.get_mut(id) {
                if entry.departed {
                    continue;
                }
                entry.health.tick(now);
                if entry.health.canary_due(&config, now) {
                    entry.health.canary_started(now);
                    entry.health.canary_under_load = loaded;
                    due.push(id);
                }
            }
        }
        due
    }

    /// A canary's answer (its tokens and latency) or its failure. The answer is judged
    /// against the worker's first answer and against what most other workers answered.
    pub fn canary_finished(
        &mut self,
        worker: WorkerId,
        answer: Result<(Vec<Token>, Duration), Failure>,
        now: Duration,
    ) -> Option<HealthChange> {
        let reference: Option<Vec<Token>> = {
            let others = self
                .registry
                .iter()
                .filter(|e| e.spec.id != worker && e.health.state != HealthState::Unhealthy)
                .filter_map(|e| e.health.last_answer.as_deref());
            health::majority(others).map(|(answer, _)| answer.to_vec())
        };
        let config = self.config.health;
        let loaded = self.has_requests(worker);
        let room = self.room_to_take_out(worker);
        let entry = self.registry.get_mut(worker)?;
        entry.health.canary_under_load |= loaded;
        entry.health.canary_finished(
            answer,
            reference.as_deref(),
            room,
            &config,
            now,
            &mut self.rng,
        )
    }

    /// Whether requests routed to `worker` are in flight there.
    fn has_requests(&self, worker: WorkerId) -> bool {
        self.registry
            .get(worker)
            .is_some_and(|e| e.spec.keys().any(|key| self.router.load(key).requests > 0))
    }

    /// A canary that came back with nothing to judge.
    pub fn canary_skipped(&mut self, worker: WorkerId) {
        if let Some(entry) = self.registry.get_mut(worker) {
            entry.health.canary_skipped();
        }
    }

    // ---- degradation ----

    /// The degradation level now (0 normal … 4 reject new requests), from the capacity
    /// of the healthy workers against what the fleet had, and latency against the SLO.
    pub fn degradation_level(&mut self, now: Duration) -> u8 {
        self.tick(now);
        let (healthy, nominal) = self.capacities();
        self.degradation.level(healthy, nominal, now)
    }

    /// The degradation level's inputs, if the level changed since this was last asked.
    pub fn take_degradation_change(&mut self) -> Option<degradation::DegradationState> {
        self.degradation.take_change()
    }

    /// A request's time to first token, for the SLO side of degradation.
    pub fn observe_ttft(&mut self, ttft: Duration) {
        self.degradation.observe_ttft(ttft);
    }

    /// Capacity of the serving workers that are healthy (suspicious ones at their weight),
    /// and of every serving worker registered and not leaving.
    fn capacities(&self) -> (f64, f64) {
        let weight = self.config.health.suspicious_weight;
        let mut healthy = 0.0;
        let mut nominal = 0.0;
        for e in self.registry.iter() {
            if !e.spec.role.serves_generation() || e.departed || e.draining {
                continue;
            }
            let capacity = degradation::capacity(&e.spec);
            nominal += capacity;
            healthy += capacity
                * match e.health.state {
                    HealthState::Healthy => 1.0,
                    HealthState::Suspicious => weight,
                    HealthState::Unhealthy => 0.0,
                };
        }
        (healthy, nominal)
    }

    /// Whether KV events from `worker` belong in the caller's indexer: it is registered,
    /// still listed, and seen through its events.
    pub fn accepts_events(&self, worker: WorkerId) -> bool {
        self.registry
            .get(worker)
            .is_some_and(|e| e.view == CacheView::Events && !e.departed)
    }

    // ---- admission ----

    /// Whether every worker that may take requests is at or above its busy threshold: KV
    /// blocks of in-flight requests at the threshold share of its capacity, or as many
    /// requests as it runs at once, or (with a wait target) prefill queued for longer than
    /// its share of the target. Workers that announce none of these are never busy.
    pub fn all_busy(&self) -> bool {
        // Degraded fleets run smaller batches (see `degradation`).
        let scale = self.degradation.batch_scale();
        let admission = &self.config.admission;
        let threshold = admission.busy_kv_threshold * scale;
        let queue_limit = admission
            .wait_target
            .map(|target| target.mul_f64(admission.busy_prefill_share));
        self.registry.iter().filter(|e| e.serving()).all(|e| {
            e.spec.keys().all(|key| {
                let load = self.router.load(key);
                let kv = e
                    .spec
                    .capacity_blocks
                    .is_some_and(|c| load.active_blocks as f64 >= threshold * c as f64);
                let seqs = e
                    .spec
                    .max_num_seqs
                    .is_some_and(|m| f64::from(load.requests) >= (f64::from(m) * scale).ceil());
                // Last: the timing model's prediction is the dearest of the three.
                kv || seqs
                    || queue_limit
                        .is_some_and(|limit| self.router.queued_prefill_time(key, self.now) > limit)
            })
        })
    }

    /// Offers a new request for admission. With no worker registered it is refused at
    /// once; while every registered worker is out of rotation (unhealthy: its breaker may
    /// half-open, or a replacement join) it queues like a request meeting a busy fleet,
    /// without being refused for a predicted wait.
    pub fn admit(&mut self, id: RequestId, priority: Priority, now: Duration) -> Admission {
        self.tick(now);
        let any = self.registry.iter().any(WorkerEntry::may_serve);
        let level = if any { self.degradation_level(now) } else { 0 };
        if let Some(rejection) = degradation::refuse(
            level,
            priority,
            self.admission.len(),
            self.config.admission.max_queue,
        ) {
            return Admission::Rejected(rejection);
        }
        self.admission.offer(id, priority, self.fleet(), now)
    }

    /// What the fleet can do for a request now (see [`Fleet`]).
    fn fleet(&self) -> Fleet {
        if self.any_serving() {
            if self.all_busy() {
                Fleet::Busy
            } else {
                Fleet::Free
            }
        } else if self.registry.iter().any(WorkerEntry::may_serve) {
            Fleet::Down
        } else {
            Fleet::Empty
        }
    }

    fn any_serving(&self) -> bool {
        self.registry.iter().any(WorkerEntry::serving)
    }

    /// How long a request of `priority` offered now would wait in the admission queue
    /// (see [`AdmissionQueue::predicted_wait`]): the `Retry-After` of a
    /// [`Rejection::WaitTooLong`].
    pub fn predicted_wait(&self, priority: Priority, now: Duration) -> Option<Duration> {
        self.admission.predicted_wait(priority, now)
    }

    /// How long a request of `priority` may wait in the admission queue now (premium waits
    /// longer when the fleet is degraded: latency targets are relaxed rather than it being
    /// refused).
    pub fn queue_timeout(&self, priority: Priority) -> Duration {
        let base = self.config.admission.queue_timeout;
        if priority == Priority::Premium && self.degradation.current() >= 3 {
            base * 2
        } else {
            base
        }
    }

    /// The next queued request that may go now, if any (one at a time: call again once it
    /// has been routed).
    pub fn next_admitted(&mut self, now: Duration) -> Option<RequestId> {
        self.tick(now);
        if self.admission.is_empty() {
            return None;
        }
        let busy = self.all_busy();
        self.admission.next(busy, now)
    }

    /// Queued requests that can no longer start within the wait target: refuse them
    /// ([`Rejection::WaitTooLong`]); see [`AdmissionQueue::overdue`].
    /// None while no worker is in rotation: the queue moves again when one is back, at a
    /// rate nothing measured yet.
    pub fn overdue(&mut self, now: Duration) -> Vec<(RequestId, Duration)> {
        if !self.any_serving() {
            return Vec::new();
        }
        self.admission.overdue(now)
    }

    /// A queued request gives up (timed out, or its client left).
    pub fn withdraw(&mut self, id: RequestId, now: Duration) -> bool {
        self.tick(now);
        self.admission.withdraw(id, now)
    }

    /// Requests waiting for admission.
    pub fn queued(&self) -> usize {
        self.admission.len()
    }

    pub fn admission(&self) -> &AdmissionQueue {
        &self.admission
    }

    // ---- routing ----

    /// Picks a worker for a request and records it as active there. `events` are the
    /// caller's indexer's matches for the prompt's blocks (only workers seen through events
    /// are read from it).
    pub fn route(
        &mut self,
        query: &RouteQuery<'_>,
        events: &OverlapScores,
        now: Duration,
    ) -> Result<RouteDecision, RouteError> {
        self.tick(now);
        self.admission.settled(query.id);
        let overlaps = self.overlaps(query, events, now);
        let overlaps = overlaps.as_ref();
        let decision = self.choose(query, overlaps, now, |e| e.serving())?;
        let request = route_request(query);
        self.router.record(&request, &decision, now)?;
        self.record_approx(query, &decision, now);
        Ok(decision)
    }

    /// Joint routing of a request with media (without recording it): the `latency`
    /// policy's cost on every serving worker (its predicted time to first token, plus the
    /// weighted delay to its running decodes and its memory penalty), where a worker
    /// holding the request's blocks up to `needed_blocks` (its media's KV) starts at once,
    /// and any other only once the media is encoded and moved to it (`encode`: the
    /// encoders' predicted finish plus the transfer), its queue draining meanwhile:
    /// max(encode, its queued prefill) + the request's own prefill. Returns the cheapest
    /// worker and whether it needs the media encoded; none when no worker serves.
    pub fn joint_media_choice(
        &mut self,
        query: &RouteQuery<'_>,
        events: &OverlapScores,
        needed_blocks: u32,
        encode: Duration,
        now: Duration,
    ) -> Option<(WorkerId, bool)> {
        self.tick(now);
        let overlaps = self.overlaps(query, events, now).into_owned();
        let keys: Vec<WorkerKey> = self
            .registry
            .iter()
            .filter(|e| e.serving() && !query.exclude.contains(&e.spec.id))
            .flat_map(|e| e.spec.keys())
            .collect();
        let request = route_request(query);
        let candidates = self
            .router
            .candidates_among(&keys, &request, &overlaps, now);
        let encode_ms = encode.as_secs_f64() * 1e3;
        candidates
            .iter()
            .map(|c| {
                let (_, cost) = self.router.latency_prediction(&request, c);
                let holds = c.overlap_blocks >= needed_blocks;
                if holds {
                    (cost, c.worker.worker_id, false)
                } else {
                    let queue_ms =
                        self.router.queued_prefill_time(c.worker, now).as_secs_f64() * 1e3;
                    (
                        cost - queue_ms.min(encode_ms) + encode_ms,
                        c.worker.worker_id,
                        true,
                    )
                }
            })
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, worker, encode)| (worker, encode))
    }

    /// Routes a request in a fleet that may have prefill and decode workers: picks the
    /// worker that generates its tokens as [`RoutingCore::route`] does (among aggregated
    /// and decode workers), then, when that is a decode worker, decides whether its prompt
    /// is computed on a prefill worker (see [`DisaggConfig`]) and picks that worker by the
    /// same policy (KV overlap and prefill queue) among the prefill workers. Both are
    /// recorded: the decode worker with nothing to prefill when the prefill is remote, the
    /// prefill worker under [`RequestId::prefill_stage`]. Returns why a request that could
    /// have gone remote stayed local, if it did.
    pub fn route_pair(
        &mut self,
        query: &RouteQuery<'_>,
        events: &OverlapScores,
        now: Duration,
    ) -> Result<(PairDecision, Option<LocalReason>), RouteError> {
        self.tick(now);
        self.admission.settled(query.id);
        let overlaps = self.overlaps(query, events, now);
        let overlaps = overlaps.as_ref();
        let decode = self.choose(query, overlaps, now, |e| e.serving())?;
        let request = route_request(query);
        let disaggregated = self
            .registry
            .get(decode.worker.worker_id)
            .is_some_and(|e| e.spec.role == switchyard_core::WorkerRole::Decode);
        let mut local = None;
        let mut prefill = None;
        let mut decode = decode;
        if disaggregated {
            if decode.prefill_tokens <= self.config.disagg.local_prefill_tokens {
                local = Some(LocalReason::Short);
            } else {
                let prefill_worker = |e: &WorkerEntry| {
                    e.routable() && e.spec.role == switchyard_core::WorkerRole::Prefill
                };
                match self.choose(query, overlaps, now, prefill_worker).ok() {
                    Some(p)
                        if self.router.load(p.worker).prefill_tokens
                            < self.config.disagg.max_prefill_queue_tokens =>
                    {
                        prefill = Some(p);
                    }
                    Some(_) => local = Some(LocalReason::Saturated),
                    None => local = Some(LocalReason::Unavailable),
                }
            }
        }
        match prefill {
            Some(p) => {
                let stage = RouteRequest {
                    id: query.id.prefill_stage(),
                    ..request
                };
                self.router.record(&stage, &p, now)?;
                // The decode worker computes none of the prompt.
                decode.prefill_tokens = 0;
                if let Err(e) = self.router.record(&request, &decode, now) {
                    self.router.free(stage.id);
                    return Err(e);
                }
                self.record_approx(query, &p, now);
                self.record_approx(query, &decode, now);
            }
            None => {
                self.router.record(&request, &decode, now)?;
                self.record_approx(query, &decode, now);
            }
        }
        Ok((PairDecision { decode, prefill }, local))
    }

    /// The remote prefill of `id` is over (its first token came back, or it failed): the
    /// prefill worker no longer counts it. Returns the worker it was on.
    pub fn prefill_finished(&mut self, id: RequestId) -> Option<WorkerKey> {
        let worker = self.router.free(id.prefill_stage())?;
        self.remove_if_drained(worker.worker_id);
        Some(worker)
    }

    /// Prefill workers that may take requests.
    pub fn prefill_workers(&self) -> usize {
        self.registry
            .iter()
            .filter(|e| e.routable() && e.spec.role == switchyard_core::WorkerRole::Prefill)
            .count()
    }

    /// Picks (without recording) among the workers `eligible` accepts and `query` does not
    /// exclude, suspicious ones for their weighted share. `overlaps`: the cache views
    /// already merged (see [`RoutingCore::merged_overlaps`]).
    fn choose(
        &mut self,
        query: &RouteQuery<'_>,
        overlaps: &OverlapScores,
        now: Duration,
        eligible: impl Fn(&WorkerEntry) -> bool,
    ) -> Result<RouteDecision, RouteError> {
        let weight = self.config.health.suspicious_weight;
        let all: Vec<&WorkerEntry> = self
            .registry
            .iter()
            .filter(|e| eligible(e) && !query.exclude.contains(&e.spec.id))
            .collect();
        // A pinned request goes to its worker when that may take it, even a suspicious one.
        let pinned: Vec<&WorkerEntry> = all
            .iter()
            .copied()
            .filter(|e| query.overrides.worker == Some(e.spec.id))
            .collect();
        let mut chosen: Vec<&WorkerEntry> = Vec::with_capacity(all.len());
        if pinned.is_empty() {
            for &e in &all {
                if e.health.state == HealthState::Healthy || self.rng.random::<f64>() < weight {
                    chosen.push(e);
                }
            }
        } else {
            chosen = pinned;
        }
        if chosen.is_empty() {
            chosen = all;
        }
        let keys: Vec<WorkerKey> = chosen.iter().flat_map(|e| e.spec.keys()).collect();
        let request = route_request(query);
        let candidates = self.router.candidates_among(&keys, &request, overlaps, now);
        self.router.select(&request, &candidates)
    }

    /// Records a routed request in the approximate view of a worker seen through it.
    fn record_approx(&mut self, query: &RouteQuery<'_>, decision: &RouteDecision, now: Duration) {
        if self
            .registry
            .get(decision.worker.worker_id)
            .is_some_and(|e| e.view == CacheView::Approximate)
        {
            self.approx.record_routed(
                decision.worker,
                query.blocks.local_hashes(),
                query.blocks.sequence_hashes(),
                now,
            );
        }
    }

    /// The cache views to route by: the caller's events, merged with the approximate view
    /// when some workers are seen through it.
    fn overlaps<'e>(
        &mut self,
        query: &RouteQuery<'_>,
        events: &'e OverlapScores,
        now: Duration,
    ) -> std::borrow::Cow<'e, OverlapScores> {
        if self.approx_workers > 0 {
            std::borrow::Cow::Owned(self.merged_overlaps(query.blocks, events, now))
        } else {
            std::borrow::Cow::Borrowed(events)
        }
    }

    /// Events for event-view workers, the approximate view for the others.
    fn merged_overlaps(
        &mut self,
        query: &TokenBlocks,
        events: &OverlapScores,
        now: Duration,
    ) -> OverlapScores {
        let approx = self.approx.find_matches_blocks(query, now);
        let registry = &self.registry;
        let by_events = |key: &WorkerKey| {
            registry
                .get(key.worker_id)
                .is_some_and(|e| e.view == CacheView::Events)
        };
        let mut scores: Vec<(WorkerKey, u32)> = events
            .scores
            .iter()
            .filter(|(k, _)| by_events(k))
            .chain(approx.scores.iter().filter(|(k, _)| !by_events(k)))
            .copied()
            .collect();
        let mut cached: Vec<(WorkerKey, u64)> = events
            .cached_blocks
            .iter()
            .filter(|(k, _)| by_events(k))
            .chain(approx.cached_blocks.iter().filter(|(k, _)| !by_events(k)))
            .copied()
            .collect();
        scores.sort_unstable_by_key(|e| e.0);
        cached.sort_unstable_by_key(|e| e.0);
        OverlapScores {
            scores,
            cached_blocks: cached,
        }
    }

    /// Records a request routed elsewhere (by another frontend) so its load counts here.
    /// Returns false when its worker is not registered here.
    pub fn record_external(
        &mut self,
        id: RequestId,
        worker: WorkerKey,
        seq_hashes: &[SequenceHash],
        prefill_tokens: u64,
        now: Duration,
    ) -> bool {
        let request = RouteRequest {
            id,
            isl_tokens: 0,
            seq_hashes,
            overrides: RoutingOverrides::default(),
        };
        let decision = RouteDecision {
            worker,
            policy: self.config.router.policy,
            overlap_blocks: 0,
            prefill_tokens,
        };
        self.router.record(&request, &decision, now).is_ok()
    }

    /// The request went to its worker ahead of its media, whose engine computes the prompt
    /// from its first media position (`prompt_tokens - media_from` tokens) only once they
    /// are ready, behind the requests that arrive meanwhile: that part leaves the worker's
    /// queue until [`Self::media_ready`], so requests routed meanwhile do not count it.
    pub fn media_pending(&mut self, id: RequestId, prompt_tokens: u64, media_from: u64) -> bool {
        self.router
            .hold_prefill(id, prompt_tokens.saturating_sub(media_from))
    }

    /// The request's media are ready at `now`: the rest of its prompt joins the back of its
    /// worker's queue.
    pub fn media_ready(&mut self, id: RequestId, now: Duration) -> bool {
        self.tick(now);
        self.router.release_prefill(id, now)
    }

    /// The request's first token arrived at `now`: its prompt is computed.
    pub fn prefill_done(&mut self, id: RequestId, now: Duration) -> bool {
        self.tick(now);
        self.router.mark_prefill_completed(id, now)
    }

    /// The request ended, however it ended. Returns the worker it was on. A departed
    /// worker whose last request this was is removed.
    pub fn finish(&mut self, id: RequestId) -> Option<WorkerKey> {
        self.admission.withdraw(id, self.now);
        let worker = self.router.free(id)?;
        self.remove_if_drained(worker.worker_id);
        Some(worker)
    }

    fn remove_if_drained(&mut self, id: WorkerId) {
        let Some(entry) = self.registry.get(id) else {
            return;
        };
        if entry.departed
            && entry
                .spec
                .keys()
                .all(|key| self.router.load(key).requests == 0)
        {
            self.remove_worker(id);
        }
    }

    /// Frees requests active longer than the TTL (their handlers vanished).
    pub fn expire(&mut self, now: Duration) -> Vec<RequestId> {
        let expired = self.router.expire(now);
        let departed: Vec<WorkerId> = self
            .registry
            .iter()
            .filter(|e| e.departed)
            .map(|e| e.spec.id)
            .collect();
        for id in departed {
            self.remove_if_drained(id);
        }
        expired
    }

    pub fn load(&self, key: WorkerKey) -> WorkerLoad {
        self.router.load(key)
    }

    /// Every registered rank's load, by key.
    pub fn loads(&self) -> Vec<(WorkerKey, WorkerLoad)> {
        self.router
            .workers()
            .iter()
            .map(|&k| (k, self.router.load(k)))
            .collect()
    }

    pub fn active_requests(&self) -> usize {
        self.router.active().active_requests()
    }

    pub fn active_request_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.router.active().request_ids()
    }
}
