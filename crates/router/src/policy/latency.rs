//! The `latency` policy: the worker where the request's first token comes soonest,
//! predicted from the worker's own timing model, with the harm the request does to the
//! work already there.

use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};

use super::choice::choose;
use super::{Candidate, Policy, PolicyKind, Selection, WorkerTiming};
use crate::InvalidConfig;

/// Settings of the `latency` policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LatencyPolicyConfig {
    /// Weight of the delay a request's prefill adds to the worker's running decodes
    /// (milliseconds of their inter-token latency, summed over them) against its own time
    /// to first token.
    pub itl_weight: f64,
    /// Weight of the request's own decoding (its output tokens, from `max_tokens`, times
    /// the worker's step time with it) against its time to first token; 0: not counted.
    pub output_weight: f64,
    /// Weight of the delay the request's prefill adds to the first token of the prefill
    /// queued before it on the worker: its tokens fill the budget of the queue's last
    /// step, which then takes longer.
    pub queue_delay_weight: f64,
    /// Milliseconds of cost per millisecond by which the worker's decode step with the
    /// request would exceed (1 + `decode_tail_margin`) × the candidates' mean decode step
    /// now: keeps requests off the workers whose decode batches make the fleet's slowest
    /// inter-token gaps, and changes nothing elsewhere.
    pub decode_tail_weight: f64,
    pub decode_tail_margin: f64,
    /// 0 picks the fastest worker; above 0 samples from a softmax over normalised costs.
    pub temperature: f64,
}

impl LatencyPolicyConfig {
    /// Checks the ranges serde cannot: every weight and the margin are numbers of at
    /// least 0 (a negative weight would reward the harm it is meant to price).
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        for (key, value) in [
            ("router.latency.itl_weight", self.itl_weight),
            ("router.latency.output_weight", self.output_weight),
            ("router.latency.queue_delay_weight", self.queue_delay_weight),
            ("router.latency.decode_tail_weight", self.decode_tail_weight),
            ("router.latency.decode_tail_margin", self.decode_tail_margin),
            ("router.latency.temperature", self.temperature),
        ] {
            InvalidConfig::check_at_least(key, value, 0.0)?;
        }
        Ok(())
    }
}

impl Default for LatencyPolicyConfig {
    fn default() -> Self {
        LatencyPolicyConfig {
            itl_weight: 0.1,
            output_weight: 0.0,
            queue_delay_weight: 0.5,
            decode_tail_weight: 100.0,
            decode_tail_margin: 0.2,
            temperature: 0.0,
        }
    }
}

/// Share of a worker's KV blocks the `latency` policy fills before it avoids the worker.
const MEMORY_LIMIT: f64 = 0.9;

/// The `latency` policy: the worker where the request's first token comes soonest, predicted
/// from the worker's own timing model.
///
/// predicted TTFT = the steps that compute the prefill already queued on the worker and
/// then this request's uncached tokens, in chunks of the worker's step budget, each step
/// also decoding the worker's running requests, less the time the worker has already spent
/// on its queue; cost = predicted TTFT + itl_weight × the delay those steps add to the
/// running decodes + queue_delay_weight × the delay they add to the first token of the
/// prefill queued before this one + decode_tail_weight × how far the worker's decode step
/// with the request would exceed (1 + decode_tail_margin) × the candidates' mean decode step.
/// A worker whose in-flight requests would hold more than 90 % of its KV blocks with this one
/// is chosen only when every worker is as full.
#[derive(Debug, Clone, Default)]
pub struct LatencyPolicy {
    pub config: LatencyPolicyConfig,
}

impl LatencyPolicy {
    /// The predicted time to first token on each candidate, in milliseconds, and the
    /// cost.
    pub fn predict(&self, s: &Selection<'_>, c: &Candidate) -> (f64, f64) {
        let fallback = WorkerTiming::default();
        let timing = s.timings.get(usize::from(c.timing)).unwrap_or(&fallback);
        let block_size = u64::from(s.block_size.max(1));
        let cached = u64::from(c.overlap_blocks) * block_size;
        let own = s.isl_tokens.saturating_sub(cached).max(1);
        let decode_ms = |decoding: u32| {
            timing.decode_step_ms(
                decoding,
                c.active_blocks * block_size,
                c.active_blocks + c.new_blocks,
            )
        };
        let prefill = |tokens: u64| timing.prefill_steps_ms(tokens);
        // The queued prefill, each of its steps also decoding the running requests (all
        // but the one prefilling). Just queued, this request's tokens share its last step;
        // once the worker has been at it a while, a step is under way and this request
        // waits for what is left of the queue, then prefills on its own; past the queue's
        // predicted time the queue is done and every request decodes.
        let queued = c.prefill_tokens;
        let prefilling = u32::from(queued > 0);
        let decoding = c.active_requests.saturating_sub(prefilling);
        let step_decode_ms = decode_ms(decoding);
        let (queued_ms, queued_steps) = prefill(queued);
        let queue_time = queued_ms + queued_steps as f64 * step_decode_ms;
        let elapsed = c.prefill_elapsed_ms;
        let (own_ms, own_steps) = prefill(own);
        let (ttft, decoding) = if queued == 0 || elapsed <= 0.0 {
            let (ms, steps) = prefill(queued + own);
            (ms + steps as f64 * step_decode_ms, decoding)
        } else {
            let remaining = (queue_time - elapsed).max(0.0);
            let decoding = if remaining > 0.0 {
                decoding
            } else {
                c.active_requests
            };
            (
                remaining + own_ms + own_steps as f64 * decode_ms(decoding),
                decoding,
            )
        };
        // What this request's own chunks add to every running decode's step time.
        let added = own_ms;
        let weight = self.config.itl_weight;
        let mut cost = ttft + weight * added * f64::from(decoding);
        // A queue not yet done ends in a step this request's tokens join (the engine fills
        // each step's budget in order), so that step, and the first token of the request
        // finishing in it, comes later by the time the added tokens take.
        let under_way = elapsed > 0.0 && queue_time <= elapsed;
        let budget = u64::from(timing.max_batched_tokens.max(1));
        let rest = queued % budget;
        if self.config.queue_delay_weight > 0.0 && rest > 0 && !under_way {
            let joined = (rest + own).min(budget);
            let delay = timing.perf.prefill_ms(joined as u32) - timing.perf.prefill_ms(rest as u32);
            cost += self.config.queue_delay_weight * delay;
        }
        if let Some(output) = s
            .overrides
            .max_tokens
            .filter(|_| self.config.output_weight > 0.0)
        {
            // Its own decoding there: every output token one step of the worker's batch
            // with it (its running requests and this one, the blocks with its own).
            let step = timing.decode_step_ms(
                c.active_requests + 1,
                (c.active_blocks + c.new_blocks) * block_size,
                c.active_blocks + c.new_blocks,
            );
            cost += self.config.output_weight * f64::from(output) * step;
        }
        // A worker whose KV would run short preempts or stalls, whatever the timing says:
        // past the limit, it is the last choice, the fuller the later.
        let pressure =
            (c.active_blocks + c.new_blocks) as f64 / timing.capacity_blocks.max(1) as f64;
        if pressure > MEMORY_LIMIT {
            cost += (pressure - MEMORY_LIMIT) * 1e9;
        }
        (ttft, cost)
    }
}

impl LatencyPolicy {
    /// Adds to each candidate's cost decode_tail_weight × how far its decode step with the
    /// request would exceed (1 + decode_tail_margin) × the candidates' mean decode step now.
    fn add_decode_tail(&self, s: &Selection<'_>, costs: &mut [f64]) {
        let weight = self.config.decode_tail_weight;
        if weight <= 0.0 || s.candidates.len() < 2 {
            return;
        }
        let fallback = WorkerTiming::default();
        let block_size = u64::from(s.block_size.max(1));
        let step = |c: &Candidate, requests: u32, blocks: u64| {
            s.timings
                .get(usize::from(c.timing))
                .unwrap_or(&fallback)
                .decode_step_ms(requests, blocks * block_size, blocks)
        };
        let mean = s
            .candidates
            .iter()
            .map(|c| step(c, c.active_requests.max(1), c.active_blocks))
            .sum::<f64>()
            / s.candidates.len() as f64;
        let limit = (1.0 + self.config.decode_tail_margin) * mean;
        for (cost, c) in costs.iter_mut().zip(s.candidates) {
            let with = step(c, c.active_requests + 1, c.active_blocks + c.new_blocks);
            *cost += weight * (with - limit).max(0.0);
        }
    }
}

impl Policy for LatencyPolicy {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Latency
    }

    fn select(&mut self, s: &Selection<'_>, rng: &mut SmallRng) -> Option<usize> {
        if s.candidates.is_empty() {
            return None;
        }
        let mut costs: Vec<f64> = s.candidates.iter().map(|c| self.predict(s, c).1).collect();
        self.add_decode_tail(s, &mut costs);
        choose(s, &costs, self.config.temperature, rng)
    }
}
