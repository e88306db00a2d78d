//! `switchyard synth`: analyse a Mooncake-style hash trace, or synthesise a new one with the
//! same structure.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand, ValueEnum};
use switchyard_workload::analyze::{Comparison, TraceAnalysis, sessions};
use switchyard_workload::synth::{Arrivals, RateShape, Sampling, SynthConfig, generate_from_trace};
use switchyard_workload::trace_io::{Trace, write_mooncake};
use switchyard_workload::units::thousands;

#[derive(Debug, Args)]
pub struct SynthArgs {
    #[command(subcommand)]
    command: SynthCommand,
}

#[derive(Debug, Subcommand)]
enum SynthCommand {
    /// Report a trace's requests, arrival rate, ISL/OSL, block reuse and prefix tree.
    Analyze(AnalyzeArgs),
    /// Learn a trace's prefix structure and write a new Mooncake JSONL trace sampled from it.
    Generate(Box<GenerateArgs>),
}

#[derive(Debug, Args)]
struct AnalyzeArgs {
    /// Mooncake JSONL trace: {timestamp (ms), input_length, output_length, hash_ids}.
    trace: PathBuf,
    /// Tokens per hash id.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    block_size: u32,
    /// Print JSON instead of the text report.
    #[arg(long)]
    json: bool,
    /// Write the sessions recovered from the prefix chains here, as a session trace
    /// (agentic form: each row waits for the turn it continues), to replay closed loop.
    #[arg(long, value_name = "PATH")]
    sessions_out: Option<PathBuf>,
    /// With --sessions-out: a turn's delay is the recorded gap less this many milliseconds
    /// per output token of the turn before (the time its answer took when recorded, which
    /// a replay spends again).
    #[arg(long, default_value_t = 0.0, requires = "sessions_out")]
    answer_ms_per_token: f64,
}

#[derive(Debug, Args)]
struct GenerateArgs {
    /// Mooncake JSONL trace to learn from.
    trace: PathBuf,
    /// Where to write the synthetic trace (Mooncake JSONL).
    #[arg(short, long)]
    output: PathBuf,
    /// Requests to generate [default: as many as the source].
    #[arg(long)]
    num_requests: Option<usize>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Scale the length of every shared-prefix (core tree) node.
    #[arg(long, default_value_t = 1.0)]
    prefix_len_multiplier: f64,
    /// Make this many disjoint copies of the core tree (separate prefix families).
    #[arg(long, default_value_t = 1)]
    prefix_root_multiplier: u32,
    /// Scale the length of each unique (unshared) prompt.
    #[arg(long, default_value_t = 1.0)]
    prompt_len_multiplier: f64,
    /// Scale output lengths.
    #[arg(long, default_value_t = 1.0)]
    osl_multiplier: f64,
    /// Divide inter-arrival gaps (2 = twice the request rate).
    #[arg(long, default_value_t = 1.0)]
    speedup_ratio: f64,
    /// Bursty arrivals: squeeze every --burst-period's arrivals into its first
    /// --burst-duty share (0.2: each minute's requests come within 12 s); 1: as learned.
    #[arg(long, default_value_t = 1.0)]
    burst_duty: f64,
    /// The period of --burst-duty.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    burst_period: std::time::Duration,
    /// Rate over time, `AT:MULTIPLIER,...` in the output's time (e.g. `10m:5,20m:1`: the
    /// learned rate for 10 minutes, five times it for 10, then the learned rate again).
    #[arg(long, value_delimiter = ',', value_name = "AT:MULTIPLIER")]
    rate_profile: Vec<RatePoint>,
    /// How --rate-profile moves between its points: `steps` holds each multiplier until
    /// the next point; `linear` ramps from each point to the next (from 1× at 0), so
    /// `5m:1,20m:5,25m:5,40m:1` rises to 5× over 15 minutes and falls back over 15.
    #[arg(long, value_enum, default_value_t = RateShapeArg::Steps)]
    rate_shape: RateShapeArg,
    /// How arrivals are spaced before --burst-duty and --rate-profile: `learned` draws the
    /// source's gaps (coarse timestamps stay lumps: the Mooncake traces stamp arrivals every
    /// 3 s, about ten requests a stamp); `poisson` draws gaps at the source's mean rate from
    /// a gamma distribution of shape --burstiness. The same requests either way.
    #[arg(long, value_enum, default_value_t = ArrivalsArg::Learned)]
    arrivals: ArrivalsArg,
    /// Shape of `--arrivals poisson`'s gaps: 1 is Poisson, below 1 burstier, above 1 more
    /// regular.
    #[arg(long, default_value_t = 1.0)]
    burstiness: f64,
    /// Tokens per hash id, of the source and the output.
    #[arg(long, default_value_t = 512)]
    block_size: u32,
    /// Draw independently from the learned distributions instead of stratified (without
    /// replacement, refilled), which adds sampling noise.
    #[arg(long)]
    independent_sampling: bool,
    /// Give requests media with these shares (`image=0.1,video=0.1,audio=0.05`; images
    /// 576 tokens, videos 30 frames of 144, audio 1,500), inserted after the first block;
    /// the turns of a conversation keep their item. Written as each row's `media`.
    #[arg(long, value_name = "MIX")]
    media_mix: Option<switchyard_workload::synth::MediaMix>,
    /// Distinct media items per modality the mix draws from.
    #[arg(long, default_value_t = 100_000)]
    media_pool: u64,
}

pub fn run(args: SynthArgs) -> Result<()> {
    match args.command {
        SynthCommand::Analyze(args) => analyze(args),
        SynthCommand::Generate(args) => generate(*args),
    }
}

fn analyze(args: AnalyzeArgs) -> Result<()> {
    let trace = Trace::read(&args.trace)?;
    let analysis = TraceAnalysis::of_trace(&trace, args.block_size)?;
    if let Some(path) = &args.sessions_out {
        if !(args.answer_ms_per_token.is_finite() && args.answer_ms_per_token >= 0.0) {
            bail!(
                "--answer-ms-per-token must be 0 or more, got {}",
                args.answer_ms_per_token
            );
        }
        let recovered = sessions::recover(&trace.records, args.block_size);
        let rows = sessions::session_trace(&trace.records, &recovered, args.answer_ms_per_token);
        write_mooncake(path, &rows)?;
        eprintln!(
            "Wrote {} rows in {} sessions to {}",
            thousands(rows.len() as u64),
            thousands(analysis.sessions.sessions as u64),
            path.display()
        );
    }
    if args.json {
        write_stdout(&format!("{}\n", analysis.to_json()?))
    } else {
        write_stdout(&format!(
            "Trace           {}\n{analysis}",
            args.trace.display()
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RateShapeArg {
    Steps,
    Linear,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ArrivalsArg {
    Learned,
    Poisson,
}

/// One point of `--rate-profile`.
#[derive(Debug, Clone, Copy)]
struct RatePoint {
    at: std::time::Duration,
    multiplier: f64,
}

impl std::str::FromStr for RatePoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (at, multiplier) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}` is not AT:MULTIPLIER (e.g. 10m:5)"))?;
        Ok(RatePoint {
            at: humantime::parse_duration(at).map_err(|e| format!("`{at}`: {e}"))?,
            multiplier: multiplier
                .parse()
                .map_err(|_| format!("`{multiplier}` is not a number"))?,
        })
    }
}

fn generate(args: GenerateArgs) -> Result<()> {
    let arrivals = match args.arrivals {
        ArrivalsArg::Poisson => Arrivals::Gamma {
            shape: args.burstiness,
        },
        ArrivalsArg::Learned if args.burstiness != 1.0 => {
            bail!("--burstiness shapes `--arrivals poisson`; the learned gaps have their own")
        }
        ArrivalsArg::Learned => Arrivals::Learned,
    };
    if args.rate_shape == RateShapeArg::Linear && args.rate_profile.is_empty() {
        bail!("--rate-shape linear shapes --rate-profile's ramps; give a --rate-profile");
    }
    let config = SynthConfig {
        arrivals,
        num_requests: args.num_requests,
        seed: args.seed,
        prefix_len_multiplier: args.prefix_len_multiplier,
        prefix_root_multiplier: args.prefix_root_multiplier,
        prompt_len_multiplier: args.prompt_len_multiplier,
        osl_multiplier: args.osl_multiplier,
        speedup_ratio: args.speedup_ratio,
        burst_period_ms: args.burst_period.as_secs_f64() * 1e3,
        burst_duty: args.burst_duty,
        rate_profile: args
            .rate_profile
            .iter()
            .map(|p| (p.at.as_secs_f64() * 1e3, p.multiplier))
            .collect(),
        rate_shape: match args.rate_shape {
            RateShapeArg::Steps => RateShape::Steps,
            RateShapeArg::Linear => RateShape::Linear,
        },
        block_size: args.block_size,
        sampling: if args.independent_sampling {
            Sampling::Independent
        } else {
            Sampling::Stratified
        },
    };
    config.validate()?;
    let trace = Trace::read(&args.trace)?;
    let mut records = generate_from_trace(&trace, &config)?;
    let source = TraceAnalysis::of_trace(&trace, config.block_size)?;
    let synthetic = TraceAnalysis::of(&records, config.block_size)
        .context("the synthetic trace is not a prefix tree (a bug)")?;
    let mut media = String::new();
    if let Some(mix) = &args.media_mix {
        let mix = switchyard_workload::synth::MediaMix {
            pool: args.media_pool,
            ..mix.clone()
        };
        mix.apply(&mut records, args.seed, config.block_size);
        let with = records.iter().filter(|r| !r.media.is_empty()).count();
        media = format!(
            " ({} with media, {} media tokens)",
            thousands(with as u64),
            thousands(
                records
                    .iter()
                    .flat_map(|r| &r.media)
                    .map(|m| m.tokens)
                    .sum()
            )
        );
    }
    write_mooncake(&args.output, &records)?;
    write_stdout(&format!(
        "Wrote {} requests{media} to {}\n\n{}",
        thousands(records.len() as u64),
        args.output.display(),
        Comparison::of(&source, &synthetic)
    ))
}

/// Writes a report to stdout; a closed pipe (`| head`) is not an error.
fn write_stdout(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
