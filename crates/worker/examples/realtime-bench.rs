//! Many mocker engines in one process on the real-time driver, under light load: how late
//! does each engine wake up for its next step?
//!
//! `cargo run --release -p switchyard-worker --example realtime-bench -- [--engines 1000] [--seconds 10] [--rate 500]`

use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use switchyard_core::protocol::GenerateRequest;
use switchyard_core::{RequestId, WorkerKey};
use switchyard_mocker::{EngineArgs, MockEngine, PerfModel};
use switchyard_worker::driver::{self, percentile_us};
use switchyard_worker::mocker::SteppedMocker;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Debug, Parser)]
struct Args {
    /// Engines in the process.
    #[arg(long, default_value_t = 1000)]
    engines: u32,
    /// Length of the run.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Requests per second over the whole fleet.
    #[arg(long, default_value_t = 500.0)]
    rate: f64,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: u32,
    /// Output tokens per request.
    #[arg(long, default_value_t = 64)]
    output_tokens: u32,
    /// Runtime worker threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(threads) = args.threads {
        builder.worker_threads(threads.max(1));
    }
    builder.build()?.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    for w in 0..args.engines {
        let engine = MockEngine::new(
            WorkerKey::new(u64::from(w), 0),
            EngineArgs::default(),
            PerfModel::Polynomial,
            1,
        )?;
        let (handle, task) =
            driver::spawn_timed(SteppedMocker::new(engine), None, &tracker, cancel.clone());
        handles.push(handle);
        tasks.push(task);
    }

    // Open-loop arrivals at a fixed rate, round robin over the engines; each stream is
    // drained by its own task.
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(0.001));
    let total = (args.seconds * args.rate) as u64;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let readers = TaskTracker::new();
    let started = tokio::time::Instant::now();
    for i in 0..total {
        ticker.tick().await;
        let prompt: Vec<u32> = (0..args.prompt_tokens)
            .map(|t| t ^ (i as u32).wrapping_mul(2_654_435_761))
            .collect();
        let request = GenerateRequest::text(RequestId(i), prompt, args.output_tokens);
        let handle = handles[(i % u64::from(args.engines)) as usize].clone();
        readers.spawn(async move {
            if let Ok(mut stream) = handle.submit(request).await {
                while stream.recv().await.is_some() {}
            }
        });
    }
    readers.close();
    readers.wait().await;
    let elapsed = started.elapsed();
    cancel.cancel();
    tracker.close();
    tracker.wait().await;

    let mut lags = driver::DriverReport::default().lag_us;
    let mut steps = 0;
    for task in tasks {
        let report = task.await?;
        steps += report.steps;
        lags.add(&report.lag_us)?;
    }
    let p50 = percentile_us(&lags, 0.50);
    let p99 = percentile_us(&lags, 0.99);
    let max = percentile_us(&lags, 1.0);
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "engines": args.engines,
                "requests": total,
                "seconds": elapsed.as_secs_f64(),
                "steps": steps,
                "steps_per_sec": steps as f64 / elapsed.as_secs_f64(),
                "step_lag_p50_ms": p50.as_secs_f64() * 1e3,
                "step_lag_p99_ms": p99.as_secs_f64() * 1e3,
                "step_lag_max_ms": max.as_secs_f64() * 1e3,
            })
        );
    } else {
        println!(
            "{} engines, {} requests in {:.1} s: {} steps ({:.0}/s); step lag p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            args.engines,
            total,
            elapsed.as_secs_f64(),
            steps,
            steps as f64 / elapsed.as_secs_f64(),
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3
        );
    }
    Ok(())
}
