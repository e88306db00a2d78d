//! The routing service: the async shell around the routing core
//! ([`switchyard_router::RoutingCore`]), which makes every decision.
//!
//! The shell owns what the core must not: the clock, the shared KV index (looked up on the
//! request's own thread without waiting for ingestion, see
//! `switchyard_router::indexer::shared`), the workers' network addresses, the tasks that
//! follow discovery and the event plane ([`sync`]), resynchronisation from the workers'
//! dumps, and sharing state with the model's other frontends ([`replicas`]). The core sits
//! behind a mutex: a decision takes microseconds.
//!
//! Admission: a request the core queues waits here on a oneshot; whenever capacity may have
//! freed (a request ended or was routed, a worker joined), the shell asks the core for the
//! next request to release and wakes it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use switchyard_core::protocol::Prompt;
use switchyard_core::{
    LoadSnapshot, Priority, RequestId, WorkerId, WorkerKey, WorkerRole, blocks_for,
};
use switchyard_router::HealthState;
use switchyard_router::indexer::shared::SharedIndexer;
use switchyard_router::routing::degradation::DegradationState;
use switchyard_router::routing::health::{Failure, HealthChange};
use switchyard_router::{
    Admission, Indexer, IndexerConfig, LocalReason, Rejection, RouteDecision, RouteError,
    RouteQuery, RoutingConfig, RoutingCore, RoutingOverrides, WorkerEntry, WorkerLoad,
};
use switchyard_runtime::{IndexView, KvSnapshotSource, WorkerInstance};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod replicas;
mod sync;

use replicas::Replicas;
pub use replicas::{ReplicaSettings, follow_replicas, publish_replicas};
pub use sync::{expire_requests, follow_discovery, follow_events};

/// Where a request was sent.
#[derive(Debug, Clone)]
pub struct Routed {
    pub instance: WorkerInstance,
    pub decision: RouteDecision,
    /// The prefill worker computing the prompt first, when the request is disaggregated
    /// (tracked until [`RoutingService::prefill_finished`]).
    pub prefill: Option<(WorkerInstance, RouteDecision)>,
    /// Why a request for a decode worker was prefilled there, if it was.
    pub local: Option<LocalReason>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteFailure {
    #[error("no worker serves this model")]
    NoWorkers,
    #[error("{0}")]
    InvalidPrompt(String),
    #[error("{0}")]
    Internal(String),
}

/// A worker as the listing endpoint and the metrics show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerStatus {
    pub worker_id: WorkerId,
    /// healthy, suspicious, unhealthy, draining or dead.
    pub status: &'static str,
    pub role: switchyard_core::WorkerRole,
    #[serde(flatten)]
    pub entry: WorkerEntry,
    pub address: Option<String>,
    /// The timing model it announced (`polynomial` or `profile`), which routing and stall
    /// detection predict it with; none when it announced none.
    pub timing: Option<&'static str>,
    /// Its step's token budget, announced with its timing.
    pub max_batched_tokens: Option<u32>,
    pub loads: Vec<(WorkerKey, WorkerLoad, Option<LoadSnapshot>)>,
}

#[derive(Debug)]
pub struct RoutingService {
    model: String,
    started: tokio::time::Instant,
    indexer: SharedIndexer,
    core: Mutex<RoutingCore>,
    /// Discovery records of the registered workers (addresses for dispatch).
    instances: RwLock<BTreeMap<WorkerId, WorkerInstance>>,
    engine_loads: RwLock<BTreeMap<WorkerKey, LoadSnapshot>>,
    /// Requests queued by admission, waiting to be released. Lock order: `core`, then this.
    /// Queued requests: released (`Ok`), or refused while waiting with a `Retry-After`.
    waiters: Mutex<HashMap<RequestId, oneshot::Sender<Result<(), Duration>>>>,
    resync: Option<sync::Resync>,
    /// Workers being resynchronised, with their events since it began. Lock order: this,
    /// then `core`.
    syncing: Mutex<HashMap<WorkerId, Vec<switchyard_core::KvEvent>>>,
    resyncs: std::sync::atomic::AtomicU64,
    /// Woken whenever the fleet changes (a worker joined, left or changed health):
    /// requests waiting for a worker look again.
    fleet_changed: tokio::sync::Notify,
    /// Sharing routing state with the model's other frontends.
    replicas: Option<Replicas>,
    /// Per worker, bumped each time it becomes unhealthy: its streams move elsewhere.
    outages: Mutex<HashMap<WorkerId, watch::Sender<u64>>>,
    /// Per worker, when it last produced a token on any stream: a stalled stream on a
    /// worker that produced nothing at all meanwhile means the worker hangs.
    progress: Mutex<HashMap<WorkerId, Progress>>,
}

impl RoutingService {
    pub fn new(model: String, config: RoutingConfig) -> Self {
        RoutingService {
            model,
            started: tokio::time::Instant::now(),
            indexer: SharedIndexer::new(Indexer::new(IndexerConfig::default())),
            core: Mutex::new(RoutingCore::new(config)),
            instances: RwLock::new(BTreeMap::new()),
            engine_loads: RwLock::new(BTreeMap::new()),
            waiters: Mutex::new(HashMap::new()),
            resync: None,
            syncing: Mutex::new(HashMap::new()),
            resyncs: std::sync::atomic::AtomicU64::new(0),
            fleet_changed: tokio::sync::Notify::new(),
            replicas: None,
            outages: Mutex::new(HashMap::new()),
            progress: Mutex::new(HashMap::new()),
        }
    }

    /// Resynchronises workers from `source` (see [`sync`]); its tasks run on `tracker`
    /// until `cancel`.
    pub fn with_resync(
        mut self,
        source: Arc<dyn KvSnapshotSource>,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        self.resync = Some(sync::Resync {
            source,
            tracker,
            cancel,
        });
        self
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// Time since the service started: the core's `now`.
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    /// Workers that may take new requests.
    pub fn worker_count(&self) -> usize {
        self.core.lock().routable_workers()
    }

    pub fn indexer(&self) -> &SharedIndexer {
        &self.indexer
    }

    /// Tokens per block prompts are cut into.
    pub fn block_size(&self) -> u32 {
        self.core.lock().block_size()
    }

    /// The index, for comparison with the workers'.
    pub fn index_view(&self) -> IndexView {
        self.indexer.read(IndexView::of)
    }

    // ---- health ----

    /// A receiver that changes whenever `worker` becomes unhealthy.
    pub fn outages(&self, worker: WorkerId) -> watch::Receiver<u64> {
        self.outages
            .lock()
            .entry(worker)
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Where streams on `worker` mark its progress.
    pub fn progress(&self, worker: WorkerId) -> Progress {
        self.progress
            .lock()
            .entry(worker)
            .or_insert_with(|| Progress::new(self.started))
            .clone()
    }

    /// A failure of `worker`'s own making. If it became unhealthy, its streams are told.
    pub fn report_failure(&self, worker: WorkerId, failure: Failure) {
        let now = self.now();
        let (change, kept_in) = {
            let mut core = self.core.lock();
            let kept_in = |core: &RoutingCore| core.worker(worker).map(|e| e.health.kept_in);
            let before = kept_in(&core);
            let change = core.observe_failure(worker, failure, now);
            (change, kept_in(&core) != before)
        };
        if kept_in {
            tracing::warn!(%worker, failure = failure.name(), "worker kept in rotation: as many workers as health.max_unhealthy_fraction allows are out already");
        }
        self.health_changed(worker, change, Some(failure));
    }

    /// A request that completed on `worker`.
    pub fn report_success(&self, worker: WorkerId) {
        let now = self.now();
        let change = self.core.lock().observe_success(worker, now);
        self.health_changed(worker, change, None);
    }

    /// A gap between two tokens streamed from `worker`.
    pub fn report_gap(&self, worker: WorkerId, gap: Duration) {
        let now = self.now();
        self.core.lock().observe_gap(worker, gap, now);
    }

    /// A request's time to first token (for degradation against the SLO).
    pub fn report_ttft(&self, ttft: Duration) {
        self.core.lock().observe_ttft(ttft);
    }

    pub(crate) fn health_changed(
        &self,
        worker: WorkerId,
        change: Option<HealthChange>,
        failure: Option<Failure>,
    ) {
        let Some(change) = change else { return };
        match change.to {
            HealthState::Unhealthy => {
                tracing::warn!(%worker, failure = failure.map(Failure::name), "worker unhealthy: moving its requests elsewhere");
                if let Some(outage) = self.outages.lock().get(&worker) {
                    outage.send_modify(|n| *n += 1);
                }
            }
            HealthState::Suspicious => {
                tracing::info!(%worker, failure = failure.map(Failure::name), "worker suspicious")
            }
            HealthState::Healthy => tracing::info!(%worker, "worker healthy again"),
        }
        // A worker coming back may free capacity for queued requests.
        self.fleet_changed.notify_waiters();
        self.pump();
    }

    /// How much longer `worker` is predicted to be busy with the prefill routed to it.
    pub fn queued_prefill_time(&self, worker: WorkerId) -> Duration {
        let now = self.now();
        self.core.lock().queued_prefill_time(worker, now)
    }

    /// How long a stream on `worker` may go without a token.
    pub fn stall_timeout(&self, worker: WorkerId) -> Duration {
        self.core.lock().stall_timeout(worker)
    }

    /// How long a request may wait for its first token.
    pub fn first_token_timeout(&self) -> Duration {
        self.core.lock().health_config().first_token_timeout
    }

    /// Workers due a canary now (marked as being checked).
    pub fn due_canaries(&self) -> Vec<WorkerInstance> {
        let now = self.now();
        let due = self.core.lock().due_canaries(now);
        let instances = self.instances.read();
        // Encoder workers generate no tokens to check.
        due.iter()
            .filter_map(|w| instances.get(w).cloned())
            .filter(|i| i.role != WorkerRole::Encoder)
            .collect()
    }

    /// Returns once discovery has shown this service every worker of `ids` (of any role).
    pub async fn until_known(&self, ids: &[WorkerId]) {
        loop {
            let changed = self.fleet_changed();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if ids.iter().all(|id| self.instances.read().contains_key(id)) {
                return;
            }
            changed.await;
        }
    }

    /// The fleet's encoder workers.
    pub fn encoders(&self) -> Vec<WorkerInstance> {
        self.instances
            .read()
            .values()
            .filter(|i| i.role == WorkerRole::Encoder)
            .cloned()
            .collect()
    }

    /// A canary's answer, or its failure. Returns the failure it counted against the
    /// worker, if any (a wrong answer is found here).
    pub fn canary_finished(
        &self,
        worker: WorkerId,
        answer: Result<(Vec<switchyard_core::Token>, Duration), Failure>,
    ) -> Option<Failure> {
        let now = self.now();
        let (change, failure) = {
            let mut core = self.core.lock();
            let change = core.canary_finished(worker, answer, now);
            let failure = core
                .registry()
                .get(worker)
                .filter(|e| e.health.consecutive_failures > 0)
                .and_then(|e| e.health.last_failure);
            (change, failure)
        };
        self.health_changed(worker, change, failure);
        failure
    }

    /// A canary that came back with nothing to judge.
    pub fn canary_skipped(&self, worker: WorkerId) {
        self.core.lock().canary_skipped(worker);
    }

    /// The degradation level now.
    pub fn degradation_level(&self) -> u8 {
        let now = self.now();
        let mut core = self.core.lock();
        let level = core.degradation_level(now);
        if let Some(state) = core.take_degradation_change() {
            log_degradation(&state);
        }
        level
    }

    // ---- admission ----

    /// Offers a request for admission; a queued one waits here until released, or for at
    /// most the queue timeout. Returns a ticket to hold until the request is routed.
    pub async fn admit(
        self: &Arc<Self>,
        id: RequestId,
        priority: Priority,
    ) -> Result<AdmissionTicket, (Rejection, Option<Duration>)> {
        let now = self.now();
        let (admission, timeout, hint) = {
            let mut core = self.core.lock();
            let admission = core.admit(id, priority, now);
            // A request refused for its predicted wait retries once that wait has passed.
            let hint = match admission {
                Admission::Rejected(Rejection::WaitTooLong) => core.predicted_wait(priority, now),
                _ => None,
            };
            if let Some(state) = core.take_degradation_change() {
                log_degradation(&state);
            }
            let timeout = core.queue_timeout(priority);
            if admission == Admission::Queued {
                let (tx, rx) = oneshot::channel();
                self.waiters.lock().insert(id, tx);
                (Err(rx), timeout, hint)
            } else {
                (Ok(admission), timeout, hint)
            }
        };
        let ticket = AdmissionTicket {
            routing: Arc::clone(self),
            id,
        };
        match admission {
            Ok(Admission::Admitted) => Ok(ticket),
            Ok(Admission::Rejected(rejection)) => Err((rejection, hint)),
            Ok(Admission::Queued) => unreachable!("handled above"),
            // Dropping the ticket withdraws the request, whichever way this ends (timed
            // out, or the client left and this future was dropped).
            Err(released) => match tokio::time::timeout(timeout, released).await {
                Ok(Ok(Ok(()))) => Ok(ticket),
                Ok(Ok(Err(retry))) => Err((Rejection::WaitTooLong, Some(retry))),
                _ => Err((Rejection::TimedOut, None)),
            },
        }
    }

    /// A future that completes at the fleet's next change (see [`Self::pump`]); create it
    /// before looking, so a change in between is not missed.
    pub fn fleet_changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.fleet_changed.notified()
    }

    /// Releases queued requests while the core allows.
    fn pump(&self) {
        let now = self.now();
        let mut core = self.core.lock();
        // Those that can no longer start in time are told so now, not at their timeout.
        for (id, retry) in core.overdue(now) {
            if let Some(waiter) = self.waiters.lock().remove(&id) {
                let _ = waiter.send(Err(retry));
            }
        }
        while let Some(id) = core.next_admitted(now) {
            let woken = self
                .waiters
                .lock()
                .remove(&id)
                .is_some_and(|waiter| waiter.send(Ok(())).is_ok());
            if woken {
                return;
            }
            // Its waiter is gone: it gave up between being released and now.
            core.withdraw(id, now);
        }
    }

    /// Requests waiting for admission, per tier (lowest first).
    pub fn queued(&self) -> [usize; 3] {
        self.core.lock().admission().by_tier()
    }

    // ---- routing ----

    /// Joint routing of a prompt with media (see `RoutingCore::joint_media_choice`): the
    /// worker predicted to give the first token soonest when it holds the media's KV
    /// already (so encoding it would be wasted: the request is to go there), given
    /// `encode` until the media could reach any other worker. None when that worker needs
    /// the media encoded, the prompt cannot be hashed or no worker serves.
    pub fn sooner_holder(&self, prompt: &Prompt, encode: Duration) -> Option<WorkerId> {
        let end = prompt.media.iter().map(|m| m.end()).max()?;
        let block_size = self.block_size();
        let needed =
            switchyard_router::flow::media::held_blocks(end, prompt.len() as u64, block_size)?;
        let blocks = blocks_for(prompt, block_size).ok()?;
        let overlaps = self.indexer.find_matches_blocks(&blocks);
        let now = self.now();
        let mut core = self.core.lock();
        if core.block_size() != block_size {
            return None;
        }
        let query = RouteQuery {
            id: RequestId(0),
            blocks: &blocks,
            overrides: RoutingOverrides::default(),
            exclude: &[],
        };
        match core.joint_media_choice(&query, &overlaps, needed, encode, now)? {
            (holder, false) => Some(holder),
            (_, true) => None,
        }
    }

    /// Picks a worker for a prompt, other than those in `exclude` (workers that just failed
    /// it), and records the request as active on it.
    pub fn route(
        &self,
        id: RequestId,
        prompt: &Prompt,
        overrides: RoutingOverrides,
        exclude: &[WorkerId],
    ) -> Result<Routed, RouteFailure> {
        let result = self.route_inner(id, prompt, overrides, exclude);
        self.pump();
        result
    }

    fn route_inner(
        &self,
        id: RequestId,
        prompt: &Prompt,
        overrides: RoutingOverrides,
        exclude: &[WorkerId],
    ) -> Result<Routed, RouteFailure> {
        let mut block_size = self.block_size();
        loop {
            // Hashing and the index lookup run outside the core's lock.
            let blocks = blocks_for(prompt, block_size)
                .map_err(|e| RouteFailure::InvalidPrompt(e.to_string()))?;
            let overlaps = self.indexer.find_matches_blocks(&blocks);
            let now = self.now();
            let mut core = self.core.lock();
            if core.block_size() != block_size {
                // The fleet changed block size meanwhile: hash again.
                block_size = core.block_size();
                continue;
            }
            let query = RouteQuery {
                id,
                blocks: &blocks,
                overrides,
                exclude,
            };
            let (pair, local) = core
                .route_pair(&query, &overlaps, now)
                .map_err(|e| match e {
                    RouteError::NoWorkers => RouteFailure::NoWorkers,
                    RouteError::Active(e) => RouteFailure::Internal(e.to_string()),
                })?;
            let decision = pair.decode;
            // Under the core's lock: the other frontends see events in the order it took them.
            if let Some(replicas) = &self.replicas {
                replicas.routed(id, &decision, blocks.sequence_hashes());
                if let Some(prefill) = &pair.prefill {
                    replicas.routed(id.prefill_stage(), prefill, blocks.sequence_hashes());
                }
            }
            let instances = self.instances.read();
            let instance = instances.get(&decision.worker.worker_id).cloned();
            let prefill = pair
                .prefill
                .map(|p| (instances.get(&p.worker.worker_id).cloned(), p));
            drop(instances);
            return match (instance, prefill) {
                (Some(instance), None) => Ok(Routed {
                    instance,
                    decision,
                    prefill: None,
                    local,
                }),
                (Some(instance), Some((Some(prefill), p))) => Ok(Routed {
                    instance,
                    decision,
                    prefill: Some((prefill, p)),
                    local,
                }),
                _ => {
                    let decode = core.finish(id);
                    let prefill = core.prefill_finished(id);
                    if let Some(replicas) = &self.replicas {
                        if decode.is_some() {
                            replicas.finished(id);
                        }
                        if prefill.is_some() {
                            replicas.finished(id.prefill_stage());
                        }
                    }
                    Err(RouteFailure::NoWorkers)
                }
            };
        }
    }

    /// The request's first token arrived: its prompt is computed (less prefill queued on
    /// its worker may let a queued request go).
    /// The request went to its worker ahead of its media (see
    /// [`switchyard_router::RoutingCore::media_pending`]).
    pub fn media_pending(&self, id: RequestId, prompt_tokens: u64, media_from: u64) {
        self.core
            .lock()
            .media_pending(id, prompt_tokens, media_from);
    }

    /// The request's media are ready: the rest of its prompt joins its worker's queue.
    pub fn media_ready(&self, id: RequestId) {
        let now = self.now();
        self.core.lock().media_ready(id, now);
    }

    pub fn prefill_done(&self, id: RequestId) {
        let now = self.now();
        let queued = {
            let mut core = self.core.lock();
            if core.prefill_done(id, now)
                && let Some(replicas) = &self.replicas
            {
                replicas.prefill_done(id);
            }
            core.queued() > 0
        };
        if queued {
            self.pump();
        }
    }

    /// The request ended, however it ended.
    pub fn finish(&self, id: RequestId) {
        {
            let mut core = self.core.lock();
            if core.finish(id).is_some()
                && let Some(replicas) = &self.replicas
            {
                replicas.finished(id);
            }
            // A remote prefill still open (its request given up mid-prefill).
            if core.prefill_finished(id).is_some()
                && let Some(replicas) = &self.replicas
            {
                replicas.finished(id.prefill_stage());
            }
        }
        self.pump();
    }

    /// The request's remote prefill is over (its first token came back, or it failed):
    /// its prefill worker no longer counts it.
    pub fn prefill_finished(&self, id: RequestId) {
        {
            let mut core = self.core.lock();
            if core.prefill_finished(id).is_some()
                && let Some(replicas) = &self.replicas
            {
                replicas.finished(id.prefill_stage());
            }
        }
        self.pump();
    }

    /// A request started: the fleet-wide budget of moves grows.
    pub fn credit_migration(&self) {
        self.core.lock().credit_migration();
    }

    /// Takes one move from the fleet-wide budget, if one is left.
    pub fn spend_migration(&self) -> bool {
        self.core.lock().spend_migration()
    }

    /// Whether every worker is at or above its busy threshold.
    pub fn all_busy(&self) -> bool {
        self.core.lock().all_busy()
    }

    /// The router's view of every worker's load, and the engines' own last report.
    pub fn loads(&self) -> Vec<(WorkerKey, WorkerLoad, Option<LoadSnapshot>)> {
        let loads = self.core.lock().loads();
        let engine = self.engine_loads.read();
        loads
            .into_iter()
            .map(|(k, load)| (k, load, engine.get(&k).copied()))
            .collect()
    }

    /// Every registered worker: role, health, draining, address and loads.
    pub fn workers(&self) -> Vec<WorkerStatus> {
        let core = self.core.lock();
        let instances = self.instances.read();
        let engine = self.engine_loads.read();
        core.registry()
            .iter()
            .map(|entry| {
                let instance = instances.get(&entry.spec.id);
                WorkerStatus {
                    worker_id: entry.spec.id,
                    status: entry.status(),
                    role: entry.spec.role,
                    entry: entry.clone(),
                    address: instance.and_then(|i| i.address.clone()),
                    timing: instance
                        .and_then(|i| i.perf.as_ref())
                        .map(|perf| match perf {
                            switchyard_core::perf::PerfModel::Polynomial => "polynomial",
                            switchyard_core::perf::PerfModel::Interpolated(_) => "profile",
                        }),
                    max_batched_tokens: instance.and_then(|i| i.max_batched_tokens),
                    loads: entry
                        .spec
                        .keys()
                        .map(|k| (k, core.load(k), engine.get(&k).copied()))
                        .collect(),
                }
            })
            .collect()
    }

    pub fn active_requests(&self) -> usize {
        self.core.lock().active_requests()
    }

    /// Frees requests that never ended (their handler vanished without a trace).
    pub fn expire(&self) -> usize {
        let now = self.now();
        let expired = self.core.lock().expire(now);
        self.pump();
        expired.len()
    }
}

/// When a worker last produced a token (on any stream), shared by its streams: one atomic
/// store per token.
#[derive(Debug, Clone)]
pub struct Progress {
    started: tokio::time::Instant,
    /// Microseconds since `started`.
    last: Arc<std::sync::atomic::AtomicU64>,
}

impl Progress {
    fn new(started: tokio::time::Instant) -> Self {
        let now = started.elapsed().as_micros() as u64;
        Progress {
            started,
            last: Arc::new(std::sync::atomic::AtomicU64::new(now)),
        }
    }

    /// The worker produced a token at `now`.
    pub fn mark(&self, now: tokio::time::Instant) {
        let micros = (now - self.started).as_micros() as u64;
        self.last
            .fetch_max(micros, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long since the worker last produced a token.
    pub fn idle(&self) -> Duration {
        let last = Duration::from_micros(self.last.load(std::sync::atomic::Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }
}

/// Held by an admitted request until it has been routed; dropping it lets the next queued
/// request go (and withdraws this one if it was still queued).
#[derive(Debug)]
pub struct AdmissionTicket {
    routing: Arc<RoutingService>,
    id: RequestId,
}

impl Drop for AdmissionTicket {
    fn drop(&mut self) {
        let now = self.routing.now();
        let withdrawn = {
            let mut core = self.routing.core.lock();
            self.routing.waiters.lock().remove(&self.id);
            core.withdraw(self.id, now)
        };
        if withdrawn {
            self.routing.pump();
        }
    }
}

/// A change of degradation level, with what it was computed from.
fn log_degradation(state: &DegradationState) {
    let DegradationState {
        level,
        healthy,
        registered,
        lost,
        ttft_seconds,
    } = *state;
    if level > 0 {
        tracing::warn!(
            level,
            healthy,
            registered,
            lost,
            ttft_seconds,
            "degradation level changed"
        );
    } else {
        tracing::info!(
            healthy,
            registered,
            lost,
            ttft_seconds,
            "degradation cleared"
        );
    }
}
