//! The engine protocol: what a frontend sends a worker, and what streams back.

use serde::{Deserialize, Serialize};

use crate::{RequestId, Token};

/// Sampling options passed through to the engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    /// Generation stops after any of these tokens (which are included in the output).
    #[serde(default)]
    pub stop_token_ids: Vec<Token>,
}

/// A request for an engine: the prompt, already tokenized.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateRequest {
    pub id: RequestId,
    pub token_ids: Vec<Token>,
    pub max_tokens: u32,
    #[serde(default)]
    pub sampling: SamplingParams,
    /// The data-parallel rank chosen by the router.
    #[serde(default)]
    pub dp_rank: u32,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The token limit was reached.
    Length,
    /// A stop token was produced.
    Stop,
    /// The request was cancelled.
    Cancelled,
}

/// One item of an engine's response stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GenerateOutput {
    /// New tokens. `cached_tokens`, on the first item, counts the prompt tokens the engine
    /// found in its prefix cache.
    Tokens {
        token_ids: Vec<Token>,
        cached_tokens: Option<u32>,
    },
    /// The end of the stream.
    Finished {
        reason: FinishReason,
        completion_tokens: u32,
    },
}
