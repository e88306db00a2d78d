//! One step: the running requests' next tokens (preempting when blocks run out), waiting
//! requests admitted, the batch timed, and its tokens sampled.

use std::time::Duration;

use rustc_hash::FxHashMap;
use switchyard_core::protocol::{FinishReason, TokenOutput};
use switchyard_core::{KvEvent, StorageTier};

use super::alloc::{allocate, release};
use super::{MockEngine, StepOutput};
use crate::config::PreemptionMode;
use crate::logprobs::logprobs;
use crate::perf::StepShape;
use crate::tokens::{TokenRules, token_guided, token_under};

impl MockEngine {
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
            let position = seq.num_tokens();
            // What the constraint allows here, for the log probabilities (before the draw
            // takes a token).
            let allowed = match (seq.logprobs, seq.guide.as_deref_mut()) {
                (Some(_), Some(guide)) => guide.allowed().ok(),
                _ => None,
            };
            let drawn = match seq.guide.as_deref_mut() {
                None => Ok(token_under(
                    self.seed,
                    seq.stream_key,
                    position,
                    &seq.rules,
                    &seq.counts,
                )),
                Some(guide) => token_guided(
                    self.seed,
                    seq.stream_key,
                    position,
                    &seq.rules,
                    &seq.counts,
                    guide,
                    (
                        seq.output_offset + seq.generated,
                        seq.output_offset + seq.max_output_tokens,
                    ),
                ),
            };
            // A constraint's end is the answer's end; a draw its matcher could not make
            // (never expected) ends the answer as cut short, never as complete.
            let (token, ended) = match (drawn, seq.guide.as_deref()) {
                (Ok(token), Some(guide)) if token == guide.eos() => {
                    (token, Some(FinishReason::Stop))
                }
                (Ok(token), _) => (token, None),
                (Err(eos), _) => (eos, Some(FinishReason::Length)),
            };
            let prompt_logprobs = seq.prompt_logprobs.take().map(|(n, prompt)| {
                let plain = (TokenRules::default(), FxHashMap::default());
                Box::new(
                    prompt
                        .iter()
                        .skip(1)
                        .map(|&token| logprobs(&plain.0, &plain.1, None, token, n))
                        .collect(),
                )
            });
            let logprobs = seq.logprobs.map(|n| {
                let allowed = allowed.as_deref();
                Box::new(logprobs(&seq.rules, &seq.counts, allowed, token, n))
            });
            if seq.rules.reshapes() {
                *seq.counts.entry(token).or_insert(0) += 1;
            }
            let finish = if ended.is_some() {
                ended
            } else if seq.stop_token_ids.contains(&token) {
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
                logprobs,
                prompt_logprobs,
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
}
