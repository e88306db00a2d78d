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

use switchyard_core::protocol::{FinishReason, TokenOutput};
use switchyard_core::{
    KvEvent, LoadSnapshot, RequestId, StorageTier, Token, TokenBlocks, WorkerKey,
};
use thiserror::Error;

use crate::blocks::{BlockId, BlockManager, Lookup, OutOfBlocks};
use crate::config::{EngineArgs, InvalidArgs, PreemptionMode};
use crate::perf::{PerfModel, StepShape};
use crate::sequence::Sequence;
use crate::tokens::{TokenRules, token_under};

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
        });
        self.arrivals += 1;
        if request.media_gate.is_none() && request.media.is_some() {
            self.stage_or_queue(request.id);
        }
        Ok(())
    }

    /// Media positions staged now.
    pub fn staged_tokens(&self) -> u64 {
        self.staged_tokens
    }

    fn sequence_mut(&mut self, id: RequestId) -> Option<&mut Sequence> {
        self.running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|s| s.id == id)
    }

    /// Stages request `id`'s encoded media if the staging memory has room (or holds
    /// nothing: media larger than all of it go alone), opening its gate. Whether it did.
    fn try_stage(&mut self, id: RequestId) -> bool {
        let (limit, staged) = (self.args.staging_tokens, self.staged_tokens);
        let Some(seq) = self.sequence_mut(id) else {
            return true;
        };
        let tokens = u64::from(seq.media.map_or(0, |(_, t)| t));
        if limit != 0 && staged != 0 && staged + tokens > limit {
            return false;
        }
        seq.staged = true;
        let held = seq.gate.take().is_some();
        self.staged_tokens += tokens;
        if held && self.args.defer_ready_media {
            self.defer(id);
        }
        true
    }

    /// Schedules request `id` (running or waiting) behind the requests that arrived
    /// before now and were not themselves sent ahead of their media.
    fn defer(&mut self, id: RequestId) {
        let arrivals = self.arrivals;
        if let Some(seq) = self.sequence_mut(id)
            && seq.behind.is_none()
        {
            seq.behind = Some(arrivals);
            self.deferred += 1;
        }
    }

    /// Ends the deferral of requests that no earlier arrival is still ahead of (every
    /// request that arrived before their media were ready has computed its prompt, or as
    /// much of it as it can before its own media).
    fn refresh_deferred(&mut self) {
        if self.deferred == 0 {
            return;
        }
        // Only requests that came with their media ready hold a deferred one back (those
        // sent ahead of theirs keep their arrival order among themselves).
        let earliest_prefilling = self
            .running
            .iter()
            .filter(|s| s.prefilling())
            .chain(self.waiting.iter())
            .filter(|s| !s.sent_ahead)
            .map(|s| s.arrival)
            .min()
            .unwrap_or(u64::MAX);
        for seq in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            if seq.behind.is_some_and(|m| earliest_prefilling >= m) {
                seq.behind = None;
                self.deferred -= 1;
            }
        }
    }

    /// Stages request `id`'s encoded media, or queues it behind those waiting (its prefill
    /// stopped at its media) until there is room.
    fn stage_or_queue(&mut self, id: RequestId) {
        if self.staging_queue.is_empty() && self.try_stage(id) {
            return;
        }
        if let Some(seq) = self.sequence_mut(id) {
            seq.gate = seq.media.map(|(first, _)| first);
        }
        self.staging_queue.push_back(id);
        self.stats.staging_waits += 1;
    }

    /// `tokens` media positions staged for request `id` leave the staging memory (its
    /// prompt is computed, or it left: then it leaves the queue too); those waiting are
    /// staged in order while there is room.
    fn unstage(&mut self, id: RequestId, tokens: u64) {
        self.staged_tokens = self.staged_tokens.saturating_sub(tokens);
        self.staging_queue.retain(|&q| q != id);
        while let Some(&next) = self.staging_queue.front() {
            if !self.try_stage(next) {
                break;
            }
            self.staging_queue.pop_front();
        }
    }

    /// Media positions of `seq` staged now.
    fn staged_of(seq: &Sequence) -> u64 {
        if seq.staged {
            u64::from(seq.media.map_or(0, |(_, t)| t))
        } else {
            0
        }
    }

    /// Whether a request here is held at its media gate.
    pub fn waiting_on_media(&self) -> bool {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .any(|s| s.gate.is_some())
    }

    /// The request's media is encoded: its prefill may pass its first media position.
    /// Returns whether the request is here.
    pub fn media_ready(&mut self, id: RequestId) -> bool {
        let Some(seq) = self.sequence_mut(id) else {
            return false;
        };
        if seq.media.is_none() {
            let held = seq.gate.take().is_some();
            if held && self.args.defer_ready_media {
                self.defer(id);
            }
        } else if !std::mem::replace(&mut seq.encoded, true) {
            self.stage_or_queue(id);
        }
        true
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

    /// Runs one step starting at `now`.
    pub fn step(&mut self, now: Duration, out: &mut StepOutput) {
        out.clear();
        out.started_at = now;
        self.refresh_deferred();
        let (budget, preempted_any) = self.schedule_running(out);
        if !preempted_any {
            // Deferred requests go after the earlier arrivals, before the later ones.
            let marker = self
                .running
                .iter()
                .chain(self.waiting.iter())
                .filter_map(|s| s.behind)
                .min();
            let budget = self.admit_waiting(budget, marker);
            if marker.is_some() {
                let budget = self.schedule_deferred(budget);
                self.admit_waiting(budget, None);
            }
        }
        out.shape = self.shape();
        let model_ms = self.perf.step_ms(&out.shape);
        // A measured profile could say anything: no negative or endless steps.
        let seconds = model_ms / 1e3 / self.args.speedup_ratio;
        out.duration = if seconds > 0.0 {
            Duration::try_from_secs_f64(seconds.min(3600.0)).unwrap_or_default()
        } else {
            Duration::ZERO
        };
        self.apply(out);
        for data in self.blocks.drain_events() {
            self.next_event_id += 1;
            out.events.push(KvEvent {
                worker_id: self.worker.worker_id,
                dp_rank: self.worker.dp_rank,
                event_id: self.next_event_id,
                tier: StorageTier::Device,
                data,
            });
        }
        self.stats.steps += 1;
    }

    /// Schedules the running requests. Returns the budget left and whether any request was
    /// preempted.
    fn schedule_running(&mut self, out: &mut StepOutput) -> (u32, bool) {
        let mut budget = self.args.max_num_batched_tokens;
        let mut preempted_any = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            if self.running[i].behind.is_some() {
                i += 1;
                continue;
            }
            let remaining = self.running[i].remaining();
            let n = remaining.min(budget).min(self.running[i].before_gate());
            if n == 0 || (!self.args.enable_chunked_prefill && n < remaining) {
                i += 1;
                continue;
            }
            loop {
                let target = self.running[i].computed + n;
                if allocate(&mut self.blocks, &mut self.running[i], target).is_ok() {
                    self.running[i].scheduled = n;
                    budget -= n;
                    i += 1;
                    break;
                }
                let victim = match self.args.preemption_mode {
                    PreemptionMode::Lifo => self.running.len() - 1,
                    PreemptionMode::Fifo => 0,
                };
                budget += self.running[victim].scheduled;
                self.preempt(victim, out);
                preempted_any = true;
                if victim == i {
                    break;
                }
                if victim < i {
                    i -= 1;
                }
            }
        }
        (budget, preempted_any)
    }

    fn preempt(&mut self, index: usize, out: &mut StepOutput) {
        let mut seq = self.running.remove(index);
        if seq.behind.take().is_some() {
            self.deferred -= 1;
        }
        for &id in seq.blocks.iter().rev() {
            self.blocks.destroy(id);
        }
        seq.blocks.clear();
        seq.full_held = 0;
        seq.computed = 0;
        seq.scheduled = 0;
        seq.imported = 0;
        out.preempted.push(seq.id);
        self.stats.preemptions += 1;
        self.waiting.push_front(seq);
    }

    /// Admits waiting requests in order while budget, sequence slots and blocks allow:
    /// first those ready to prefill, then those waiting for their media (for the text
    /// before it).
    /// Only requests that arrived before `before` (all, if none) are admitted. Returns the
    /// budget left.
    fn admit_waiting(&mut self, mut budget: u32, before: Option<u64>) -> u32 {
        let block_size = self.args.block_size;
        'admit: for gated in [false, true] {
            let mut i = 0;
            while budget > 0 && self.running.len() < self.args.max_num_seqs as usize {
                let Some(seq) = self.waiting.get_mut(i) else {
                    break;
                };
                let held_back = before
                    .is_some_and(|b| seq.arrival >= b || seq.sent_ahead || seq.behind.is_some());
                if seq.gate.is_some() != gated || held_back {
                    i += 1;
                    continue;
                }
                // A cached prefix is not recomputed, but the last token always is: its
                // logits give the next token.
                let cacheable = (seq.num_tokens() - 1) / block_size;
                let hits =
                    (self.blocks.cached_prefix(seq.tokens.sequence_hashes()) as u32).min(cacheable);
                let cached = hits * block_size;
                let computed = cached.max(seq.imported.min(seq.num_tokens() - 1));
                let remaining = seq.num_tokens() - computed;
                let allowed = seq.gate.map_or(u32::MAX, |g| g.saturating_sub(computed));
                let n = remaining.min(budget).min(allowed);
                if gated && (n == 0 || (!self.args.enable_chunked_prefill && n < remaining)) {
                    // Nothing it may compute before its media: it waits, the others go on.
                    i += 1;
                    continue;
                }
                if !self.args.enable_chunked_prefill && remaining > budget {
                    break 'admit;
                }
                if allocate(&mut self.blocks, seq, computed + n).is_err() {
                    break 'admit;
                }
                seq.computed = computed;
                seq.scheduled = n;
                if seq.cached_tokens.is_none() {
                    seq.cached_tokens = Some(cached);
                    self.stats.prompt_tokens += u64::from(seq.prompt_tokens);
                    self.stats.cached_prompt_tokens += u64::from(cached.min(seq.prompt_tokens));
                }
                budget -= n;
                if let Some(seq) = self.waiting.remove(i) {
                    self.running.push(seq);
                }
            }
        }
        budget
    }

    /// Schedules the deferred requests' next chunks within `budget` (no preemption for
    /// them: without blocks they wait for the next step). Returns the budget left.
    fn schedule_deferred(&mut self, mut budget: u32) -> u32 {
        for seq in self.running.iter_mut().filter(|s| s.behind.is_some()) {
            if budget == 0 {
                break;
            }
            let remaining = seq.remaining();
            let n = remaining.min(budget).min(seq.before_gate());
            if n == 0 || (!self.args.enable_chunked_prefill && n < remaining) {
                continue;
            }
            if allocate(&mut self.blocks, seq, seq.computed + n).is_ok() {
                seq.scheduled = n;
                budget -= n;
            }
        }
        budget
    }

    fn shape(&self) -> StepShape {
        let mut shape = StepShape {
            active_blocks: self.blocks.in_use() as u64,
            capacity_blocks: self.blocks.capacity() as u64,
            ..StepShape::default()
        };
        for seq in self.running.iter().filter(|s| s.scheduled > 0) {
            if seq.is_decode() {
                shape.decode_seqs += 1;
                shape.decode_kv_tokens += u64::from(seq.num_tokens());
            } else {
                shape.prefill_tokens += seq.scheduled;
                shape.prefill_context += u64::from(seq.computed) * u64::from(seq.scheduled);
            }
        }
        shape
    }

    /// Applies the step's computation: sample tokens, finish requests.
    fn apply(&mut self, out: &mut StepOutput) {
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            if seq.scheduled == 0 {
                i += 1;
                continue;
            }
            seq.computed += seq.scheduled;
            seq.scheduled = 0;
            if seq.computed < seq.num_tokens() {
                i += 1;
                continue;
            }
            if seq.staged {
                // Its prompt is computed: its media's features leave the staging memory.
                let (id, tokens) = (seq.id, Self::staged_of(seq));
                seq.staged = false;
                self.unstage(id, tokens);
            }
            let seq = &mut self.running[i];
            let token = token_under(
                self.seed,
                seq.stream_key,
                seq.num_tokens(),
                &seq.rules,
                &seq.counts,
            );
            if seq.rules.reshapes() {
                *seq.counts.entry(token).or_insert(0) += 1;
            }
            let finish = if seq.stop_token_ids.contains(&token) {
                Some(FinishReason::Stop)
            } else if seq.generated + 1 == seq.max_output_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            out.tokens.push(TokenOutput {
                request: seq.id,
                token,
                index: seq.output_offset + seq.generated,
                cached_tokens: seq.cached_tokens.unwrap_or(0),
                finish,
            });
            seq.generated += 1;
            self.stats.output_tokens += 1;
            if finish.is_some() {
                let seq = self.running.remove(i);
                release(&mut self.blocks, &seq);
                self.stats.finished += 1;
            } else {
                seq.tokens.extend(&[token]);
                i += 1;
            }
        }
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

    /// Checks the block accounting against the sequences; for tests.
    pub fn validate(&self) -> Result<(), String> {
        let blocks = &self.blocks;
        if blocks.in_use() + blocks.inactive() + blocks.free() != blocks.capacity() {
            return Err(format!(
                "{} in use + {} cached + {} free != {}",
                blocks.in_use(),
                blocks.inactive(),
                blocks.free(),
                blocks.capacity()
            ));
        }
        if let Some(seq) = self.waiting.iter().find(|s| !s.blocks.is_empty()) {
            return Err(format!("waiting request {} holds blocks", seq.id));
        }
        let mut refs: rustc_hash::FxHashMap<BlockId, u32> = Default::default();
        let mut partial = 0;
        for seq in &self.running {
            let needed = seq.computed.max(1).div_ceil(self.args.block_size) as usize;
            if seq.blocks.len() < needed {
                return Err(format!(
                    "request {} computed {} tokens but holds {} blocks",
                    seq.id,
                    seq.computed,
                    seq.blocks.len()
                ));
            }
            for (i, &id) in seq.blocks.iter().enumerate() {
                *refs.entry(id).or_insert(0) += 1;
                let full = i < seq.full_held as usize;
                if full == blocks.is_partial(id) {
                    return Err(format!(
                        "request {} block {i} partial/full mismatch",
                        seq.id
                    ));
                }
                if full
                    && blocks.prefix_caching()
                    && blocks.hash_of(id) != Some(seq.tokens.sequence_hashes()[i])
                {
                    return Err(format!("request {} block {i} holds other content", seq.id));
                }
                partial += usize::from(!full);
            }
        }
        if partial != blocks.partial_blocks() {
            return Err(format!(
                "{partial} partial blocks held but the manager counts {}",
                blocks.partial_blocks()
            ));
        }
        if refs.len() != blocks.in_use() {
            return Err(format!(
                "sequences hold {} blocks but {} are in use",
                refs.len(),
                blocks.in_use()
            ));
        }
        for (id, count) in refs {
            if blocks.refcount(id) != count {
                return Err(format!(
                    "block {id} has refcount {} but {count} holders",
                    blocks.refcount(id)
                ));
            }
        }
        Ok(())
    }
}

/// Gives `seq` the blocks for its first `target` tokens, all or nothing.
///
/// Cached blocks are shared first, so that allocating new ones (which may evict) can never
/// evict a block this same allocation relies on.
fn allocate(blocks: &mut BlockManager, seq: &mut Sequence, target: u32) -> Result<(), OutOfBlocks> {
    let block_size = seq.tokens.block_size();
    let first = seq.full_held as usize;
    let full_target = (target / block_size) as usize;
    let want_partial = !target.is_multiple_of(block_size);
    let had_partial = seq.partial_held();
    let hashes = seq.tokens.sequence_hashes();
    let locals = seq.tokens.local_hashes();

    // Plan: the cached block for each new full block (or none), and how many new blocks
    // that leaves to find, against what is free or evictable. Past the first block that
    // is not cached the rest are taken as not cached without a lookup: a block's hash names
    // its whole prefix, and tails are evicted before their prefixes, so a cached block
    // after an uncached one is rare; `store_or_share` still finds it if it happens.
    let mut plan: smallvec::SmallVec<[Lookup; 8]> = smallvec::SmallVec::new();
    let (mut new, mut reactivated, mut freed) = (0usize, 0usize, 0usize);
    let mut missed = false;
    for (i, &hash) in hashes.iter().enumerate().take(full_target).skip(first) {
        let promoting = i == first && had_partial;
        let lookup = if missed && !promoting {
            Lookup::Miss
        } else {
            blocks.lookup(hash)
        };
        reactivated += usize::from(matches!(lookup, Lookup::Inactive(_)));
        if promoting {
            freed += usize::from(lookup != Lookup::Miss);
        } else if lookup == Lookup::Miss {
            new += 1;
            missed = true;
        }
        plan.push(lookup);
    }
    let keeps_partial = had_partial && full_target == first;
    if want_partial && !keeps_partial {
        new += 1;
    }
    if new > blocks.free() + freed + blocks.inactive() - reactivated {
        return Err(OutOfBlocks);
    }

    let parent = |i: usize| i.checked_sub(1).map(|p| hashes[p]);
    let partial = if had_partial && !keeps_partial {
        seq.blocks.pop()
    } else {
        None
    };
    let mut ids: smallvec::SmallVec<[BlockId; 8]> = smallvec::SmallVec::with_capacity(plan.len());
    for (k, lookup) in plan.iter().enumerate() {
        let i = first + k;
        let id = match (partial.filter(|_| k == 0), *lookup) {
            (Some(p), _) => blocks.promote(p, hashes[i], locals[i], parent(i)),
            (None, Lookup::Active(id) | Lookup::Inactive(id)) => {
                blocks.share(id);
                id
            }
            (None, Lookup::Miss) => BlockId::MAX,
        };
        ids.push(id);
    }
    // Shares done, evict for all the new blocks at once (see `BlockManager::reserve`).
    blocks.reserve(new)?;
    for (k, id) in ids.iter_mut().enumerate() {
        if *id == BlockId::MAX {
            let i = first + k;
            *id = blocks.store_or_share(hashes[i], locals[i], parent(i))?;
        }
    }
    if keeps_partial {
        // The held tail block stays where it is, after the full blocks.
    } else {
        seq.blocks.extend_from_slice(&ids);
        if want_partial {
            let id = blocks.use_partial()?;
            seq.blocks.push(id);
        }
    }
    seq.full_held = full_target as u32;
    Ok(())
}

/// Returns a finished or cancelled sequence's blocks, tail first, keeping them cached.
fn release(blocks: &mut BlockManager, seq: &Sequence) {
    for &id in seq.blocks.iter().rev() {
        blocks.release(id);
    }
}
