//! An engine that runs a real GGUF model on the CPU with candle.
//!
//! - [`model`]: a Llama-architecture model computed for many sequences per step.

pub mod model;
