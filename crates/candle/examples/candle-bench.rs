//! The CPU engine's speed on a GGUF model: single-stream decode, batch throughput at 1, 4
//! and 16 sequences, time to first token for 128/512/2,048-token prompts, and a fully cached
//! 2,048-token prompt against a cold one. Prints a Markdown table.
//!
//!     cargo run --release -p switchyard-candle --example candle-bench -- MODEL.gguf
//!     cargo run --release -p switchyard-candle --example candle-bench -- MODEL.gguf --mixed
//!     cargo run --release -p switchyard-candle --example candle-bench -- MODEL.gguf --context
//!
//! `--mixed` times steps instead: a prompt chunk of `c` tokens computed beside `n` decoding
//! sequences, against the two timing models of a mixed step (`switchyard_core::perf`): the
//! prefill and decode steps added, or the decode step plus what `c` more rows add to a
//! pass of `n`.
//!
//! `--context` times a prompt chunk after the part of its prompt computed before it,
//! against the same chunk as a prompt alone, and fits the profile's `prefill_context_ms`.
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

/// Median wall time of `f` over `runs` calls.
fn median(runs: usize, mut f: impl FnMut() -> Duration) -> f64 {
    let mut times: Vec<f64> = (0..runs).map(|_| f().as_secs_f64() * 1e3).collect();
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}

/// One step, timed.
fn timed_step(e: &mut CandleEngine) -> Duration {
    let (mut tokens, mut events) = (Vec::new(), Vec::new());
    let start = Instant::now();
    e.step(Duration::ZERO, &mut tokens, &mut events);
    start.elapsed()
}

/// Mixed steps against the two models: for each batch `n` and chunk `c`, the measured
/// step of `n` decodes and a `c`-token chunk, the decode step alone `D(n)`, and single
/// prompts of `k` tokens computed in one step `P(k)`.
fn mixed(path: &str) {
    let config = |budget: u32| CandleConfig {
        model: path.into(),
        max_num_seqs: 32,
        max_batched_tokens: budget,
        step_target: Duration::from_secs(3600),
        ..CandleConfig::default()
    };
    let salt = std::cell::Cell::new(1000);
    let fresh_prompt = |n: usize| {
        salt.set(salt.get() + 1);
        prompt(n, salt.get())
    };
    // P(k): a prompt of k tokens alone, in one step.
    let mut single = engine(path, config(4096));
    single.add(request(1, fresh_prompt(64), 2)).unwrap();
    run(&mut single);
    let mut id = 10;
    let mut prefill = |k: usize| {
        median(5, || {
            id += 1;
            single.add(request(id, fresh_prompt(k), 1)).unwrap();
            let t = timed_step(&mut single);
            run(&mut single);
            t
        })
    };
    let mut fits = Vec::new();
    println!("| decoding n | chunk c | measured | D(n) | P(c) | D + P(c) | D + P(n+c) − P(n) |");
    println!("|---|---|---|---|---|---|---|");
    for n in [4usize, 8, 16] {
        for c in [16usize, 32, 48, 96] {
            let mut e = engine(path, config((n + c) as u32));
            for i in 0..n {
                e.add(request(i as u64, fresh_prompt(256), 100_000))
                    .unwrap();
            }
            // Until every sequence decodes (has its first token).
            let mut started = std::collections::HashSet::new();
            let (mut tokens, mut events) = (Vec::new(), Vec::new());
            while started.len() < n {
                tokens.clear();
                e.step(Duration::ZERO, &mut tokens, &mut events);
                started.extend(tokens.iter().map(|t: &TokenOutput| t.request));
            }
            let decode = median(5, || timed_step(&mut e));
            e.add(request(99, fresh_prompt(c * 8), 1)).unwrap();
            let measured = median(5, || timed_step(&mut e));
            let (pc, pn, pnc) = (prefill(c), prefill(n), prefill(n + c));
            println!(
                "| {n} | {c} | {measured:.1} ms | {decode:.1} | {pc:.1} | {:.1} | {:.1} |",
                decode + pc,
                decode + pnc - pn
            );
            fits.push((measured, decode + pc, decode + pnc - pn));
        }
    }
    // measured ≈ added − saving·(added − one pass), by least squares.
    let (num, den) = fits
        .iter()
        .fold((0.0, 0.0), |(num, den), (m, added, pass)| {
            (
                num + (added - m) * (added - pass),
                den + (added - pass).powi(2),
            )
        });
    let saving = if den > 0.0 {
        (num / den).clamp(0.0, 1.0)
    } else {
        1.0
    };
    println!("\nmixed_step_saving = {saving:.2}");
}

/// A prompt chunk after the part of its prompt computed before it: for chunks of `t`
/// tokens after `p`, the step that computes the chunk against the step of a `t`-token
/// prompt alone. A profile times whole prompts in one step each, so the difference (the
/// chunk's attention to the `p` tokens before it) is what it misses; fitted as `k·p·t`.
fn context(path: &str) {
    let config = |budget: usize| CandleConfig {
        model: path.into(),
        max_num_seqs: 4,
        max_batched_tokens: budget as u32,
        step_target: Duration::from_secs(3600),
        ..CandleConfig::default()
    };
    let salt = std::cell::Cell::new(5000);
    let mut fits = Vec::new();
    println!(
        "| chunk t | tokens before p | step | a t-token prompt alone | difference | per p·t |"
    );
    println!("|---|---|---|---|---|---|");
    for t in [64usize, 128, 192] {
        let mut e = engine(path, config(t));
        e.add(request(1, prompt(64, 4999), 2)).unwrap();
        run(&mut e);
        let mut id = 10;
        let mut last_step = |p: usize| {
            median(3, || {
                id += 1;
                salt.set(salt.get() + 1);
                e.add(request(id, prompt(p + t, salt.get()), 1)).unwrap();
                // The prompt is computed t tokens a step: p / t steps, then the chunk.
                let (mut tokens, mut events) = (Vec::new(), Vec::new());
                for _ in 0..p / t {
                    e.step(Duration::ZERO, &mut tokens, &mut events);
                }
                let step = timed_step(&mut e);
                run(&mut e);
                step
            })
        };
        let alone = last_step(0);
        for p in [256usize, 512, 1024] {
            let step = last_step(p);
            let extra = step - alone;
            let pt = (p * t) as f64;
            println!(
                "| {t} | {p} | {step:.1} ms | {alone:.1} ms | {extra:.1} ms | {:.2e} |",
                extra / pt
            );
            fits.push((pt, extra));
        }
    }
    // extra ≈ k·p·t, by least squares through the origin.
    let (num, den) = fits.iter().fold((0.0, 0.0), |(n, d), (pt, extra)| {
        (n + pt * extra, d + pt * pt)
    });
    let k = if den > 0.0 { (num / den).max(0.0) } else { 0.0 };
    println!("\nprefill_context_ms = {k:.4e}");
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: candle-bench MODEL.gguf [--mixed | --context]");
    match std::env::args().nth(2).as_deref() {
        Some("--mixed") => return mixed(&path),
        Some("--context") => return context(&path),
        _ => {}
    }
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
