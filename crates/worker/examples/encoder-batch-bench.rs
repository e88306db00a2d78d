//! Batching across requests on a real encoder: single-image jobs from independent requests
//! arrive at an offered rate (Poisson) at the batcher an encoder worker runs, which gathers
//! them into passes of at most `max_batch` within `batch_timeout`. Per setting: the items
//! per second served, each item's latency from submission to its embeddings (the wait for
//! its batch included), and the passes' mean size.
//!
//!     cargo run --release -p switchyard-worker --features encoders --example encoder-batch-bench -- \
//!         --runtime ~/.cache/switchyard/models/libonnxruntime.so \
//!         --model ~/.cache/switchyard/models/dinov2_vits14.onnx \
//!         --rates 4,8,11 --batches 1,4,8 --seconds 15

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use rand::{Rng, SeedableRng};
use switchyard_encoders::{EncoderError, VisionEncoder};
use switchyard_worker::batcher::{BatchModel, Batcher};

#[derive(Debug, Parser)]
struct Args {
    /// ONNX Runtime's shared library.
    #[arg(long)]
    runtime: PathBuf,
    /// The DINOv2 ViT-S/14 model.
    #[arg(long)]
    model: PathBuf,
    /// Offered images per second (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "4,8,11")]
    rates: Vec<f64>,
    /// Largest pass (comma separated: one run each).
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    batches: Vec<usize>,
    /// How long the first job of a pass waits for others.
    #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
    batch_timeout: Duration,
    /// Length of each run's arrivals.
    #[arg(long, default_value_t = 15.0)]
    seconds: f64,
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// The vision tower: one image square per unit.
struct Vision(VisionEncoder);

impl BatchModel for Vision {
    type Unit = Vec<u8>;
    type Output = usize;
    type Error = EncoderError;

    fn run(&mut self, units: Vec<Vec<u8>>) -> Result<Vec<usize>, EncoderError> {
        let squares: Vec<&[u8]> = units.iter().map(Vec::as_slice).collect();
        let embeddings = self.0.encode(&squares)?;
        Ok(vec![embeddings.tokens; embeddings.batch])
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> Result<()> {
    let args = Args::parse();
    println!(
        "| max batch | offered images/s | served images/s | latency p50 ms | p99 ms | mean pass size |"
    );
    println!("|---|---|---|---|---|---|");
    for &max_batch in &args.batches {
        let encoder = VisionEncoder::load(&args.runtime, &args.model, args.threads)
            .context("loading the vision encoder")?;
        let side = encoder.side();
        let batcher = Batcher::start(
            "bench-encoder",
            Vision(encoder),
            max_batch,
            args.batch_timeout,
        )?;
        let image: Vec<u8> = (0..side * side * 3).map(|i| (i % 251) as u8).collect();
        // One pass first: the runtime's first call sets itself up.
        batcher.run(vec![image.clone()]).await?;
        for &rate in &args.rates {
            let (passes, units) = (
                batcher.stats().passes.load(Ordering::Relaxed),
                batcher.stats().units.load(Ordering::Relaxed),
            );
            let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
            let started = Instant::now();
            let end = started + Duration::from_secs_f64(args.seconds);
            let mut next = started;
            let mut jobs = Vec::new();
            let image = Arc::new(image.clone());
            while next < end {
                tokio::time::sleep_until(next.into()).await;
                let (batcher, image) = (batcher.clone(), Arc::clone(&image));
                jobs.push(tokio::spawn(async move {
                    let submitted = Instant::now();
                    let out = batcher.run(vec![image.as_ref().clone()]).await;
                    (out.is_ok(), submitted.elapsed(), Instant::now())
                }));
                let gap: f64 = -(1.0 - rng.random::<f64>()).ln() / rate;
                next += Duration::from_secs_f64(gap);
            }
            let mut latencies = Vec::with_capacity(jobs.len());
            let mut last = started;
            for job in jobs {
                let (ok, latency, done) = job.await?;
                anyhow::ensure!(ok, "an encoding failed");
                latencies.push(latency.as_secs_f64() * 1e3);
                last = last.max(done);
            }
            latencies.sort_by(f64::total_cmp);
            let served = latencies.len() as f64 / (last - started).as_secs_f64();
            let passes = batcher.stats().passes.load(Ordering::Relaxed) - passes;
            let units = batcher.stats().units.load(Ordering::Relaxed) - units;
            println!(
                "| {max_batch} | {rate} | {served:.1} | {:.0} | {:.0} | {:.2} |",
                percentile(&latencies, 0.5),
                percentile(&latencies, 0.99),
                units as f64 / passes.max(1) as f64,
            );
        }
    }
    Ok(())
}
