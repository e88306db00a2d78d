//! Indexer benchmark: lookup latency on a large index, ingestion throughput, lookups under
//! concurrent ingestion, and a mixed replay of the Mooncake conversation trace.
//!
//! `cargo run --release -p switchyard-router --example indexer-bench -- [--trace FILE] [--workers N] [--json]`

mod latency;
mod mixed;
mod query;
mod sweep;
mod synthetic;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use serde::Serialize;

/// Counts the bytes allocated, for the index's memory in the sweep.
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

/// The conversation trace shipped beside the repository.
const DEFAULT_TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/data/mooncake_conversation_trace.jsonl"
);

#[derive(Debug, Parser)]
#[command(about = "Benchmark the radix-tree indexer")]
struct Args {
    /// Mooncake JSONL trace for the mixed replay.
    #[arg(long, default_value = DEFAULT_TRACE)]
    trace: PathBuf,
    /// Workers in the synthetic index and the mixed replay.
    #[arg(long, default_value_t = 256)]
    workers: u32,
    /// Distinct blocks to build in the synthetic index.
    #[arg(long, default_value_t = 1_000_000)]
    index_blocks: usize,
    /// Queries per query length.
    #[arg(long, default_value_t = 20_000)]
    queries: usize,
    /// Engine block size (tokens) in the mixed replay. The default, the trace's own 512, makes
    /// each trace hash id one block (as Dynamo's mooncake_bench does); 64 makes 8.
    #[arg(long, default_value_t = 512)]
    block_size: u32,
    /// Per-worker cache capacity in tokens in the mixed replay (512k tokens: the KV cache
    /// of an 80 GB GPU serving an 8B model, roughly).
    #[arg(long, default_value_t = 524_288)]
    cache_tokens: usize,
    /// Prefill chunk (tokens) in the mixed replay: new blocks are stored in events of at
    /// most this many tokens, as vLLM does with its default max_num_batched_tokens.
    #[arg(long, default_value_t = 8192)]
    chunk_tokens: u32,
    /// Seconds of lookups under concurrent ingestion.
    #[arg(long, default_value_t = 2.0)]
    concurrent_secs: f64,
    /// Timed passes of the mixed replay (the report is the median one; each pass follows
    /// the removal of every worker, so it starts from a warm, empty index).
    #[arg(long, default_value_t = 1)]
    passes: usize,
    /// Skip the mixed replay (no trace needed).
    #[arg(long)]
    no_mixed: bool,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Instead of the other measurements: the concurrent sweep, each candidate way of
    /// sharing the index at rising offered rates of the mixed replay's operations.
    #[arg(long)]
    sweep: bool,
    /// Candidates for `--sweep`, comma-separated (shared, shared-channel, left-right, mutex,
    /// mutex-chunked, rwlock, sharded-mutex).
    #[arg(long, value_delimiter = ',', default_value = "shared,left-right,mutex")]
    candidates: Vec<String>,
    /// Event-publishing threads in the sweep (each owns a share of the workers).
    #[arg(long, default_value_t = 2)]
    publishers: usize,
    /// Lookup threads in the sweep.
    #[arg(long, default_value_t = 2)]
    lookup_threads: usize,
    /// The sweep's first offered rate, in operations per second.
    #[arg(long, default_value_t = 50_000.0)]
    start_rate: f64,
    /// Each sweep step offers this much more than the last.
    #[arg(long, default_value_t = 1.25)]
    step_factor: f64,
    /// Sweep steps at most, per candidate.
    #[arg(long, default_value_t = 20)]
    max_steps: usize,
    /// Tries per sweep step (sustained when most are).
    #[arg(long, default_value_t = 3)]
    tries: usize,
    /// Shards for the `sharded-mutex` candidate.
    #[arg(long, default_value_t = 4)]
    shards: usize,
    /// Look up by local hashes alone, comparing keys along chains, instead of with the
    /// queries' sequence hashes (the frontend and the simulator have them).
    #[arg(long)]
    keys_only: bool,
    /// Print one JSON object instead of a human summary.
    #[arg(long)]
    json: bool,
}

impl Args {
    fn lookup(&self) -> query::Lookup {
        if self.keys_only {
            query::Lookup::Keys
        } else {
            query::Lookup::Hashes
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    workers: u32,
    /// Distinct blocks (tree nodes) in the synthetic index.
    blocks: usize,
    /// Sum over workers of the blocks each holds.
    worker_blocks: u64,
    find_matches_p50_us: f64,
    find_matches_p99_us: f64,
    find_matches: Vec<latency::QueryLatency>,
    ingest_blocks_per_sec: f64,
    ingest_events_per_sec: f64,
    remove_blocks_per_sec: f64,
    concurrent: synthetic::ConcurrentReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    mixed: Option<mixed::MixedReport>,
    mixed_ops_per_sec: Option<f64>,
    mixed_p99_us: Option<f64>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let progress = |msg: &str| {
        if !args.json {
            eprintln!("{msg}");
        }
    };
    if args.sweep {
        return run_sweep(&args);
    }

    progress(&format!(
        "building a synthetic index of {} blocks over {} workers…",
        args.index_blocks, args.workers
    ));
    let synth = synthetic::build(args.workers, args.index_blocks, args.seed);
    let ingest = synthetic::measure_ingest(&synth);
    progress("measuring find_matches…");
    let find = synthetic::measure_find_matches(
        &ingest.indexer,
        &synth,
        args.queries,
        args.seed,
        args.lookup(),
    );
    let p128 = find
        .iter()
        .find(|q| q.query_blocks == 128)
        .map(|q| (q.p50_us, q.p99_us))
        .unwrap_or_default();
    progress("measuring lookups under concurrent ingestion…");
    let concurrent = synthetic::measure_concurrent(
        ingest.indexer,
        &synth,
        Duration::from_secs_f64(args.concurrent_secs),
        args.seed,
        args.lookup(),
    );

    let mixed = if args.no_mixed {
        None
    } else {
        progress(&format!("mixed replay of {}…", args.trace.display()));
        Some(mixed::run(
            &args.trace,
            args.workers,
            args.block_size,
            args.cache_tokens / args.block_size.max(1) as usize,
            args.chunk_tokens,
            args.seed,
            mixed::Replay {
                lookup: args.lookup(),
                passes: args.passes,
            },
        )?)
    };

    let report = Report {
        workers: args.workers,
        blocks: ingest.blocks,
        worker_blocks: ingest.worker_blocks,
        find_matches_p50_us: p128.0,
        find_matches_p99_us: p128.1,
        find_matches: find,
        ingest_blocks_per_sec: ingest.blocks_per_sec,
        ingest_events_per_sec: ingest.events_per_sec,
        remove_blocks_per_sec: ingest.remove_blocks_per_sec,
        concurrent,
        mixed_ops_per_sec: mixed.as_ref().map(|m| m.ops_per_sec),
        mixed_p99_us: mixed.as_ref().map(|m| m.p99_us),
        mixed,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_summary(&report);
    }
    Ok(())
}

fn print_summary(r: &Report) {
    println!(
        "index: {} distinct blocks, {} worker-blocks, {} workers",
        r.blocks, r.worker_blocks, r.workers
    );
    for q in &r.find_matches {
        println!(
            "find_matches {:>4} blocks: p50 {:>6.2} µs  p99 {:>6.2} µs  mean {:>6.2} µs  (mean best overlap {:.1})",
            q.query_blocks, q.p50_us, q.p99_us, q.mean_us, q.mean_best_overlap
        );
    }
    println!(
        "ingest: {:.2} M blocks/s ({:.0} events/s); remove: {:.2} M blocks/s",
        r.ingest_blocks_per_sec / 1e6,
        r.ingest_events_per_sec,
        r.remove_blocks_per_sec / 1e6
    );
    let c = &r.concurrent;
    println!(
        "under concurrent ingestion ({:.2} M blocks/s): find_matches 128 blocks p50 {:.2} µs  p99 {:.2} µs  max {:.1} µs",
        c.ingest_blocks_per_sec / 1e6,
        c.find_matches_p50_us,
        c.find_matches_p99_us,
        c.find_matches_max_us
    );
    if let Some(m) = &r.mixed {
        println!(
            "mixed replay ({} requests, {} workers, block size {}): {:.2} M ops/s ({} lookups + {} events, {:.1} M blocks/s, events {:.1} M blocks/s), op p50 {:.2} µs  p99 {:.2} µs; lookups p99 {:.2} µs (mean {:.2}), events p99 {:.2} µs",
            m.requests,
            m.workers,
            m.block_size,
            m.ops_per_sec / 1e6,
            m.lookups,
            m.events,
            m.blocks_per_sec / 1e6,
            m.event_blocks_per_sec / 1e6,
            m.p50_us,
            m.p99_us,
            m.lookup_p99_us,
            m.lookup_mean_us,
            m.event_p99_us
        );
        if m.passes.len() > 1 {
            for (i, p) in m.passes.iter().enumerate() {
                println!(
                    "  pass {i}: {:.1} M blocks/s, events {:.1} M blocks/s, lookups p99 {:.2} µs (mean {:.2}), events p99 {:.2} µs",
                    p.blocks_per_sec / 1e6,
                    p.event_blocks_per_sec / 1e6,
                    p.lookup_p99_us,
                    p.lookup_mean_us,
                    p.event_p99_us
                );
            }
        }
    }
}

fn run_sweep(args: &Args) -> Result<()> {
    let cache_blocks = args.cache_tokens / args.block_size.max(1) as usize;
    eprintln!(
        "generating the operations of {} ({} workers, block size {}, {} blocks per worker)…",
        args.trace.display(),
        args.workers,
        args.block_size,
        cache_blocks
    );
    let stream = mixed::generate(
        &args.trace,
        args.workers,
        args.block_size,
        cache_blocks,
        args.chunk_tokens,
        args.seed,
    )?;
    let config = sweep::SweepConfig {
        candidates: args.candidates.clone(),
        publishers: args.publishers,
        lookup_threads: args.lookup_threads,
        start_rate: args.start_rate,
        step_factor: args.step_factor,
        max_steps: args.max_steps,
        steps_past_saturation: 1,
        shards: args.shards,
        tries: args.tries,
        lookup: args.lookup(),
    };
    anyhow::ensure!(
        args.start_rate > 0.0 && args.step_factor > 1.0,
        "--start-rate must be positive and --step-factor above 1"
    );
    let report =
        sweep::run(&stream, &config, args.block_size, cache_blocks).map_err(anyhow::Error::msg)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "{} lookups + {} events ({} blocks), {} workers, block size {}, {} blocks per worker; {} publishers, {} lookup threads",
        report.lookups,
        report.events,
        report.blocks,
        report.workers,
        report.block_size,
        report.cache_blocks,
        report.publishers,
        report.lookup_threads
    );
    println!(
        "| candidate | sustained ops/s | blocks/s there | lookup p99 there | memory | per worker-block |"
    );
    println!("|---|---|---|---|---|---|");
    for c in &report.candidates {
        println!(
            "| {} | {:.0}k | {:.2} M | {:.2} µs | {:.1} MiB | {:.0} B |",
            c.candidate,
            c.sustained_ops_per_sec / 1e3,
            c.blocks_per_sec_at_sustained / 1e6,
            c.lookup_p99_us_at_sustained,
            c.memory_bytes as f64 / (1 << 20) as f64,
            c.bytes_per_worker_block
        );
    }
    Ok(())
}
