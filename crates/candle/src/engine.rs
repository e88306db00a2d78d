//! The step engine around the model: continuous batching, chunked prefill, a paged prefix
//! cache with LRU eviction under a memory budget, KV events, sampling.
//!
//! Every step decodes one token for each running sequence that has finished its prompt and
//! computes the next chunk of the prompts still being prefilled, within a token budget
//! (`max_batched_tokens`), in one forward pass. Admission takes waiting requests while
//! fewer than `max_num_seqs` run.
//!
//! The prefix cache keeps the keys and values of every full block of `block_size` tokens a
//! sequence computed (prompt and output), keyed by the block hashes every component uses
//! (`switchyard_core::blocks_for`); a request whose first blocks are cached copies them
//! instead of computing them (all but the last prompt token, whose logits are needed).
//! Stores and evictions are published as KV events, so KV-aware routing sees the real
//! cache. The cache holds copies: evicting a block never touches a running sequence.
//!
//! Media are merged: a prompt's media spans take the input embeddings projected from the
//! embeddings its encoder computed (carried in `media_inputs`, one per span) in place of
//! their placeholder tokens. A request sent ahead of its media (`media_pending`) computes
//! its text up to its first media position and waits there; its frontend sends it again
//! with the embeddings, and the text computed meanwhile is found in the prefix cache. A
//! request with media and no embeddings is served only when its media's KV is cached.

use std::collections::{HashMap, VecDeque};

use candle_core::Tensor;
use hashlink::LinkedHashMap;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use switchyard_core::perf::PerfModel;
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateRequest, Phase, SamplingParams, TokenOutput,
};
use switchyard_core::{
    KvEvent, KvEventData, LoadSnapshot, RequestId, SequenceHash, StorageTier, StoredBlock,
    TokenBlocks, WorkerKey, blocks_for,
};
use switchyard_worker::driver::StepEngine;

use crate::model::{Model, SeqKv, StepInput};

pub use switchyard_worker::config::CandleConfig;

/// A cached block: its keys and values for every layer, and its place in the chain.
struct CachedBlock {
    kv: Vec<(Tensor, Tensor)>,
}

/// The prefix cache: blocks by sequence hash, least recently used first.
struct PrefixCache {
    blocks: LinkedHashMap<SequenceHash, CachedBlock>,
    budget_blocks: usize,
}

impl PrefixCache {
    fn touch(&mut self, hash: SequenceHash) -> Option<&CachedBlock> {
        let block = self.blocks.remove(&hash)?;
        self.blocks.insert(hash, block);
        self.blocks.get(&hash)
    }

    /// Inserts a block (a no-op for one already held); returns the hashes evicted to make
    /// room.
    fn insert(&mut self, hash: SequenceHash, block: CachedBlock) -> Vec<SequenceHash> {
        if self.blocks.contains_key(&hash) || self.budget_blocks == 0 {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        while self.blocks.len() >= self.budget_blocks {
            match self.blocks.pop_front() {
                Some((old, _)) => evicted.push(old),
                None => break,
            }
        }
        self.blocks.insert(hash, block);
        evicted
    }
}

struct Sequence {
    request: GenerateRequest,
    /// Prompt then output.
    tokens: Vec<u32>,
    prompt_len: usize,
    kv: SeqKv,
    /// The sequence's blocks as everyone hashes them, extended as it grows.
    blocks: TokenBlocks,
    /// Full blocks already offered to the cache.
    offered: usize,
    cached_tokens: u32,
    /// Output tokens so far, counting those before a resume.
    generated: u32,
    /// The media spans' input embeddings: (offset, rows [length, hidden]).
    media: Vec<(usize, Tensor)>,
    /// Its media are being encoded: its prefill stops before this position.
    hold: Option<usize>,
    /// It came with media and no embeddings: the prefix cache must hold up to here.
    needs_cached: usize,
}

impl Sequence {
    /// Whether more than the last token is still to compute (else it decodes).
    fn prefilling(&self) -> bool {
        self.kv.len() + 1 < self.tokens.len()
    }

    /// Whether it waits for its media with everything before them computed.
    fn waits_for_media(&self) -> bool {
        self.hold.is_some_and(|h| self.kv.len() >= h)
    }

    /// The media embeddings for its positions `from..to`, as [`StepInput::embeds`].
    fn embeds(&self, from: usize, to: usize) -> Result<Vec<(usize, Tensor)>, candle_core::Error> {
        let mut out = Vec::new();
        for (offset, rows) in &self.media {
            let (lo, hi) = ((*offset).max(from), (offset + rows.dim(0)?).min(to));
            if lo < hi {
                out.push((lo - from, rows.narrow(0, lo - offset, hi - lo)?));
            }
        }
        Ok(out)
    }
}

/// The engine.
pub struct CandleEngine {
    model: Model,
    config: CandleConfig,
    worker: WorkerKey,
    cache: PrefixCache,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    next_event: u64,
    vocab: usize,
    /// Seconds a step takes per token it computes (a moving average), to size prompt chunks
    /// so a step stays within `step_target`.
    per_token: Option<f64>,
    /// The timing profile given, and the step's token budget it sets (replacing the
    /// running measurement, so the same work is chunked the same way every time, as the
    /// mocker replaying the profile chunks it).
    timing: Option<(PerfModel, u32)>,
    /// Media projectors by encoder width (see [`Model::media_projector`]).
    projectors: HashMap<usize, Tensor>,
}

impl std::fmt::Debug for CandleEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleEngine")
            .field("model", &self.model)
            .field("waiting", &self.waiting.len())
            .field("running", &self.running.len())
            .field("cached_blocks", &self.cache.blocks.len())
            .finish()
    }
}

impl CandleEngine {
    pub fn new(model: Model, config: CandleConfig, worker: WorkerKey) -> Self {
        let block_bytes = model.shape.kv_bytes_per_token() * config.block_size as usize;
        let budget_blocks = (config.cache_mib as usize * 1024 * 1024) / block_bytes.max(1);
        let vocab = model.shape.vocab;
        CandleEngine {
            model,
            cache: PrefixCache {
                blocks: LinkedHashMap::new(),
                budget_blocks,
            },
            config,
            worker,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_event: 0,
            vocab,
            per_token: None,
            timing: None,
            projectors: HashMap::new(),
        }
    }

    /// The input embeddings of `request`'s media spans, from the embeddings it carries.
    fn merge_inputs(
        &mut self,
        request: &GenerateRequest,
    ) -> Result<Vec<(usize, Tensor)>, EngineError> {
        let spans = &request.prompt.media;
        if request.media_inputs.len() != spans.len() {
            return Err(EngineError::Invalid(format!(
                "{} media spans and {} media inputs",
                spans.len(),
                request.media_inputs.len()
            )));
        }
        let failed = |e: crate::model::ModelError| EngineError::Internal(e.to_string());
        let mut media = Vec::with_capacity(spans.len());
        for (span, input) in spans.iter().zip(&request.media_inputs) {
            let (_, dim, rows) = input.embedding_rows().map_err(EngineError::Invalid)?;
            let projector = match self.projectors.get(&dim) {
                Some(p) => p.clone(),
                None => {
                    let p = self.model.media_projector(dim).map_err(failed)?;
                    self.projectors.insert(dim, p.clone());
                    p
                }
            };
            let rows = self
                .model
                .media_embeddings(&projector, &rows, dim, span.length as usize)
                .map_err(failed)?;
            media.push((span.offset as usize, rows));
        }
        Ok(media)
    }

    /// Takes a timing profile of this engine: its step budget becomes the most tokens whose
    /// predicted prefill fits `step_target` (at most `max_batched_tokens`).
    pub fn with_timing(mut self, perf: PerfModel) -> Self {
        let tokens = step_tokens(
            &perf,
            self.config.step_target,
            self.config.max_batched_tokens,
        );
        tracing::info!(step_tokens = tokens, "step budget from the timing profile");
        self.timing = Some((perf, tokens));
        self
    }

    /// The timing profile and step budget, when one was given.
    pub fn timing(&self) -> Option<(PerfModel, u32)> {
        self.timing.clone()
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Blocks the cache holds at most.
    pub fn capacity_blocks(&self) -> u64 {
        self.cache.budget_blocks as u64
    }

    fn event(&mut self, data: KvEventData) -> KvEvent {
        self.next_event += 1;
        KvEvent {
            worker_id: self.worker.worker_id,
            dp_rank: self.worker.dp_rank,
            event_id: self.next_event,
            tier: StorageTier::Device,
            data,
        }
    }

    /// Starts a waiting sequence: copies its cached prefix blocks.
    fn admit(&mut self, mut seq: Sequence) -> Result<Sequence, candle_core::Error> {
        let size = self.config.block_size as usize;
        // The last prompt token is always computed: its logits give the first output.
        let usable = (seq.prompt_len - 1) / size;
        let hashes: Vec<SequenceHash> =
            seq.blocks.sequence_hashes()[..usable.min(seq.blocks.full_blocks())].to_vec();
        let mut held = 0;
        for &hash in &hashes {
            if self.cache.touch(hash).is_none() {
                break;
            }
            held += 1;
        }
        // Room for the prompt and its first output at once; the output grows it by doubling.
        seq.kv.reserve(seq.prompt_len + 1)?;
        let blocks: Vec<&[(Tensor, Tensor)]> = hashes[..held]
            .iter()
            .filter_map(|h| self.cache.blocks.get(h).map(|b| b.kv.as_slice()))
            .collect();
        seq.kv.extend_from(&blocks, size)?;
        seq.cached_tokens = seq.kv.len() as u32;
        Ok(seq)
    }

    /// Offers a sequence's newly filled blocks to the cache.
    fn offer_blocks(&mut self, index: usize, events: &mut Vec<KvEvent>) {
        let size = self.config.block_size as usize;
        let seq = &self.running[index];
        let full = (seq.kv.len() / size).min(seq.blocks.full_blocks());
        if full <= seq.offered {
            return;
        }
        let from = seq.offered;
        let hashes = seq.blocks.sequence_hashes()[from..full].to_vec();
        let locals = seq.blocks.local_hashes()[from..full].to_vec();
        let parent = from.checked_sub(1).map(|p| seq.blocks.sequence_hashes()[p]);
        let mut stored = Vec::new();
        let mut evicted = Vec::new();
        for (i, (&hash, &local)) in hashes.iter().zip(&locals).enumerate() {
            if self.cache.blocks.contains_key(&hash) {
                self.cache.touch(hash);
                continue;
            }
            let kv = match self.running[index].kv.slice((from + i) * size, size) {
                Ok(kv) => kv,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot copy a block into the prefix cache");
                    break;
                }
            };
            evicted.extend(self.cache.insert(hash, CachedBlock { kv }));
            stored.push((
                from + i,
                StoredBlock {
                    seq_hash: hash,
                    local_hash: local,
                },
            ));
        }
        self.running[index].offered = full;
        if !evicted.is_empty() {
            let event = self.event(KvEventData::Removed {
                seq_hashes: evicted,
            });
            events.push(event);
        }
        // Stored blocks as chains: a run of consecutive blocks is one event.
        let all = self.running[index].blocks.sequence_hashes().to_vec();
        let mut run: Vec<StoredBlock> = Vec::new();
        let mut run_parent = parent;
        let mut last: Option<usize> = None;
        for (position, block) in stored {
            if last.is_some_and(|l| l + 1 != position) && !run.is_empty() {
                let event = self.event(KvEventData::Stored {
                    parent: run_parent,
                    blocks: std::mem::take(&mut run),
                });
                events.push(event);
            }
            if run.is_empty() {
                run_parent = position.checked_sub(1).map(|p| all[p]);
            }
            run.push(block);
            last = Some(position);
        }
        if !run.is_empty() {
            let event = self.event(KvEventData::Stored {
                parent: run_parent,
                blocks: run,
            });
            events.push(event);
        }
    }

    fn prefill_tokens_left(&self) -> u64 {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .map(|s| s.tokens.len().saturating_sub(s.kv.len()) as u64)
            .sum()
    }
}

/// The most tokens (from 1 to `max`) whose predicted prefill fits `target`; 1 when none
/// does.
pub fn step_tokens(perf: &PerfModel, target: std::time::Duration, max: u32) -> u32 {
    let target_ms = target.as_secs_f64() * 1e3;
    (1..=max.max(1))
        .rev()
        .find(|&t| perf.prefill_ms(t) <= target_ms)
        .unwrap_or(1)
}

/// Samples the next token from logits, as the request's sampling options say. The random
/// draw depends on the request's stream key and the output position only, so a resumed
/// request continues the same sequence.
pub fn sample(
    logits: &mut [f32],
    sampling: &SamplingParams,
    history: &[u32],
    key: u64,
    position: u32,
) -> u32 {
    for &(token, bias) in &sampling.logit_bias {
        if let Some(l) = logits.get_mut(token as usize) {
            *l += bias;
        }
    }
    for token in sampling.banned_tokens() {
        if let Some(l) = logits.get_mut(token as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
    let frequency = sampling.frequency_penalty.unwrap_or(0.0);
    let presence = sampling.presence_penalty.unwrap_or(0.0);
    if frequency != 0.0 || presence != 0.0 {
        let mut counts: rustc_hash::FxHashMap<u32, u32> = Default::default();
        for &t in history {
            *counts.entry(t).or_default() += 1;
        }
        for (t, n) in counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= frequency * n as f32 + presence;
            }
        }
    }
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i as u32)
    };
    let temperature = sampling.temperature.unwrap_or(1.0);
    if temperature <= 0.0 || sampling.top_k == Some(1) {
        return argmax();
    }
    let mut candidates: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l / temperature))
        .collect();
    if candidates.is_empty() {
        return argmax();
    }
    candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
    if let Some(k) = sampling.top_k.filter(|&k| k > 0) {
        candidates.truncate(k as usize);
    }
    let max = candidates[0].1;
    let mut probs: Vec<f32> = candidates.iter().map(|(_, l)| (l - max).exp()).collect();
    let total: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    if let Some(top_p) = sampling.top_p.filter(|&p| p < 1.0) {
        let mut mass = 0.0;
        let keep = probs
            .iter()
            .position(|&p| {
                mass += p;
                mass >= top_p
            })
            .map_or(probs.len(), |i| i + 1);
        probs.truncate(keep);
        let total: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
    }
    let mut rng =
        SmallRng::seed_from_u64(key ^ u64::from(position).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let draw: f32 = rng.random();
    let mut mass = 0.0;
    for (i, p) in probs.iter().enumerate() {
        mass += p;
        if draw < mass {
            return candidates[i].0;
        }
    }
    candidates[probs.len() - 1].0
}

impl StepEngine for CandleEngine {
    fn add(&mut self, request: GenerateRequest) -> Result<(), EngineError> {
        if !matches!(request.phase, Phase::Aggregated) {
            return Err(EngineError::Unsupported(
                "the candle engine serves aggregated requests only".into(),
            ));
        }
        if request.prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt is empty".into()));
        }
        if request.max_tokens == 0 {
            return Err(EngineError::Invalid("max_tokens must be at least 1".into()));
        }
        if let Some(&bad) = request
            .prompt
            .token_ids
            .iter()
            .find(|&&t| t as usize >= self.vocab)
        {
            return Err(EngineError::Invalid(format!(
                "token {bad} is outside the model's vocabulary of {}",
                self.vocab
            )));
        }
        let context = self.model.shape.context_length;
        if request.prompt.len() >= context {
            return Err(EngineError::Invalid(format!(
                "the prompt has {} tokens; the model's context is {context}",
                request.prompt.len()
            )));
        }
        if self
            .running
            .iter()
            .chain(&self.waiting)
            .any(|s| s.request.id == request.id)
        {
            return Err(EngineError::Invalid(format!(
                "request {} is already here",
                request.id
            )));
        }
        let blocks = blocks_for(&request.prompt, self.config.block_size)
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let spans = &request.prompt.media;
        let (mut media, mut hold, mut needs_cached) = (Vec::new(), None, 0);
        if !request.media_inputs.is_empty() {
            media = self.merge_inputs(&request)?;
        } else if request.media_pending && !spans.is_empty() {
            hold = Some(spans[0].offset as usize);
        } else if let Some(end) = spans.iter().map(|s| s.end() as usize).max() {
            // Only a cached prefix can stand for media it was not given.
            let size = self.config.block_size as usize;
            let usable = (request.prompt.len() - 1) / size;
            let cached =
                self.held_prefix(&blocks.sequence_hashes()[..usable.min(blocks.full_blocks())]);
            if (cached as usize) * size < end {
                return Err(EngineError::Unsupported(
                    "this engine merges media embeddings: the request carries none, and its media's KV is not cached here".into(),
                ));
            }
            needs_cached = end;
        }
        let tokens = request.prompt.token_ids.clone();
        self.waiting.push_back(Sequence {
            media,
            hold,
            needs_cached,
            prompt_len: tokens.len(),
            tokens,
            kv: SeqKv::new(&self.model.shape),
            blocks,
            offered: 0,
            cached_tokens: 0,
            generated: request.generated(),
            request,
        });
        Ok(())
    }

    fn cancel(&mut self, id: RequestId) -> bool {
        let before = self.running.len() + self.waiting.len();
        self.running.retain(|s| s.request.id != id);
        self.waiting.retain(|s| s.request.id != id);
        before != self.running.len() + self.waiting.len()
    }

    fn has_work(&self) -> bool {
        // Requests waiting at their media do nothing until they are sent again.
        self.running.iter().any(|s| !s.waits_for_media())
            || (!self.waiting.is_empty() && self.running.len() < self.config.max_num_seqs as usize)
    }

    fn step(
        &mut self,
        _now: std::time::Duration,
        tokens: &mut Vec<TokenOutput>,
        events: &mut Vec<KvEvent>,
    ) -> std::time::Duration {
        while self.running.len() < self.config.max_num_seqs as usize {
            let Some(seq) = self.waiting.pop_front() else {
                break;
            };
            match self.admit(seq) {
                Ok(seq) if seq.kv.len() < seq.needs_cached => {
                    // Its media's KV left the cache since it came: it goes elsewhere, or
                    // again with its embeddings.
                    tracing::info!(request = %seq.request.id, "the cached media a request relied on were evicted");
                    tokens.push(TokenOutput {
                        request: seq.request.id,
                        token: 0,
                        index: seq.generated,
                        cached_tokens: 0,
                        finish: Some(FinishReason::Cancelled),
                    });
                }
                Ok(seq) => self.running.push(seq),
                Err(e) => tracing::error!(error = %e, "cannot start a request"),
            }
        }
        // Decodes first (one token each), then prompt chunks in arrival order, within the
        // token budget and, once the pace is known, within the step time target: a long
        // prompt must not hold the running streams' next tokens for seconds (their clients,
        // and the frontend's stall detection, wait on them).
        let mut budget = self.config.max_batched_tokens as usize;
        let paced = match (&self.timing, self.per_token) {
            (Some((_, tokens)), _) => Some(*tokens as usize),
            (None, Some(per_token)) => {
                Some((self.config.step_target.as_secs_f64() / per_token) as usize)
            }
            (None, None) => None,
        };
        if let Some(paced) = paced {
            budget = budget.min(paced.max(self.running.len() + 16));
        }
        let mut plan: Vec<(usize, usize, usize)> = Vec::new(); // (index, from, to)
        for (i, seq) in self.running.iter().enumerate() {
            if !seq.prefilling() && budget > 0 {
                let from = seq.kv.len();
                plan.push((i, from, from + 1));
                budget -= 1;
            }
        }
        for (i, seq) in self.running.iter().enumerate() {
            if seq.prefilling() && budget > 0 && !seq.waits_for_media() {
                let from = seq.kv.len();
                let to = (from + budget)
                    .min(seq.tokens.len())
                    .min(seq.hold.unwrap_or(usize::MAX));
                budget -= to - from;
                plan.push((i, from, to));
            }
        }
        plan.sort_unstable_by_key(|&(i, _, _)| i);
        if plan.is_empty() {
            return std::time::Duration::ZERO;
        }
        let owned: Vec<Vec<u32>> = plan
            .iter()
            .map(|&(i, from, to)| self.running[i].tokens[from..to].to_vec())
            .collect();
        let wants: Vec<bool> = plan
            .iter()
            .map(|&(i, _, to)| to == self.running[i].tokens.len())
            .collect();
        let embeds: Result<Vec<Vec<(usize, Tensor)>>, _> = plan
            .iter()
            .map(|&(i, from, to)| self.running[i].embeds(from, to))
            .collect();
        let mut embeds = match embeds {
            Ok(embeds) => embeds.into_iter(),
            Err(e) => {
                tracing::error!(error = %e, "cannot slice media embeddings");
                return std::time::Duration::ZERO;
            }
        };
        let logits = {
            let mut kvs: Vec<(usize, &mut Sequence)> = self
                .running
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| plan.iter().any(|p| p.0 == *i))
                .collect();
            let mut inputs: Vec<StepInput<'_>> = kvs
                .iter_mut()
                .zip(owned.iter().zip(&wants))
                .map(|((_, seq), (tokens, &logits))| StepInput {
                    tokens,
                    kv: &mut seq.kv,
                    logits,
                    embeds: embeds.next().unwrap_or_default(),
                })
                .collect();
            let started = std::time::Instant::now();
            let computed: usize = inputs.iter().map(|i| i.tokens.len()).sum();
            let out = self.model.forward(&mut inputs);
            // Only steps of many tokens say what a token costs (a decode step is mostly the
            // fixed cost of reading the weights).
            if computed >= 32 {
                let sample = started.elapsed().as_secs_f64() / computed as f64;
                self.per_token = Some(match self.per_token {
                    Some(avg) => 0.7 * avg + 0.3 * sample,
                    None => sample,
                });
            }
            out
        };
        let logits = match logits {
            Ok(logits) => logits,
            Err(e) => {
                // Nothing to do but fail what was in the step.
                tracing::error!(error = %e, "the model failed a step; its requests end");
                let failed: Vec<usize> = plan.iter().map(|p| p.0).collect();
                for &i in failed.iter().rev() {
                    let seq = self.running.remove(i);
                    tokens.push(TokenOutput {
                        request: seq.request.id,
                        token: 0,
                        index: seq.generated,
                        cached_tokens: seq.cached_tokens,
                        finish: Some(FinishReason::Cancelled),
                    });
                }
                return std::time::Duration::ZERO;
            }
        };
        let context = self.model.shape.context_length;
        let mut finished = Vec::new();
        for (&(i, _, _), logits) in plan.iter().zip(logits) {
            let Some(mut logits) = logits else {
                continue;
            };
            let seq = &mut self.running[i];
            let history = &seq.tokens[seq.prompt_len..];
            let token = sample(
                &mut logits,
                &seq.request.sampling,
                history,
                seq.request.stream_key(),
                seq.generated,
            );
            let index = seq.generated;
            seq.generated += 1;
            seq.tokens.push(token);
            seq.blocks.extend(&[token]);
            let produced = seq.generated - seq.request.generated();
            let finish = if seq.request.sampling.stop_token_ids.contains(&token) {
                Some(FinishReason::Stop)
            } else if produced >= seq.request.max_tokens || seq.tokens.len() >= context {
                Some(FinishReason::Length)
            } else {
                None
            };
            tokens.push(TokenOutput {
                request: seq.request.id,
                token,
                index,
                cached_tokens: seq.cached_tokens,
                finish,
            });
            if finish.is_some() {
                finished.push(i);
            }
        }
        for i in 0..self.running.len() {
            self.offer_blocks(i, events);
        }
        for &i in finished.iter().rev() {
            self.running.remove(i);
        }
        std::time::Duration::ZERO
    }

    fn load(&self) -> LoadSnapshot {
        let size = self.config.block_size as usize;
        LoadSnapshot {
            waiting: self.waiting.len() as u32,
            running: self.running.len() as u32,
            active_blocks: self
                .running
                .iter()
                .map(|s| s.kv.len().div_ceil(size) as u64)
                .sum(),
            cached_blocks: self.cache.blocks.len() as u64,
            capacity_blocks: self.cache.budget_blocks as u64,
            active_prefill_tokens: self.prefill_tokens_left(),
        }
    }

    fn held_prefix(&self, blocks: &[SequenceHash]) -> u32 {
        blocks
            .iter()
            .take_while(|h| self.cache.blocks.contains_key(h))
            .count() as u32
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use switchyard_core::perf::Profile;

    use super::*;

    #[test]
    fn the_step_budget_is_the_most_tokens_that_fit_the_target() {
        // 10 ms plus 2 ms a token.
        let perf = PerfModel::from_profile(Profile {
            prefill_isl: vec![1.0, 1001.0],
            prefill_ttft_ms: vec![12.0, 2012.0],
            decode_active_kv_tokens: vec![1.0, 100.0],
            decode_context_length: vec![1.0, 100.0],
            decode_itl: vec![vec![5.0, 5.0], vec![5.0, 5.0]],
            mixed_step_saving: 0.0,
            prefill_context_ms: 0.0,
        })
        .unwrap();
        assert_eq!(step_tokens(&perf, Duration::from_millis(110), 512), 50);
        assert_eq!(step_tokens(&perf, Duration::from_millis(111), 512), 50);
        assert_eq!(step_tokens(&perf, Duration::from_millis(112), 512), 51);
        // Nothing fits: a token a step still moves.
        assert_eq!(step_tokens(&perf, Duration::from_millis(5), 512), 1);
        // Everything fits: the configured most.
        assert_eq!(step_tokens(&perf, Duration::from_secs(10), 512), 512);
        assert_eq!(step_tokens(&perf, Duration::from_secs(10), 0), 1);
    }
}
