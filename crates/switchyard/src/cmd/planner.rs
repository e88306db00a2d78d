//! `switchyard planner`: the planner against a running deployment. It watches the fleet
//! at the metric interval, either through a frontend's admin listener (`--frontend`: the
//! workers' loads from `/v1/internal/workers`, the traffic from `/metrics`) or through the
//! planes (`--discovery`, `--event-plane`: the workers registered in etcd, their load
//! reports and every frontend's traffic counters from NATS, so no frontend is needed and
//! several are summed), feeds the same [`Planner`] the simulator runs, and hands its
//! replica counts to a connector:
//!
//! - `noop`: decides and logs, changes nothing;
//! - `local`: starts `switchyard worker` processes (the arguments after `--`) and stops
//!   them with SIGTERM, which drains them (nothing in flight is dropped). The processes
//!   are listed in a state file, so a restarted planner adopts the workers it left;
//! - `kubernetes` (built with `--features kubernetes`): patches a Deployment's scale
//!   subresource.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use switchyard_core::load::LoadSnapshot;
use switchyard_core::{WorkerKey, WorkerRole};
use switchyard_mocker::PerfModel;
use switchyard_planner::{Observation, Planner, PlannerConfig, TrafficSample, WorkerSample};
use switchyard_runtime::TrafficCounters;

#[derive(Debug, Args)]
pub struct PlannerArgs {
    /// A frontend's admin listener (`http://HOST:PORT`), where the fleet is watched;
    /// without it, the planes (`--discovery`, `--event-plane`) are.
    #[arg(long)]
    frontend: Option<String>,
    #[command(flatten)]
    planes: super::distributed::PlaneFlags,
    /// The model whose workers are planned, when watching the planes (default:
    /// `frontend.model`).
    #[arg(long)]
    model: Option<String>,
    /// What carries out the decisions.
    #[arg(long, value_enum, default_value_t = ConnectorArg::Noop)]
    connector: ConnectorArg,
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// A TOML configuration file: its `[planner]` and `[log]` tables (see
    /// docs/configuration.md); `SWITCHYARD_PLANNER__*` variables and these flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// How often metrics are pulled, and decisions taken.
    #[arg(long, value_parser = humantime::parse_duration)]
    metric_interval: Option<Duration>,
    #[arg(long, value_parser = humantime::parse_duration)]
    adjustment_interval: Option<Duration>,
    /// Fewest and most workers (the GPU budget at one GPU per engine).
    #[arg(long)]
    min_workers: Option<u32>,
    #[arg(long)]
    max_workers: Option<u32>,
    /// SLA mode: the engines' timing profile (JSON), else the polynomial model.
    #[arg(long)]
    perf_profile: Option<PathBuf>,
    /// Plan a disaggregated fleet: prefill and decode workers, each pool on its own (the
    /// local connector starts workers with `--role prefill` / `--role decode`).
    #[arg(long)]
    disagg: bool,
    /// Kubernetes connector: the Deployment of workers, and its namespace.
    #[arg(long, value_name = "NAME")]
    k8s_deployment: Option<String>,
    /// Kubernetes connector with --disagg: the Deployments of prefill and decode workers.
    #[arg(long, value_name = "NAME")]
    k8s_prefill_deployment: Option<String>,
    #[arg(long, value_name = "NAME")]
    k8s_decode_deployment: Option<String>,
    #[arg(long, value_name = "NAMESPACE", default_value = "default")]
    k8s_namespace: String,
    /// Local connector: where it lists the worker processes it runs (and their logs).
    #[arg(long, default_value = "switchyard-planner.json")]
    state_file: PathBuf,
    /// Serve the planner's Prometheus metrics on this port of 127.0.0.1 (0: any free port).
    #[arg(long)]
    metrics_port: Option<u16>,
    /// Where to append every decision (JSON lines).
    #[arg(long, value_name = "FILE.jsonl")]
    decision_log: Option<PathBuf>,
    /// Local connector: the arguments of every `switchyard worker` it starts (its planes,
    /// model, engine settings).
    #[arg(last = true)]
    worker_args: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ConnectorArg {
    Noop,
    Local,
    Kubernetes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    Load,
    Sla,
}

impl PlannerArgs {
    fn overlay(&self) -> super::flags::Overlay {
        let mut o = super::flags::Overlay::default();
        let duration = |d: Duration| humantime::format_duration(d).to_string();
        o.set_some(
            &["planner", "mode"],
            self.mode.map(|m| match m {
                ModeArg::Load => "load",
                ModeArg::Sla => "sla",
            }),
        );
        o.set_some(
            &["planner", "metric_interval"],
            self.metric_interval.map(duration),
        );
        o.set_some(
            &["planner", "adjustment_interval"],
            self.adjustment_interval.map(duration),
        );
        o.set_some(
            &["planner", "budget", "min_replicas"],
            self.min_workers.map(i64::from),
        );
        o.set_some(
            &["planner", "budget", "min_gpus"],
            self.min_workers.map(i64::from),
        );
        o.set_some(
            &["planner", "budget", "max_gpus"],
            self.max_workers.map(i64::from),
        );
        self.planes.apply(&mut o);
        o.set_some(&["frontend", "model"], self.model.clone());
        o
    }
}

pub fn run(args: PlannerArgs, env: &BTreeMap<String, String>) -> Result<()> {
    let tree = switchyard::config::load(args.config.as_deref(), env, args.overlay().0)?;
    let _telemetry = crate::logging::init(&tree.log, "switchyard-planner")?;
    let config = tree.planner.clone();
    config.validate()?;
    let source = match &args.frontend {
        Some(url) => Source::Frontend(url.trim_end_matches('/').to_string()),
        None if tree.runtime.discovery.is_none() && tree.runtime.event_plane.is_none() => bail!(
            "the planner watches the fleet through a frontend (--frontend http://HOST:PORT, \
             its admin listener) or the planes (--discovery etcd://HOST:PORT \
             --event-plane nats://HOST:PORT)"
        ),
        None => {
            tree.runtime.planes()?;
            Source::Planes(Box::new(tree.clone()))
        }
    };
    if args.disagg
        && args
            .worker_args
            .iter()
            .any(|a| a == "--role" || a.starts_with("--role="))
    {
        bail!(
            "with --disagg the planner gives each worker its --role; leave it out of the worker arguments"
        );
    }
    if args.connector == ConnectorArg::Local && args.worker_args.is_empty() {
        bail!(
            "the local connector starts `switchyard worker` with the arguments after `--` \
             (at least the planes: -- --discovery ... --event-plane ...)"
        );
    }
    let perf = match &args.perf_profile {
        Some(path) => switchyard_mocker::perf::load(path)
            .with_context(|| format!("cannot read the profile {}", path.display()))?,
        None => PerfModel::Polynomial,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(watch(args, source, config, perf))
}

/// Where the fleet is watched from.
enum Source {
    /// A frontend's admin listener.
    Frontend(String),
    /// The planes the configuration names (`runtime.*`), for `frontend.model`'s workers.
    Planes(Box<switchyard::config::Config>),
}

async fn watch(
    args: PlannerArgs,
    source: Source,
    config: PlannerConfig,
    perf: PerfModel,
) -> Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let tracker = tokio_util::task::TaskTracker::new();
    let cancel = tokio_util::sync::CancellationToken::new();
    let _stop_planes = cancel.clone().drop_guard();
    let (mut fleet, frontend) = match &source {
        Source::Frontend(url) => (Fleet::Frontend(FleetView::new(&client, url)), url.clone()),
        Source::Planes(tree) => (
            Fleet::Planes(PlaneView::start(tree, &tracker, &cancel).await?),
            format!(
                "the planes ({}, {})",
                tree.runtime.discovery.as_deref().unwrap_or_default(),
                tree.runtime.event_plane.as_deref().unwrap_or_default()
            ),
        ),
    };
    let mut connector = match args.connector {
        ConnectorArg::Noop => Connector::Noop,
        ConnectorArg::Local => Connector::Local(LocalWorkers::adopt(
            &args.state_file,
            args.worker_args.clone(),
        )?),
        ConnectorArg::Kubernetes => kubernetes(&args).await?,
    };
    // The planner starts from the workers there are (its minimum if none), per pool.
    let seen = fleet.observe().await?;
    let roles: &[WorkerRole] = if args.disagg {
        &[WorkerRole::Prefill, WorkerRole::Decode]
    } else {
        &[WorkerRole::Aggregated]
    };
    if let Connector::Local(local) = &mut connector {
        // Workers adopted from a run that planned other pools would serve outside the
        // budget, unplanned: they drain and stop.
        local.stop_roles_except(roles)?;
    }
    let mut initial: BTreeMap<WorkerRole, u32> = BTreeMap::new();
    for &role in roles {
        let there = match &connector {
            Connector::Local(local) => local.count(role),
            _ => seen.count(role),
        };
        let start = there.max(config.budget.min_replicas);
        connector.scale_to(role, start).await?;
        initial.insert(role, start);
    }
    let start: u32 = initial.values().sum();
    let began = Instant::now();
    let mut planner = Planner::new(config.clone(), &initial, perf, Duration::ZERO)?;
    let mut log = match &args.decision_log {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot write {}", path.display()))?,
        ),
        None => None,
    };
    tracing::info!(
        workers = start,
        mode = ?config.mode,
        connector = ?args.connector,
        "planner watching {frontend}"
    );
    let metrics = std::sync::Arc::new(super::planner_metrics::PlannerMetrics::default());
    let stop_metrics = tokio_util::sync::CancellationToken::new();
    let mut metrics_task = None;
    let mut announce = format!("planner watching on {frontend} ({start} workers)");
    if let Some(port) = args.metrics_port {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("cannot listen on 127.0.0.1:{port} for metrics"))?;
        announce.push_str(&format!(", admin http://{}", listener.local_addr()?));
        metrics_task = Some(tokio::spawn(super::planner_metrics::serve(
            listener,
            std::sync::Arc::clone(&metrics),
            stop_metrics.clone(),
        )));
    }
    println!("{announce}");
    let mut ticks = tokio::time::interval(config.metric_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stop = crate::signals::terminated();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = &mut stop => break,
        }
        if let Connector::Local(local) = &mut connector {
            local.reap();
        }
        let observation = match fleet.observe().await {
            Ok(o) => o,
            Err(e) => {
                // A pull that fails is no observation (not an idle fleet).
                tracing::warn!("cannot observe the fleet: {e:#}");
                continue;
            }
        };
        let tick = planner.tick(began.elapsed(), &observation);
        for action in &tick.actions {
            tracing::info!(role = %action.role, replicas = action.replicas, "scaling");
            // A refused scaling (forbidden, conflict) is logged and the planner goes on:
            // its action times out and the next decision tries again.
            if let Err(e) = connector.scale_to(action.role, action.replicas).await {
                metrics.scaling_failed();
                tracing::error!("{e:#}");
            }
        }
        if let Some(decision) = &tick.decision {
            metrics.record(decision);
            tracing::info!(reasons = ?decision.reasons, actions = decision.actions.len(), "decision");
            if let Some(log) = &mut log {
                serde_json::to_writer(&mut *log, decision)?;
                log.write_all(b"\n")?;
                log.flush()?;
            }
        }
    }
    stop_metrics.cancel();
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    // The workers stay: a restarted planner adopts them from the state file.
    tracing::info!("planner stopped; its workers keep running");
    Ok(())
}

/// Reads the fleet from a frontend.
struct FleetView<'a> {
    client: &'a reqwest::Client,
    frontend: &'a str,
    /// The traffic counters at the last pull.
    last: Option<Counters>,
}

/// Cumulative traffic counters from `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    requests: f64,
    input_tokens: f64,
    cached_tokens: f64,
    output_tokens: f64,
    finished: f64,
    ttft_sum: f64,
    ttft_count: f64,
    itl_sum: f64,
    itl_count: f64,
    /// Requests waiting in the frontend's admission queue (a gauge).
    queued: f64,
}

/// What `/v1/internal/workers` says of a worker (the fields the planner reads).
#[derive(Debug, Deserialize)]
struct ListedWorker {
    status: String,
    role: WorkerRole,
    loads: Vec<(serde_json::Value, serde_json::Value, Option<LoadSnapshot>)>,
}

impl<'a> FleetView<'a> {
    fn new(client: &'a reqwest::Client, frontend: &'a str) -> Self {
        FleetView {
            client,
            frontend,
            last: None,
        }
    }

    /// GET `path` from the frontend, a success or an error naming the URL.
    async fn get(&self, path: &str) -> Result<reqwest::Response> {
        let url = format!("{}{path}", self.frontend);
        self.client
            .get(&url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .with_context(|| format!("GET {url}"))
    }

    async fn observe(&mut self) -> Result<Observation> {
        let path = switchyard_frontend::http::WORKERS_PATH;
        let listed: Vec<ListedWorker> = self
            .get(path)
            .await?
            .json()
            .await
            .with_context(|| format!("GET {path}: not a worker listing"))?;
        let workers: Vec<WorkerSample> = listed
            .iter()
            .filter(|w| !matches!(w.status.as_str(), "draining" | "dead"))
            .map(|w| {
                let engines: Vec<LoadSnapshot> = w.loads.iter().filter_map(|l| l.2).collect();
                sample(w.role, &engines)
            })
            .collect();
        let text = self.get("/metrics").await?.text().await?;
        let now = counters(&text)?;
        let queued = now.queued.round().max(0.0) as u32;
        let traffic = match self.last.replace(now) {
            None => TrafficSample::default(),
            Some(before) => {
                let d = |a: f64, b: f64| (a - b).max(0.0);
                TrafficSample {
                    requests: d(now.requests, before.requests) as u64,
                    input_tokens: d(now.input_tokens, before.input_tokens) as u64,
                    cached_tokens: d(now.cached_tokens, before.cached_tokens) as u64,
                    output_tokens: d(now.output_tokens, before.output_tokens) as u64,
                    finished: d(now.finished, before.finished) as u64,
                    ttft_ms_sum: d(now.ttft_sum, before.ttft_sum) * 1e3,
                    ttft_count: d(now.ttft_count, before.ttft_count) as u64,
                    itl_ms_sum: d(now.itl_sum, before.itl_sum) * 1e3,
                    itl_count: d(now.itl_count, before.itl_count) as u64,
                }
            }
        };
        let mut observation = Observation { workers, traffic };
        // Requests the frontend holds back for want of a free engine.
        observation.add_queued(queued);
        Ok(observation)
    }
}

/// A worker as the planner sees it, from its engines' (data-parallel ranks') loads: the
/// mean KV usage, and the requests waiting and running summed.
fn sample(role: WorkerRole, engines: &[LoadSnapshot]) -> WorkerSample {
    let n = engines.len().max(1) as f64;
    WorkerSample {
        role,
        kv_usage: engines.iter().map(LoadSnapshot::kv_usage).sum::<f64>() / n,
        waiting: engines.iter().map(|e| e.waiting).sum(),
        running: engines.iter().map(|e| e.running).sum(),
    }
}

/// Where the planner reads the fleet.
enum Fleet<'a> {
    Frontend(FleetView<'a>),
    Planes(PlaneView),
}

impl Fleet<'_> {
    async fn observe(&mut self) -> Result<Observation> {
        match self {
            Fleet::Frontend(view) => view.observe().await,
            Fleet::Planes(view) => Ok(view.observe()),
        }
    }
}

/// A frontend not heard from for this long has stopped: its queue no longer counts.
const FRONTEND_SILENCE: Duration = Duration::from_secs(10);

/// Reads the fleet from the planes: the model's workers as discovery lists them (a
/// draining worker deregisters first), the load each engine last reported on the event
/// plane (none yet: idle, as an engine reports only changes), and the traffic counters
/// every frontend of the model publishes, summed.
struct PlaneView {
    model: String,
    /// Kept for its watch (etcd's lease and watch tasks run while it lives).
    _discovery: switchyard_runtime::net::etcd::EtcdDiscovery,
    instances: tokio::sync::watch::Receiver<switchyard_runtime::Instances>,
    loads: std::sync::Arc<parking_lot::Mutex<BTreeMap<WorkerKey, LoadSnapshot>>>,
    traffic: std::sync::Arc<parking_lot::Mutex<BTreeMap<u64, (TrafficCounters, Instant)>>>,
    /// Each frontend's counters at the previous observation.
    last: BTreeMap<u64, TrafficCounters>,
    first: bool,
}

impl PlaneView {
    async fn start(
        tree: &switchyard::config::Config,
        tracker: &tokio_util::task::TaskTracker,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<PlaneView> {
        use switchyard_runtime::{Discovery, EventPlane, ReplicaEvent, ReplicaPlane, WorkerEvent};
        let model = tree.frontend.model.clone();
        let (discovery, events) = switchyard::deploy::connect(tree, tracker, cancel).await?;
        let loads = std::sync::Arc::new(parking_lot::Mutex::new(BTreeMap::new()));
        let traffic = std::sync::Arc::new(parking_lot::Mutex::new(BTreeMap::new()));
        let mut reports = events.subscribe(&model).await?;
        let into = std::sync::Arc::clone(&loads);
        tracker.spawn(async move {
            while let Some(event) = reports.recv().await {
                if let WorkerEvent::Load { worker, load } = event {
                    into.lock().insert(worker, load);
                }
            }
        });
        let mut messages = events.subscribe_replicas(&model).await?;
        let into = std::sync::Arc::clone(&traffic);
        tracker.spawn(async move {
            while let Some(message) = messages.recv().await {
                for event in message.events {
                    if let ReplicaEvent::Traffic(counters) = event {
                        into.lock()
                            .insert(message.frontend, (counters, Instant::now()));
                    }
                }
            }
        });
        Ok(PlaneView {
            model,
            instances: discovery.watch(),
            _discovery: discovery,
            loads,
            traffic,
            last: BTreeMap::new(),
            first: true,
        })
    }

    fn observe(&mut self) -> Observation {
        let instances = self.instances.borrow().clone();
        let mut loads = self.loads.lock();
        // Workers gone from discovery are forgotten (a new one reuses no id).
        loads.retain(|key, _| instances.contains_key(&key.worker_id));
        let workers: Vec<WorkerSample> = instances
            .values()
            .filter(|w| w.model == self.model)
            .map(|w| {
                let engines: Vec<LoadSnapshot> = (0..w.dp_size.max(1))
                    .map(|rank| {
                        loads
                            .get(&WorkerKey {
                                worker_id: w.worker_id,
                                dp_rank: rank,
                            })
                            .copied()
                            .unwrap_or_default()
                    })
                    .collect();
                sample(w.role, &engines)
            })
            .collect();
        drop(loads);
        let mut traffic = self.traffic.lock();
        traffic.retain(|_, (_, seen)| seen.elapsed() <= FRONTEND_SILENCE);
        let mut sample = TrafficSample::default();
        let mut queued = 0;
        for (frontend, (now, _)) in traffic.iter() {
            queued += now.queued;
            // A frontend first heard of now is the baseline for the next interval.
            if let Some(before) = self.last.get(frontend) {
                let d = |a: u64, b: u64| a.saturating_sub(b);
                sample.requests += d(now.requests, before.requests);
                sample.input_tokens += d(now.input_tokens, before.input_tokens);
                sample.cached_tokens += d(now.cached_tokens, before.cached_tokens);
                sample.output_tokens += d(now.output_tokens, before.output_tokens);
                sample.finished += d(now.finished, before.finished);
                sample.ttft_ms_sum += d(now.ttft_us_sum, before.ttft_us_sum) as f64 / 1e3;
                sample.ttft_count += d(now.ttft_count, before.ttft_count);
                sample.itl_ms_sum += d(now.itl_us_sum, before.itl_us_sum) as f64 / 1e3;
                sample.itl_count += d(now.itl_count, before.itl_count);
            }
        }
        self.last = traffic.iter().map(|(&f, &(c, _))| (f, c)).collect();
        drop(traffic);
        // The first observation has no interval behind it (as a frontend's first pull).
        if std::mem::take(&mut self.first) {
            sample = TrafficSample::default();
        }
        let mut observation = Observation {
            workers,
            traffic: sample,
        };
        observation.add_queued(u32::try_from(queued).unwrap_or(u32::MAX));
        observation
    }
}

/// The counters the planner reads, from a Prometheus text exposition.
fn counters(text: &str) -> Result<Counters> {
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).context("the frontend's /metrics")?;
    let sum = |name: &str, label: Option<(&str, &[&str])>| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| {
                label.is_none_or(|(key, values)| {
                    s.labels.get(key).is_some_and(|v| values.contains(&v))
                })
            })
            .map(|s| match &s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                _ => 0.0,
            })
            .sum()
    };
    let histogram = |name: &str| -> (f64, f64) {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .find_map(|s| match &s.value {
                prometheus_parse::Value::Histogram(h) => {
                    let count = h.iter().map(|b| b.count).fold(0.0, f64::max);
                    Some((count, 0.0))
                }
                _ => None,
            })
            .map_or_else(
                || {
                    (
                        sum(&format!("{name}_count"), None),
                        sum(&format!("{name}_sum"), None),
                    )
                },
                |(count, _)| (count, sum(&format!("{name}_sum"), None)),
            )
    };
    let generation: &[&str] = &["/v1/completions", "/v1/chat/completions"];
    let (ttft_count, ttft_sum) = histogram("switchyard_time_to_first_token_seconds");
    let (itl_count, itl_sum) = histogram("switchyard_inter_token_latency_seconds");
    let (finished, _) = histogram("switchyard_request_duration_seconds");
    Ok(Counters {
        requests: sum(
            "switchyard_http_requests_total",
            Some(("route", generation)),
        ),
        // The prompt tokens of every request counted above, refused ones included, as the
        // simulator counts them; a frontend from before that counter: those served.
        input_tokens: if scrape
            .samples
            .iter()
            .any(|s| s.metric == "switchyard_offered_prompt_tokens_total")
        {
            sum("switchyard_offered_prompt_tokens_total", None)
        } else {
            sum("switchyard_input_tokens_total", None)
        },
        cached_tokens: sum("switchyard_cached_tokens_total", None),
        output_tokens: sum("switchyard_output_tokens_total", None),
        finished,
        ttft_sum,
        ttft_count,
        itl_sum,
        itl_count,
        queued: sum("switchyard_requests_queued", None),
    })
}

enum Connector {
    Noop,
    Local(LocalWorkers),
    /// A Deployment per role.
    #[cfg(feature = "kubernetes")]
    Kubernetes(BTreeMap<WorkerRole, switchyard::kubernetes::DeploymentScaler>),
}

impl Connector {
    async fn scale_to(&mut self, role: WorkerRole, replicas: u32) -> Result<()> {
        match self {
            Connector::Noop => Ok(()),
            Connector::Local(local) => local.scale_to(role, replicas),
            #[cfg(feature = "kubernetes")]
            Connector::Kubernetes(scalers) => match scalers.get_mut(&role) {
                Some(scaler) => Ok(scaler.scale_to(replicas).await?),
                None => bail!("no Deployment of {role} workers to scale"),
            },
        }
    }
}

#[cfg(feature = "kubernetes")]
async fn kubernetes(args: &PlannerArgs) -> Result<Connector> {
    let deployments: Vec<(WorkerRole, &String)> = if args.disagg {
        match (&args.k8s_prefill_deployment, &args.k8s_decode_deployment) {
            (Some(p), Some(d)) => vec![(WorkerRole::Prefill, p), (WorkerRole::Decode, d)],
            _ => bail!(
                "with --disagg the kubernetes connector scales the Deployments named by \
                 --k8s-prefill-deployment and --k8s-decode-deployment"
            ),
        }
    } else {
        let Some(deployment) = &args.k8s_deployment else {
            bail!("the kubernetes connector scales the Deployment named by --k8s-deployment");
        };
        vec![(WorkerRole::Aggregated, deployment)]
    };
    let mut scalers = BTreeMap::new();
    for (role, deployment) in deployments {
        let scaler = switchyard::kubernetes::DeploymentScaler::from_environment(
            &args.k8s_namespace,
            deployment,
        )
        .await
        .context("no Kubernetes credentials (in-cluster service account or kubeconfig)")?;
        scalers.insert(role, scaler);
    }
    Ok(Connector::Kubernetes(scalers))
}

#[cfg(not(feature = "kubernetes"))]
async fn kubernetes(_: &PlannerArgs) -> Result<Connector> {
    bail!(
        "this switchyard was built without the kubernetes connector: cargo build --features kubernetes"
    )
}

/// Worker processes this planner runs.
struct LocalWorkers {
    state_file: PathBuf,
    args: Vec<String>,
    /// Serving, oldest first: a child of this planner, or one adopted by pid.
    running: Vec<LocalWorker>,
    /// Told to stop, draining.
    stopping: Vec<LocalWorker>,
}

struct LocalWorker {
    pid: u32,
    role: WorkerRole,
    child: Option<Child>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// Process ids of the running (aggregated) workers, oldest first.
    workers: Vec<u32>,
    /// Those of a disaggregated fleet's pools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    prefill: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    decode: Vec<u32>,
}

impl LocalWorkers {
    /// Takes over the live workers a previous planner listed in `state_file`.
    fn adopt(state_file: &Path, args: Vec<String>) -> Result<LocalWorkers> {
        let state: State = match std::fs::read_to_string(state_file) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("{}: not a planner state file", state_file.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => return Err(e).context(format!("cannot read {}", state_file.display())),
        };
        let running = [
            (WorkerRole::Aggregated, state.workers),
            (WorkerRole::Prefill, state.prefill),
            (WorkerRole::Decode, state.decode),
        ]
        .into_iter()
        .flat_map(|(role, pids)| pids.into_iter().map(move |pid| (role, pid)))
        .filter(|&(_, pid)| alive(pid))
        .map(|(role, pid)| LocalWorker {
            pid,
            role,
            child: None,
        })
        .collect::<Vec<_>>();
        if !running.is_empty() {
            tracing::info!(
                workers = running.len(),
                "adopted workers from {}",
                state_file.display()
            );
        }
        let workers = LocalWorkers {
            state_file: state_file.to_path_buf(),
            args,
            running,
            stopping: Vec::new(),
        };
        workers.save()?;
        Ok(workers)
    }

    /// Stops the workers of roles not in `planned`.
    fn stop_roles_except(&mut self, planned: &[WorkerRole]) -> Result<()> {
        let (keep, stop): (Vec<LocalWorker>, Vec<LocalWorker>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|w| planned.contains(&w.role));
        self.running = keep;
        for worker in stop {
            tracing::warn!(pid = worker.pid, role = %worker.role, "stopping an adopted worker of a pool this planner does not plan");
            terminate(worker.pid);
            self.stopping.push(worker);
        }
        self.save()
    }

    fn count(&self, role: WorkerRole) -> u32 {
        self.running.iter().filter(|w| w.role == role).count() as u32
    }

    fn scale_to(&mut self, role: WorkerRole, replicas: u32) -> Result<()> {
        // Adopted workers may have exited on their own since.
        self.running.retain(|w| alive(w.pid));
        while self.count(role) < replicas {
            self.start(role)?;
        }
        while self.count(role) > replicas {
            // The newest goes first (the oldest have the warmest caches).
            if let Some(i) = self.running.iter().rposition(|w| w.role == role) {
                let worker = self.running.remove(i);
                terminate(worker.pid);
                self.stopping.push(worker);
            }
        }
        self.save()
    }

    fn start(&mut self, role: WorkerRole) -> Result<()> {
        let program = std::env::current_exe().context("cannot find the switchyard binary")?;
        let dir = self
            .state_file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let n = self.running.len() + self.stopping.len();
        let log_path = dir.join(format!("worker-{}-{n}.log", std::process::id()));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("cannot write {}", log_path.display()))?;
        let mut command = Command::new(program);
        command.arg("worker").args(&self.args);
        if role != WorkerRole::Aggregated {
            command.args(["--role", role.name()]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start a worker")?;
        tracing::info!(pid = child.id(), %role, log = %log_path.display(), "worker started");
        self.running.push(LocalWorker {
            pid: child.id(),
            role,
            child: Some(child),
        });
        Ok(())
    }

    /// Collects the exit of stopped workers.
    fn reap(&mut self) {
        self.stopping.retain_mut(|w| match &mut w.child {
            Some(child) => !matches!(child.try_wait(), Ok(Some(_)) | Err(_)),
            None => alive(w.pid),
        });
    }

    fn save(&self) -> Result<()> {
        let pids = |role: WorkerRole| -> Vec<u32> {
            self.running
                .iter()
                .filter(|w| w.role == role)
                .map(|w| w.pid)
                .collect()
        };
        let state = State {
            workers: pids(WorkerRole::Aggregated),
            prefill: pids(WorkerRole::Prefill),
            decode: pids(WorkerRole::Decode),
        };
        let tmp = self.state_file.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&state)?)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.state_file)
            .with_context(|| format!("cannot write {}", self.state_file.display()))
    }
}

/// Whether a process with this id runs (and is not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Asks a worker to drain and exit.
fn terminate(pid: u32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let Ok(raw) = i32::try_from(pid) else {
        return;
    };
    if let Err(e) = kill(Pid::from_raw(raw), Signal::SIGTERM) {
        tracing::warn!(pid, "cannot stop the worker: {e}");
    } else {
        tracing::info!(pid, "worker told to drain and stop");
    }
}
