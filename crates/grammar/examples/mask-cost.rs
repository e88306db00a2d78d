//! What a constraint costs an engine that masks its logits (the candle engine): per token,
//! the mask over SmolLM2's 49,152 logits and taking the sampled token, p50 and p99.
//!
//! The tokens are the mocker's draws under the schema (so every answer is valid and ends);
//! the logits are a buffer of the vocabulary's size, as the candle engine's are.
//!
//! Run: `cargo run --release -p switchyard-grammar --example mask-cost` (results in
//! `docs/benchmarks.md`).

use std::time::{Duration, Instant};

use switchyard_grammar::guide::pressure;
use switchyard_grammar::{Constraint, Grammars, Pick};

const SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"city":{"type":"string"},"tags":{"type":"array","items":{"enum":["red","green","blue"]}}},"required":["name","age","city","tags"],"additionalProperties":false}"#;
const ANSWERS: u32 = 200;
const BUDGET: u32 = 256;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let grammars = Grammars::smollm2()?;
    let constraint = Constraint::JsonSchema(SCHEMA.into());
    // The answers, drawn as the mocker draws.
    let mut answers = Vec::new();
    for a in 0..ANSWERS {
        let mut guide = grammars.guide(&constraint)?;
        let mut tokens = Vec::new();
        for g in 0..BUDGET {
            let unit =
                |salt: u32| f64::from((a * 7_919 + g * 104_729 + salt * 31) % 10_007) / 10_007.0;
            let pick = Pick {
                plain: (a * 31 + g * 977) % 32_000,
                close: unit(1),
                other: unit(2),
                pressure: pressure(g, BUDGET),
            };
            let token = guide.pick(&pick)?;
            tokens.push(token);
            if token == guide.eos() {
                break;
            }
        }
        answers.push(tokens);
    }
    let mut logits = vec![0.0f32; 49_152];
    let mut masked: Vec<Duration> = Vec::new();
    let mut plain: Vec<Duration> = Vec::new();
    for tokens in &answers {
        let mut guide = grammars.guide(&constraint)?;
        for &token in tokens {
            let started = Instant::now();
            logits.iter_mut().for_each(|l| *l = 1.0);
            plain.push(started.elapsed());
            let started = Instant::now();
            logits.iter_mut().for_each(|l| *l = 1.0);
            guide.mask_logits(&mut logits)?;
            guide.take(&[token])?;
            masked.push(started.elapsed());
        }
    }
    let tokens: usize = answers.iter().map(Vec::len).sum();
    println!("{ANSWERS} answers, {tokens} tokens");
    for (name, times) in [
        ("without a schema", &mut plain),
        ("under the schema", &mut masked),
    ] {
        times.sort_unstable();
        let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
        println!(
            "{name}: p50 {:.1} us, p99 {:.1} us, max {:.1} us",
            at(0.5).as_secs_f64() * 1e6,
            at(0.99).as_secs_f64() * 1e6,
            at(1.0).as_secs_f64() * 1e6,
        );
    }
    Ok(())
}
