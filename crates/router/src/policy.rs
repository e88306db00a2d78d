//! Worker selection policies.
//!
//! Every policy sees the same [`Candidate`] rows (one per eligible worker) and picks one. The
//! `kv` policy is Switchyard's own; the others are baselines to compare it with.

use std::fmt;
use std::str::FromStr;

use rand::Rng;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};
use switchyard_core::perf::{PerfModel, StepShape};
use switchyard_core::{WorkerId, WorkerKey};
use thiserror::Error;

/// What a policy knows about one worker for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub worker: WorkerKey,
    /// Blocks of the request already cached on the worker (consecutive from the first).
    pub overlap_blocks: u32,
    /// Blocks cached on the worker in total (its tree size).
    pub cached_blocks: u64,
    /// Blocks held by the worker's in-flight requests.
    pub active_blocks: u64,
    /// Blocks of the request the worker's in-flight requests do not already hold.
    pub new_blocks: u64,
    /// Prefill tokens routed to the worker and not yet computed.
    pub prefill_tokens: u64,
    /// How long the worker has been computing the head of those tokens, in milliseconds
    /// (0 when none are queued).
    pub prefill_elapsed_ms: f64,
    /// In-flight requests on the worker.
    pub active_requests: u32,
    /// The worker's timing, an index into [`Selection::timings`].
    pub timing: u16,
}

/// How a worker's steps take time, for predicting latency: announced by the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerTiming {
    pub perf: PerfModel,
    /// Tokens one step computes at most (vLLM's `max_num_batched_tokens`).
    pub max_batched_tokens: u32,
    /// KV blocks the worker holds.
    pub capacity_blocks: u64,
}

impl Default for WorkerTiming {
    /// The mocker's defaults: the polynomial model, vLLM's 8,192-token steps, 16,384 blocks.
    fn default() -> Self {
        WorkerTiming {
            perf: PerfModel::Polynomial,
            max_batched_tokens: 8192,
            capacity_blocks: 16_384,
        }
    }
}

impl WorkerTiming {
    /// One step's decode time for `decoding` running sequences whose contexts hold
    /// `kv_tokens`, with `active_blocks` of the worker's KV in use, in milliseconds.
    pub fn decode_step_ms(&self, decoding: u32, kv_tokens: u64, active_blocks: u64) -> f64 {
        if decoding == 0 {
            return 0.0;
        }
        self.perf.decode_ms(&StepShape {
            decode_seqs: decoding,
            decode_kv_tokens: kv_tokens,
            active_blocks,
            capacity_blocks: self.capacity_blocks,
            ..StepShape::default()
        })
    }

    /// Prefill of `tokens` in steps of at most `max_batched_tokens`: milliseconds of
    /// prefill compute, and the number of steps.
    pub fn prefill_steps_ms(&self, tokens: u64) -> (f64, u64) {
        let budget = u64::from(self.max_batched_tokens.max(1));
        let (full, rest) = (tokens / budget, tokens % budget);
        let mut ms = full as f64 * self.perf.prefill_ms(budget as u32);
        if rest > 0 {
            ms += self.perf.prefill_ms(rest as u32);
        }
        (ms, full + u64::from(rest > 0))
    }
}

/// Per-request routing overrides.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct RoutingOverrides {
    pub policy: Option<PolicyKind>,
    pub overlap_weight: Option<f64>,
    pub temperature: Option<f64>,
    /// The worker the request goes to whenever it may take it (serving, not excluded),
    /// whatever the policy would choose: joint routing sends media it did not encode to the
    /// worker holding their KV.
    pub worker: Option<WorkerId>,
    /// The request goes ahead of its media (still being encoded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub media_pending: bool,
    /// The most tokens the request will generate (its `max_tokens`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

/// One request, as the policies see it.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    pub isl_tokens: u64,
    pub block_size: u32,
    pub candidates: &'a [Candidate],
    pub overrides: &'a RoutingOverrides,
    /// The workers' timings ([`Candidate::timing`] indexes them).
    pub timings: &'a [WorkerTiming],
}

/// A selection policy. Returns the index of the chosen candidate (`None` only when there
/// are no candidates).
pub trait Policy: Send + fmt::Debug {
    fn kind(&self) -> PolicyKind;
    fn select(&mut self, selection: &Selection<'_>, rng: &mut SmallRng) -> Option<usize>;
}

/// The policies, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    Kv,
    Latency,
    RoundRobin,
    Random,
    LeastLoaded,
    PowerOfTwo,
    CacheAware,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 7] = [
        PolicyKind::Kv,
        PolicyKind::Latency,
        PolicyKind::RoundRobin,
        PolicyKind::Random,
        PolicyKind::LeastLoaded,
        PolicyKind::PowerOfTwo,
        PolicyKind::CacheAware,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Kv => "kv",
            PolicyKind::Latency => "latency",
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::Random => "random",
            PolicyKind::LeastLoaded => "least-loaded",
            PolicyKind::PowerOfTwo => "power-of-two",
            PolicyKind::CacheAware => "cache-aware",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error(
    "unknown routing policy {0:?}; expected one of: kv, latency, round-robin, random, least-loaded, power-of-two, cache-aware"
)]
pub struct UnknownPolicy(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// Settings of the `kv` policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvPolicyConfig {
    /// Weight of prefill work against decode load in the cost.
    pub overlap_weight: f64,
    /// 0 picks the cheapest worker; above 0 samples from a softmax over normalised costs.
    pub temperature: f64,
}

impl Default for KvPolicyConfig {
    fn default() -> Self {
        KvPolicyConfig {
            overlap_weight: 1.0,
            temperature: 0.0,
        }
    }
}

/// Settings of the `latency` policy.
#[derive(Debug, Clone, Copy, PartialEq)]
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

/// Settings of the SGLang-style `cache-aware` policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheAwareConfig {
    /// Minimum fraction of the prompt cached on the best worker to route by cache.
    pub cache_threshold: f64,
    /// The load is imbalanced when max − min exceeds this many requests …
    pub balance_abs_threshold: u32,
    /// … and max exceeds min times this.
    pub balance_rel_threshold: f64,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        CacheAwareConfig {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
        }
    }
}

/// The `kv` policy: the worker where the request should finish soonest.
///
/// cost = overlap_weight × prefill_blocks + decode_blocks, with
/// prefill_blocks = (outstanding prefill tokens + max(isl − overlap × block_size, 0)) / block_size
/// and decode_blocks = active blocks + the request's blocks the worker does not hold yet.
#[derive(Debug, Clone, Default)]
pub struct KvPolicy {
    pub config: KvPolicyConfig,
}

impl KvPolicy {
    /// The cost of placing the request on each candidate.
    pub fn costs(&self, s: &Selection<'_>) -> Vec<f64> {
        let weight = s
            .overrides
            .overlap_weight
            .unwrap_or(self.config.overlap_weight);
        let block_size = f64::from(s.block_size.max(1));
        s.candidates
            .iter()
            .map(|c| {
                let cached_tokens = u64::from(c.overlap_blocks) * u64::from(s.block_size);
                let new_prefill = s.isl_tokens.saturating_sub(cached_tokens);
                let prefill_blocks = (c.prefill_tokens + new_prefill) as f64 / block_size;
                let decode_blocks = (c.active_blocks + c.new_blocks) as f64;
                weight * prefill_blocks + decode_blocks
            })
            .collect()
    }
}

impl Policy for KvPolicy {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Kv
    }

    fn select(&mut self, s: &Selection<'_>, rng: &mut SmallRng) -> Option<usize> {
        if s.candidates.is_empty() {
            return None;
        }
        choose(s, &self.costs(s), self.config.temperature, rng)
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

/// The cheapest candidate, or with a temperature above 0 (the request's, else `temperature`)
/// a softmax sample over the costs.
fn choose(s: &Selection<'_>, costs: &[f64], temperature: f64, rng: &mut SmallRng) -> Option<usize> {
    let temperature = s.overrides.temperature.unwrap_or(temperature);
    if temperature > 0.0 {
        return Some(softmax_sample(costs, temperature, rng));
    }
    cheapest(s, costs, rng)
}

/// The cheapest candidate; ties to the worker with less cached (more room), then at random.
fn cheapest(s: &Selection<'_>, costs: &[f64], rng: &mut SmallRng) -> Option<usize> {
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let cheapest: Vec<usize> = (0..costs.len())
        .filter(|&i| costs[i] - min <= 1e-9)
        .collect();
    let fewest_cached = cheapest
        .iter()
        .map(|&i| s.candidates[i].cached_blocks)
        .min()?;
    let tied: Vec<usize> = cheapest
        .into_iter()
        .filter(|&i| s.candidates[i].cached_blocks == fewest_cached)
        .collect();
    pick(&tied, rng)
}

/// Samples an index with probability ∝ exp(−normalised cost / T), costs normalised to [0, 1].
fn softmax_sample(costs: &[f64], temperature: f64, rng: &mut SmallRng) -> usize {
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = costs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let span = max - min;
    let weights: Vec<f64> = costs
        .iter()
        .map(|&c| {
            let normalised = if span > 0.0 { (c - min) / span } else { 0.0 };
            (-normalised / temperature).exp()
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let mut point = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if point < *w {
            return i;
        }
        point -= w;
    }
    costs.len() - 1
}

fn pick(indices: &[usize], rng: &mut SmallRng) -> Option<usize> {
    match indices.len() {
        0 => None,
        1 => Some(indices[0]),
        n => Some(indices[rng.random_range(0..n)]),
    }
}

/// Indices of the candidates minimising `key`.
fn argmin_all<K: Ord + Copy>(
    candidates: &[Candidate],
    key: impl Fn(&Candidate) -> K,
) -> Vec<usize> {
    let Some(best) = candidates.iter().map(&key).min() else {
        return Vec::new();
    };
    (0..candidates.len())
        .filter(|&i| key(&candidates[i]) == best)
        .collect()
}

/// Each worker in turn.
#[derive(Debug, Clone, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Policy for RoundRobin {
    fn kind(&self) -> PolicyKind {
        PolicyKind::RoundRobin
    }

    fn select(&mut self, s: &Selection<'_>, _rng: &mut SmallRng) -> Option<usize> {
        if s.candidates.is_empty() {
            return None;
        }
        let chosen = self.next % s.candidates.len();
        self.next = self.next.wrapping_add(1);
        Some(chosen)
    }
}

/// A uniformly random worker.
#[derive(Debug, Clone, Default)]
pub struct RandomPolicy;

impl Policy for RandomPolicy {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Random
    }

    fn select(&mut self, s: &Selection<'_>, rng: &mut SmallRng) -> Option<usize> {
        (!s.candidates.is_empty()).then(|| rng.random_range(0..s.candidates.len()))
    }
}

/// The worker with the fewest active blocks (then fewest requests, then at random).
#[derive(Debug, Clone, Default)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn kind(&self) -> PolicyKind {
        PolicyKind::LeastLoaded
    }

    fn select(&mut self, s: &Selection<'_>, rng: &mut SmallRng) -> Option<usize> {
        pick(
            &argmin_all(s.candidates, |c| (c.active_blocks, c.active_requests)),
            rng,
        )
    }
}

/// Two workers at random; the one with fewer active blocks.
#[derive(Debug, Clone, Default)]
pub struct PowerOfTwo;

impl Policy for PowerOfTwo {
    fn kind(&self) -> PolicyKind {
        PolicyKind::PowerOfTwo
    }

    fn select(&mut self, s: &Selection<'_>, rng: &mut SmallRng) -> Option<usize> {
        let n = s.candidates.len();
        match n {
            0 => None,
            1 => Some(0),
            _ => {
                let a = rng.random_range(0..n);
                let b = (a + rng.random_range(1..n)) % n;
                let load = |i: usize| {
                    (
                        s.candidates[i].active_blocks,
                        s.candidates[i].active_requests,
                    )
                };
                Some(if load(b) < load(a) { b } else { a })
            }
        }
    }
}

/// SGLang's cache-aware policy: shortest queue when the load is imbalanced; otherwise the
/// best cache match if it covers enough of the prompt, else the emptiest cache.
#[derive(Debug, Clone, Default)]
pub struct CacheAware {
    pub config: CacheAwareConfig,
}

impl Policy for CacheAware {
    fn kind(&self) -> PolicyKind {
        PolicyKind::CacheAware
    }

    fn select(&mut self, s: &Selection<'_>, rng: &mut SmallRng) -> Option<usize> {
        let loads = s.candidates.iter().map(|c| c.active_requests);
        let (min, max) = (loads.clone().min()?, loads.max()?);
        let imbalanced = max - min > self.config.balance_abs_threshold
            && f64::from(max) > self.config.balance_rel_threshold * f64::from(min);
        if imbalanced {
            return pick(&argmin_all(s.candidates, |c| c.active_requests), rng);
        }
        let best_overlap = s.candidates.iter().map(|c| c.overlap_blocks).max()?;
        let matched_tokens = u64::from(best_overlap) * u64::from(s.block_size);
        let match_rate = if s.isl_tokens == 0 {
            0.0
        } else {
            matched_tokens as f64 / s.isl_tokens as f64
        };
        if best_overlap > 0 && match_rate > self.config.cache_threshold {
            pick(
                &argmin_all(s.candidates, |c| std::cmp::Reverse(c.overlap_blocks)),
                rng,
            )
        } else {
            pick(&argmin_all(s.candidates, |c| c.cached_blocks), rng)
        }
    }
}

/// Builds a policy by kind.
pub fn build(
    kind: PolicyKind,
    kv: KvPolicyConfig,
    latency: LatencyPolicyConfig,
    cache_aware: CacheAwareConfig,
) -> Box<dyn Policy> {
    match kind {
        PolicyKind::Kv => Box::new(KvPolicy { config: kv }),
        PolicyKind::Latency => Box::new(LatencyPolicy { config: latency }),
        PolicyKind::RoundRobin => Box::new(RoundRobin::default()),
        PolicyKind::Random => Box::new(RandomPolicy),
        PolicyKind::LeastLoaded => Box::new(LeastLoaded),
        PolicyKind::PowerOfTwo => Box::new(PowerOfTwo),
        PolicyKind::CacheAware => Box::new(CacheAware {
            config: cache_aware,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn worker(i: u64) -> WorkerKey {
        WorkerKey::new(i, 0)
    }

    fn cand(i: u64) -> Candidate {
        Candidate {
            worker: worker(i),
            overlap_blocks: 0,
            cached_blocks: 0,
            active_blocks: 0,
            new_blocks: 0,
            prefill_tokens: 0,
            prefill_elapsed_ms: 0.0,
            active_requests: 0,
            timing: 0,
        }
    }

    fn select(
        policy: &mut dyn Policy,
        isl: u64,
        candidates: &[Candidate],
        overrides: RoutingOverrides,
        seed: u64,
    ) -> usize {
        let mut rng = SmallRng::seed_from_u64(seed);
        let s = Selection {
            isl_tokens: isl,
            block_size: 16,
            candidates,
            overrides: &overrides,
            timings: &[],
        };
        policy.select(&s, &mut rng).expect("a candidate")
    }

    #[test]
    fn kv_cost_follows_the_formula() {
        // 160-token prompt (10 blocks). A caches 6 blocks but is busy; B is idle.
        let a = Candidate {
            overlap_blocks: 6,
            active_blocks: 20,
            new_blocks: 4,
            prefill_tokens: 32,
            ..cand(0)
        };
        let b = Candidate {
            new_blocks: 10,
            ..cand(1)
        };
        let policy = KvPolicy::default();
        let overrides = RoutingOverrides::default();
        let s = Selection {
            isl_tokens: 160,
            block_size: 16,
            candidates: &[a, b],
            overrides: &overrides,
            timings: &[],
        };
        // A: prefill (32 + 160 - 96) / 16 = 6, decode 20 + 4 = 24 -> 30.
        // B: prefill 160 / 16 = 10, decode 0 + 10 = 10 -> 20.
        assert_eq!(policy.costs(&s), vec![30.0, 20.0]);
        let mut p = KvPolicy::default();
        assert_eq!(select(&mut p, 160, &[a, b], overrides, 0), 1);
    }

    #[test]
    fn kv_prefers_cache_when_load_is_equal_and_weight_shifts_the_balance() {
        let a = Candidate {
            overlap_blocks: 8,
            active_blocks: 10,
            new_blocks: 2,
            ..cand(0)
        };
        let b = Candidate {
            overlap_blocks: 0,
            active_blocks: 5,
            new_blocks: 10,
            ..cand(1)
        };
        let mut p = KvPolicy::default();
        // A: 2 + 12 = 14; B: 10 + 15 = 25.
        assert_eq!(
            select(&mut p, 160, &[a, b], RoutingOverrides::default(), 0),
            0
        );
        // Decode-heavy weighting (prefill barely counts) favours the less loaded B:
        // A: 0.1 * 2 + 12 = 12.2; B: 0.1 * 10 + 15 = 16 -> still A; lower B's load.
        let b_idle = Candidate {
            active_blocks: 0,
            ..b
        };
        let light = RoutingOverrides {
            overlap_weight: Some(0.1),
            ..RoutingOverrides::default()
        };
        // A: 12.2; B: 1 + 10 = 11 -> B.
        assert_eq!(select(&mut p, 160, &[a, b_idle], light, 0), 1);
        // With full weight A wins again: A 14, B 20.
        assert_eq!(
            select(&mut p, 160, &[a, b_idle], RoutingOverrides::default(), 0),
            0
        );
    }

    #[test]
    fn kv_ties_go_to_the_smaller_tree_then_random() {
        let a = Candidate {
            cached_blocks: 500,
            ..cand(0)
        };
        let b = Candidate {
            cached_blocks: 100,
            ..cand(1)
        };
        let c = Candidate {
            cached_blocks: 100,
            ..cand(2)
        };
        let mut p = KvPolicy::default();
        let mut seen = [0usize; 3];
        for seed in 0..200 {
            seen[select(&mut p, 64, &[a, b, c], RoutingOverrides::default(), seed)] += 1;
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1] > 50 && seen[2] > 50, "{seen:?}");
    }

    #[test]
    fn kv_temperature_samples_cheaper_workers_more_often() {
        let cheap = Candidate {
            active_blocks: 0,
            ..cand(0)
        };
        let dear = Candidate {
            active_blocks: 100,
            ..cand(1)
        };
        let mut p = KvPolicy::default();
        let mut count = |t: f64| {
            let o = RoutingOverrides {
                temperature: Some(t),
                ..RoutingOverrides::default()
            };
            let mut rng = SmallRng::seed_from_u64(7);
            let s = Selection {
                isl_tokens: 64,
                block_size: 16,
                candidates: &[cheap, dear],
                overrides: &o,
                timings: &[],
            };
            (0..2000)
                .filter(|_| p.select(&s, &mut rng) == Some(1))
                .count()
        };
        // Softmax of normalised costs {0, 1}: P(dear) = e^(-1/T) / (1 + e^(-1/T)).
        let hot = count(10.0); // ≈ 0.475
        let cool = count(0.25); // ≈ 0.018
        assert!((850..1050).contains(&hot), "{hot}");
        assert!(cool < 80, "{cool}");
        // Temperature 0 is deterministic.
        assert_eq!(count(0.0), 0);
    }

    #[test]
    fn round_robin_cycles() {
        let cs = [cand(0), cand(1), cand(2)];
        let mut p = RoundRobin::default();
        let picks: Vec<usize> = (0..6)
            .map(|i| select(&mut p, 10, &cs, RoutingOverrides::default(), i))
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn random_reaches_every_worker() {
        let cs = [cand(0), cand(1), cand(2), cand(3)];
        let mut p = RandomPolicy;
        let mut rng = SmallRng::seed_from_u64(1);
        let o = RoutingOverrides::default();
        let s = Selection {
            isl_tokens: 1,
            block_size: 16,
            candidates: &cs,
            overrides: &o,
            timings: &[],
        };
        let seen: std::collections::HashSet<usize> =
            (0..100).filter_map(|_| p.select(&s, &mut rng)).collect();
        assert_eq!(seen.len(), 4);
    }

    #[test]
    fn least_loaded_and_power_of_two_avoid_load() {
        let cs = [
            Candidate {
                active_blocks: 50,
                ..cand(0)
            },
            Candidate {
                active_blocks: 10,
                active_requests: 3,
                ..cand(1)
            },
            Candidate {
                active_blocks: 10,
                active_requests: 1,
                ..cand(2)
            },
        ];
        assert_eq!(
            select(&mut LeastLoaded, 10, &cs, RoutingOverrides::default(), 0),
            2
        );
        // With two candidates, power-of-two compares both and takes the lighter.
        let two = [cs[0], cs[1]];
        for seed in 0..20 {
            assert_eq!(
                select(&mut PowerOfTwo, 10, &two, RoutingOverrides::default(), seed),
                1
            );
        }
        // With three, it never picks the heaviest unless both samples... it samples two
        // distinct ones, so the heaviest can never win.
        for seed in 0..50 {
            assert_ne!(
                select(&mut PowerOfTwo, 10, &cs, RoutingOverrides::default(), seed),
                0
            );
        }
    }

    #[test]
    fn cache_aware_follows_sglang_rules() {
        let mut p = CacheAware::default();
        // Balanced load, 50% of a 160-token prompt cached on worker 1: route by cache.
        let cs = [
            Candidate {
                cached_blocks: 10,
                active_requests: 5,
                ..cand(0)
            },
            Candidate {
                overlap_blocks: 5,
                cached_blocks: 900,
                active_requests: 6,
                ..cand(1)
            },
        ];
        assert_eq!(select(&mut p, 160, &cs, RoutingOverrides::default(), 0), 1);
        // Only 20% cached (below the 0.3 threshold): the emptiest cache wins.
        let low = [
            cs[0],
            Candidate {
                overlap_blocks: 2,
                ..cs[1]
            },
        ];
        assert_eq!(select(&mut p, 160, &low, RoutingOverrides::default(), 0), 0);
        // Imbalanced (max - min = 100 > 64 and 110 > 1.5 * 10): shortest queue regardless.
        let busy = [
            Candidate {
                active_requests: 10,
                ..cs[0]
            },
            Candidate {
                active_requests: 110,
                ..cs[1]
            },
        ];
        assert_eq!(
            select(&mut p, 160, &busy, RoutingOverrides::default(), 0),
            0
        );
        // A gap over 64 that is not 1.5× is not imbalance: cache wins.
        let wide = [
            Candidate {
                active_requests: 200,
                ..cs[0]
            },
            Candidate {
                active_requests: 270,
                ..cs[1]
            },
        ];
        assert_eq!(
            select(&mut p, 160, &wide, RoutingOverrides::default(), 0),
            1
        );
    }

    #[test]
    fn policies_parse_by_name() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.name().parse::<PolicyKind>(), Ok(kind));
        }
        let err = "fastest".parse::<PolicyKind>().unwrap_err();
        assert!(err.to_string().contains("round-robin"));
    }

    fn latency_select(
        candidates: &[Candidate],
        timings: &[WorkerTiming],
        isl: u64,
        itl_weight: f64,
    ) -> (usize, Vec<f64>) {
        let overrides = RoutingOverrides::default();
        let s = Selection {
            isl_tokens: isl,
            block_size: 16,
            candidates,
            overrides: &overrides,
            timings,
        };
        let mut policy = LatencyPolicy {
            config: LatencyPolicyConfig {
                itl_weight,
                ..LatencyPolicyConfig::default()
            },
        };
        let ttfts = candidates.iter().map(|c| policy.predict(&s, c).0).collect();
        let mut rng = SmallRng::seed_from_u64(1);
        (policy.select(&s, &mut rng).unwrap(), ttfts)
    }

    #[test]
    fn latency_predicts_prefill_queue_and_decode_from_the_model() {
        let m = PerfModel::Polynomial;
        let timings = [WorkerTiming::default()];
        // Idle: exactly the prefill of the uncached tokens.
        let idle = cand(1);
        let cached = Candidate {
            overlap_blocks: 50,
            ..cand(2)
        };
        let (chosen, ttft) = latency_select(&[idle, cached], &timings, 1600, 0.0);
        assert_eq!(chosen, 1, "the cache hit is faster");
        assert!((ttft[0] - m.prefill_ms(1600)).abs() < 1e-9);
        assert!((ttft[1] - m.prefill_ms(800)).abs() < 1e-9);
        // The cache hit behind 20,000 queued prompt tokens (three chunks of 8,192 and a
        // rest, each step also decoding the 4 running requests) loses to an idle worker.
        let busy = Candidate {
            prefill_tokens: 20_000,
            active_requests: 5,
            active_blocks: 1_000,
            ..cached
        };
        let (chosen, ttft) = latency_select(&[idle, busy], &timings, 1600, 0.0);
        assert_eq!(chosen, 0);
        let decode = m.decode_ms(&StepShape {
            decode_seqs: 4,
            decode_kv_tokens: 16_000,
            active_blocks: 1_000,
            capacity_blocks: 16_384,
            ..StepShape::default()
        });
        let expected = 2.0 * m.prefill_ms(8192) + m.prefill_ms(20_800 - 16_384) + 3.0 * decode;
        assert!(
            (ttft[1] - expected).abs() < 1e-6,
            "{} vs {expected}",
            ttft[1]
        );
    }

    #[test]
    fn a_long_answer_weighs_the_workers_decode_step_when_output_weight_is_set() {
        let timings = [WorkerTiming::default()];
        // A: idle for prefill but decoding a large batch over many blocks (a slow step);
        // B: a short prefill queued, a light batch.
        let a = Candidate {
            active_requests: 200,
            active_blocks: 12_000,
            ..cand(1)
        };
        let b = Candidate {
            prefill_tokens: 3_000,
            active_requests: 2,
            active_blocks: 100,
            ..cand(2)
        };
        let choose = |output_weight: f64, max_tokens: Option<u32>| {
            let overrides = RoutingOverrides {
                max_tokens,
                ..RoutingOverrides::default()
            };
            let candidates = [a, b];
            let s = Selection {
                isl_tokens: 1_000,
                block_size: 16,
                candidates: &candidates,
                overrides: &overrides,
                timings: &timings,
            };
            let mut policy = LatencyPolicy {
                config: LatencyPolicyConfig {
                    itl_weight: 0.0,
                    output_weight,
                    decode_tail_weight: 0.0,
                    ..LatencyPolicyConfig::default()
                },
            };
            policy.select(&s, &mut SmallRng::seed_from_u64(1)).unwrap()
        };
        // By time to first token alone, A.
        assert_eq!(choose(0.0, Some(2_000)), 0);
        // A long answer is worth B's queue; a short one is not.
        assert_eq!(choose(0.05, Some(2_000)), 1);
        assert_eq!(choose(0.05, Some(4)), 0);
        // Without max_tokens the term is not counted.
        assert_eq!(choose(0.05, None), 0);
    }

    /// The latency policy's choice among `candidates` and their costs, with `config`.
    fn latency_costs(
        config: LatencyPolicyConfig,
        candidates: &[Candidate],
        isl: u64,
    ) -> (usize, Vec<f64>) {
        let timings = [WorkerTiming::default()];
        let overrides = RoutingOverrides::default();
        let s = Selection {
            isl_tokens: isl,
            block_size: 16,
            candidates,
            overrides: &overrides,
            timings: &timings,
        };
        let mut policy = LatencyPolicy { config };
        let costs = candidates.iter().map(|c| policy.predict(&s, c).1).collect();
        let chosen = policy.select(&s, &mut SmallRng::seed_from_u64(1)).unwrap();
        (chosen, costs)
    }

    #[test]
    fn latency_counts_the_delay_a_request_adds_to_the_prefill_queued_before_it() {
        let m = PerfModel::Polynomial;
        // A: idle, 1,504 tokens to compute. B: 496 tokens just queued, then 896 of this
        // request's own, sooner by its own time to first token (one step of 1,392 tokens).
        let a = Candidate {
            overlap_blocks: 56,
            ..cand(1)
        };
        let b = Candidate {
            overlap_blocks: 94,
            prefill_tokens: 496,
            active_requests: 1,
            ..cand(2)
        };
        let without = LatencyPolicyConfig {
            queue_delay_weight: 0.0,
            ..LatencyPolicyConfig::default()
        };
        let (chosen, costs) = latency_costs(without, &[a, b], 2_400);
        assert_eq!(chosen, 1);
        assert!((costs[1] - m.prefill_ms(1_392)).abs() < 1e-9);
        // But its 896 tokens join the queued request's step, whose first token then comes
        // later by the time they take.
        let config = LatencyPolicyConfig::default();
        let (chosen, with) = latency_costs(config, &[a, b], 2_400);
        assert_eq!(chosen, 0);
        let delay = m.prefill_ms(1_392) - m.prefill_ms(496);
        assert!((with[1] - costs[1] - config.queue_delay_weight * delay).abs() < 1e-9);
        assert!((with[0] - costs[0]).abs() < 1e-9, "nothing queued on A");
        // A queue whose last step is full, or one already done, is not delayed.
        for queue in [
            Candidate {
                prefill_tokens: 8_192,
                ..b
            },
            Candidate {
                prefill_elapsed_ms: 1_000.0,
                ..b
            },
        ] {
            let (_, without) = latency_costs(
                LatencyPolicyConfig {
                    queue_delay_weight: 0.0,
                    ..config
                },
                &[queue],
                2_400,
            );
            let (_, with) = latency_costs(config, &[queue], 2_400);
            assert!((with[0] - without[0]).abs() < 1e-9, "{queue:?}");
        }
    }

    #[test]
    fn latency_keeps_requests_off_a_worker_whose_decode_step_would_lead_the_fleet() {
        // A holds most of the prompt and is the soonest to a first token, but decodes on
        // 3,000 of its 16,384 blocks while B and C are idle.
        let a = Candidate {
            overlap_blocks: 150,
            active_blocks: 3_000,
            new_blocks: 50,
            active_requests: 1,
            ..cand(1)
        };
        let idle = |i| Candidate {
            new_blocks: 200,
            ..cand(i)
        };
        let without = LatencyPolicyConfig {
            decode_tail_weight: 0.0,
            ..LatencyPolicyConfig::default()
        };
        let candidates = [a, idle(2), idle(3)];
        assert_eq!(latency_costs(without, &candidates, 3_200).0, 0);
        let (chosen, _) = latency_costs(LatencyPolicyConfig::default(), &candidates, 3_200);
        assert_ne!(chosen, 0, "A's step would be well above the fleet's");
        // Where every worker decodes as much, A's step is the fleet's: the cache wins.
        let busy = |i| Candidate {
            active_blocks: 3_000,
            active_requests: 1,
            ..idle(i)
        };
        let candidates = [a, busy(2), busy(3)];
        assert_eq!(
            latency_costs(LatencyPolicyConfig::default(), &candidates, 3_200).0,
            0
        );
    }

    #[test]
    fn latency_counts_the_queue_work_already_done() {
        let m = PerfModel::Polynomial;
        let timings = [WorkerTiming::default()];
        let fresh = Candidate {
            prefill_tokens: 8_192,
            active_requests: 1,
            ..cand(1)
        };
        let queue_ms = m.prefill_ms(8_192);
        // Half-way through the queue: half of it is left to wait for.
        let half = Candidate {
            prefill_elapsed_ms: queue_ms / 2.0,
            ..fresh
        };
        // Longer than predicted: the queue is done, and its request decodes alongside.
        let overdue = Candidate {
            prefill_elapsed_ms: queue_ms * 10.0,
            ..fresh
        };
        let (chosen, ttft) = latency_select(&[fresh, half, overdue], &timings, 1_600, 0.0);
        assert_eq!(chosen, 2);
        let own = m.prefill_ms(1_600);
        assert!((ttft[0] - (queue_ms + own)).abs() < 1e-6);
        assert!((ttft[1] - (queue_ms / 2.0 + own)).abs() < 1e-6);
        let decode_one = m.decode_ms(&StepShape {
            decode_seqs: 1,
            capacity_blocks: 16_384,
            ..StepShape::default()
        });
        assert!(
            (ttft[2] - (own + decode_one)).abs() < 1e-6,
            "{} vs {own} + {decode_one}",
            ttft[2]
        );
        // A short prefill under way: the step running it must end before this request's
        // tokens start, so an idle worker is sooner whatever the elapsed time.
        for elapsed in [1.0, 5.0, 16.0, 100.0] {
            let short = Candidate {
                prefill_tokens: 20,
                active_requests: 1,
                prefill_elapsed_ms: elapsed,
                ..cand(3)
            };
            let (chosen, _) = latency_select(&[short, cand(4)], &timings, 200, 0.1);
            assert_eq!(chosen, 1, "after {elapsed} ms");
        }
    }

    #[test]
    fn latency_uses_each_workers_own_model_and_protects_running_decodes() {
        let slow = WorkerTiming::default();
        let fast = WorkerTiming {
            perf: PerfModel::from_profile(switchyard_core::perf::Profile {
                prefill_isl: vec![0.0, 10_000.0],
                prefill_ttft_ms: vec![1.0, 100.0],
                decode_active_kv_tokens: vec![0.0, 100_000.0],
                decode_context_length: vec![1.0, 10_000.0],
                decode_itl: vec![vec![2.0, 2.0], vec![4.0, 4.0]],
                mixed_step_saving: 0.0,
                prefill_context_ms: 0.0,
            })
            .unwrap(),
            ..WorkerTiming::default()
        };
        let on_slow = cand(1);
        let on_fast = Candidate {
            timing: 1,
            ..cand(2)
        };
        let (chosen, ttft) = latency_select(&[on_slow, on_fast], &[slow, fast], 4000, 0.0);
        assert_eq!(chosen, 1);
        assert!((ttft[1] - 40.6).abs() < 1e-9, "{ttft:?}");
        // A worker decoding 100 requests: a little faster for this request's first token,
        // but its prefill would stall all of them; with an ITL weight the idle one wins.
        let crowded = Candidate {
            active_requests: 100,
            active_blocks: 200,
            overlap_blocks: 40,
            ..cand(3)
        };
        let idle = cand(4);
        let timings = [WorkerTiming::default()];
        assert_eq!(latency_select(&[crowded, idle], &timings, 4000, 0.0).0, 0);
        assert_eq!(latency_select(&[crowded, idle], &timings, 4000, 0.01).0, 1);
    }

    #[test]
    fn latency_avoids_a_worker_whose_cache_would_overflow() {
        let timings = [WorkerTiming::default()];
        // The cache hit sits on a worker at 95 % of its blocks: the idle one is chosen,
        // unless every worker is that full, then the least full.
        let full = Candidate {
            overlap_blocks: 100,
            active_blocks: 15_600,
            ..cand(1)
        };
        let idle = cand(2);
        assert_eq!(latency_select(&[full, idle], &timings, 1600, 0.1).0, 1);
        let fuller = Candidate {
            active_blocks: 16_000,
            ..cand(3)
        };
        assert_eq!(latency_select(&[fuller, full], &timings, 1600, 0.1).0, 1);
    }
}
