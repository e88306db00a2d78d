//! One request inside the engine.

use rustc_hash::FxHashMap;
use switchyard_core::{RequestId, Token, TokenBlocks};

use crate::blocks::BlockId;
use crate::tokens::TokenRules;

/// A request as the engine tracks it: its tokens (prompt, then generated) cut into blocks,
/// how many are computed, and which KV blocks it holds.
#[derive(Debug)]
pub struct Sequence {
    pub id: RequestId,
    /// Prompt and generated tokens; full blocks carry their hashes.
    pub tokens: TokenBlocks,
    pub prompt_tokens: u32,
    /// Output tokens to generate here.
    pub max_output_tokens: u32,
    /// Output tokens generated before it came here (a resumed request).
    pub output_offset: u32,
    pub stream_key: u64,
    pub stop_token_ids: Vec<Token>,
    pub rules: TokenRules,
    /// How often each token is in the output so far, kept only when the rules reshape
    /// the draws.
    pub counts: FxHashMap<Token, u32>,
    /// Output tokens generated here.
    pub generated: u32,
    /// Tokens whose KV is computed.
    pub computed: u32,
    /// Blocks held: the leading full blocks, then the unfilled tail block if any.
    pub blocks: Vec<BlockId>,
    /// How many of `blocks` are full.
    pub full_held: u32,
    /// Tokens scheduled in the step being built.
    pub scheduled: u32,
    /// Prompt tokens found cached when first admitted.
    pub cached_tokens: Option<u32>,
    /// Leading tokens whose KV came with the request (not computed here).
    pub imported: u32,
    /// Prefill stops at this position until the request's media is encoded and staged.
    pub gate: Option<u32>,
    /// Its media: first position and positions in all (staged together).
    pub media: Option<(u32, u32)>,
    /// Its media are encoded (they may be staged).
    pub encoded: bool,
    /// Its media hold staging memory.
    pub staged: bool,
    /// Its place in arrival order.
    pub arrival: u64,
    /// It came ahead of its media (they were being encoded).
    pub sent_ahead: bool,
    /// Its media became ready when this many requests had arrived: it is scheduled behind
    /// the earlier ones still computing their prompts (see
    /// [`crate::EngineArgs::defer_ready_media`]).
    pub behind: Option<u64>,
    /// Its constraint, where it stands in it.
    pub guide: Option<Box<switchyard_grammar::Guide>>,
    /// Report each token's log probability and this many alternatives'.
    pub logprobs: Option<u32>,
    /// Report the prompt's too, with its first token (see `MockRequest`).
    pub prompt_logprobs: Option<(u32, Vec<Token>)>,
}

impl Sequence {
    pub fn num_tokens(&self) -> u32 {
        self.tokens.total_tokens() as u32
    }

    /// Whether the scheduled work is one decode step (the last sampled token).
    pub fn is_decode(&self) -> bool {
        self.generated > 0 && self.scheduled == 1 && self.computed + 1 == self.num_tokens()
    }

    /// Whether the unfilled tail block is held.
    pub fn partial_held(&self) -> bool {
        self.blocks.len() > self.full_held as usize
    }

    /// Tokens it may compute before its media gate (all of them when there is none).
    pub fn before_gate(&self) -> u32 {
        self.gate
            .map_or(u32::MAX, |g| g.saturating_sub(self.computed))
    }

    /// Whether it has yet to sample its first token here (its prompt is being computed).
    pub fn prefilling(&self) -> bool {
        self.generated == 0
    }

    /// Tokens still to compute before the next token can be sampled.
    pub fn remaining(&self) -> u32 {
        self.num_tokens() - self.computed
    }
}
