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
//!
//! This file holds the flags and the watch loop; [`fleet`] reads the fleet, [`connector`]
//! carries out the decisions and [`local`] runs the local connector's worker processes.

mod connector;
mod fleet;
mod local;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use switchyard_core::WorkerRole;
use switchyard_mocker::PerfModel;
use switchyard_planner::{Planner, PlannerConfig};

use self::connector::{Connector, kubernetes};
use self::fleet::{Fleet, FleetView, PlaneView};
use self::local::LocalWorkers;

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
