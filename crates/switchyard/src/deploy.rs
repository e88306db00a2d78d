//! Assembling a deployment: the planes, the workers and the frontend.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use switchyard_core::WorkerId;
use switchyard_frontend::preprocess::Preprocessor;
use switchyard_frontend::routing::RoutingService;
use switchyard_frontend::{Frontend, FrontendConfig, server};
use switchyard_router::RouterConfig;
use switchyard_router::policy::KvPolicyConfig;
use switchyard_runtime::local::{LocalDiscovery, LocalEventPlane, LocalRequestPlane};
use switchyard_runtime::{Discovery, EventPlane, RequestPlane};
use switchyard_worker::{EngineConfig, Worker, WorkerConfig, WorkerPlanes};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, EngineKind};

/// A running deployment.
#[derive(Debug)]
pub struct Deployment {
    pub address: SocketAddr,
    pub frontend: Arc<Frontend>,
    pub workers: Vec<Worker>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    server: JoinHandle<std::io::Result<()>>,
}

impl Deployment {
    /// Stops accepting, finishes the responses in flight, then stops the workers.
    pub async fn shutdown(self) -> Result<()> {
        self.cancel.cancel();
        let served = self.server.await;
        drop(self.workers);
        self.tracker.close();
        self.tracker.wait().await;
        served??;
        Ok(())
    }
}

/// The frontend on its planes: preprocessor, routing service, background tasks, HTTP.
pub async fn start_frontend(
    config: &FrontendConfig,
    discovery: &dyn Discovery,
    events: &dyn EventPlane,
    requests: Arc<dyn RequestPlane>,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> Result<(Arc<Frontend>, TcpListener)> {
    let preprocessor = match &config.tokenizer {
        Some(dir) => Preprocessor::from_dir(dir, config.context_length)?,
        None => Preprocessor::builtin(config.context_length.unwrap_or(32_768)),
    };
    let settings = config.router;
    let routing = Arc::new(RoutingService::new(
        config.model.clone(),
        RouterConfig {
            policy: settings.policy,
            kv: KvPolicyConfig {
                overlap_weight: settings.overlap_weight,
                temperature: settings.temperature,
            },
            request_ttl: settings.request_ttl,
            seed: settings.seed,
            ..RouterConfig::default()
        },
    ));
    let frontend = Arc::new(Frontend::new(
        config.clone(),
        Arc::new(preprocessor),
        routing,
        requests,
    ));
    server::start_background(&frontend, discovery, events, tracker, cancel).await?;
    let (host, port) = (config.host.as_str(), config.port);
    let listener = TcpListener::bind((host, port))
        .await
        .with_context(|| format!("cannot listen on {host}:{port}"))?;
    Ok((frontend, listener))
}

/// Everything in one process: in-process planes, `config.workers.count` workers, the
/// frontend.
pub async fn start_local(config: Config) -> Result<Deployment> {
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let discovery = Arc::new(LocalDiscovery::new());
    let events = Arc::new(LocalEventPlane::new());
    let requests = LocalRequestPlane::new();

    let (frontend, listener) = start_frontend(
        &config.frontend,
        discovery.as_ref(),
        events.as_ref(),
        Arc::new(requests.clone()),
        &tracker,
        &cancel,
    )
    .await?;

    let planes = WorkerPlanes {
        discovery,
        events,
        requests,
    };
    let engine = match config.workers.engine {
        EngineKind::Mocker => EngineConfig::Mocker(config.workers.mocker.clone()),
        EngineKind::Echo => EngineConfig::Echo(config.workers.echo.clone()),
    };
    let worker_config = WorkerConfig {
        model: config.frontend.model.clone(),
        engine,
    };
    let mut workers = Vec::new();
    for i in 0..config.workers.count {
        workers.push(
            Worker::start(
                WorkerId(u64::from(i) + 1),
                &worker_config,
                &planes,
                &tracker,
                cancel.clone(),
            )
            .await?,
        );
    }

    let address = listener.local_addr()?;
    let shutdown = {
        let cancel = cancel.clone();
        async move { cancel.cancelled().await }
    };
    let server = tokio::spawn(server::serve(listener, Arc::clone(&frontend), shutdown));
    Ok(Deployment {
        address,
        frontend,
        workers,
        cancel,
        tracker,
        server,
    })
}
