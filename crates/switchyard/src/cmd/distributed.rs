//! `switchyard frontend` and `switchyard worker`: the processes of a distributed
//! deployment, meeting in etcd (discovery) and NATS (events).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use switchyard::config::{self, Config, EngineKind};
use switchyard::deploy;
use switchyard_router::PolicyKind;

/// Flags both processes take.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// A TOML configuration file (see docs/configuration.md).
    #[arg(long)]
    config: Option<PathBuf>,
    /// etcd, for discovery: etcd://HOST:PORT.
    #[arg(long)]
    discovery: Option<String>,
    /// NATS, for KV events and load: nats://HOST:PORT.
    #[arg(long)]
    event_plane: Option<String>,
    /// Deployments sharing etcd and NATS stay apart by namespace.
    #[arg(long)]
    namespace: Option<String>,
    /// The model name served.
    #[arg(long)]
    model: Option<String>,
}

#[derive(Debug, Args)]
pub struct FrontendArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Address to listen on.
    #[arg(long)]
    host: Option<String>,
    /// Port to listen on (0: any free port).
    #[arg(long)]
    port: Option<u16>,
    /// A Hugging Face model directory for the tokenizer and chat template.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Routing policy.
    #[arg(long)]
    policy: Option<PolicyKind>,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// The engine it runs.
    #[arg(long, value_enum)]
    engine: Option<EngineKind>,
    /// Where its request plane listens (HOST:PORT; port 0: any free port).
    #[arg(long)]
    listen: Option<String>,
    /// The HOST:PORT frontends reach it on (default: the listening address).
    #[arg(long)]
    advertise: Option<String>,
    /// Its worker id (default: random).
    #[arg(long)]
    worker_id: Option<u64>,
    /// Seconds a dead worker stays registered.
    #[arg(long)]
    lease_ttl: Option<String>,
    /// Mocker: KV cache capacity in blocks.
    #[arg(long)]
    num_gpu_blocks: Option<u32>,
    /// Tokens per KV block.
    #[arg(long)]
    block_size: Option<u32>,
    /// Mocker: most requests running at once.
    #[arg(long)]
    max_num_seqs: Option<u32>,
    /// Mocker: token budget of one step.
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    /// Mocker: time runs this many times faster than the timing model.
    #[arg(long)]
    speedup_ratio: Option<f64>,
    /// Mocker: a timing profile (JSON or NPZ) instead of the polynomial model.
    #[arg(long)]
    perf_profile: Option<PathBuf>,
}

struct Overlay(toml::Table);

impl Overlay {
    fn set(&mut self, path: &[&str], value: impl Into<toml::Value>) {
        let path: Vec<String> = path.iter().map(|s| s.to_string()).collect();
        config::insert(&mut self.0, &path, value.into());
    }

    fn common(&mut self, args: &CommonArgs) {
        if let Some(url) = &args.discovery {
            self.set(&["runtime", "discovery"], url.clone());
        }
        if let Some(url) = &args.event_plane {
            self.set(&["runtime", "event_plane"], url.clone());
        }
        if let Some(namespace) = &args.namespace {
            self.set(&["runtime", "namespace"], namespace.clone());
        }
        if let Some(model) = &args.model {
            self.set(&["frontend", "model"], model.clone());
        }
    }
}

fn frontend_overlay(args: &FrontendArgs) -> toml::Table {
    let mut o = Overlay(toml::Table::new());
    o.common(&args.common);
    if let Some(host) = &args.host {
        o.set(&["frontend", "host"], host.clone());
    }
    if let Some(port) = args.port {
        o.set(&["frontend", "port"], i64::from(port));
    }
    if let Some(tokenizer) = &args.tokenizer {
        o.set(&["frontend", "tokenizer"], tokenizer.display().to_string());
    }
    if let Some(policy) = args.policy {
        o.set(&["frontend", "router", "policy"], policy.name());
    }
    o.0
}

fn worker_overlay(args: &WorkerArgs) -> toml::Table {
    let mut o = Overlay(toml::Table::new());
    o.common(&args.common);
    if let Some(engine) = args.engine {
        let name = match engine {
            EngineKind::Mocker => "mocker",
            EngineKind::Echo => "echo",
        };
        o.set(&["workers", "engine"], name);
    }
    if let Some(listen) = &args.listen {
        o.set(&["worker", "listen"], listen.clone());
    }
    if let Some(advertise) = &args.advertise {
        o.set(&["worker", "advertise"], advertise.clone());
    }
    if let Some(id) = args.worker_id {
        // TOML integers are signed; ids above i64::MAX are written as strings and refused
        // by the loader with a precise message.
        match i64::try_from(id) {
            Ok(id) => o.set(&["worker", "id"], id),
            Err(_) => o.set(&["worker", "id"], id.to_string()),
        }
    }
    if let Some(ttl) = &args.lease_ttl {
        o.set(&["runtime", "lease_ttl"], ttl.clone());
    }
    if let Some(n) = args.num_gpu_blocks {
        o.set(&["workers", "mocker", "num_gpu_blocks"], i64::from(n));
    }
    if let Some(n) = args.block_size {
        o.set(&["workers", "mocker", "block_size"], i64::from(n));
        o.set(&["workers", "echo", "block_size"], i64::from(n));
    }
    if let Some(n) = args.max_num_seqs {
        o.set(&["workers", "mocker", "max_num_seqs"], i64::from(n));
    }
    if let Some(n) = args.max_num_batched_tokens {
        o.set(
            &["workers", "mocker", "max_num_batched_tokens"],
            i64::from(n),
        );
    }
    if let Some(ratio) = args.speedup_ratio {
        o.set(&["workers", "mocker", "speedup_ratio"], ratio);
    }
    if let Some(path) = &args.perf_profile {
        o.set(
            &["workers", "mocker", "perf_profile"],
            path.display().to_string(),
        );
    }
    o.0
}

fn load(common: &CommonArgs, env: &BTreeMap<String, String>, flags: toml::Table) -> Result<Config> {
    let config = config::load(common.config.as_deref(), env, flags)?;
    config.runtime.planes()?;
    crate::logging::init(&config.log.level)?;
    Ok(config)
}

pub fn run_frontend(args: FrontendArgs, env: &BTreeMap<String, String>) -> Result<()> {
    let config = load(&args.common, env, frontend_overlay(&args))?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let deployment = deploy::start_distributed_frontend(config.clone()).await?;
            println!(
                "Switchyard frontend is serving `{}` on http://{} (namespace `{}`, workers from {}).",
                config.frontend.model,
                deployment.address,
                config.runtime.namespace,
                config.runtime.discovery.as_deref().unwrap_or_default(),
            );
            crate::signals::terminated().await;
            tracing::info!("shutting down");
            deployment.shutdown(deploy::SHUTDOWN_GRACE).await
        })
}

pub fn run_worker(args: WorkerArgs, env: &BTreeMap<String, String>) -> Result<()> {
    let config = load(&args.common, env, worker_overlay(&args))?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let process = deploy::start_distributed_worker(config.clone()).await?;
            let instance = &process.worker.instance;
            println!(
                "Switchyard worker {} ({:?}) is serving `{}` on {} (namespace `{}`).",
                instance.worker_id,
                config.workers.engine,
                instance.model,
                instance.address.as_deref().unwrap_or_default(),
                config.runtime.namespace,
            );
            crate::signals::terminated().await;
            tracing::info!("draining: deregistered, finishing the requests in flight");
            process.drain(config.worker.drain_timeout).await;
            tracing::info!("drained");
            Ok(())
        })
}
