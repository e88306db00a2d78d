//! The CPU engine's speed on a GGUF model: single-stream decode, batch throughput at 1, 4
//! and 16 sequences, time to first token for 128/512/2,048-token prompts, and a fully cached
//! 2,048-token prompt against a cold one. Prints a Markdown table.
//!
//!     cargo run --release -p switchyard-candle --example candle-bench -- MODEL.gguf
//!
//! `scripts/bench-candle` runs it and llama.cpp on the same file, side by side.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use switchyard_candle::{CandleConfig, CandleEngine, Gguf, Model};
use switchyard_core::protocol::{GenerateRequest, TokenOutput};
use switchyard_core::{RequestId, WorkerKey};
use switchyard_worker::driver::StepEngine;

fn engine(path: &str, config: CandleConfig) -> CandleEngine {
    let mut gguf = Gguf::open(std::path::Path::new(path)).unwrap();
    let model = Model::load(&mut gguf, config.dense_weights).unwrap();
    CandleEngine::new(model, config, WorkerKey::new(1, 0))
}

/// Prompt-like token ids (no special tokens), distinct per `salt`.
fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 300 + (i * 31 + salt * 977) % 40_000)
        .collect()
}

fn request(id: u64, prompt: Vec<u32>, max_tokens: u32) -> GenerateRequest {
    let mut r = GenerateRequest::text(RequestId(id), prompt, max_tokens);
    r.sampling.temperature = Some(0.0);
    r
}

/// Steps until idle. Returns when each request's first token came (since the start) and
/// the total time.
fn run(e: &mut CandleEngine) -> (Vec<(RequestId, Duration)>, Duration, usize) {
    let start = Instant::now();
    let mut firsts = Vec::new();
    let mut tokens: Vec<TokenOutput> = Vec::new();
    let mut events = Vec::new();
    let mut produced = 0;
    while e.has_work() {
        tokens.clear();
        e.step(Duration::ZERO, &mut tokens, &mut events);
        for t in &tokens {
            produced += 1;
            if !firsts.iter().any(|(id, _)| *id == t.request) {
                firsts.push((t.request, start.elapsed()));
            }
        }
    }
    (firsts, start.elapsed(), produced)
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: candle-bench MODEL.gguf");
    let config = CandleConfig {
        model: path.clone().into(),
        max_num_seqs: 16,
        max_batched_tokens: 512,
        ..CandleConfig::default()
    };
    let mut e = engine(&path, config.clone());
    // Warm-up (weights paged in, kernels' first use).
    e.add(request(1, prompt(64, 0), 8)).unwrap();
    run(&mut e);

    println!("| measurement | candle engine |");
    println!("|---|---|");
    // Single stream: 128 tokens after a 16-token prompt; decode rate after the first token.
    e.add(request(2, prompt(16, 1), 129)).unwrap();
    let (firsts, total, produced) = run(&mut e);
    let decode = total - firsts[0].1;
    println!(
        "| single-stream decode | {:.1} tokens/s |",
        (produced - 1) as f64 / decode.as_secs_f64()
    );
    // Batches: n sequences of 64-token prompts, 64 tokens each.
    for n in [1u64, 4, 16] {
        for i in 0..n {
            e.add(request(
                100 + n * 100 + i,
                prompt(64, 10 + i as u32 + n as u32 * 20),
                64,
            ))
            .unwrap();
        }
        let (firsts, total, produced) = run(&mut e);
        let decoding = total - firsts.iter().map(|f| f.1).max().unwrap();
        println!(
            "| batch of {n}: output tokens/s, prefill included / decode only | {:.1} / {:.1} |",
            produced as f64 / total.as_secs_f64(),
            (produced - n as usize) as f64 / decoding.as_secs_f64()
        );
    }
    // Time to first token, cold (a fresh cache each time), then the 2,048-token prompt again.
    for n in [128usize, 512, 2048] {
        let mut cold = engine(&path, config.clone());
        cold.add(request(1, prompt(8, 99), 2)).unwrap();
        run(&mut cold);
        cold.add(request(2, prompt(n, 7), 1)).unwrap();
        let (firsts, _, _) = run(&mut cold);
        println!(
            "| TTFT, {n}-token prompt, cold | {:.1} ms |",
            firsts[0].1.as_secs_f64() * 1e3
        );
        if n == 2048 {
            cold.add(request(3, prompt(n, 7), 1)).unwrap();
            let (cached, _, _) = run(&mut cold);
            println!(
                "| TTFT, {n}-token prompt, fully cached | {:.1} ms ({:.1}x faster) |",
                cached[0].1.as_secs_f64() * 1e3,
                firsts[0].1.as_secs_f64() / cached[0].1.as_secs_f64()
            );
        }
    }
}
