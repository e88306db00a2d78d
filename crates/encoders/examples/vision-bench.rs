//! The DINOv2 ViT-S/14 vision tower on this CPU: milliseconds per batch and images per
//! second at several batch sizes.
//!
//!     cargo run --release -p switchyard-encoders --example vision-bench -- \
//!         --runtime ~/.cache/switchyard/models/libonnxruntime.so \
//!         --model ~/.cache/switchyard/models/dinov2_vits14.onnx --batches 1,4,8 --threads 2

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use switchyard_encoders::VisionEncoder;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long)]
    runtime: PathBuf,
    #[arg(long)]
    model: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    batches: Vec<usize>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Forward passes per batch size (after one warm-up).
    #[arg(long, default_value_t = 10)]
    runs: usize,
}

fn main() {
    let args = Args::parse();
    let mut encoder = VisionEncoder::load(&args.runtime, &args.model, args.threads).unwrap();
    let side = encoder.side();
    let images: Vec<Vec<u8>> = (0..*args.batches.iter().max().unwrap_or(&1))
        .map(|seed| {
            (0..side * side * 3)
                .map(|i| ((i * 31 + seed * 17) % 251) as u8)
                .collect()
        })
        .collect();
    println!("| batch | ms per batch (p50) | ms per image | images/s |");
    println!("|---|---|---|---|");
    for &batch in &args.batches {
        let squares: Vec<&[u8]> = images[..batch].iter().map(Vec::as_slice).collect();
        encoder.encode(&squares).unwrap();
        let mut times: Vec<f64> = (0..args.runs)
            .map(|_| {
                let start = Instant::now();
                encoder.encode(&squares).unwrap();
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let p50 = times[times.len() / 2];
        println!(
            "| {batch} | {p50:.1} | {:.1} | {:.1} |",
            p50 / batch as f64,
            batch as f64 * 1e3 / p50
        );
    }
}
