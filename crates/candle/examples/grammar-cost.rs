//! What a JSON Schema costs the CPU engine per token, inside its steps: the same requests
//! decoded with and without a schema, alternated, each decode step timed. At batch 1 a
//! step is one token; at batch 16 a step is one token of each sequence. Prints p50 and p99
//! per step and the difference of the medians, greedy and sampled (temperature 1, seeded).
//!
//!     cargo run --release -p switchyard-candle --example grammar-cost -- MODEL.gguf [ROUNDS]
//!
//! Only steps that decode every sequence of the batch at its tokens 1 to [`WINDOW`] are
//! counted: an object closed early leaves smaller steps behind, and a later token attends
//! over more context, so steps compare only at the same positions.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use switchyard_candle::{CandleConfig, CandleEngine, Gguf, Model};
use switchyard_core::protocol::{Constraint, GenerateRequest};
use switchyard_core::{RequestId, WorkerKey};
use switchyard_worker::driver::StepEngine;

const SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0},"tags":{"type":"array","items":{"type":"string","maxLength":20},"maxItems":4}},"required":["name","age","tags"],"additionalProperties":false}"#;

/// Tokens each request may generate.
const MAX_TOKENS: u32 = 64;

/// The output positions whose steps are compared.
const WINDOW: u32 = 16;

fn engine(path: &str) -> (CandleEngine, String) {
    let mut gguf = Gguf::open(std::path::Path::new(path)).unwrap();
    let grammars = switchyard_candle::grammars(&gguf).unwrap();
    let vocabulary = grammars.vocabulary().to_owned();
    let config = CandleConfig {
        model: path.into(),
        max_num_seqs: 16,
        max_batched_tokens: 2048,
        step_target: Duration::from_secs(3600),
        ..CandleConfig::default()
    };
    let model = Model::load(&mut gguf, config.dense_weights).unwrap();
    let engine = CandleEngine::new(model, config, WorkerKey::new(1, 0)).with_grammars(grammars);
    (engine, vocabulary)
}

/// Prompt-like token ids (no special tokens), distinct per `salt`.
fn prompt(salt: u32) -> Vec<u32> {
    (0..48u32)
        .map(|i| 300 + (i * 31 + salt * 977) % 40_000)
        .collect()
}

fn request(id: u64, salt: u32, temperature: f32, constrained: Option<&str>) -> GenerateRequest {
    let mut r = GenerateRequest::text(RequestId(id), prompt(salt), MAX_TOKENS);
    r.sampling.temperature = Some(temperature);
    r.sampling.seed = Some(u64::from(salt));
    if let Some(vocabulary) = constrained {
        r.sampling.constraint = Some(Constraint::JsonSchema(SCHEMA.into()));
        r.sampling.vocabulary = Some(vocabulary.to_owned());
    }
    r
}

/// Runs until idle; the time of every step that only decoded, and the tokens made.
fn decode_steps(e: &mut CandleEngine, batch: usize, into: &mut Vec<f64>) -> usize {
    let (mut tokens, mut events) = (Vec::new(), Vec::new());
    let mut made = 0;
    let mut first_tokens = 0;
    while e.has_work() {
        tokens.clear();
        let start = Instant::now();
        e.step(Duration::ZERO, &mut tokens, &mut events);
        let took = start.elapsed().as_secs_f64() * 1e6;
        made += tokens.len();
        // Steps before every sequence has its first token hold prompts; once one has
        // ended, a step decodes fewer sequences and is not compared.
        let prefilling = first_tokens < batch;
        first_tokens += tokens.iter().filter(|t| t.index == 0).count();
        if !prefilling && tokens.len() == batch && tokens.iter().all(|t| t.index < WINDOW) {
            into.push(took);
        }
    }
    made
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: grammar-cost MODEL.gguf [ROUNDS]");
    let rounds: u32 = std::env::args().nth(2).map_or(8, |r| r.parse().unwrap());
    let (mut e, vocabulary) = engine(&path);
    // Warm-up: weights paged in, the schema compiled once (then cached, as in serving).
    for constrained in [None, Some(vocabulary.as_str())] {
        e.add(request(1, 0, 1.0, constrained)).unwrap();
        decode_steps(&mut e, 1, &mut Vec::new());
    }
    println!("| sampling | batch | schema | steps compared | tokens made | step p50 | step p99 |");
    println!("|---|---|---|---|---|---|---|");
    for (temperature, batch) in [(0.0, 1usize), (0.0, 16), (1.0, 1), (1.0, 16)] {
        let sampling = if temperature == 0.0 { "greedy" } else { "T=1" };
        let (mut plain, mut schema) = (Vec::new(), Vec::new());
        let (mut plain_tokens, mut schema_tokens) = (0, 0);
        let mut id = 10;
        for round in 0..rounds {
            // Alternated, the order swapped each round: drift on a shared machine falls on
            // both alike.
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for constrained in order {
                for i in 0..batch {
                    id += 1;
                    let salt = round * 100 + i as u32 + 1;
                    let vocabulary = constrained.then_some(vocabulary.as_str());
                    e.add(request(id, salt, temperature, vocabulary)).unwrap();
                }
                if constrained {
                    schema_tokens += decode_steps(&mut e, batch, &mut schema);
                } else {
                    plain_tokens += decode_steps(&mut e, batch, &mut plain);
                }
            }
        }
        let mut medians = Vec::new();
        for (label, times, tokens) in [
            ("no", &mut plain, plain_tokens),
            ("yes", &mut schema, schema_tokens),
        ] {
            times.sort_by(f64::total_cmp);
            let p50 = percentile(times, 0.5);
            medians.push(p50);
            println!(
                "| {sampling} | {batch} | {label} | {} | {tokens} | {:.0} µs | {:.0} µs |",
                times.len(),
                p50,
                percentile(times, 0.99)
            );
        }
        println!(
            "| {sampling} | {batch} | difference of the medians | | | {:+.0} µs ({:+.1} %) | |",
            medians[1] - medians[0],
            (medians[1] / medians[0] - 1.0) * 100.0
        );
    }
}
