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
//!
//! - [`admission`]: admitting requests, queueing them, and releasing the queued.
//! - [`route`]: choosing a worker for a request, and following it until it ends.
//! - [`health`]: failures, stalls, canaries and degradation.
//! - [`sync`]: discovery, the event plane, resynchronisation.
//! - [`replicas`]: sharing routing state with the model's other frontends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use switchyard_core::{LoadSnapshot, RequestId, WorkerId, WorkerKey, WorkerRole};
use switchyard_router::indexer::shared::SharedIndexer;
use switchyard_router::{
    Indexer, IndexerConfig, RoutingConfig, RoutingCore, WorkerEntry, WorkerLoad,
};
use switchyard_runtime::{IndexView, KvSnapshotSource, WorkerInstance};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod admission;
mod health;
mod replicas;
mod route;
mod sync;

pub use admission::AdmissionTicket;
pub use health::Progress;
use replicas::Replicas;
pub use replicas::{ReplicaSettings, follow_replicas, publish_replicas};
pub use route::{RouteFailure, Routed};
pub use sync::{expire_requests, follow_discovery, follow_events};

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
