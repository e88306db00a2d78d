//! The engine: a vLLM-v1-style scheduler over the block manager, as a pure state machine.
//!
//! Each [`MockEngine::step`] builds one batch and returns what it produced and how long it
//! took; time is an input, never read. A step:
//!
//! 1. gives each running request, in order, its next tokens from the step's token budget:
//!    one for a decode, a chunk for a prefill. When its KV blocks cannot be found, running
//!    requests are preempted (the last admitted by default, the first with FIFO) until they
//!    can, the request itself last; a preempted request loses its blocks and goes back to
//!    the front of the queue to be recomputed;
//! 2. if nothing was preempted, admits waiting requests in order while the budget, the
//!    sequence limit and the blocks allow; a request's cached prefix is not recomputed;
//! 3. times the batch with the performance model and applies it: a request whose tokens are
//!    all computed samples its next token, and finishes at its requested output length or
//!    on one of its stop tokens (end of sequence), freeing its blocks at once.
//!
//! Output tokens are a function of the request's stream key, the token's absolute
//! position in the sequence and, under biases or penalties, the output so far (see
//! [`crate::tokens`]), never of the engine: a request resumed
//! on another engine, with what was generated so far appended to its prompt, continues the
//! very sequence the first engine started.

use std::collections::VecDeque;
use std::time::Duration;

use rustc_hash::FxHashMap;

use switchyard_core::protocol::TokenOutput;
use switchyard_core::{KvEvent, LoadSnapshot, RequestId, Token, TokenBlocks, WorkerKey};
use thiserror::Error;

use crate::blocks::BlockManager;
use crate::config::{EngineArgs, InvalidArgs};
use crate::perf::{PerfModel, StepShape};
use crate::sequence::Sequence;
use crate::tokens::TokenRules;
use switchyard_grammar::Guide;

mod alloc;
mod media;
mod schedule;
mod validate;

use alloc::release;
pub use validate::Inconsistency;

/// A request for the engine: its prompt already cut into blocks of the engine's size.
#[derive(Debug, Clone)]
pub struct MockRequest {
    pub id: RequestId,
    /// The prompt; for a resumed request, followed by the tokens already generated.
    pub prompt: TokenBlocks,
    /// Output tokens still to generate.
    pub max_output_tokens: u32,
    /// Output tokens generated before this request (by a worker that failed); the output
    /// positions continue from there.
    pub generated: u32,
    /// Keys the output tokens (see [`crate::tokens::token_avoiding`]).
    pub stream_key: u64,
    /// Generation ends after any of these tokens.
    pub stop_token_ids: Vec<Token>,
    /// Bans, biases and penalties on the output tokens.
    pub rules: TokenRules,
    /// The tokens generated before this request (its prompt's last `generated` tokens),
    /// which penalties count; needed only when the rules [reshape](TokenRules::reshapes)
    /// the draws.
    pub earlier_output: Vec<Token>,
    /// Leading tokens whose KV comes with the request (sent over from another worker), so
    /// they are not computed here; the last token is always computed. Lost if the request
    /// is preempted (its blocks go, so it computes everything when it comes back).
    pub imported_tokens: u32,
    /// The position of the prompt's first media placeholder while its media is still being
    /// encoded: prefill stops there until [`MockEngine::media_ready`]. Such requests are
    /// admitted after those that are ready, for the text before their media.
    pub media_gate: Option<u32>,
    /// Its media's first position and positions in all, for staging (see
    /// [`EngineArgs::staging_tokens`]); none: no media, or staging not modelled.
    pub media: Option<(u32, u32)>,
    /// Its constraint (structured output), having taken the output generated before this
    /// request: the draws keep to it, and its end ends the request (see
    /// [`crate::tokens::token_guided`]).
    pub guide: Option<Box<Guide>>,
    /// Report each output token's log probability and this many alternatives' (see
    /// [`crate::logprobs`]).
    pub logprobs: Option<u32>,
    /// Report the prompt's too, with this many alternatives: its tokens (the model's plain
    /// distribution, with the first token's).
    pub prompt_logprobs: Option<(u32, Vec<Token>)>,
}

impl MockRequest {
    /// A fresh request keyed by its id, with no stop tokens.
    pub fn new(id: RequestId, prompt: TokenBlocks, max_output_tokens: u32) -> Self {
        MockRequest {
            id,
            prompt,
            max_output_tokens,
            generated: 0,
            stream_key: id.0,
            stop_token_ids: Vec::new(),
            rules: TokenRules::default(),
            earlier_output: Vec::new(),
            imported_tokens: 0,
            media_gate: None,
            media: None,
            guide: None,
            logprobs: None,
            prompt_logprobs: None,
        }
    }
}

/// Why the engine refused a request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Rejected {
    #[error("request {0} is already in the engine")]
    Duplicate(RequestId),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max output tokens must be at least 1")]
    NoOutput,
    #[error("prompt blocks are of {got} tokens but the engine uses {expected}")]
    BlockSize { expected: u32, got: u32 },
    #[error("the request needs {needed} KV blocks but the engine has {capacity}")]
    TooLarge { needed: u64, capacity: u64 },
    #[error(
        "the request needs {needed} tokens in one step but the step budget is {budget} and chunked prefill is off"
    )]
    NoChunking { needed: u64, budget: u32 },
}

impl Rejected {
    /// The engine error a worker answers with: an invalid request for any engine, or one
    /// another engine (with a larger cache, other settings) may take.
    pub fn engine_error(&self) -> switchyard_core::protocol::EngineError {
        use switchyard_core::protocol::EngineError;
        match self {
            Rejected::EmptyPrompt | Rejected::NoOutput | Rejected::Duplicate(_) => {
                EngineError::Invalid(self.to_string())
            }
            Rejected::BlockSize { .. }
            | Rejected::TooLarge { .. }
            | Rejected::NoChunking { .. } => EngineError::Unsupported(self.to_string()),
        }
    }
}

/// What a step did.
#[derive(Debug, Default)]
pub struct StepOutput {
    pub started_at: Duration,
    /// Model time divided by the speedup ratio.
    pub duration: Duration,
    pub shape: StepShape,
    pub tokens: Vec<TokenOutput>,
    pub preempted: Vec<RequestId>,
    /// KV events, in order, with this engine's ids.
    pub events: Vec<KvEvent>,
}

impl StepOutput {
    pub fn finished_at(&self) -> Duration {
        self.started_at + self.duration
    }

    fn clear(&mut self) {
        self.tokens.clear();
        self.preempted.clear();
        self.events.clear();
        self.shape = StepShape::default();
        self.duration = Duration::ZERO;
    }
}

/// Counters over the engine's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub steps: u64,
    pub preemptions: u64,
    pub prompt_tokens: u64,
    pub cached_prompt_tokens: u64,
    pub output_tokens: u64,
    pub finished: u64,
    pub cancelled: u64,
    /// Requests whose encoded media waited for staging memory.
    pub staging_waits: u64,
}

/// A simulated inference engine.
#[derive(Debug)]
pub struct MockEngine {
    worker: WorkerKey,
    args: EngineArgs,
    perf: PerfModel,
    seed: u64,
    blocks: BlockManager,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    next_event_id: u64,
    stats: EngineStats,
    /// Media positions staged now, and the requests waiting to stage theirs, in order.
    staged_tokens: u64,
    staging_queue: VecDeque<RequestId>,
    /// Requests added so far (each one's place in arrival order).
    arrivals: u64,
    /// Running requests scheduled behind earlier arrivals (their media just became ready).
    deferred: usize,
}

impl MockEngine {
    /// An engine publishing events as `worker`, drawing output tokens from `seed` (the
    /// model's: every engine of a fleet uses the same, so any of them continues a stream).
    pub fn new(
        worker: WorkerKey,
        args: EngineArgs,
        perf: PerfModel,
        seed: u64,
    ) -> Result<Self, InvalidArgs> {
        args.validate()?;
        Ok(MockEngine {
            worker,
            args,
            perf,
            seed,
            blocks: BlockManager::new(args.num_gpu_blocks as usize, args.enable_prefix_caching),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_event_id: 0,
            stats: EngineStats::default(),
            staged_tokens: 0,
            staging_queue: VecDeque::new(),
            arrivals: 0,
            deferred: 0,
        })
    }

    pub fn worker(&self) -> WorkerKey {
        self.worker
    }

    /// The timing model its steps follow.
    pub fn perf(&self) -> &PerfModel {
        &self.perf
    }

    pub fn args(&self) -> &EngineArgs {
        &self.args
    }

    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    pub fn block_manager(&self) -> &BlockManager {
        &self.blocks
    }

    /// Whether a step would do anything.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Queues a request.
    pub fn add_request(&mut self, request: MockRequest) -> Result<(), Rejected> {
        let prompt = request.prompt.total_tokens() as u64;
        if prompt == 0 {
            return Err(Rejected::EmptyPrompt);
        }
        if request.max_output_tokens == 0 {
            return Err(Rejected::NoOutput);
        }
        if request.prompt.block_size() != self.args.block_size {
            return Err(Rejected::BlockSize {
                expected: self.args.block_size,
                got: request.prompt.block_size(),
            });
        }
        // The last output token is never computed, so a request's KV spans this many tokens.
        let span = prompt + u64::from(request.max_output_tokens) - 1;
        let needed = span.div_ceil(u64::from(self.args.block_size));
        if needed > u64::from(self.args.num_gpu_blocks) {
            return Err(Rejected::TooLarge {
                needed,
                capacity: u64::from(self.args.num_gpu_blocks),
            });
        }
        if !self.args.enable_chunked_prefill && span > u64::from(self.args.max_num_batched_tokens) {
            return Err(Rejected::NoChunking {
                needed: span,
                budget: self.args.max_num_batched_tokens,
            });
        }
        if self.contains(request.id) {
            return Err(Rejected::Duplicate(request.id));
        }
        self.waiting.push_back(Sequence {
            id: request.id,
            prompt_tokens: prompt as u32,
            max_output_tokens: request.max_output_tokens,
            output_offset: request.generated,
            stream_key: request.stream_key,
            stop_token_ids: request.stop_token_ids,
            counts: if request.rules.reshapes() {
                let mut counts = FxHashMap::default();
                for &token in &request.earlier_output {
                    *counts.entry(token).or_insert(0) += 1;
                }
                counts
            } else {
                FxHashMap::default()
            },
            rules: request.rules,
            tokens: request.prompt,
            generated: 0,
            computed: 0,
            blocks: Vec::new(),
            full_held: 0,
            scheduled: 0,
            cached_tokens: None,
            imported: request.imported_tokens,
            gate: request.media_gate,
            media: request.media,
            encoded: request.media_gate.is_none(),
            staged: false,
            arrival: self.arrivals,
            sent_ahead: request.media_gate.is_some(),
            behind: None,
            guide: request.guide,
            logprobs: request.logprobs,
            prompt_logprobs: request.prompt_logprobs,
        });
        self.arrivals += 1;
        if request.media_gate.is_none() && request.media.is_some() {
            self.stage_or_queue(request.id);
        }
        Ok(())
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.running.iter().any(|s| s.id == id) || self.waiting.iter().any(|s| s.id == id)
    }

    /// Drops a request; its blocks stay cached for reuse. Returns whether it was here.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        let seq = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let mut seq = self.running.remove(i);
            release(&mut self.blocks, &seq);
            if seq.behind.take().is_some() {
                self.deferred -= 1;
            }
            seq
        } else if let Some(mut seq) = self
            .waiting
            .iter()
            .position(|s| s.id == id)
            .and_then(|i| self.waiting.remove(i))
        {
            if seq.behind.take().is_some() {
                self.deferred -= 1;
            }
            // Waiting requests hold no blocks.
            seq
        } else {
            return false;
        };
        self.unstage(seq.id, Self::staged_of(&seq));
        self.stats.cancelled += 1;
        true
    }

    /// The engine's load right now.
    pub fn load(&self) -> LoadSnapshot {
        let running_prefill: u64 = self
            .running
            .iter()
            .filter(|s| s.generated == 0)
            .map(|s| u64::from(s.remaining()))
            .sum();
        let waiting_prefill: u64 = self.waiting.iter().map(|s| u64::from(s.num_tokens())).sum();
        LoadSnapshot {
            waiting: self.waiting.len() as u32,
            running: self.running.len() as u32,
            active_blocks: self.blocks.in_use() as u64,
            cached_blocks: self.blocks.inactive() as u64,
            capacity_blocks: self.blocks.capacity() as u64,
            active_prefill_tokens: running_prefill + waiting_prefill,
        }
    }

    /// Ids of the requests in the engine, running first.
    pub fn requests(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.running.iter().chain(self.waiting.iter()).map(|s| s.id)
    }
}
