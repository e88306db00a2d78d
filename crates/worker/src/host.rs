//! Starting a worker on a set of planes, whatever its engine.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_core::{KvEvent, LoadSnapshot, WorkerId, WorkerKey, WorkerRole};
use switchyard_runtime::local::{LocalKvSnapshots, LocalRequestPlane};
use switchyard_runtime::net::http::HttpRequestPlane;
use switchyard_runtime::{
    Discovery, EngineService, EventPlane, Lease, RequestPlane, WorkerEvent, WorkerInstance,
};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::WorkerConfig;
use crate::disagg::{DisaggService, TransferTiming};
use crate::engine::{Engine, EngineCapabilities};
use crate::error::WorkerError;
use crate::faults::{self, CrashMode, FaultSettings, Faults, FaultyService};
use crate::kv_state::{self, KvState};
use crate::registry::EngineRegistry;

/// How a worker receives requests.
#[derive(Debug)]
pub enum Serving {
    /// Through in-process planes: requests, and its cache record for resynchronisation.
    Local {
        requests: LocalRequestPlane,
        snapshots: LocalKvSnapshots,
    },
    /// Over the network (HTTP/2) on this listener, announced at `advertise` (host:port).
    Network {
        listener: TcpListener,
        advertise: String,
        /// Refuse frontends that do not present this (see
        /// [`switchyard_runtime::net::secret`]).
        secret: Option<String>,
    },
}

/// The planes a worker attaches to.
#[derive(Debug, Clone)]
pub struct WorkerPlanes {
    pub discovery: Arc<dyn Discovery>,
    pub events: Arc<dyn EventPlane>,
}

/// A running worker. Dropping it deregisters it and stops its engine and tasks (as does the
/// cancellation token it was started with).
#[derive(Debug)]
pub struct Worker {
    pub instance: WorkerInstance,
    pub service: Arc<dyn EngineService>,
    pub kv_state: Arc<Mutex<KvState>>,
    lease: Option<Box<dyn Lease>>,
    local: Option<(LocalRequestPlane, LocalKvSnapshots)>,
    server: Option<(CancellationToken, JoinHandle<std::io::Result<()>>)>,
    /// Its injected faults.
    faults: Faults,
    /// Stops the engine and the publisher.
    stop: CancellationToken,
}

impl Worker {
    /// Builds the engine the configuration names (one of this crate's) and starts the
    /// worker on it.
    pub async fn start(
        worker_id: WorkerId,
        config: &WorkerConfig,
        planes: &WorkerPlanes,
        serving: Serving,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Worker, WorkerError> {
        let engines = EngineRegistry::builtin();
        Self::start_with(
            &engines, worker_id, config, planes, serving, tracker, cancel,
        )
        .await
    }

    /// Builds the engine the configuration names from `engines` and starts the worker on
    /// it.
    pub async fn start_with(
        engines: &EngineRegistry,
        worker_id: WorkerId,
        config: &WorkerConfig,
        planes: &WorkerPlanes,
        serving: Serving,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Worker, WorkerError> {
        let engine = engines
            .build(&config.engine, WorkerKey::from(worker_id), &config.model)
            .await?;
        Self::start_engine(
            worker_id,
            &config.model,
            config.role,
            engine,
            config.engine.load_report_interval(),
            &config.faults,
            planes,
            serving,
            tracker,
            cancel,
        )
        .await
    }

    /// Starts `engine`, serves it, publishes its events and load (at most once per
    /// `load_interval`), and registers it as a worker of `model`; plays the fault schedule
    /// and serves the fault admin endpoint if the settings ask.
    #[allow(clippy::too_many_arguments)]
    pub async fn start_engine(
        worker_id: WorkerId,
        model: &str,
        role: WorkerRole,
        engine: Box<dyn Engine>,
        load_interval: Duration,
        fault_settings: &FaultSettings,
        planes: &WorkerPlanes,
        serving: Serving,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Worker, WorkerError> {
        let key = WorkerKey::from(worker_id);
        let kv_state = Arc::new(Mutex::new(KvState::default()));
        let stop = cancel.child_token();
        // Whatever fails below, the engine and its tasks stop with it.
        let stop_on_error = stop.clone().drop_guard();
        let capabilities = engine.capabilities();
        let timing = engine.timing();
        // Prefill-only and decode requests: engines with a transfer model and blocks.
        let transfer = TransferTiming::of(engine.as_ref()).zip(capabilities.block_size);
        let encodes = capabilities.role == WorkerRole::Encoder;
        if encodes != (role == WorkerRole::Encoder) {
            return Err(WorkerError::Start(if encodes {
                format!("a media encoder cannot serve as a {role} worker")
            } else {
                format!("an LLM engine cannot serve as a {role} worker")
            }));
        }
        if matches!(role, WorkerRole::Prefill | WorkerRole::Decode) && transfer.is_none() {
            return Err(WorkerError::Start(format!(
                "this engine cannot serve as a {role} worker (it cannot hand over or take KV blocks)"
            )));
        }
        let crash = if fault_settings.crash_exits {
            CrashMode::Exit
        } else {
            CrashMode::Stop(stop.clone())
        };
        let faults = Faults::new(crash, engine.pace().unwrap_or_default());
        let running = engine.start(tracker, stop.clone()).await?;
        if running.events.is_some() || running.load.is_some() {
            tracker.spawn(publish(
                planes.events.clone(),
                model.to_string(),
                key,
                running.events,
                running.load,
                Arc::clone(&kv_state),
                load_interval,
                stop.clone(),
            ));
        }
        let mut service = running.service;
        if let Some((timing, block_size)) = transfer {
            let peers: Arc<dyn RequestPlane> = match &serving {
                Serving::Local { requests, .. } => Arc::new(requests.clone()),
                Serving::Network { secret, .. } => Arc::new(
                    HttpRequestPlane::with_secret(secret.as_deref())
                        .map_err(|e| WorkerError::Start(e.to_string()))?,
                ),
            };
            service = Arc::new(DisaggService::new(service, key, block_size, peers, timing));
        }
        let service: Arc<dyn EngineService> = Arc::new(FaultyService::new(service, faults.clone()));
        faults.schedule(&fault_settings.schedule, tracker, &stop);
        let mut instance = instance(worker_id, model, &capabilities, timing);
        instance.role = role;
        // Serve first, then register, so a frontend that sees the worker listed can reach
        // it at once (a canary sent the moment it appeared found nothing serving, and
        // counted `Unreachable` against a healthy worker). In-process, serving claims the
        // id only if it is free, so a duplicate id cannot take over the registered worker's
        // requests; the claim is given back if registration fails. Over the network:
        // listen first, for the same reason.
        match serving {
            Serving::Local {
                requests,
                snapshots,
            } => {
                let duplicate = switchyard_runtime::DiscoveryError::Duplicate(worker_id);
                if !requests.claim(worker_id, Arc::clone(&service)) {
                    return Err(duplicate.into());
                }
                let state = Arc::clone(&kv_state);
                if !snapshots.claim(worker_id, Arc::new(move || state.lock().dump())) {
                    requests.remove(worker_id);
                    return Err(duplicate.into());
                }
                let lease = match planes.discovery.register(instance.clone()).await {
                    Ok(lease) => lease,
                    Err(e) => {
                        requests.remove(worker_id);
                        snapshots.remove(worker_id);
                        return Err(e.into());
                    }
                };
                stop_on_error.disarm();
                Ok(Worker {
                    instance,
                    service,
                    kv_state,
                    lease: Some(lease),
                    local: Some((requests, snapshots)),
                    server: None,
                    faults,
                    stop,
                })
            }
            Serving::Network {
                listener,
                advertise,
                secret,
            } => {
                instance.address = Some(advertise);
                let mut app = switchyard_runtime::net::http::routes(Arc::clone(&service))
                    .merge(kv_state::routes(Arc::clone(&kv_state)));
                if let Some(token) = &fault_settings.admin_token {
                    tracing::warn!("fault injection on command is enabled (tests and demos only)");
                    app = app.merge(faults::admin_routes(
                        faults.clone(),
                        token.clone(),
                        tracker.clone(),
                        stop.clone(),
                    ));
                }
                if let Some(secret) = secret {
                    app = app.layer(axum::middleware::from_fn_with_state(
                        Arc::<str>::from(secret),
                        switchyard_runtime::net::secret::require,
                    ));
                }
                // Request bodies come from frontends, over a network that should be fast: one
                // trickled slower than 1 MiB/s past the header timeout is cut off.
                let deadline = switchyard_runtime::net::deadline::BodyDeadline {
                    grace: switchyard_runtime::net::server::ServerLimits::REQUEST_PLANE
                        .header_read_timeout,
                    min_rate: 1 << 20,
                };
                app = app.layer(deadline.layer());
                let server_stop = stop.child_token();
                let shutdown = {
                    let server_stop = server_stop.clone();
                    async move { server_stop.cancelled().await }
                };
                let task = tokio::spawn(switchyard_runtime::net::server::serve(
                    listener,
                    app,
                    switchyard_runtime::net::server::ServerLimits::REQUEST_PLANE,
                    shutdown,
                ));
                let lease = planes.discovery.register(instance.clone()).await?;
                stop_on_error.disarm();
                Ok(Worker {
                    instance,
                    service,
                    kv_state,
                    lease: Some(lease),
                    local: None,
                    server: Some((server_stop, task)),
                    faults,
                    stop,
                })
            }
        }
    }

    /// Its faults: inject one (tests, demos), see what is active.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    pub fn worker_id(&self) -> WorkerId {
        self.instance.worker_id
    }

    /// The address requests reach it on, when it serves over the network.
    pub fn address(&self) -> Option<SocketAddr> {
        self.instance
            .address
            .as_deref()
            .and_then(|a| a.parse().ok())
    }

    /// Leaves gracefully: deregisters (frontends stop routing here), then lets the requests
    /// in flight finish, for at most `grace`.
    pub async fn drain(mut self, grace: Duration) {
        self.lease.take();
        if let Some((stop, task)) = self.server.take() {
            stop.cancel();
            if tokio::time::timeout(grace, task).await.is_err() {
                tracing::warn!(worker = %self.instance.worker_id, "requests still in flight after the grace period");
            }
        }
    }
}

/// The discovery record of a worker with these capabilities.
fn instance(
    worker_id: WorkerId,
    model: &str,
    capabilities: &EngineCapabilities,
    timing: Option<(switchyard_core::perf::PerfModel, u32)>,
) -> WorkerInstance {
    let (perf, max_batched_tokens) = timing.unzip();
    WorkerInstance {
        perf,
        max_batched_tokens,
        role: capabilities.role,
        block_size: capabilities.block_size,
        capacity_blocks: capabilities.capacity_blocks,
        max_num_seqs: capabilities.max_num_seqs,
        kv_events: capabilities.kv_events,
        prompt_text: capabilities.prompt_text,
        media_embeddings: capabilities.media_embeddings,
        modalities: capabilities.modalities,
        constraints: capabilities.constraints,
        vocabularies: capabilities.vocabularies.clone(),
        logprobs: capabilities.logprobs,
        prompt_logprobs: capabilities.prompt_logprobs,
        dp_size: capabilities.dp_size.max(1),
        // Random per start: a worker restarted under the same id is told apart.
        incarnation: rand::random::<u64>(),
        ..WorkerInstance::new(worker_id, model)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some((requests, snapshots)) = &self.local {
            requests.remove(self.instance.worker_id);
            snapshots.remove(self.instance.worker_id);
        }
        if let Some((stop, _)) = &self.server {
            stop.cancel();
        }
        self.stop.cancel();
    }
}

/// Forwards KV events as they come (recording them for dumps first), and the load at most
/// once per interval (the latest state always goes out, at the end of the interval if it
/// changed within it).
#[allow(clippy::too_many_arguments)]
async fn publish(
    plane: Arc<dyn EventPlane>,
    model: String,
    worker: WorkerKey,
    mut events: Option<mpsc::Receiver<Vec<KvEvent>>>,
    mut load: Option<watch::Receiver<LoadSnapshot>>,
    kv_state: Arc<Mutex<KvState>>,
    interval: Duration,
    cancel: CancellationToken,
) {
    let mut next_report = tokio::time::Instant::now();
    let mut pending = load.is_some();
    loop {
        let report_due = tokio::time::sleep_until(next_report);
        tokio::select! {
            () = cancel.cancelled() => return,
            batch = recv_events(&mut events) => match batch {
                Some(batch) => {
                    kv_state.lock().record(&batch);
                    if let Err(e) = plane.publish(&model, WorkerEvent::Kv(batch)).await {
                        tracing::warn!(%worker, error = %e, "cannot publish KV events");
                    }
                }
                None => events = None,
            },
            changed = load_changed(&mut load) => {
                if changed {
                    pending = true;
                } else {
                    load = None;
                }
            }
            () = report_due, if pending => {
                pending = false;
                next_report = tokio::time::Instant::now() + interval;
                if let Some(load) = &mut load {
                    let snapshot = *load.borrow_and_update();
                    if let Err(e) = plane.publish(&model, WorkerEvent::Load { worker, load: snapshot }).await {
                        tracing::warn!(%worker, error = %e, "cannot publish load");
                    }
                }
            }
        }
        if events.is_none() && load.is_none() {
            return;
        }
    }
}

/// The next event batch, or never when the engine has no events (left).
async fn recv_events(events: &mut Option<mpsc::Receiver<Vec<KvEvent>>>) -> Option<Vec<KvEvent>> {
    match events {
        Some(events) => events.recv().await,
        None => std::future::pending().await,
    }
}

/// Whether the load changed (false once its sender is gone), or never without load reports.
async fn load_changed(load: &mut Option<watch::Receiver<LoadSnapshot>>) -> bool {
    match load {
        Some(load) => load.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}
