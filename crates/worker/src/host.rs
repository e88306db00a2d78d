//! Starting a worker on a set of planes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use switchyard_core::{WorkerId, WorkerKey};
use switchyard_mocker::{MockEngine, PerfModel, driver};
use switchyard_runtime::local::LocalRequestPlane;
use switchyard_runtime::{
    Discovery, EngineService, EventPlane, Lease, WorkerEvent, WorkerInstance,
};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{EngineConfig, WorkerConfig};
use crate::echo::EchoService;
use crate::kv_state::{self, KvState};
use crate::mocker::MockerService;

/// How a worker receives requests.
#[derive(Debug)]
pub enum Serving {
    /// Through an in-process request plane.
    Local(LocalRequestPlane),
    /// Over the network (HTTP/2) on this listener, announced at `advertise` (host:port).
    Network {
        listener: TcpListener,
        advertise: String,
    },
}

/// The planes a worker attaches to.
#[derive(Debug, Clone)]
pub struct WorkerPlanes {
    pub discovery: Arc<dyn Discovery>,
    pub events: Arc<dyn EventPlane>,
}

#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("invalid engine arguments: {0}")]
    Engine(#[from] switchyard_mocker::config::InvalidArgs),
    #[error(transparent)]
    Profile(#[from] switchyard_mocker::perf::ProfileError),
    #[error(transparent)]
    Discovery(#[from] switchyard_runtime::DiscoveryError),
    #[error("cannot serve requests: {0}")]
    Io(#[from] std::io::Error),
}

/// A running worker. Dropping it deregisters it and stops its engine and tasks (as does the
/// cancellation token it was started with).
#[derive(Debug)]
pub struct Worker {
    pub instance: WorkerInstance,
    pub service: Arc<dyn EngineService>,
    pub kv_state: Arc<Mutex<KvState>>,
    lease: Option<Box<dyn Lease>>,
    local: Option<LocalRequestPlane>,
    server: Option<(CancellationToken, JoinHandle<std::io::Result<()>>)>,
    /// Stops the engine and the publisher.
    stop: CancellationToken,
}

impl Worker {
    /// Builds the engine, serves it, publishes its events and load, and registers it.
    pub async fn start(
        worker_id: WorkerId,
        config: &WorkerConfig,
        planes: &WorkerPlanes,
        serving: Serving,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Worker, WorkerError> {
        let key = WorkerKey {
            worker_id,
            dp_rank: 0,
        };
        let kv_state = Arc::new(Mutex::new(KvState::default()));
        let incarnation = rand::random::<u64>();
        let stop = cancel.child_token();
        // Whatever fails below, the engine and its tasks stop with it.
        let stop_on_error = stop.clone().drop_guard();
        let cancel = stop.clone();
        let (service, mut instance): (Arc<dyn EngineService>, WorkerInstance) = match &config.engine
        {
            EngineConfig::Mocker(mocker) => {
                let perf = match &mocker.perf_profile {
                    Some(path) => PerfModel::load(path)?,
                    None => PerfModel::Polynomial,
                };
                let engine = MockEngine::new(key, mocker.args, perf, mocker.seed ^ worker_id.0)?;
                let (events_tx, events_rx) = mpsc::unbounded_channel();
                let (handle, _task) =
                    driver::spawn(engine, Some(events_tx), tracker, cancel.clone());
                tracker.spawn(publish(
                    planes.events.clone(),
                    config.model.clone(),
                    key,
                    events_rx,
                    handle.watch_load(),
                    Arc::clone(&kv_state),
                    mocker.load_report_interval,
                    cancel.clone(),
                ));
                let instance = WorkerInstance {
                    worker_id,
                    model: config.model.clone(),
                    block_size: mocker.args.block_size,
                    capacity_blocks: u64::from(mocker.args.num_gpu_blocks),
                    max_num_seqs: mocker.args.max_num_seqs,
                    dp_size: 1,
                    address: None,
                    incarnation,
                };
                (
                    Arc::new(MockerService::new(handle, mocker.args.block_size)),
                    instance,
                )
            }
            EngineConfig::Echo(echo) => {
                let instance = WorkerInstance {
                    worker_id,
                    model: config.model.clone(),
                    block_size: echo.block_size.max(1),
                    capacity_blocks: u64::MAX / 2,
                    max_num_seqs: u32::MAX,
                    dp_size: 1,
                    address: None,
                    incarnation,
                };
                (Arc::new(EchoService::new(echo.clone())), instance)
            }
        };
        // In-process: register first, so a duplicate id cannot take over the registered
        // worker's requests. (Until it serves, a frontend gets `UnknownWorker` and tries
        // another.) Over the network: listen first, so it is reachable once listed.
        if let Serving::Local(plane) = serving {
            let lease = planes.discovery.register(instance.clone()).await?;
            plane.serve(worker_id, Arc::clone(&service));
            stop_on_error.disarm();
            return Ok(Worker {
                instance,
                service,
                kv_state,
                lease: Some(lease),
                local: Some(plane),
                server: None,
                stop,
            });
        }
        let server = match serving {
            Serving::Local(_) => None,
            Serving::Network {
                listener,
                advertise,
            } => {
                instance.address = Some(advertise);
                let app = switchyard_runtime::net::http::routes(Arc::clone(&service))
                    .merge(kv_state::routes(Arc::clone(&kv_state)));
                let stop = cancel.child_token();
                let shutdown = {
                    let stop = stop.clone();
                    async move { stop.cancelled().await }
                };
                let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                    let _ = tcp.set_nodelay(true);
                });
                let task = tokio::spawn(async move {
                    axum::serve(listener, app)
                        .with_graceful_shutdown(shutdown)
                        .await
                });
                Some((stop, task))
            }
        };
        let lease = planes.discovery.register(instance.clone()).await?;
        stop_on_error.disarm();
        Ok(Worker {
            instance,
            service,
            kv_state,
            lease: Some(lease),
            local: None,
            server,
            stop,
        })
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

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(local) = &self.local {
            local.remove(self.instance.worker_id);
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
    mut events: mpsc::UnboundedReceiver<Vec<switchyard_core::KvEvent>>,
    mut load: tokio::sync::watch::Receiver<switchyard_core::LoadSnapshot>,
    kv_state: Arc<Mutex<KvState>>,
    interval: Duration,
    cancel: CancellationToken,
) {
    let mut next_report = tokio::time::Instant::now();
    let mut pending = true;
    loop {
        let report_due = tokio::time::sleep_until(next_report);
        tokio::select! {
            () = cancel.cancelled() => return,
            batch = events.recv() => match batch {
                Some(batch) => {
                    kv_state.lock().record(&batch);
                    if let Err(e) = plane.publish(&model, WorkerEvent::Kv(batch)).await {
                        tracing::warn!(%worker, error = %e, "cannot publish KV events");
                    }
                }
                None => return,
            },
            changed = load.changed() => {
                if changed.is_err() {
                    return;
                }
                pending = true;
            }
            () = report_due, if pending => {
                pending = false;
                next_report = tokio::time::Instant::now() + interval;
                let snapshot = *load.borrow_and_update();
                if let Err(e) = plane.publish(&model, WorkerEvent::Load { worker, load: snapshot }).await {
                    tracing::warn!(%worker, error = %e, "cannot publish load");
                }
            }
        }
    }
}
