//! Greedy generation from token ids, one sequence, timed: a quick check of the model.
//!
//!     cargo run --release -p switchyard-candle --example greedy -- MODEL.gguf 1,2,3 32
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use switchyard_candle::model::{Gguf, Model, SeqKv, StepInput};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut gguf = Gguf::open(std::path::Path::new(&args[1])).unwrap();
    let start = Instant::now();
    let model = Model::load(&mut gguf, true).unwrap();
    eprintln!("loaded in {:?}: {:?}", start.elapsed(), model.shape);
    let prompt: Vec<u32> = args[2].split(',').map(|t| t.parse().unwrap()).collect();
    let n: usize = args[3].parse().unwrap();
    let mut kv = SeqKv::new(&model.shape);
    let t0 = Instant::now();
    let mut tokens = prompt.clone();
    let mut out = Vec::new();
    for i in 0..n {
        let input = if i == 0 {
            &tokens[..]
        } else {
            &tokens[tokens.len() - 1..]
        };
        let logits = model
            .forward(&mut [StepInput {
                tokens: input,
                kv: &mut kv,
                logits: true,
                embeds: Vec::new(),
                rows: None,
            }])
            .unwrap();
        let logits = logits[0].as_ref().unwrap();
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0 as u32;
        if i == 0 {
            eprintln!("prefill of {} tokens: {:?}", prompt.len(), t0.elapsed());
        }
        out.push(next);
        tokens.push(next);
    }
    let total = t0.elapsed();
    println!(
        "{}",
        out.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
    );
    eprintln!("{n} tokens in {total:?}");
}
