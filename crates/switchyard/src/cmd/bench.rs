//! `switchyard bench`: drive an OpenAI-compatible endpoint and measure it.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use switchyard_workload::bench::{
    BenchConfig, Endpoint, ExtraBody, LoadShape, RequestSource, Slo, parse_extra_body, run_blocking,
};
use switchyard_workload::trace_io::Trace;
use switchyard_workload::units::{parse_duration, parse_millis};

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Server base URL, e.g. http://127.0.0.1:8000 (or …/v1, or a full …/completions URL).
    #[arg(long)]
    url: String,
    /// Model name sent with every request.
    #[arg(long)]
    model: String,
    #[arg(long, value_enum, default_value_t = EndpointArg::Chat)]
    endpoint: EndpointArg,
    /// Ask for whole responses instead of a token stream (then no TTFT or ITL).
    #[arg(long)]
    no_stream: bool,

    /// Mooncake JSONL trace: prompts from its hash ids, output lengths from output_length.
    /// Without --rate or --concurrency it is replayed at its timestamps.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Tokens per hash id of the trace.
    #[arg(long, default_value_t = 512)]
    trace_block_size: u32,
    /// Replay speed: trace timestamps are divided by this.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    speedup: f64,
    /// Open loop with Poisson arrivals at this many requests per second.
    #[arg(long, conflicts_with = "concurrency", allow_negative_numbers = true)]
    rate: Option<f64>,
    /// Closed loop with this many requests in flight.
    #[arg(long)]
    concurrency: Option<usize>,
    /// Prompt tokens of each request without --trace.
    #[arg(long, default_value_t = 512)]
    input_tokens: u64,
    /// max_tokens of each request without --trace.
    #[arg(long, default_value_t = 128)]
    output_tokens: u64,

    /// Send at most this many requests [default: one pass over the trace, or 100 without
    /// a trace, unless --duration is given].
    #[arg(long)]
    num_requests: Option<usize>,
    /// Send no request after this long (e.g. 90s, 5m); requests in flight then finish.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Goodput objective: time to first token, in ms.
    #[arg(long, value_parser = parse_millis, allow_negative_numbers = true)]
    slo_ttft_ms: Option<Duration>,
    /// Goodput objective: a request's mean inter-token latency, in ms.
    #[arg(long, value_parser = parse_millis, allow_negative_numbers = true)]
    slo_itl_ms: Option<Duration>,
    /// Deadline of each request.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    timeout: Duration,
    /// Bearer token for the Authorization header.
    #[arg(long)]
    api_key: Option<String>,
    /// Send "ignore_eos": true (vLLM, SGLang) so outputs reach max_tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// JSON object merged into every request body, e.g. '{"temperature": 0}'.
    #[arg(long, value_parser = parse_extra_body)]
    extra_body: Option<ExtraBody>,
    /// Salts prompt text and seeds Poisson arrivals.
    #[arg(long, default_value_t = 0)]
    seed: u64,

    /// Write the summary and every request's measurements as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write plots (PNG and SVG) into this directory.
    #[arg(long)]
    plots: Option<PathBuf>,
    /// Never draw the progress bar (it is only drawn on a terminal anyway).
    #[arg(long)]
    no_progress: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum EndpointArg {
    Chat,
    Completions,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let mut config = BenchConfig::new(args.url, args.model);
    config.endpoint = match args.endpoint {
        EndpointArg::Chat => Endpoint::Chat,
        EndpointArg::Completions => Endpoint::Completions,
    };
    config.stream = !args.no_stream;
    config.shape = match (args.rate, args.concurrency, &args.trace) {
        (Some(rate), _, _) => LoadShape::Poisson { rate },
        (None, Some(clients), _) => LoadShape::Concurrency { clients },
        (None, None, Some(_)) => LoadShape::Replay {
            speedup: args.speedup,
        },
        (None, None, None) => {
            bail!("choose a load: --trace (replay), --rate (Poisson) or --concurrency")
        }
    };
    if args.speedup != 1.0 && !matches!(config.shape, LoadShape::Replay { .. }) {
        bail!("--speedup applies to trace replay only (drop --rate / --concurrency)");
    }
    config.source = match &args.trace {
        Some(path) => {
            let trace = Trace::read(path)?;
            // A session trace is replayed closed loop; a broken one names its line.
            switchyard_core::trace::session::resolve(&trace.records)
                .map_err(|e| trace.locate(e.into()))?;
            RequestSource::Trace {
                records: trace.records,
                block_size: args.trace_block_size,
            }
        }
        None => RequestSource::Synthetic {
            input_tokens: args.input_tokens,
            output_tokens: args.output_tokens,
        },
    };
    config.max_requests = args.num_requests;
    config.duration = args.duration;
    config.slo = Slo {
        ttft: args.slo_ttft_ms,
        itl: args.slo_itl_ms,
    };
    config.request_timeout = args.timeout;
    config.api_key = args.api_key;
    config.ignore_eos = args.ignore_eos;
    config.extra_body = args.extra_body.unwrap_or_default();
    config.seed = args.seed;
    config.show_progress = !args.no_progress;

    let report = run_blocking(config)?;
    let mut out = std::io::stdout().lock();
    write!(out, "{report}")?;
    out.flush()?;
    if let Some(path) = &args.json {
        report.write_json(path)?;
        writeln!(out, "\nWrote {}", path.display())?;
    }
    if let Some(dir) = &args.plots {
        let written = report.write_plots(dir)?;
        writeln!(out, "Wrote {} plots to {}", written.len(), dir.display())?;
    }
    Ok(())
}
