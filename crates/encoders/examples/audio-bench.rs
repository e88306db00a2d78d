//! Whisper's audio encoder on this CPU: milliseconds per batch of 30-second windows and
//! seconds of audio encoded per second.
//!
//!     cargo run --release -p switchyard-encoders --features whisper --example audio-bench -- \
//!         --model ~/.cache/switchyard/models/whisper-tiny.en --batches 1,2,4

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use switchyard_encoders::{AudioEncoder, WINDOW_FRAMES};

#[derive(Debug, Parser)]
struct Args {
    /// A CTranslate2 Whisper export (`model.bin` or its directory).
    #[arg(long)]
    model: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    batches: Vec<usize>,
    /// Forward passes per batch size (after one warm-up).
    #[arg(long, default_value_t = 5)]
    runs: usize,
}

fn main() {
    let args = Args::parse();
    let mut encoder = AudioEncoder::load(&args.model).unwrap();
    let bins = encoder.mel_bins();
    let windows: Vec<Vec<f32>> = (0..*args.batches.iter().max().unwrap_or(&1))
        .map(|seed| {
            (0..bins * WINDOW_FRAMES)
                .map(|i| (((i * 31 + seed * 17) % 251) as f32 / 125.0 - 1.0).clamp(-1.0, 1.5))
                .collect()
        })
        .collect();
    println!("| batch (30 s windows) | ms per batch (p50) | ms per window | audio s per s |");
    println!("|---|---|---|---|");
    for &batch in &args.batches {
        let input: Vec<&[f32]> = windows[..batch].iter().map(Vec::as_slice).collect();
        encoder.encode(&input).unwrap();
        let mut times: Vec<f64> = (0..args.runs)
            .map(|_| {
                let start = Instant::now();
                encoder.encode(&input).unwrap();
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let p50 = times[times.len() / 2];
        println!(
            "| {batch} | {p50:.0} | {:.0} | {:.1} |",
            p50 / batch as f64,
            batch as f64 * 30.0 * 1e3 / p50
        );
    }
}
