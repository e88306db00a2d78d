//! The OpenAI-compatible frontend.

pub mod preprocess;
