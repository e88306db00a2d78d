//! `switchyard sim`: replay a trace through the router and a simulated fleet.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use switchyard_mocker::{EngineArgs, PerfModel, PreemptionMode};
use switchyard_router::indexer::approx::ApproxConfig;
use switchyard_router::policy::KvPolicyConfig;
use switchyard_router::routing::encoders::{EncoderCost, EncoderPolicy};
use switchyard_router::{
    AdmissionConfig, CacheViewMode, LatencyPolicyConfig, PolicyKind, RouterConfig, RoutingConfig,
};
use switchyard_sim::{
    FaultConfig, Link, ModelShape, PreparedWorkload, ScheduledFault, SimConfig, SimReport,
    TraceRequest, simulate,
};
use switchyard_workload::trace_io::Trace;

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
    /// Engines in the fleet (comma separated: a sweep over fleet sizes).
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub(super) workers: Vec<u32>,
    /// Policies to compare, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "latency,kv,round-robin")]
    pub(super) policy: Vec<PolicyKind>,
    /// Weight of prefill against decode load in the kv policy.
    #[arg(long, default_value_t = 1.0)]
    overlap_weight: f64,
    /// Softmax temperature of the kv policy (0: always the cheapest worker).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Weight of the delay a request's prefill adds to running decodes in the latency
    /// policy.
    #[arg(long, default_value_t = LatencyPolicyConfig::default().itl_weight)]
    itl_weight: f64,
    /// `latency`: weight of the request's own decoding (its output tokens × the worker's
    /// step time with it) against its time to first token (0: not counted).
    #[arg(long, default_value_t = LatencyPolicyConfig::default().output_weight)]
    output_weight: f64,
    /// `latency`: weight of the delay a request's prefill adds to the first token of the
    /// prefill queued before it on the worker.
    #[arg(long, default_value_t = LatencyPolicyConfig::default().queue_delay_weight)]
    queue_delay_weight: f64,
    /// `latency`: cost per millisecond by which a worker's decode step with the request
    /// would exceed (1 + --decode-tail-margin) × the workers' mean step (0: off).
    #[arg(long, default_value_t = LatencyPolicyConfig::default().decode_tail_weight)]
    decode_tail_weight: f64,
    #[arg(long, default_value_t = LatencyPolicyConfig::default().decode_tail_margin)]
    decode_tail_margin: f64,
    /// The router's view of the caches: the engines' KV events (as `serve` sees its
    /// workers), blocks assumed cached when routed (approx), or natural: approx for
    /// cache-aware (as SGLang's router, which has no events, is deployed), events for the
    /// others.
    #[arg(long, value_enum, default_value_t = ViewArg::Events)]
    cache_view: ViewArg,
    /// How long the approximate view assumes a routed block stays cached, in seconds.
    #[arg(long, default_value_t = 120.0)]
    approx_ttl_secs: f64,
    /// Delay before KV events reach the indexer, in milliseconds.
    #[arg(long, default_value_t = 0.0)]
    event_delay_ms: f64,
    #[arg(long, default_value_t = 16_384)]
    pub(super) num_gpu_blocks: u32,
    #[arg(long, default_value_t = 16)]
    pub(super) block_size: u32,
    #[arg(long, default_value_t = 256)]
    max_num_seqs: u32,
    #[arg(long, default_value_t = 8_192)]
    max_num_batched_tokens: u32,
    #[arg(long)]
    no_prefix_caching: bool,
    #[arg(long)]
    no_chunked_prefill: bool,
    /// Media positions whose encoded features an engine's staging memory holds at once
    /// (0: no limit; default: 4 GiB of 8 KiB-a-token embeddings)
    #[arg(long, default_value_t = switchyard_mocker::DEFAULT_STAGING_TOKENS)]
    staging_tokens: u64,
    /// With --overlap-media: a request whose media become ready resumes at once, ahead of
    /// the requests that arrived while it waited (default: behind them)
    #[arg(long)]
    no_defer_ready_media: bool,
    /// Which running request to preempt when KV blocks run out.
    #[arg(long, value_enum, default_value_t = Preemption::Lifo)]
    preemption: Preemption,
    /// Timing profile (JSON or NPZ) instead of the polynomial model; several, comma
    /// separated, make a heterogeneous fleet (worker i runs the (i mod n)-th; `polynomial`
    /// names the default model).
    #[arg(long, value_delimiter = ',')]
    perf_profile: Vec<PathBuf>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Token ids that end a generation early (the servers pass the tokenizer's
    /// end-of-sequence tokens; the built-in tokenizer's is 257). None by default: every
    /// request produces its trace output length.
    #[arg(long, value_delimiter = ',')]
    eos_token_ids: Vec<u32>,
    /// Admission: a worker is busy when in-flight requests hold this share of its KV blocks
    /// [default: 0.95; with --planner the servers' 0.8].
    #[arg(long)]
    pub(super) busy_kv_threshold: Option<f64>,
    /// Admission: most requests waiting at once.
    #[arg(long, default_value_t = AdmissionConfig::default().max_queue)]
    max_queue: usize,
    /// Admission: longest a request waits in the queue, in seconds.
    #[arg(long, default_value_t = AdmissionConfig::default().queue_timeout.as_secs_f64())]
    queue_timeout_secs: f64,
    /// Admission: refuse a request predicted to wait longer than this in the queue, in
    /// seconds (premium: twice), or `off` [default: off; with --planner the TTFT target;
    /// the servers' default is 5].
    #[arg(long, value_name = "SECS|off", value_parser = parse_wait_target)]
    pub(super) wait_target_secs: Option<WaitTarget>,
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
    #[arg(long, default_value_t = FaultConfig::default().crash_detection.as_secs_f64() * 1e3)]
    crash_detection_ms: f64,
    /// Times one request may be moved off failed workers before it fails.
    #[arg(long, default_value_t = FaultConfig::default().max_migrations)]
    max_migrations: u32,
    /// The link a moved request's KV may take when the failed worker's memory is still
    /// readable (hang, drain): nvlink (900 GB/s), pcie5 (28 GB/s), ib (50 GB/s) or GB/s;
    /// the cheaper of that and computing the KV again is taken. None: always computed.
    #[arg(long)]
    kv_link: Option<Link>,
    /// The model's KV shape, for the bytes a token's KV takes: llama-3-8b, llama-3-70b or
    /// LAYERS,KV_HEADS,HEAD_DIM,VALUE_BYTES.
    #[arg(long, default_value = "llama-3-8b")]
    pub(super) model_shape: ModelShape,
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
    /// Encoder workers for the media (0: media costs no encoding time).
    #[arg(long, default_value_t = 0)]
    encoders: usize,
    /// How an item's encoder is chosen: soonest (the one that would finish it first) or
    /// round-robin.
    #[arg(long, value_enum, default_value_t = EncoderPolicyArg::Soonest)]
    encoder_policy: EncoderPolicyArg,
    /// Joint routing: a request whose media a worker holds in its cache skips the encoders
    /// and goes to such a worker.
    #[arg(long)]
    joint_media: bool,
    /// Overlap: a request with media goes to its LLM worker at once, which prefills the
    /// text before the media while the encoders run.
    #[arg(long)]
    overlap_media: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EncoderPolicyArg {
    Soonest,
    RoundRobin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ViewArg {
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
    policies: BTreeMap<&'a str, &'a SimReport>,
}

/// `--wait-target-secs`: a number of seconds, or `off`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum WaitTarget {
    Off,
    After(Duration),
}

fn parse_wait_target(s: &str) -> Result<WaitTarget, String> {
    if s == "off" {
        return Ok(WaitTarget::Off);
    }
    match s.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 => {
            Ok(WaitTarget::After(Duration::from_secs_f64(secs)))
        }
        _ => Err(format!(
            "expected a positive number of seconds or `off`, got {s:?}"
        )),
    }
}

pub fn run(args: SimArgs) -> Result<()> {
    if args.workers.is_empty() || args.workers.contains(&0) {
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
    if !(args.event_delay_ms.is_finite() && args.event_delay_ms >= 0.0) {
        bail!(
            "--event-delay-ms must be a non-negative number, got {}",
            args.event_delay_ms
        );
    }
    if !(args.approx_ttl_secs.is_finite() && args.approx_ttl_secs > 0.0) {
        bail!(
            "--approx-ttl-secs must be a positive number, got {}",
            args.approx_ttl_secs
        );
    }
    if args.trace_block_size == 0 {
        bail!("--trace-block-size must be at least 1");
    }
    if let Some(busy) = args.busy_kv_threshold
        && !(busy > 0.0 && busy <= 1.0)
    {
        bail!("--busy-kv-threshold must be in (0, 1], got {busy}");
    }
    if args.max_queue == 0 {
        bail!("--max-queue must be at least 1");
    }
    if !(args.queue_timeout_secs.is_finite() && args.queue_timeout_secs > 0.0) {
        bail!(
            "--queue-timeout-secs must be a positive number, got {}",
            args.queue_timeout_secs
        );
    }
    if let Some(fault) = args.faults.iter().find(|f| f.worker > args.workers[0]) {
        bail!(
            "--fault {fault}: there are only {} workers (numbered from 1)",
            args.workers[0]
        );
    }
    if args.mtbf.is_some_and(|m| m.is_zero()) {
        bail!("--mtbf must be longer than zero");
    }
    if !(args.crash_detection_ms.is_finite() && args.crash_detection_ms >= 0.0) {
        bail!(
            "--crash-detection-ms must be a non-negative number, got {}",
            args.crash_detection_ms
        );
    }
    let engine = EngineArgs {
        num_gpu_blocks: args.num_gpu_blocks,
        block_size: args.block_size,
        max_num_seqs: args.max_num_seqs,
        max_num_batched_tokens: args.max_num_batched_tokens,
        enable_prefix_caching: !args.no_prefix_caching,
        enable_chunked_prefill: !args.no_chunked_prefill,
        preemption_mode: match args.preemption {
            Preemption::Lifo => PreemptionMode::Lifo,
            Preemption::Fifo => PreemptionMode::Fifo,
        },
        speedup_ratio: 1.0,
        staging_tokens: args.staging_tokens,
        defer_ready_media: !args.no_defer_ready_media,
    };
    engine.validate().context("invalid engine arguments")?;
    let mut perf = Vec::new();
    for path in &args.perf_profile {
        perf.push(if path.as_os_str() == "polynomial" {
            PerfModel::Polynomial
        } else {
            switchyard_mocker::perf::load(path)?
        });
    }
    if perf.is_empty() {
        perf.push(PerfModel::Polynomial);
    }

    let mut requests = read_trace(&args)?;
    if let Some(limit) = args.limit {
        requests.truncate(limit);
    }
    let approx = ApproxConfig {
        ttl: Duration::from_secs_f64(args.approx_ttl_secs),
        max_blocks_per_worker: args.num_gpu_blocks as usize,
    };
    let config = SimConfig {
        encoders: None,
        workers: args.workers[0],
        engine,
        perf,
        routing: RoutingConfig {
            router: RouterConfig {
                kv: KvPolicyConfig {
                    overlap_weight: args.overlap_weight,
                    temperature: args.temperature,
                },
                latency: LatencyPolicyConfig {
                    itl_weight: args.itl_weight,
                    output_weight: args.output_weight,
                    queue_delay_weight: args.queue_delay_weight,
                    decode_tail_weight: args.decode_tail_weight,
                    decode_tail_margin: args.decode_tail_margin,
                    temperature: args.temperature,
                },
                ..RouterConfig::default()
            },
            cache_view: CacheViewMode::Auto,
            approx,
            admission: AdmissionConfig {
                busy_kv_threshold: args
                    .busy_kv_threshold
                    .unwrap_or(AdmissionConfig::default().busy_kv_threshold),
                max_queue: args.max_queue,
                queue_timeout: Duration::from_secs_f64(args.queue_timeout_secs),
                wait_target: match args.wait_target_secs {
                    Some(WaitTarget::After(target)) => Some(target),
                    Some(WaitTarget::Off) | None => None,
                },
                ..AdmissionConfig::default()
            },
            ..RoutingConfig::default()
        },
        event_delay: Duration::from_secs_f64(args.event_delay_ms / 1e3),
        eos_token_ids: args.eos_token_ids.clone(),
        seed: args.seed,
        record_requests: args.requests_out.is_some(),
        lazy_engines: true,
        faults: FaultConfig {
            schedule: args.faults.clone(),
            mtbf: args.mtbf,
            repair: args.repair,
            crash_detection: Duration::from_secs_f64(args.crash_detection_ms / 1e3),
            max_migrations: args.max_migrations,
            link: args.kv_link,
            kv_bytes_per_token: args.model_shape.kv_bytes_per_token(),
        },
        planner: None,
        sla_targets: None,
        disagg: None,
    };
    let config = SimConfig {
        encoders: (args.encoders > 0).then(|| switchyard_sim::EncoderSim {
            count: args.encoders,
            cost: EncoderCost::default(),
            policy: match args.encoder_policy {
                EncoderPolicyArg::Soonest => EncoderPolicy::Soonest,
                EncoderPolicyArg::RoundRobin => EncoderPolicy::RoundRobin,
            },
            joint: args.joint_media,
            overlap: args.overlap_media,
        }),
        ..config
    };

    if !args.disagg.disagg.is_empty() && !args.planning.planner.is_empty() {
        // A planned disaggregated fleet, starting from the split.
        let [split] = args.disagg.disagg[..] else {
            bail!("--planner with --disagg plans one fleet: give one P:D split");
        };
        if sweep {
            bail!("--planner runs one fleet at one load: give one --speedup");
        }
        let config = super::sim_disagg::with_split(&args, config, split)?;
        return super::sim_planner::run(&args, &requests, &config);
    }
    if !args.disagg.disagg.is_empty() {
        if sweep || args.workers.len() > 1 {
            bail!("--disagg sets the fleet sizes itself: give one --speedup and no --sweep");
        }
        let workload = PreparedWorkload::prepare(
            &requests,
            args.trace_block_size,
            args.block_size,
            args.speedup[0],
        );
        return super::sim_disagg::run(&args, &workload, &config);
    }
    if !args.planning.planner.is_empty() {
        if sweep {
            bail!("--planner runs one fleet at one load: give one --workers and one --speedup");
        }
        return super::sim_planner::run(&args, &requests, &config);
    }
    if sweep {
        return run_sweep(&args, &requests, &config);
    }
    let workload = PreparedWorkload::prepare(
        &requests,
        args.trace_block_size,
        args.block_size,
        args.speedup[0],
    );
    let reports = run_policies(&args, &workload, &config, args.json)?;
    if let Some(path) = &args.requests_out {
        write_requests(path, reports.iter().map(|r| (r.policy.as_str(), r)))?;
    }
    if args.json {
        let policies = reports.iter().map(|r| (r.policy.as_str(), r)).collect();
        let out = Output {
            trace: args.trace.display().to_string(),
            workers: config.workers,
            policies,
        };
        write_stdout(&format!("{}\n", serde_json::to_string_pretty(&out)?))?;
    } else {
        write_stdout(&table(&args, workload.requests.len(), &reports))?;
    }
    Ok(())
}

/// One request's fate, as `--requests-out` writes it.
#[derive(Serialize)]
struct RequestLine<'a> {
    policy: &'a str,
    id: u64,
    arrival_ms: f64,
    ttft_ms: Option<f64>,
    e2e_ms: Option<f64>,
    worker: Option<u64>,
    output_tokens: u32,
    cached_tokens: u32,
    outcome: &'a str,
}

/// Writes every request of each run, labelled (a policy, or a planned or fixed fleet).
pub(super) fn write_requests<'a>(
    path: &std::path::Path,
    runs: impl IntoIterator<Item = (&'a str, &'a SimReport)>,
) -> Result<()> {
    use std::io::Write as _;
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (label, report) in runs {
        for r in &report.request_records {
            let line = RequestLine {
                policy: label,
                id: r.id,
                arrival_ms: ms(r.arrival),
                ttft_ms: r.first_token.map(|t| ms(t.saturating_sub(r.arrival))),
                e2e_ms: r.finished.map(|t| ms(t.saturating_sub(r.arrival))),
                worker: r.worker.map(|w| w.worker_id.0),
                output_tokens: r.output_tokens,
                cached_tokens: r.cached_tokens,
                outcome: r.outcome,
            };
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
        }
    }
    out.flush()
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Runs every policy of `args` on the workload.
fn run_policies(
    args: &SimArgs,
    workload: &PreparedWorkload,
    config: &SimConfig,
    quiet: bool,
) -> Result<Vec<SimReport>> {
    let mut reports = Vec::new();
    for &policy in &args.policy {
        let bar = progress_bar(workload.requests.len() as u64, policy, quiet);
        let cache_view = cache_view_for(args, policy);
        let mut config = config.clone();
        config.routing.cache_view = cache_view;
        let started = Instant::now();
        let mut report = simulate(&config, workload, policy, &mut |done| {
            bar.set_position(done)
        })?;
        report.cache_view = match cache_view {
            CacheViewMode::Auto => "events",
            CacheViewMode::Approximate => "approx",
        };
        report.wall_seconds = started.elapsed().as_secs_f64();
        bar.finish_and_clear();
        reports.push(report);
    }
    Ok(reports)
}

/// The router's view of the caches for `policy` under `--cache-view`.
pub(super) fn cache_view_for(args: &SimArgs, policy: PolicyKind) -> CacheViewMode {
    match args.cache_view {
        ViewArg::Natural if policy == PolicyKind::CacheAware => CacheViewMode::Approximate,
        ViewArg::Natural | ViewArg::Events => CacheViewMode::Auto,
        ViewArg::Approx => CacheViewMode::Approximate,
    }
}

/// One point of a sweep.
#[derive(Serialize)]
struct SweepPoint {
    workers: u32,
    speedup: f64,
    /// Arrivals per second per worker.
    offered_per_worker: f64,
    report: SimReport,
}

/// Every policy on every fleet size at every load level: a table (or JSON) and a plot.
fn run_sweep(args: &SimArgs, requests: &[TraceRequest], base: &SimConfig) -> Result<()> {
    let mut points = Vec::new();
    for &speedup in &args.speedup {
        let workload =
            PreparedWorkload::prepare(requests, args.trace_block_size, args.block_size, speedup);
        let span = match (workload.requests.first(), workload.requests.last()) {
            (Some(first), Some(last)) => (last.arrival - first.arrival).as_secs_f64(),
            _ => 0.0,
        };
        let rate = if span > 0.0 {
            workload.requests.len() as f64 / span
        } else {
            0.0
        };
        for &workers in &args.workers {
            let config = SimConfig {
                workers,
                ..base.clone()
            };
            for report in run_policies(args, &workload, &config, args.json)? {
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

fn sweep_table(trace: &std::path::Path, points: &[SweepPoint]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "sweep of {}", trace.display());
    let _ = writeln!(
        out,
        "{:<14} {:>7} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8} {:>8} {:>7}",
        "policy",
        "workers",
        "speedup",
        "req/s/w",
        "ttft mean",
        "ttft p90",
        "ttft p99",
        "itl p99",
        "e2e mean",
        "hit rate",
        "refused",
        "wall s"
    );
    for p in points {
        let r = &p.report;
        let _ = writeln!(
            out,
            "{:<14} {:>7} {:>7} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>9.1} {:>7.1}% {:>8} {:>7.2}",
            r.policy,
            p.workers,
            p.speedup,
            p.offered_per_worker,
            r.ttft_ms.mean,
            r.ttft_ms.p90,
            r.ttft_ms.p99,
            r.itl_ms.p99,
            r.e2e_ms.mean,
            r.cache_hit_rate * 100.0,
            r.rejected + r.failed,
            r.wall_seconds
        );
    }
    out
}

/// TTFT p90 against offered load, a line per policy and fleet size.
fn plot(path: &std::path::Path, trace: &std::path::Path, points: &[SweepPoint]) -> Result<()> {
    use plotters::prelude::*;

    switchyard_workload::bench::register_font();
    let mut series: BTreeMap<(String, u32), Vec<(f64, f64)>> = BTreeMap::new();
    for p in points {
        series
            .entry((p.report.policy.clone(), p.workers))
            .or_default()
            .push((p.offered_per_worker, p.report.ttft_ms.p90));
    }
    let x_max = points
        .iter()
        .map(|p| p.offered_per_worker)
        .fold(0.0, f64::max)
        * 1.05;
    let y_max = points
        .iter()
        .map(|p| p.report.ttft_ms.p90)
        .fold(0.0, f64::max)
        * 1.1;
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let name = trace.file_name().map_or_else(
            || trace.display().to_string(),
            |n| n.to_string_lossy().into(),
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("TTFT p90 against load: {name}"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max.max(1e-3), 0.0..y_max.max(1.0))?;
        chart
            .configure_mesh()
            .x_desc("offered load, requests/s per worker")
            .y_desc("TTFT p90, ms")
            .draw()?;
        for (i, ((policy, workers), mut line)) in series.into_iter().enumerate() {
            line.sort_by(|a, b| a.0.total_cmp(&b.0));
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
                .label(format!("{policy}, {workers} workers"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))
}

fn read_trace(args: &SimArgs) -> Result<Vec<TraceRequest>> {
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
            let mut records = Trace::read(&args.trace)?.records;
            if let Some(mix) = &args.media_mix {
                let mix = switchyard_workload::synth::MediaMix {
                    pool: args.media_pool,
                    ..mix.clone()
                };
                mix.apply(&mut records, args.seed, args.trace_block_size);
            }
            Ok(records.iter().map(TraceRequest::from_mooncake).collect())
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
            })
            .collect()),
    }
}

fn progress_bar(len: u64, policy: PolicyKind, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    let style =
        ProgressStyle::with_template("{prefix:>14} [{bar:40}] {pos}/{len} requests ({elapsed})")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(policy.name());
    bar
}

/// Writes the output; a reader that went away (`| head`) is not an error.
pub(super) fn write_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

fn table(args: &SimArgs, requests: usize, reports: &[SimReport]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} requests from {} on {} workers",
        requests,
        args.trace.display(),
        args.workers
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    let _ = writeln!(
        out,
        "{:<14} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>9} {:>10} {:>10} {:>8} {:>7} {:>8} {:>8} {:>8}",
        "policy",
        "ttft mean",
        "ttft p50",
        "ttft p90",
        "ttft p99",
        "itl mean",
        "itl p99",
        "tpot p99",
        "e2e mean",
        "e2e p99",
        "hit rate",
        "req cv",
        "preempt",
        "refused",
        "wall s"
    );
    for r in reports {
        let _ = writeln!(
            out,
            "{:<14} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.2} {:>8.2} {:>9.2} {:>10.1} {:>10.1} {:>7.1}% {:>7.3} {:>8} {:>8} {:>8.2}",
            r.policy,
            r.ttft_ms.mean,
            r.ttft_ms.p50,
            r.ttft_ms.p90,
            r.ttft_ms.p99,
            r.itl_ms.mean,
            r.itl_ms.p99,
            r.tpot_ms.p99,
            r.e2e_ms.mean,
            r.e2e_ms.p99,
            r.cache_hit_rate * 100.0,
            r.load_spread.requests_cv,
            r.preemptions,
            r.rejected + r.failed,
            r.wall_seconds
        );
    }
    if let Some(r) = reports.first() {
        let _ = writeln!(
            out,
            "(ms; {:.0} simulated seconds; {:.2} req/s, {:.0} output tok/s for {})",
            r.simulated_seconds,
            r.throughput.requests_per_sec,
            r.throughput.output_tokens_per_sec,
            r.policy
        );
    }
    for r in reports {
        let Some(m) = &r.media else {
            continue;
        };
        let classes = m
            .ttft_ms_by_class
            .iter()
            .map(|(class, d)| format!("{class} {:.0}/{:.0}", d.p50, d.p99))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "{}: {} requests with media ({} items), {} routed to a worker holding theirs; {} \
             encoders {:.1} % busy, encoded p50 {:.0} ms p99 {:.0} ms after admission; TTFT \
             p50/p99 ms by class: {classes}",
            r.policy,
            m.requests,
            m.items,
            m.skipped,
            m.encoders,
            m.encoder_utilisation * 100.0,
            m.encode_wait_ms.p50,
            m.encode_wait_ms.p99,
        );
    }
    for r in reports {
        let Some(f) = &r.failures else {
            continue;
        };
        let _ = writeln!(
            out,
            "{}: {} faults, {} requests caught ({} restarted, {} moved mid-stream: {} by KV \
             transfer, {} by re-prefill), {} failed, {} completed after a move; stall p50 {:.0} \
             ms p99 {:.0} ms; e2e mean {:.0} ms moved vs {:.0} ms untouched; {:.0} worker-s down",
            r.policy,
            f.faults,
            f.interrupted,
            f.restarted,
            f.migrations,
            f.by_transfer,
            f.by_reprefill,
            f.failed,
            f.completed_after_move,
            f.stall_ms.p50,
            f.stall_ms.p99,
            f.moved_e2e_ms.mean,
            f.untouched_e2e_ms.mean,
            f.worker_seconds_down
        );
    }
    out
}
