//! `switchyard frontend` and `switchyard worker`: the processes of a distributed
//! deployment, meeting in etcd (discovery) and NATS (events).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use switchyard::config::{self, Config, EngineKind};
use switchyard::deploy;

use super::flags::{FrontendFlags, LogFlags, Overlay};
use crate::logging::Telemetry;

/// Where the planes are: flags both processes take.
#[derive(Debug, Args)]
pub struct PlaneFlags {
    /// etcd, for discovery: etcd://HOST:PORT.
    #[arg(long)]
    discovery: Option<String>,
    /// NATS, for KV events and load: nats://HOST:PORT.
    #[arg(long)]
    event_plane: Option<String>,
    /// Deployments sharing etcd and NATS stay apart by namespace.
    #[arg(long)]
    namespace: Option<String>,
}

impl PlaneFlags {
    pub(super) fn apply(&self, o: &mut Overlay) {
        o.set_some(&["runtime", "discovery"], self.discovery.clone());
        o.set_some(&["runtime", "event_plane"], self.event_plane.clone());
        o.set_some(&["runtime", "namespace"], self.namespace.clone());
    }
}

#[derive(Debug, Args)]
pub struct FrontendArgs {
    #[command(flatten)]
    frontend: FrontendFlags,
    #[command(flatten)]
    planes: PlaneFlags,
}

impl FrontendArgs {
    fn overlay(&self) -> toml::Table {
        let mut o = Overlay::default();
        self.frontend.apply(&mut o);
        self.planes.apply(&mut o);
        o.0
    }
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// A TOML configuration file (see docs/configuration.md).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The model name served (with `--engine candle`: the GGUF file, served under its
    /// file name).
    #[arg(long)]
    model: Option<String>,
    #[command(flatten)]
    planes: PlaneFlags,
    #[command(flatten)]
    log: LogFlags,
    /// The engine it runs.
    #[arg(long, value_enum)]
    engine: Option<EngineKind>,
    /// Its part of the work: aggregated, prefill, decode, or encoder (a mock media encoder
    /// timed by `frontend.multimodal`'s cost model, whatever `--engine` says).
    #[arg(long)]
    role: Option<switchyard_core::WorkerRole>,
    /// Mocker: the KV link's bandwidth in GB/s (for the KV a decode worker pulls).
    #[arg(long)]
    kv_bandwidth_gbps: Option<f64>,
    /// Where its request plane listens (HOST:PORT; port 0: any free port).
    #[arg(long)]
    listen: Option<String>,
    /// The HOST:PORT frontends reach it on (default: the listening address).
    #[arg(long)]
    advertise: Option<String>,
    /// Its worker id (default: random).
    #[arg(long)]
    worker_id: Option<u64>,
    /// How long a dead worker stays registered (e.g. 10s).
    #[arg(long)]
    lease_ttl: Option<String>,
    /// Mocker: a Hugging Face model directory (the frontend's `--tokenizer`) whose
    /// vocabulary it enforces constraints over, besides the built-in ones.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
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
    /// A measured timing profile (JSON or NPZ): the mocker's timing instead of the
    /// polynomial model; the candle engine's announced timing and prompt chunk size.
    #[arg(long)]
    perf_profile: Option<PathBuf>,
    /// OpenAI engine: the upstream server's URL (http://HOST:PORT).
    #[arg(long)]
    upstream: Option<String>,
    /// OpenAI engine: the model name upstream (default: --model).
    #[arg(long)]
    upstream_model: Option<String>,
    /// OpenAI engine: send the prompt as `text` (any server) or `token-ids` (vLLM,
    /// SGLang, llama.cpp's server: exact).
    #[arg(long, value_parser = ["text", "token-ids"])]
    upstream_prompt: Option<String>,
    /// OpenAI engine: how the upstream is told a request's constraint (structured
    /// output): `vllm` (`structured_outputs`), `sglang` (`json_schema`, `regex`),
    /// `llamacpp` (a GBNF `grammar`) or `none` (constrained requests go to other workers).
    #[arg(long, value_parser = ["none", "vllm", "sglang", "llamacpp"])]
    upstream_constraints: Option<String>,
    /// OpenAI engine: the engine's KV event publisher (zmq://HOST:PORT, vLLM's format).
    #[arg(long)]
    kv_events: Option<String>,
    /// OpenAI engine: the publisher's replay socket (zmq://HOST:PORT, or `none`; default:
    /// the next port).
    #[arg(long)]
    kv_events_replay: Option<String>,
    /// Inject a fault, as KIND[:ARG][@AT][+FOR]: crash@30s, hang@10s+5s, slow:4@20s,
    /// corrupt@15s, refuse+10s (tests and demos; repeatable).
    #[arg(long = "fault", value_name = "SPEC")]
    faults: Vec<String>,
    /// Serve the fault admin endpoint (/v1/internal/faults) to requests bearing this token
    /// (tests and demos only).
    #[arg(long, value_name = "TOKEN")]
    fault_admin_token: Option<String>,
}

impl WorkerArgs {
    fn overlay(&self) -> toml::Table {
        let mut o = Overlay::default();
        o.set_some(&["frontend", "model"], self.model.clone());
        self.planes.apply(&mut o);
        self.log.apply(&mut o);
        o.engine(self.engine);
        o.candle_model(self.engine, self.model.as_deref());
        o.set_some(&["worker", "listen"], self.listen.clone());
        o.set_some(&["worker", "role"], self.role.map(|r| r.name().to_string()));
        o.set_some(
            &["workers", "mocker", "kv_transfer", "bandwidth_gbps"],
            self.kv_bandwidth_gbps,
        );
        o.set_some(&["worker", "advertise"], self.advertise.clone());
        // TOML integers are signed; larger ids go as strings, which the loader refuses
        // with a precise message.
        o.set_some(
            &["worker", "id"],
            self.worker_id.map(|id| match i64::try_from(id) {
                Ok(id) => toml::Value::from(id),
                Err(_) => toml::Value::from(id.to_string()),
            }),
        );
        o.set_some(&["runtime", "lease_ttl"], self.lease_ttl.clone());
        let mocker = |key| ["workers", "mocker", key];
        o.set_some(
            &mocker("num_gpu_blocks"),
            self.num_gpu_blocks.map(i64::from),
        );
        o.set_some(&mocker("block_size"), self.block_size.map(i64::from));
        o.set_some(
            &mocker("tokenizer"),
            self.tokenizer.as_ref().map(|p| p.display().to_string()),
        );
        o.set_some(
            &["workers", "echo", "block_size"],
            self.block_size.map(i64::from),
        );
        o.set_some(&mocker("max_num_seqs"), self.max_num_seqs.map(i64::from));
        let openai = |key| ["workers", "openai", key];
        o.set_some(&openai("upstream"), self.upstream.clone());
        o.set_some(&openai("upstream_model"), self.upstream_model.clone());
        o.set_some(
            &openai("prompt"),
            self.upstream_prompt.as_deref().map(|p| p.replace('-', "_")),
        );
        o.set_some(&openai("constraints"), self.upstream_constraints.clone());
        o.set_some(&openai("kv_events"), self.kv_events.clone());
        o.set_some(&openai("kv_events_replay"), self.kv_events_replay.clone());
        o.set_some(&openai("block_size"), self.block_size.map(i64::from));
        o.set_some(&openai("max_num_seqs"), self.max_num_seqs.map(i64::from));
        let candle = |key| ["workers", "candle", key];
        o.set_some(&candle("block_size"), self.block_size.map(i64::from));
        o.set_some(&candle("max_num_seqs"), self.max_num_seqs.map(i64::from));
        o.set_some(
            &candle("max_batched_tokens"),
            self.max_num_batched_tokens.map(i64::from),
        );
        o.set_some(
            &openai("capacity_blocks"),
            self.num_gpu_blocks.map(i64::from),
        );
        o.set_some(
            &mocker("max_num_batched_tokens"),
            self.max_num_batched_tokens.map(i64::from),
        );
        o.set_some(&mocker("speedup_ratio"), self.speedup_ratio);
        for key in [mocker("perf_profile"), candle("perf_profile")] {
            o.set_some(
                &key,
                self.perf_profile.as_ref().map(|p| p.display().to_string()),
            );
        }
        if !self.faults.is_empty() {
            o.set_some(
                &["worker", "faults", "schedule"],
                Some(toml::Value::Array(
                    self.faults.iter().cloned().map(toml::Value::from).collect(),
                )),
            );
        }
        o.set_some(
            &["worker", "faults", "admin_token"],
            self.fault_admin_token.clone(),
        );
        o.0
    }
}

/// The configuration, and logging (and span export, as `service`) set up from it.
fn load(
    file: Option<&Path>,
    env: &BTreeMap<String, String>,
    flags: toml::Table,
    service: &str,
) -> Result<(Config, Telemetry)> {
    let config = config::load(file, env, flags)?;
    config.runtime.planes()?;
    let telemetry = crate::logging::init(&config.log, service)?;
    Ok((config, telemetry))
}

pub fn run_frontend(args: FrontendArgs, env: &BTreeMap<String, String>) -> Result<()> {
    let (config, _telemetry) = load(
        args.frontend.config.as_deref(),
        env,
        args.overlay(),
        "switchyard-frontend",
    )?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let deployment = deploy::start_distributed_frontend(config.clone()).await?;
            println!(
                "Switchyard frontend is serving `{}` on http://{} (namespace `{}`, workers from {}).{}",
                config.frontend.model,
                deployment.address,
                config.runtime.namespace,
                config.runtime.discovery.as_deref().unwrap_or_default(),
                super::serve::admin_note(deployment.admin_address),
            );
            crate::signals::terminated().await;
            tracing::info!("shutting down");
            deployment.shutdown(deploy::SHUTDOWN_GRACE).await
        })
}

pub fn run_worker(args: WorkerArgs, env: &BTreeMap<String, String>) -> Result<()> {
    let (config, _telemetry) = load(
        args.config.as_deref(),
        env,
        args.overlay(),
        "switchyard-worker",
    )?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let process = deploy::start_distributed_worker(config.clone()).await?;
            let instance = &process.worker.instance;
            let engine = if config.worker.role == switchyard_core::WorkerRole::Encoder {
                "an encoder".to_owned()
            } else {
                format!("{:?}", config.workers.engine)
            };
            println!(
                "Switchyard worker {} ({engine}) is serving `{}` on {} (namespace `{}`).",
                instance.worker_id,
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
