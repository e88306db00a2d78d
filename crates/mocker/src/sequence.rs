//! One request inside the engine.

use switchyard_core::{RequestId, TokenBlocks};

/// A request as the engine tracks it: its tokens (prompt, then generated) cut into blocks,
/// how many are computed, and which KV blocks it holds.
#[derive(Debug)]
pub struct Sequence {
    pub id: RequestId,
    /// Prompt and generated tokens; full blocks carry their hashes.
    pub tokens: TokenBlocks,
    pub prompt_tokens: u32,
    pub max_output_tokens: u32,
    pub generated: u32,
    /// Tokens whose KV is computed.
    pub computed: u32,
    /// Leading full blocks held in the block manager.
    pub full_held: u32,
    /// Whether the unfilled tail block is held.
    pub partial_held: bool,
    /// Tokens scheduled in the step being built.
    pub scheduled: u32,
    /// Prompt tokens found cached when first admitted.
    pub cached_tokens: Option<u32>,
}

impl Sequence {
    pub fn num_tokens(&self) -> u32 {
        self.tokens.total_tokens() as u32
    }

    /// Whether the scheduled work is one decode step (the last sampled token).
    pub fn is_decode(&self) -> bool {
        self.generated > 0 && self.scheduled == 1 && self.computed + 1 == self.num_tokens()
    }

    /// Tokens still to compute before the next token can be sampled.
    pub fn remaining(&self) -> u32 {
        self.num_tokens() - self.computed
    }
}
