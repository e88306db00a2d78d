//! Assembling a deployment: the planes, the workers and the frontend.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use switchyard_core::{WorkerId, WorkerRole};
use switchyard_frontend::auth::KeyTable;
use switchyard_frontend::config::{BuiltinTokenizer, DEFAULT_CONTEXT_LENGTH};
use switchyard_frontend::preprocess::{PreprocessError, Preprocessor};
use switchyard_frontend::routing::{ReplicaSettings, RoutingService};
use switchyard_frontend::{Frontend, FrontendConfig, server};
use switchyard_runtime::local::{
    LocalDiscovery, LocalEventPlane, LocalKvSnapshots, LocalRequestPlane,
};
use switchyard_runtime::net::etcd::EtcdDiscovery;
use switchyard_runtime::net::http::HttpRequestPlane;
use switchyard_runtime::net::kv::KvDumpClient;
use switchyard_runtime::net::nats::NatsEventPlane;
use switchyard_runtime::{Discovery, EventPlane, KvSnapshotSource, ReplicaPlane, RequestPlane};
use switchyard_worker::{Serving, Worker, WorkerConfig, WorkerPlanes};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;

/// How long `shutdown` lets the responses in flight run before cutting them off.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// A running deployment.
#[derive(Debug)]
pub struct Deployment {
    pub address: SocketAddr,
    /// The admin listener (`/metrics`, `/v1/internal/*`), when `frontend.admin.port` is set.
    pub admin_address: Option<SocketAddr>,
    pub frontend: Arc<Frontend>,
    pub workers: Vec<Worker>,
    /// Stops the HTTP server (which then finishes the responses in flight).
    stop_http: CancellationToken,
    /// Stops everything else: workers, engines, background tasks.
    cancel: CancellationToken,
    tracker: TaskTracker,
    server: JoinHandle<std::io::Result<()>>,
}

impl Deployment {
    /// Stops accepting, finishes the responses in flight (for at most `grace`), then stops
    /// the workers and the background tasks.
    pub async fn shutdown(self, grace: Duration) -> Result<()> {
        self.stop_http.cancel();
        let mut server = self.server;
        let served = match tokio::time::timeout(grace, &mut server).await {
            Ok(served) => Some(served),
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "responses still in flight after the grace period; cutting them off"
                );
                None
            }
        };
        self.cancel.cancel();
        drop(self.workers);
        if served.is_none() {
            server.abort();
        }
        self.tracker.close();
        self.tracker.wait().await;
        if let Some(served) = served {
            served??;
        }
        Ok(())
    }
}

/// How a frontend keeps in step with the rest of a distributed deployment.
#[derive(Debug, Default)]
pub struct FrontendSync {
    /// Rebuild workers' index entries from their dumps when needed.
    pub resync: Option<Arc<dyn KvSnapshotSource>>,
    /// Share routing state with the model's other frontends.
    pub replicas: Option<Arc<dyn ReplicaPlane>>,
    /// Publish the traffic counters there (every second), for `switchyard planner`
    /// watching the planes.
    pub traffic: Option<Arc<dyn ReplicaPlane>>,
}

/// The frontend on its planes: preprocessor, routing service, background tasks, HTTP.
pub async fn start_frontend(
    config: &FrontendConfig,
    discovery: &dyn Discovery,
    events: &dyn EventPlane,
    requests: Arc<dyn RequestPlane>,
    sync: FrontendSync,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> Result<(Arc<Frontend>, Listeners)> {
    let preprocessor = preprocessor(config)?;
    let keys = KeyTable::from_config(&config.auth)?;
    let mut routing = RoutingService::new(config.model.clone(), config.routing());
    if let Some(source) = sync.resync {
        routing = routing.with_resync(source, tracker.clone(), cancel.clone());
    }
    let mut replicas = None;
    if let Some(plane) = sync.replicas {
        let (with, outbox) = routing.with_replicas(rand::random(), ReplicaSettings::default());
        routing = with;
        replicas = Some((plane, outbox));
    }
    let routing = Arc::new(routing);
    let frontend = Arc::new(
        Frontend::new(config.clone(), Arc::new(preprocessor), routing, requests).with_keys(keys),
    );
    let (host, port) = (config.host.as_str(), config.port);
    let public = switchyard_runtime::net::server::bind((host, port))
        .await
        .with_context(|| format!("cannot listen on {host}:{port}"))?;
    let admin = match config.admin.port {
        Some(port) => {
            let host = config.admin.host.as_str();
            Some(
                switchyard_runtime::net::server::bind((host, port))
                    .await
                    .with_context(|| format!("cannot listen on {host}:{port} (frontend.admin)"))?,
            )
        }
        None => None,
    };
    server::start_background(&frontend, discovery, events, replicas, tracker, cancel).await?;
    if let Some(plane) = sync.traffic {
        tracker.spawn(server::publish_traffic(
            Arc::clone(&frontend),
            plane,
            Duration::from_secs(1),
            cancel.clone(),
        ));
    }
    Ok((frontend, Listeners { public, admin }))
}

/// The frontend's bound listeners: the public API, and the admin one if configured.
#[derive(Debug)]
pub struct Listeners {
    pub public: TcpListener,
    pub admin: Option<TcpListener>,
}

/// How long `serve` waits, at start, for its frontend to see the workers it started.
const WORKERS_SEEN_WITHIN: Duration = Duration::from_secs(10);

/// Everything in one process: in-process planes, `config.workers.count` workers, the
/// frontend.
pub async fn start_local(config: Config) -> Result<Deployment> {
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    // Whatever fails on the way, what was started stops.
    let stop_on_error = cancel.clone().drop_guard();
    let discovery = Arc::new(LocalDiscovery::new());
    let events = Arc::new(LocalEventPlane::new());
    let requests = LocalRequestPlane::new();
    // The workers' cache records, for the frontend to resynchronise from (a restarted
    // worker, or events lost while the frontend fell behind).
    let snapshots = LocalKvSnapshots::new();

    // An engine's model file may hold the tokenizer and chat template the frontend needs.
    let mut frontend_config = config.frontend.clone();
    if frontend_config.tokenizer.is_none() {
        frontend_config.tokenizer = config.workers.engine_tokenizer();
    }
    let (frontend, listener) = start_frontend(
        &frontend_config,
        discovery.as_ref(),
        events.as_ref(),
        Arc::new(requests.clone()),
        FrontendSync {
            resync: Some(Arc::new(snapshots.clone())),
            replicas: None,
            traffic: None,
        },
        &tracker,
        &cancel,
    )
    .await?;

    let planes = WorkerPlanes { discovery, events };
    let worker_config = config.worker_config();
    anyhow::ensure!(
        worker_config.faults == Default::default(),
        "worker.faults applies to `switchyard worker` processes, not to `serve`'s workers"
    );
    // The LLM workers, then the encoder workers: timed as the frontend models them, or
    // real for the modalities `workers.encoder` names models for.
    let mut configs: Vec<WorkerConfig> = (0..config.workers.count)
        .map(|i| WorkerConfig {
            role: match config.workers.prefill {
                0 => WorkerRole::Aggregated,
                p if i < p => WorkerRole::Prefill,
                _ => WorkerRole::Decode,
            },
            ..worker_config.clone()
        })
        .collect();
    configs.extend(
        (0..config.frontend.multimodal.encoders).map(|_| WorkerConfig {
            role: WorkerRole::Encoder,
            engine: config.encoder_engine(),
            ..worker_config.clone()
        }),
    );
    let mut workers = Vec::new();
    for (id, worker) in (1..).zip(&configs) {
        workers.push(
            start_worker(
                WorkerId(id),
                worker,
                &planes,
                Serving::Local {
                    requests: requests.clone(),
                    snapshots: snapshots.clone(),
                },
                &tracker,
                cancel.clone(),
            )
            .await?,
        );
    }

    // Served once the frontend sees every worker: a request arriving before the encoder
    // workers are known would have its media go unencoded.
    let ids: Vec<WorkerId> = workers.iter().map(Worker::worker_id).collect();
    let seen = frontend.routing.until_known(&ids);
    if tokio::time::timeout(WORKERS_SEEN_WITHIN, seen)
        .await
        .is_err()
    {
        tracing::warn!(
            within = ?WORKERS_SEEN_WITHIN,
            "the frontend has not seen every worker yet; serving anyway"
        );
    }
    stop_on_error.disarm();
    Deployment::serve(listener, frontend, workers, tracker, cancel)
}

impl Deployment {
    fn serve(
        listeners: Listeners,
        frontend: Arc<Frontend>,
        workers: Vec<Worker>,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Deployment> {
        let address = listeners.public.local_addr()?;
        let stop_http = cancel.child_token();
        let shutdown = {
            let stop_http = stop_http.clone();
            async move { stop_http.cancelled().await }
        };
        let admin_address = match listeners.admin {
            Some(admin) => {
                let address = admin.local_addr()?;
                // Metrics and internal endpoints answer until everything stops.
                let stop = cancel.clone();
                let frontend = Arc::clone(&frontend);
                tracker.spawn(async move {
                    let shutdown = async move { stop.cancelled().await };
                    if let Err(e) = server::serve_admin(admin, frontend, shutdown).await {
                        tracing::error!(error = %e, "the admin listener failed");
                    }
                });
                Some(address)
            }
            None => None,
        };
        let server = tokio::spawn(server::serve(
            listeners.public,
            Arc::clone(&frontend),
            shutdown,
        ));
        Ok(Deployment {
            address,
            admin_address,
            frontend,
            workers,
            stop_http,
            cancel,
            tracker,
            server,
        })
    }
}

/// Discovery through etcd and events through NATS, as `config.runtime` says.
pub async fn connect(
    config: &Config,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> Result<(EtcdDiscovery, NatsEventPlane)> {
    let runtime = &config.runtime;
    let planes = runtime.planes()?;
    let discovery = EtcdDiscovery::start(
        &planes.etcd,
        &runtime.namespace,
        runtime.lease_ttl,
        tracker.clone(),
        cancel.clone(),
    );
    let events = NatsEventPlane::connect(
        &planes.nats,
        &runtime.namespace,
        tracker.clone(),
        cancel.clone(),
    )
    .await?;
    Ok((discovery, events))
}

/// A frontend of a distributed deployment: workers from etcd, their events from NATS,
/// requests to them over HTTP/2.
pub async fn start_distributed_frontend(config: Config) -> Result<Deployment> {
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let stop_on_error = cancel.clone().drop_guard();
    let (discovery, events) = connect(&config, &tracker, &cancel).await?;
    let secret = config.runtime.request_secret.as_deref();
    let requests = HttpRequestPlane::with_secret(secret)?;
    let dumps = KvDumpClient::with_secret(secret)?;
    let sync = FrontendSync {
        resync: Some(Arc::new(dumps)),
        replicas: config
            .runtime
            .replica_sync
            .then(|| Arc::new(events.clone()) as Arc<dyn ReplicaPlane>),
        traffic: Some(Arc::new(events.clone())),
    };
    let (frontend, listener) = start_frontend(
        &config.frontend,
        &discovery,
        &events,
        Arc::new(requests),
        sync,
        &tracker,
        &cancel,
    )
    .await?;
    stop_on_error.disarm();
    Deployment::serve(listener, frontend, Vec::new(), tracker, cancel)
}

/// A worker of a distributed deployment, serving requests over HTTP/2.
#[derive(Debug)]
pub struct WorkerProcess {
    pub worker: Worker,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl WorkerProcess {
    /// Deregisters, lets the requests in flight finish (for at most `grace`), then stops.
    pub async fn drain(self, grace: Duration) {
        self.worker.drain(grace).await;
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

pub async fn start_distributed_worker(config: Config) -> Result<WorkerProcess> {
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let stop_on_error = cancel.clone().drop_guard();
    let listen = &config.worker.listen;
    let listener = switchyard_runtime::net::server::bind(listen.as_str())
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr()?;
    let advertise = match &config.worker.advertise {
        Some(address) => address.clone(),
        None if local.ip().is_unspecified() => anyhow::bail!(
            "worker.listen ({listen}) binds every interface: say where frontends reach this worker with --advertise HOST:PORT"
        ),
        None => local.to_string(),
    };
    let (discovery, events) = connect(&config, &tracker, &cancel).await?;
    let id = config
        .worker
        .id
        .unwrap_or_else(|| rand::random::<u64>() >> 1 | 1);
    let mut worker_config = config.worker_config();
    // A crash (fault injection) ends this process, as a real one would.
    worker_config.faults.crash_exits = true;
    let worker = start_worker(
        WorkerId(id),
        &worker_config,
        &WorkerPlanes {
            discovery: Arc::new(discovery),
            events: Arc::new(events),
        },
        Serving::Network {
            listener,
            advertise,
            secret: config.runtime.request_secret.clone(),
        },
        &tracker,
        cancel.clone(),
    )
    .await?;
    stop_on_error.disarm();
    Ok(WorkerProcess {
        worker,
        cancel,
        tracker,
    })
}

/// The frontend's tokenizer and chat template: the model directory's, else a built-in one.
/// A directory whose files declare no context length gets the default one, with a warning.
pub fn preprocessor(config: &FrontendConfig) -> Result<Preprocessor> {
    let preprocessor = model_preprocessor(config)?;
    Ok(match &config.chat.template {
        Some(path) => preprocessor.with_chat_template(path)?,
        None => preprocessor,
    })
}

/// The model's own tokenizer and chat template.
fn model_preprocessor(config: &FrontendConfig) -> Result<Preprocessor> {
    let context_length = config.context_length;
    if let Some(path) = config.tokenizer.as_deref().filter(|p| is_gguf(p)) {
        return gguf_preprocessor(path, context_length);
    }
    Ok(match (&config.tokenizer, config.builtin_tokenizer) {
        (Some(dir), _) => match Preprocessor::from_dir(dir, context_length) {
            Err(PreprocessError::UnknownContextLength { dir, keys }) => {
                tracing::warn!(
                    dir = %dir.display(),
                    context_length = DEFAULT_CONTEXT_LENGTH,
                    "the model's files declare no context length (none of {keys}); using the \
                     default (set frontend.context_length or --context-length to choose)"
                );
                Preprocessor::from_dir(&dir, Some(DEFAULT_CONTEXT_LENGTH))?
            }
            other => other?,
        },
        (None, BuiltinTokenizer::Smollm2) => {
            Preprocessor::smollm2(Some(context_length.unwrap_or(DEFAULT_CONTEXT_LENGTH)))?
        }
        (None, BuiltinTokenizer::Bytes) => {
            Preprocessor::builtin(context_length.unwrap_or(DEFAULT_CONTEXT_LENGTH))
        }
    })
}

/// Whether a tokenizer path names a GGUF file (by its magic bytes).
fn is_gguf(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    path.is_file()
        && std::fs::File::open(path)
            .and_then(|mut f| f.read_exact(&mut magic))
            .is_ok()
        && &magic == b"GGUF"
}

/// The tokenizer and chat template of a GGUF model file (`--tokenizer PATH.gguf`, or the
/// CPU engine's model).
fn gguf_preprocessor(path: &std::path::Path, context_length: Option<u32>) -> Result<Preprocessor> {
    #[cfg(feature = "candle")]
    {
        let gguf = switchyard_candle::Gguf::open(path)?;
        let files = gguf.tokenizer_files()?;
        Ok(Preprocessor::from_files(
            &path.display().to_string(),
            &files.tokenizer,
            &files.tokenizer_config,
            &files.config,
            context_length,
        )?)
    }
    #[cfg(not(feature = "candle"))]
    {
        let _ = context_length;
        anyhow::bail!(
            "{} is a GGUF file: reading its tokenizer needs a build with `--features candle`",
            path.display()
        )
    }
}

/// Starts a worker on the engine its configuration names, built by this build's engines
/// ([`crate::engines`]).
async fn start_worker(
    worker_id: WorkerId,
    config: &WorkerConfig,
    planes: &WorkerPlanes,
    serving: Serving,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> Result<Worker> {
    let engines = crate::engines::registry();
    Ok(Worker::start_with(
        &engines, worker_id, config, planes, serving, tracker, cancel,
    )
    .await?)
}
