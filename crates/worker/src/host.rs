//! Starting a worker on a set of planes.

use std::sync::Arc;

use switchyard_core::{WorkerId, WorkerKey};
use switchyard_mocker::{MockEngine, PerfModel, driver};
use switchyard_runtime::local::LocalRequestPlane;
use switchyard_runtime::{
    Discovery, EngineService, EventPlane, Lease, WorkerEvent, WorkerInstance,
};
use thiserror::Error;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{EngineConfig, WorkerConfig};
use crate::echo::EchoService;
use crate::mocker::MockerService;

/// The planes a worker attaches to.
#[derive(Debug, Clone)]
pub struct WorkerPlanes {
    pub discovery: Arc<dyn Discovery>,
    pub events: Arc<dyn EventPlane>,
    /// The in-process request plane to serve on.
    pub requests: LocalRequestPlane,
}

#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("invalid engine arguments: {0}")]
    Engine(#[from] switchyard_mocker::config::InvalidArgs),
    #[error(transparent)]
    Profile(#[from] switchyard_mocker::perf::ProfileError),
    #[error(transparent)]
    Discovery(#[from] switchyard_runtime::DiscoveryError),
}

/// A running worker. Dropping it deregisters it; its tasks stop with the cancellation token
/// it was started with.
#[derive(Debug)]
pub struct Worker {
    pub instance: WorkerInstance,
    pub service: Arc<dyn EngineService>,
    lease: Box<dyn Lease>,
    requests: LocalRequestPlane,
}

impl Worker {
    /// Builds the engine, serves it on the request plane, publishes its events and load,
    /// and registers it.
    pub async fn start(
        worker_id: WorkerId,
        config: &WorkerConfig,
        planes: &WorkerPlanes,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Worker, WorkerError> {
        let key = WorkerKey {
            worker_id,
            dp_rank: 0,
        };
        let (service, instance): (Arc<dyn EngineService>, WorkerInstance) = match &config.engine {
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
                };
                (Arc::new(EchoService::new(echo.clone())), instance)
            }
        };
        planes.requests.serve(worker_id, Arc::clone(&service));
        let lease = planes.discovery.register(instance.clone()).await?;
        Ok(Worker {
            instance,
            service,
            lease,
            requests: planes.requests.clone(),
        })
    }

    pub fn worker_id(&self) -> WorkerId {
        self.lease.worker_id()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.requests.remove(self.instance.worker_id);
    }
}

/// Forwards KV events as they come, and the load at most once per interval (the latest
/// state always goes out, at the end of the interval if it changed within it).
async fn publish(
    plane: Arc<dyn EventPlane>,
    model: String,
    worker: WorkerKey,
    mut events: mpsc::UnboundedReceiver<Vec<switchyard_core::KvEvent>>,
    mut load: tokio::sync::watch::Receiver<switchyard_core::LoadSnapshot>,
    interval: std::time::Duration,
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
