//! `switchyard profile`: measure an engine through its OpenAI API and write its timing
//! profile (the mocker's format), a report and plots.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use switchyard_workload::bench::config::Endpoint;
use switchyard_workload::profile::{self, ProfileConfig, ProfileResult};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct ProfileArgs {
    /// The server (`http://host:port`), any OpenAI-compatible one: `switchyard serve`, a
    /// worker's engine, vLLM, SGLang, llama.cpp.
    #[arg(long)]
    url: String,
    #[arg(long)]
    model: String,
    /// Use /v1/chat/completions instead of /v1/completions.
    #[arg(long)]
    chat: bool,
    #[arg(long)]
    api_key: Option<String>,
    /// Prompt lengths of the prefill sweep (words of synthetic text).
    #[arg(long, value_delimiter = ',', default_value = "128,512,1024,2048,4096")]
    isl: Vec<u64>,
    /// Requests per prompt length.
    #[arg(long, default_value_t = 3)]
    samples: usize,
    /// Context lengths of the decode sweep.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    context: Vec<u64>,
    /// Streams decoding together, per context length.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    concurrency: Vec<usize>,
    /// Tokens each decode stream asks for.
    #[arg(long, default_value_t = 64)]
    output_tokens: u64,
    /// Cached-prefix lengths (words) after which a chunk is timed, for the cost of
    /// attending to cached tokens (`prefill_context_ms`); 0 skips it. Needs a server with
    /// prefix caching.
    #[arg(long, value_delimiter = ',', default_value = "1024,2048")]
    cached_prefix: Vec<u64>,
    /// Words of the chunk timed after each cached prefix.
    #[arg(long, default_value_t = 512)]
    chunk: u64,
    /// Targets the report reads the measurements against.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "500ms")]
    ttft_target: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "50ms")]
    itl_target: Duration,
    /// Salts the synthetic text. Default: a new one each run, so that no prompt of an
    /// earlier run against the same server is still in its prefix cache.
    #[arg(long)]
    seed: Option<u64>,
    /// The engine's KV cache in tokens (vLLM logs it at start; Switchyard's workers list it
    /// in /v1/internal/workers): the report then gives the load planner's KV thresholds.
    #[arg(long)]
    kv_capacity_tokens: Option<u64>,
    /// Where to write profile.json, report.md, prefill.svg and decode.svg.
    #[arg(long, default_value = "profile")]
    out: PathBuf,
}

pub fn run(args: ProfileArgs) -> Result<()> {
    let mut config = ProfileConfig::new(args.url.clone(), args.model.clone());
    config.endpoint = if args.chat {
        Endpoint::Chat
    } else {
        Endpoint::Completions
    };
    config.api_key = args.api_key.clone();
    config.prefill_isl = args.isl.clone();
    config.prefill_samples = args.samples;
    config.decode_context = args.context.clone();
    config.decode_concurrency = args.concurrency.clone();
    config.decode_output_tokens = args.output_tokens;
    config.context_prefix = args.cached_prefix.clone();
    config.context_chunk = args.chunk;
    config.ttft_target = args.ttft_target;
    config.itl_target = args.itl_target;
    config.seed = args.seed.unwrap_or_else(rand::random);
    config.kv_capacity_tokens = args.kv_capacity_tokens;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            crate::signals::terminated().await;
            stop.cancel();
        });
        profile::measure(&config, shutdown).await
    })?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let write = |name: &str, bytes: &[u8]| -> Result<()> {
        let path = args.out.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))
    };
    write("profile.json", &serde_json::to_vec_pretty(&result.profile)?)?;
    write("measurements.json", &serde_json::to_vec_pretty(&result)?)?;
    let report = profile::report(&result, &config);
    write("report.md", report.as_bytes())?;
    plot(&args.out, &result)?;
    print!("{report}");
    println!(
        "\nWrote profile.json, report.md, prefill.svg and decode.svg to {}",
        args.out.display()
    );
    Ok(())
}

fn plot(dir: &Path, result: &ProfileResult) -> Result<()> {
    use plotters::prelude::*;

    switchyard_workload::bench::register_font();
    let max = |v: &mut dyn Iterator<Item = f64>| v.fold(1e-3, f64::max) * 1.1;
    let prefill: Vec<(f64, f64)> = result.prefill.iter().map(|p| (p.isl, p.ttft_ms)).collect();
    let path = dir.join("prefill.svg");
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(&path, (800, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Prefill: time to first token", ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                0.0..max(&mut prefill.iter().map(|p| p.0)),
                0.0..max(&mut prefill.iter().map(|p| p.1)),
            )?;
        chart
            .configure_mesh()
            .x_desc("prompt tokens")
            .y_desc("TTFT, ms")
            .draw()?;
        chart.draw_series(LineSeries::new(prefill.clone(), BLUE.stroke_width(2)))?;
        chart.draw_series(prefill.iter().map(|p| Circle::new(*p, 3, BLUE.filled())))?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))?;

    let path = dir.join("decode.svg");
    let mut contexts: Vec<f64> = result.decode.iter().map(|d| d.context).collect();
    contexts.sort_by(f64::total_cmp);
    contexts.dedup_by(|a, b| (*a - *b).abs() < 0.5);
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(&path, (800, 480)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Decode: inter-token latency", ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(
                0.0..max(&mut result.decode.iter().map(|d| d.active_kv_tokens)),
                0.0..max(&mut result.decode.iter().map(|d| d.itl_ms)),
            )?;
        chart
            .configure_mesh()
            .x_desc("active KV tokens (streams × context)")
            .y_desc("ITL, ms")
            .draw()?;
        for (i, &c) in contexts.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let line: Vec<(f64, f64)> = result
                .decode
                .iter()
                .filter(|d| (d.context - c).abs() < 0.5)
                .map(|d| (d.active_kv_tokens, d.itl_ms))
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
                .label(format!("context {c:.0}"))
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
