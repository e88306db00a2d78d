//! What a constraint costs the mocker: a step of 64 decoding sequences, each under a JSON
//! Schema (over SmolLM2's vocabulary, `serve`'s default) or under none.
//!
//! - `decode64/plain` and `decode64/schema`: 64 requests admitted and prefilled, then the
//!   engine steps until each has generated 32 tokens or closed its object; the time is
//!   for all those steps (the steps and tokens are printed first).
//!
//! Run: `cargo bench -p switchyard-mocker --bench constrained` (results in
//! `docs/benchmarks.md`).

use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use switchyard_core::protocol::Constraint;
use switchyard_core::{HashSeed, RequestId, TokenBlocks, WorkerKey};
use switchyard_grammar::Grammars;
use switchyard_mocker::{EngineArgs, MockEngine, MockRequest, PerfModel, StepOutput};

const BATCH: u64 = 64;
const TOKENS: u32 = 32;
const SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"enum":["red","green"]}},"admin":{"type":"boolean"}},"required":["name","age","tags","admin"],"additionalProperties":false}"#;

/// An engine with the batch admitted and its prompts computed (the next steps decode).
fn engine(constrained: bool) -> MockEngine {
    let grammars = Grammars::smollm2().expect("the built-in vocabulary");
    let constraint = Constraint::JsonSchema(SCHEMA.into());
    let mut engine = MockEngine::new(
        WorkerKey::new(1, 0),
        EngineArgs::default(),
        PerfModel::Polynomial,
        7,
    )
    .expect("engine");
    for i in 0..BATCH {
        let prompt: Vec<u32> = (0..128).map(|t| (i * 1000 + t) as u32).collect();
        let blocks = TokenBlocks::new(&prompt, 16, HashSeed::default()).expect("prompt");
        let mut request = MockRequest::new(RequestId(i), blocks, TOKENS);
        if constrained {
            request.guide = Some(Box::new(grammars.guide(&constraint).expect("compiles")));
        }
        engine.add_request(request).expect("admitted");
    }
    let mut out = StepOutput::default();
    engine.step(Duration::ZERO, &mut out);
    engine
}

/// Steps until every request is done; returns the steps taken and the tokens generated.
fn decode(mut engine: MockEngine) -> (u32, usize) {
    let (mut steps, mut tokens) = (0, 0);
    let mut now = Duration::ZERO;
    while engine.has_work() {
        let mut out = StepOutput::default();
        engine.step(now, &mut out);
        now = out.finished_at();
        steps += 1;
        tokens += out.tokens.len();
    }
    (steps, tokens)
}

fn decode64(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode64");
    group.sample_size(20);
    for (name, constrained) in [("plain", false), ("schema", true)] {
        let (steps, tokens) = decode(engine(constrained));
        eprintln!("decode64/{name}: {steps} steps, {tokens} tokens");
        group.bench_function(name, |b| {
            b.iter_batched(|| engine(constrained), decode, BatchSize::LargeInput)
        });
    }
    group.finish();
}

criterion_group!(benches, decode64);
criterion_main!(benches);
