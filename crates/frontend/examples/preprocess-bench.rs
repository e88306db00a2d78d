//! Preprocessing cost per request, built-in byte tokenizer against the built-in SmolLM2 BPE:
//! chat template, tokenization, and incremental detokenization of generated tokens.
//!
//! `cargo run --release -p switchyard-frontend --example preprocess-bench -- [ITERATIONS] [OUTPUT_TOKENS]`

use std::time::Instant;

use switchyard_frontend::preprocess::{ChatMessage, Preprocessor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let iterations: usize = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(20_000);
    let output_tokens: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let messages = [ChatMessage::new(
        "user",
        "Summarise the main trade-offs between prefix-aware routing and plain \
         round-robin for a fleet of sixteen inference engines serving chat traffic.",
    )];
    println!("{iterations} requests, {output_tokens} generated tokens each");
    println!("tokenizer | template µs | encode µs | prompt tokens | detokenize µs/token");
    for (name, preprocessor) in [
        ("bytes", Preprocessor::builtin(32_768)),
        ("smollm2", Preprocessor::smollm2(None)?),
    ] {
        let started = Instant::now();
        let mut prompt = String::new();
        for _ in 0..iterations {
            prompt = preprocessor.render_chat(&messages)?;
        }
        let template = started.elapsed().as_secs_f64() * 1e6 / iterations as f64;
        let started = Instant::now();
        let mut tokens = Vec::new();
        for _ in 0..iterations {
            tokens = preprocessor.encode(&prompt)?;
        }
        let encode = started.elapsed().as_secs_f64() * 1e6 / iterations as f64;
        // Generated ids as the mocker draws them: spread over the first 32,000.
        let generated: Vec<u32> = (0..output_tokens as u32)
            .map(|i| 300 + (i * 7919) % 31_000)
            .collect();
        let started = Instant::now();
        let mut bytes = 0;
        for _ in 0..iterations / 10 {
            let mut decoder = preprocessor.decoder();
            for &id in &generated {
                bytes += decoder.push(id)?.len();
            }
            bytes += decoder.finish().len();
        }
        let per_token =
            started.elapsed().as_secs_f64() * 1e6 / (iterations / 10 * output_tokens).max(1) as f64;
        println!(
            "{name} | {template:.2} | {encode:.2} | {} | {per_token:.3} ({bytes} bytes)",
            tokens.len()
        );
    }
    Ok(())
}
