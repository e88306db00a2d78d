//! `switchyard sim`: replay a trace through the router and a simulated fleet.
//!
//! The fleet and its routing come from the same configuration tree `serve` reads
//! (`--config FILE`, then `SWITCHYARD_*` variables, then `--set KEY=VALUE` and the flags
//! below): a production configuration replays as it is. What only a simulation has (the
//! trace, its speed, faults to play, sweeps) comes from flags.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;
use switchyard_router::{CacheViewMode, PolicyKind};
use switchyard_sim::{
    ModelShape, PreparedWorkload, ScheduledFault, SimConfig, SimReport, TraceRequest, simulate,
};
use switchyard_workload::trace_io::Trace;

use super::flags::Overlay;
use super::sim_output::{plot, progress_bar, sweep_table, table, write_requests, write_stdout};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TraceFormat {
    /// Mooncake JSONL (timestamp, input_length, output_length, hash_ids).
    Mooncake,
    /// Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens).
    Azure,
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// The trace to replay.
    #[arg(long)]
    pub(super) trace: PathBuf,
    /// Trace format; by default from the file extension (.csv is Azure).
    #[arg(long, value_enum)]
    format: Option<TraceFormat>,
    /// Tokens per hash id in a Mooncake trace.
    #[arg(long, default_value_t = 512)]
    pub(super) trace_block_size: u32,
    /// Arrivals come this many times faster than in the trace (comma separated: a sweep
    /// over load levels).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(super) speedup: Vec<f64>,
    /// Replay only the first N requests.
    #[arg(long)]
    limit: Option<usize>,
    /// Replay a session trace open loop, as a flat one: every row at its own timestamp (a
    /// row without one at 0), whether or not what it follows has ended.
    #[arg(long)]
    open_loop: bool,
    /// The deployment's configuration file, as `serve` and `frontend` read it: the fleet
    /// from `[workers]` (count, prefill split, the mocker's engine and timing), the routing
    /// from `[frontend]`, the planner from `[planner]`.
    #[arg(long, value_name = "FILE.toml")]
    pub(super) config: Option<PathBuf>,
    /// Sets one configuration key over the file and the environment, `KEY=VALUE` with a
    /// TOML value (`frontend.router.latency.itl_weight=0.2`,
    /// `frontend.admission.wait_target="off"`); repeat for more.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Engines in the fleet (comma separated: a sweep over fleet sizes) [default:
    /// workers.count].
    #[arg(long, value_delimiter = ',')]
    workers: Vec<u32>,
    /// Policies to compare, comma separated [default: frontend.router.policy with
    /// --config, else latency,kv,round-robin].
    #[arg(long, value_delimiter = ',')]
    policy: Vec<PolicyKind>,
    /// The router's view of the caches: the engines' KV events (as `serve` sees its
    /// workers), blocks assumed cached when routed (approx), or natural: approx for
    /// cache-aware (as SGLang's router, which has no events, is deployed), events for the
    /// others [default: frontend.router.cache_view].
    #[arg(long, value_enum)]
    cache_view: Option<ViewArg>,
    /// Delay before KV events reach the indexer.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    event_delay: Duration,
    /// workers.mocker.num_gpu_blocks.
    #[arg(long)]
    num_gpu_blocks: Option<u32>,
    /// workers.mocker.block_size.
    #[arg(long)]
    block_size: Option<u32>,
    /// workers.mocker.max_num_seqs.
    #[arg(long)]
    max_num_seqs: Option<u32>,
    /// workers.mocker.max_num_batched_tokens.
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    /// workers.mocker.enable_prefix_caching = false.
    #[arg(long)]
    no_prefix_caching: bool,
    /// workers.mocker.enable_chunked_prefill = false.
    #[arg(long)]
    no_chunked_prefill: bool,
    /// workers.mocker.staging_tokens: media positions whose encoded features an engine's
    /// staging memory holds at once (0: no limit).
    #[arg(long)]
    staging_tokens: Option<u64>,
    /// workers.mocker.defer_ready_media = false: a request whose media become ready
    /// resumes at once, ahead of the requests that arrived while it waited.
    #[arg(long)]
    no_defer_ready_media: bool,
    /// workers.mocker.preemption_mode: which running request to preempt when KV blocks
    /// run out.
    #[arg(long, value_enum)]
    preemption: Option<Preemption>,
    /// Timing profile (JSON or NPZ) instead of the polynomial model; several, comma
    /// separated, make a heterogeneous fleet (worker i runs the (i mod n)-th; `polynomial`
    /// names the default model) [default: workers.mocker.perf_profile].
    #[arg(long, value_delimiter = ',')]
    perf_profile: Vec<PathBuf>,
    /// The engines' seed (workers.mocker.seed) and the router's (frontend.router.seed).
    #[arg(long)]
    seed: Option<u64>,
    /// Token ids that end a generation early (the servers pass the tokenizer's
    /// end-of-sequence tokens; the `bytes` built-in tokenizer's is 257). None by default:
    /// every request produces its trace output length.
    #[arg(long, value_delimiter = ',')]
    eos_token_ids: Vec<u32>,
    /// frontend.admission.busy_kv_threshold: a worker is busy when in-flight requests hold
    /// this share of its KV blocks.
    #[arg(long)]
    pub(super) busy_kv_threshold: Option<f64>,
    /// frontend.admission.max_queue.
    #[arg(long)]
    max_queue: Option<usize>,
    /// frontend.admission.queue_timeout.
    #[arg(long, value_parser = humantime::parse_duration)]
    queue_timeout: Option<Duration>,
    /// frontend.admission.wait_target: refuse a request predicted to wait longer than this
    /// in the queue (premium: twice), or `off` [with --planner: the TTFT target].
    #[arg(long, value_name = "DURATION|off")]
    pub(super) wait_target: Option<String>,
    /// A worker fault to play, `WORKER:KIND@AT[+FOR]` (kinds: crash, hang, drain; e.g.
    /// `2:crash@90s+30s`: worker 2 crashes 90 s into the run and is back 30 s later).
    /// Repeat for more.
    #[arg(long = "fault", value_name = "SPEC")]
    faults: Vec<ScheduledFault>,
    /// Mean time between crashes of each worker (e.g. `10m`): crashes drawn at random.
    #[arg(long, value_parser = humantime::parse_duration)]
    mtbf: Option<Duration>,
    /// How long a worker crashed by the MTBF stays away.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    repair: Duration,
    /// How long the frontend takes to notice a crash.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20ms")]
    crash_detection: Duration,
    /// The link a moved request's KV may take when the failed worker's memory is still
    /// readable (hang, drain): nvlink (900 GB/s), pcie5 (28 GB/s), ib (50 GB/s) or GB/s;
    /// the cheaper of that and computing the KV again is taken. None: always computed.
    #[arg(long)]
    kv_link: Option<switchyard_sim::Link>,
    /// The model's KV shape, for the bytes a token's KV takes: llama-3-8b, llama-3-70b or
    /// LAYERS,KV_HEADS,HEAD_DIM,VALUE_BYTES [default: workers.mocker.kv_transfer's].
    #[arg(long)]
    model_shape: Option<ModelShape>,
    /// One row per policy × fleet size × load level (implied by several --workers or
    /// --speedup values).
    #[arg(long)]
    sweep: bool,
    /// With a sweep: an SVG plot of TTFT p90 against offered load per policy and fleet
    /// size.
    #[arg(long, value_name = "FILE.svg")]
    pub(super) plot: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub(super) json: bool,
    /// Write every request's fate to this file, one JSON object a line (policy, or with
    /// --planner the fleet, planned or fixed; id, arrival, time to first token, end to
    /// end, worker, outcome; times in ms).
    #[arg(long, value_name = "FILE.jsonl")]
    pub(super) requests_out: Option<PathBuf>,
    #[command(flatten)]
    pub(super) planning: super::sim_planner::PlanningArgs,
    #[command(flatten)]
    pub(super) disagg: super::sim_disagg::DisaggArgs,
    /// Give the trace's requests media, with these shares (`image=0.1,video=0.1,audio=0.05`;
    /// images 576 tokens, videos 30 frames of 144, audio 1,500), inserted after the first
    /// 512 prompt tokens. A Mooncake trace's own `media` rows are used otherwise.
    #[arg(long, value_name = "MIX")]
    media_mix: Option<switchyard_workload::synth::MediaMix>,
    /// Distinct media items per modality the mix draws from (fewer recur more).
    #[arg(long, default_value_t = 100_000)]
    media_pool: u64,
    /// frontend.multimodal.encoders: encoder workers for the media (0: media costs no
    /// encoding time).
    #[arg(long)]
    encoders: Option<usize>,
    /// frontend.multimodal.encoder_policy: soonest (the one that would finish it first)
    /// or round_robin.
    #[arg(long, value_enum)]
    encoder_policy: Option<EncoderPolicyArg>,
    /// frontend.multimodal.joint_routing: a request whose media a worker holds in its
    /// cache skips the encoders and goes to such a worker when it is sooner.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    joint_media: Option<bool>,
    /// frontend.multimodal.overlap: a request with media goes to its LLM worker at once,
    /// which prefills the text before the media while the encoders run.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    overlap_media: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EncoderPolicyArg {
    Soonest,
    RoundRobin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum ViewArg {
    Events,
    Approx,
    Natural,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Preemption {
    Lifo,
    Fifo,
}

#[derive(Serialize)]
struct Output<'a> {
    trace: String,
    workers: u32,
    /// What the fleet ran with: the routing core's settings (as the configuration gave
    /// them; the policy is each report's) and the engines'.
    routing: &'a switchyard_router::RoutingConfig,
    engine: &'a switchyard_mocker::EngineArgs,
    policies: BTreeMap<&'a str, &'a SimReport>,
}

/// What the configuration tree and the flags settle for a run: the simulator's settings
/// (the first fleet size), the fleet sizes and policies to run, the tree itself.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) base: SimConfig,
    pub(super) workers: Vec<u32>,
    pub(super) policies: Vec<PolicyKind>,
    pub(super) config: switchyard::config::Config,
}

impl SimArgs {
    /// The flags that stand for configuration keys, as an overlay over the file and the
    /// environment (so the one loader checks them and names their keys).
    fn overlay(&self) -> Result<Overlay> {
        let mut o = Overlay::default();
        for set in &self.set {
            let Some((key, value)) = set.split_once('=') else {
                bail!("--set {set}: expected KEY=VALUE, e.g. frontend.router.seed=3");
            };
            let path: Vec<&str> = key.trim().split('.').collect();
            if path.iter().any(|p| p.is_empty()) {
                bail!("--set {set}: the key must be dotted names, e.g. frontend.router.seed");
            }
            o.set(&path, switchyard::config::parse_value(value.trim()));
        }
        let mocker = ["workers", "mocker"];
        let key = |name: &'static str| [mocker[0], mocker[1], name];
        o.set_some(&key("num_gpu_blocks"), self.num_gpu_blocks.map(i64::from));
        o.set_some(&key("block_size"), self.block_size.map(i64::from));
        o.set_some(&key("max_num_seqs"), self.max_num_seqs.map(i64::from));
        o.set_some(
            &key("max_num_batched_tokens"),
            self.max_num_batched_tokens.map(i64::from),
        );
        if self.no_prefix_caching {
            o.set(&key("enable_prefix_caching"), false);
        }
        if self.no_chunked_prefill {
            o.set(&key("enable_chunked_prefill"), false);
        }
        if let Some(tokens) = self.staging_tokens {
            o.set(&key("staging_tokens"), i64::try_from(tokens)?);
        }
        if self.no_defer_ready_media {
            o.set(&key("defer_ready_media"), false);
        }
        o.set_some(
            &key("preemption_mode"),
            self.preemption.map(|p| match p {
                Preemption::Lifo => "lifo",
                Preemption::Fifo => "fifo",
            }),
        );
        if let Some(seed) = self.seed {
            let seed = i64::try_from(seed)?;
            o.set(&key("seed"), seed);
            o.set(&["frontend", "router", "seed"], seed);
        }
        o.set_some(
            &["workers", "count"],
            self.workers.first().map(|&w| i64::from(w)),
        );
        let admission = |name| ["frontend", "admission", name];
        o.set_some(&admission("busy_kv_threshold"), self.busy_kv_threshold);
        if let Some(queue) = self.max_queue {
            o.set(&admission("max_queue"), i64::try_from(queue)?);
        }
        o.set_some(
            &admission("queue_timeout"),
            self.queue_timeout
                .map(|t| humantime::format_duration(t).to_string()),
        );
        o.set_some(&admission("wait_target"), self.wait_target.clone());
        let multimodal = |name| ["frontend", "multimodal", name];
        if let Some(encoders) = self.encoders {
            o.set(&multimodal("encoders"), i64::try_from(encoders)?);
        }
        o.set_some(
            &multimodal("encoder_policy"),
            self.encoder_policy.map(|p| match p {
                EncoderPolicyArg::Soonest => "soonest",
                EncoderPolicyArg::RoundRobin => "round_robin",
            }),
        );
        o.set_some(&multimodal("joint_routing"), self.joint_media);
        o.set_some(&multimodal("overlap"), self.overlap_media);
        Ok(o)
    }

    /// The configuration tree (file, environment, overlay) and what the run takes from it.
    pub(super) fn plan(&self, env: &BTreeMap<String, String>) -> Result<Plan> {
        let config = switchyard::config::load(self.config.as_deref(), env, self.overlay()?.0)?;
        let only = switchyard::replay::SimOnly {
            perf_profiles: self.perf_profile.clone(),
            event_delay: self.event_delay,
            eos_token_ids: self.eos_token_ids.clone(),
            faults: switchyard_sim::FaultConfig {
                schedule: self.faults.clone(),
                mtbf: self.mtbf,
                repair: self.repair,
                crash_detection: self.crash_detection,
                link: self.kv_link,
                ..switchyard_sim::FaultConfig::default()
            },
            kv_bytes_per_token: self.model_shape.map(|s| s.kv_bytes_per_token()),
            record_requests: self.requests_out.is_some(),
        };
        let base = switchyard::replay::sim_config(&config, only)?;
        let workers = if self.workers.is_empty() {
            vec![config.workers.count]
        } else {
            self.workers.clone()
        };
        let policies = match (&self.policy[..], &self.config) {
            ([], Some(_)) => vec![config.frontend.router.policy],
            ([], None) => vec![PolicyKind::Latency, PolicyKind::Kv, PolicyKind::RoundRobin],
            (given, _) => given.to_vec(),
        };
        Ok(Plan {
            base,
            workers,
            policies,
            config,
        })
    }
}

pub fn run(args: SimArgs, env: &BTreeMap<String, String>) -> Result<()> {
    if args.workers.contains(&0) {
        bail!("--workers must be at least 1");
    }
    if let Some(bad) = args.speedup.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        bail!("--speedup must be a positive number, got {bad}");
    }
    if args.speedup.is_empty() {
        bail!("--speedup needs a value");
    }
    let sweep = args.sweep || args.workers.len() > 1 || args.speedup.len() > 1;
    if args.plot.is_some() && !sweep && args.planning.planner.is_empty() {
        bail!(
            "--plot draws a sweep or a planned run: give several --workers or --speedup values, \
             --sweep, or --planner"
        );
    }
    if args.requests_out.is_some()
        && args.planning.planner.is_empty()
        && (sweep || !args.disagg.disagg.is_empty())
    {
        bail!(
            "--requests-out writes the requests of single runs and planned ones, not of a sweep or --disagg"
        );
    }
    if sweep && !(args.faults.is_empty() && args.mtbf.is_none()) {
        bail!("faults are played in single runs, not in a sweep");
    }
    if args.trace_block_size == 0 {
        bail!("--trace-block-size must be at least 1");
    }
    if args.mtbf.is_some_and(|m| m.is_zero()) {
        bail!("--mtbf must be longer than zero");
    }
    let plan = args.plan(env)?;
    if let Some(fault) = args.faults.iter().find(|f| f.worker > plan.workers[0]) {
        bail!(
            "--fault {fault}: there are only {} workers (numbered from 1)",
            plan.workers[0]
        );
    }
    let mut requests = read_trace(&args, plan.base.seed)?;
    if let Some(limit) = args.limit {
        requests.truncate(limit);
    }
    let block_size = plan.base.engine.block_size;

    if !args.disagg.disagg.is_empty() && !args.planning.planner.is_empty() {
        // A planned disaggregated fleet, starting from the split.
        let [split] = args.disagg.disagg[..] else {
            bail!("--planner with --disagg plans one fleet: give one P:D split");
        };
        if sweep {
            bail!("--planner runs one fleet at one load: give one --speedup");
        }
        let config = super::sim_disagg::with_split(&args, &plan, plan.base.clone(), split)?;
        return super::sim_planner::run(&args, &plan, &requests, &config);
    }
    if !args.disagg.disagg.is_empty() {
        if sweep || plan.workers.len() > 1 {
            bail!("--disagg sets the fleet sizes itself: give one --speedup and no --sweep");
        }
        let workload = PreparedWorkload::prepare(
            &requests,
            args.trace_block_size,
            block_size,
            args.speedup[0],
        );
        return super::sim_disagg::run(&args, &plan, &workload);
    }
    if !args.planning.planner.is_empty() {
        if sweep {
            bail!("--planner runs one fleet at one load: give one --workers and one --speedup");
        }
        return super::sim_planner::run(&args, &plan, &requests, &plan.base);
    }
    if sweep {
        return run_sweep(&args, &plan, &requests);
    }
    let workload = PreparedWorkload::prepare(
        &requests,
        args.trace_block_size,
        block_size,
        args.speedup[0],
    );
    let reports = run_policies(&args, &plan.policies, &workload, &plan.base, args.json)?;
    if let Some(path) = &args.requests_out {
        write_requests(path, reports.iter().map(|r| (r.policy.as_str(), r)))?;
    }
    if args.json {
        let policies = reports.iter().map(|r| (r.policy.as_str(), r)).collect();
        let out = Output {
            trace: args.trace.display().to_string(),
            workers: plan.base.workers,
            routing: &plan.base.routing,
            engine: &plan.base.engine,
            policies,
        };
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&out)?))?;
    } else {
        write_stdout(&table(
            &args,
            &plan.workers,
            workload.requests.len(),
            &reports,
        ))?;
    }
    Ok(())
}

/// Runs every policy on the workload.
fn run_policies(
    args: &SimArgs,
    policies: &[PolicyKind],
    workload: &PreparedWorkload,
    config: &SimConfig,
    quiet: bool,
) -> Result<Vec<SimReport>> {
    let mut reports = Vec::new();
    for &policy in policies {
        let bar = progress_bar(workload.requests.len() as u64, policy, quiet);
        let mut config = config.clone();
        config.routing.router.cache_view =
            cache_view_for(args, policy, config.routing.router.cache_view);
        let started = Instant::now();
        let mut report = simulate(&config, workload, policy, &mut |done| {
            bar.set_position(done)
        })?;
        report.cache_view = view_name(config.routing.router.cache_view);
        report.wall_seconds = started.elapsed().as_secs_f64();
        bar.finish_and_clear();
        reports.push(report);
    }
    Ok(reports)
}

/// The router's view of the caches for `policy` under `--cache-view` (none: the
/// configuration's, `configured`).
pub(super) fn cache_view_for(
    args: &SimArgs,
    policy: PolicyKind,
    configured: CacheViewMode,
) -> CacheViewMode {
    match args.cache_view {
        None => configured,
        Some(ViewArg::Natural) if policy == PolicyKind::CacheAware => CacheViewMode::Approximate,
        Some(ViewArg::Natural | ViewArg::Events) => CacheViewMode::Auto,
        Some(ViewArg::Approx) => CacheViewMode::Approximate,
    }
}

/// A cache view's name in reports.
pub(super) fn view_name(view: CacheViewMode) -> &'static str {
    match view {
        CacheViewMode::Auto => "events",
        CacheViewMode::Approximate => "approx",
    }
}

/// One point of a sweep.
#[derive(Serialize)]
pub(super) struct SweepPoint {
    pub(super) workers: u32,
    pub(super) speedup: f64,
    /// Arrivals per second per worker.
    pub(super) offered_per_worker: f64,
    pub(super) report: SimReport,
}

/// Every policy on every fleet size at every load level: a table (or JSON) and a plot.
fn run_sweep(args: &SimArgs, plan: &Plan, requests: &[TraceRequest]) -> Result<()> {
    let mut points = Vec::new();
    let block_size = plan.base.engine.block_size;
    for &speedup in &args.speedup {
        let workload =
            PreparedWorkload::prepare(requests, args.trace_block_size, block_size, speedup);
        let span = match (workload.requests.first(), workload.requests.last()) {
            (Some(first), Some(last)) => (last.arrival - first.arrival).as_secs_f64(),
            _ => 0.0,
        };
        let rate = if span > 0.0 {
            workload.requests.len() as f64 / span
        } else {
            0.0
        };
        for &workers in &plan.workers {
            let config = SimConfig {
                workers,
                ..plan.base.clone()
            };
            for report in run_policies(args, &plan.policies, &workload, &config, args.json)? {
                points.push(SweepPoint {
                    workers,
                    speedup,
                    offered_per_worker: rate / f64::from(workers),
                    report,
                });
            }
        }
    }
    if let Some(path) = &args.plot {
        plot(path, &args.trace, &points)?;
    }
    if args.json {
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&points)?))
    } else {
        write_stdout(&sweep_table(&args.trace, &points))
    }
}

fn read_trace(args: &SimArgs, seed: u64) -> Result<Vec<TraceRequest>> {
    let format = args.format.unwrap_or_else(|| {
        if args
            .trace
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
        {
            TraceFormat::Azure
        } else {
            TraceFormat::Mooncake
        }
    });
    match format {
        TraceFormat::Mooncake => {
            let mut trace = Trace::read(&args.trace)?;
            // Cut before the sessions are resolved: a row waiting for one past the cut is
            // then named.
            if let Some(limit) = args.limit {
                trace.records.truncate(limit);
            }
            if let Some(mix) = &args.media_mix {
                let mix = switchyard_workload::synth::MediaMix {
                    pool: args.media_pool,
                    ..mix.clone()
                };
                mix.apply(&mut trace.records, seed, args.trace_block_size);
            }
            // A session trace is replayed closed loop (its rows' `session_id`, `wait_for`).
            if args.open_loop {
                return Ok(trace
                    .records
                    .iter()
                    .map(TraceRequest::from_mooncake)
                    .collect());
            }
            let requests =
                TraceRequest::from_trace(&trace.records).map_err(|e| trace.locate(e.into()));
            match (requests, args.limit) {
                (Err(e), Some(limit)) => Err(anyhow::Error::new(e)
                    .context(format!("the trace's first {limit} rows (--limit)"))),
                (requests, _) => Ok(requests?),
            }
        }
        TraceFormat::Azure if args.media_mix.is_some() => {
            anyhow::bail!(
                "--media-mix needs a Mooncake trace (the Azure traces have no prefixes to place media after)"
            )
        }
        TraceFormat::Azure => Ok(switchyard_workload::azure::read(&args.trace)?
            .iter()
            .map(|r| TraceRequest {
                arrival: r.arrival,
                input_tokens: r.context_tokens,
                output_tokens: r.generated_tokens,
                hash_ids: Vec::new(),
                media: Vec::new(),
                turn: None,
            })
            .collect()),
    }
}
