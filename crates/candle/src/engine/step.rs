//! The engine as the worker's threaded driver runs it: requests added and cancelled, and
//! each step's plan (decodes first, then prompt chunks within the token budget), forward
//! pass, sampling and cache offers.

use candle_core::Tensor;
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateRequest, Phase, TokenLogprobs, TokenOutput,
};
use switchyard_core::{KvEvent, LoadSnapshot, RequestId, SequenceHash, blocks_for};
use switchyard_worker::driver::StepEngine;

use super::sequence::{PromptRows, Sequence};
use super::{CandleEngine, Distribution, sample};
use crate::model::{SeqKv, StepInput};

/// What takes a prompt's rows of logits in a step (see [`StepInput::rows`]).
type RowSink<'a> = Box<dyn FnMut(usize, &[f32]) + 'a>;

/// The most alternatives a step reports with a token's log probability (OpenAI's limit).
const MAX_TOP_LOGPROBS: u32 = 20;

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
        let guide = self.guide(&request)?;
        let tokens = request.prompt.token_ids.clone();
        // Never for a resumed request: its prompt's went out with its first token.
        let prompt_logprobs = request
            .sampling
            .prompt_logprobs
            .filter(|_| request.generated() == 0)
            .map(|n| (n.min(MAX_TOP_LOGPROBS), Vec::with_capacity(tokens.len())));
        self.waiting.push_back(Sequence {
            guide,
            prompt_logprobs,
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
                        logprobs: None,
                        prompt_logprobs: None,
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
        // The prompts whose log probabilities are asked take their rows' logits.
        let mut prompt_rows: Vec<Option<PromptRows>> = plan
            .iter()
            .map(|&(i, from, to)| PromptRows::of(&self.running[i], from, to))
            .collect();
        let mut sinks: Vec<Option<RowSink<'_>>> = prompt_rows
            .iter_mut()
            .map(|rows| {
                rows.as_mut().map(|rows| {
                    Box::new(move |row: usize, logits: &[f32]| rows.take(row, logits))
                        as RowSink<'_>
                })
            })
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
                .zip(sinks.iter_mut())
                .map(|(((_, seq), (tokens, &logits)), sink)| StepInput {
                    tokens,
                    kv: &mut seq.kv,
                    logits,
                    embeds: embeds.next().unwrap_or_default(),
                    rows: sink
                        .as_mut()
                        .map(|s| &mut **s as &mut dyn FnMut(usize, &[f32])),
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
                        logprobs: None,
                        prompt_logprobs: None,
                    });
                }
                return std::time::Duration::ZERO;
            }
        };
        drop(sinks);
        for (&(i, _, _), rows) in plan.iter().zip(prompt_rows) {
            if let (Some((_, so_far)), Some(rows)) =
                (self.running[i].prompt_logprobs.as_mut(), rows)
            {
                so_far.extend(rows.entries);
            }
        }
        let context = self.model.shape.context_length;
        let mut finished = Vec::new();
        for (&(i, _, _), logits) in plan.iter().zip(logits) {
            let Some(mut logits) = logits else {
                continue;
            };
            let seq = &mut self.running[i];
            // The model's own distribution, before constraints, biases and penalties.
            let distribution = seq.request.sampling.logprobs.map(|n| {
                (
                    Distribution::of(&logits, n.min(MAX_TOP_LOGPROBS) as usize),
                    logits.clone(),
                )
            });
            // Under a constraint, only what it allows next (a matcher that fails ends the
            // answer as cut short: never as complete).
            let mut broken = seq
                .guide
                .as_deref_mut()
                .is_some_and(|guide| guide.mask_logits(&mut logits).is_err());
            let history = &seq.tokens[seq.prompt_len..];
            let token = sample(
                &mut logits,
                &seq.request.sampling,
                history,
                seq.request.stream_key(),
                seq.generated,
            );
            if let Some(guide) = seq.guide.as_deref_mut() {
                broken |= guide.take(&[token]).is_err();
            }
            let done = seq
                .guide
                .as_deref()
                .is_some_and(|g| g.is_done() || token == g.eos());
            let index = seq.generated;
            // The prompt's log probabilities go with its first token.
            let prompt_logprobs = seq.prompt_logprobs.take().map(|(_, l)| Box::new(l));
            seq.generated += 1;
            seq.tokens.push(token);
            seq.blocks.extend(&[token]);
            let produced = seq.generated - seq.request.generated();
            let finish = if broken {
                Some(FinishReason::Length)
            } else if done || seq.request.sampling.stop_token_ids.contains(&token) {
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
                logprobs: distribution.map(|(d, raw)| {
                    Box::new(TokenLogprobs {
                        logprob: d.logprob(raw[token as usize]),
                        top: d.top,
                    })
                }),
                prompt_logprobs,
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
