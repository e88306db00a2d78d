//! The router: active sequences plus a policy, deciding where each request goes.
//!
//! The indexer is kept outside (callers pass its [`OverlapScores`]) so that it can be
//! shared between threads while the router itself stays a plain state machine.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};
use switchyard_core::{RequestId, SequenceHash, WorkerKey};
use thiserror::Error;

use crate::active::{ActiveError, ActiveSequences, WorkerLoad};
use crate::indexer::OverlapScores;
use crate::indexer::approx::ApproxConfig;
use crate::policy::{
    self, CacheAwareConfig, Candidate, KvPolicyConfig, LatencyPolicyConfig, Policy, PolicyKind,
    PolicySettings, RoutingOverrides, Selection, WorkerTiming,
};

/// Which cache view workers get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheViewMode {
    /// Events for workers that publish them, the approximate view for the others.
    #[default]
    Auto,
    /// The approximate view for every worker, whatever it publishes (how a router without
    /// an event plane, such as SGLang's, sees the fleet).
    Approximate,
}

/// Router settings: `[frontend.router]` in a configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// Tokens per KV block prompts are cut into until a worker announces its own (every
    /// worker of a model shares one): set by the workers, not configured.
    #[serde(skip)]
    pub block_size: u32,
    /// The policy used when a request does not name one.
    pub policy: PolicyKind,
    /// Seed of the random choices (ties, sampling, random policies).
    pub seed: u64,
    /// Requests active longer than this are presumed lost and freed.
    #[serde(with = "humantime_serde")]
    pub request_ttl: Duration,
    /// `auto`: each worker seen through its KV events if it publishes them, else through
    /// what was routed to it; `approximate`: every worker through what was routed to it.
    pub cache_view: CacheViewMode,
    /// The view of workers seen through what was routed to them.
    pub approx: ApproxConfig,
    /// The `kv` policy's settings.
    pub kv: KvPolicyConfig,
    /// The `latency` policy's settings.
    pub latency: LatencyPolicyConfig,
    /// The `cache-aware` policy's settings.
    pub cache_aware: CacheAwareConfig,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            block_size: 16,
            policy: PolicyKind::Latency,
            seed: 0,
            request_ttl: Duration::from_secs(600),
            cache_view: CacheViewMode::Auto,
            approx: ApproxConfig::default(),
            kv: KvPolicyConfig::default(),
            latency: LatencyPolicyConfig::default(),
            cache_aware: CacheAwareConfig::default(),
        }
    }
}

impl RouterConfig {
    /// Checks values serde cannot; names the key under `[frontend.router]`.
    pub fn validate(&self) -> Result<(), crate::InvalidConfig> {
        self.kv.validate()?;
        self.latency.validate()?;
        self.cache_aware.validate()?;
        if self.request_ttl.is_zero() {
            return Err(crate::InvalidConfig::new(
                "router.request_ttl",
                "must be longer than zero",
            ));
        }
        if self.approx.ttl.is_zero() {
            return Err(crate::InvalidConfig::new(
                "router.approx.ttl",
                "must be longer than zero",
            ));
        }
        if self.approx.max_blocks_per_worker == 0 {
            return Err(crate::InvalidConfig::new(
                "router.approx.max_blocks_per_worker",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

/// A request to route.
#[derive(Debug, Clone, Copy)]
pub struct RouteRequest<'a> {
    pub id: RequestId,
    /// Prompt length in tokens.
    pub isl_tokens: u64,
    /// Sequence hashes of the prompt's full blocks, from the first.
    pub seq_hashes: &'a [SequenceHash],
    pub overrides: RoutingOverrides,
}

/// Where a request goes, and why.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteDecision {
    pub worker: WorkerKey,
    pub policy: PolicyKind,
    /// Blocks of the prompt already cached on the chosen worker.
    pub overlap_blocks: u32,
    /// Prompt tokens the chosen worker must compute.
    pub prefill_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RouteError {
    #[error("no worker is available")]
    NoWorkers,
    #[error(transparent)]
    Active(#[from] ActiveError),
}

/// Chooses workers and tracks what they are busy with.
#[derive(Debug)]
pub struct Router {
    config: RouterConfig,
    active: ActiveSequences,
    /// Sorted, so candidate order (and round-robin) is stable.
    workers: Vec<WorkerKey>,
    policies: Vec<Box<dyn Policy>>,
    /// The distinct timings the workers announced (the first: the default).
    timings: Vec<WorkerTiming>,
    /// Each worker's, as an index into `timings` (absent: the default).
    timing_of: rustc_hash::FxHashMap<WorkerKey, u16>,
    rng: SmallRng,
}

impl Router {
    /// Sets the tokens per KV block, when the workers tell (every worker of a model shares
    /// it).
    pub fn set_block_size(&mut self, block_size: u32) {
        self.config.block_size = block_size.max(1);
    }

    pub fn new(config: RouterConfig) -> Self {
        let settings = PolicySettings {
            kv: config.kv,
            latency: config.latency,
            cache_aware: config.cache_aware,
        };
        let policies = PolicyKind::ALL
            .iter()
            .map(|&k| policy::build(k, &settings))
            .collect();
        Router {
            config,
            active: ActiveSequences::new(config.request_ttl),
            workers: Vec::new(),
            policies,
            timings: vec![WorkerTiming::default()],
            timing_of: rustc_hash::FxHashMap::default(),
            rng: SmallRng::seed_from_u64(config.seed),
        }
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    pub fn add_worker(&mut self, worker: WorkerKey) {
        if let Err(i) = self.workers.binary_search(&worker) {
            self.workers.insert(i, worker);
            self.active.add_worker(worker);
        }
    }

    /// Sets how a worker's steps take time (what the `latency` policy predicts with).
    pub fn set_timing(&mut self, worker: WorkerKey, timing: WorkerTiming) {
        let index = match self.timings.iter().position(|t| *t == timing) {
            Some(i) => i,
            None => {
                self.timings.push(timing);
                self.timings.len() - 1
            }
        };
        self.timing_of
            .insert(worker, u16::try_from(index).unwrap_or(0));
    }

    /// Unregisters a worker; returns the requests that were active on it.
    pub fn remove_worker(&mut self, worker: WorkerKey) -> Vec<RequestId> {
        if let Ok(i) = self.workers.binary_search(&worker) {
            self.workers.remove(i);
        }
        self.timing_of.remove(&worker);
        self.active.remove_worker(worker)
    }

    pub fn workers(&self) -> &[WorkerKey] {
        &self.workers
    }

    pub fn active(&self) -> &ActiveSequences {
        &self.active
    }

    pub fn load(&self, worker: WorkerKey) -> WorkerLoad {
        self.active.load(worker)
    }

    /// How much longer `worker` is predicted to be computing the prefill already routed to
    /// it: its timing model's steps for the queued tokens (each also decoding the running
    /// requests), less the time it has been at them. A worker busy with a burst of
    /// prompts (requests moved to it from a failed worker, say) decodes slowly meanwhile,
    /// and its streams are not stalled for that.
    pub fn queued_prefill_time(&self, worker: WorkerKey, now: Duration) -> Duration {
        let load = self.active.load(worker);
        if load.prefill_tokens == 0 {
            return Duration::ZERO;
        }
        let timing = &self.timings[usize::from(self.timing_of.get(&worker).copied().unwrap_or(0))];
        let block_size = u64::from(self.config.block_size.max(1));
        let step_ms = timing.decode_step_ms(
            load.requests.saturating_sub(1),
            load.active_blocks * block_size,
            load.active_blocks,
        );
        let (prefill_ms, steps) = timing.prefill_steps_ms(load.prefill_tokens);
        let total_ms = prefill_ms + steps as f64 * step_ms;
        let elapsed_ms = now.saturating_sub(load.prefill_since).as_secs_f64() * 1e3;
        // A prediction past what a `Duration` holds (a profile's extreme extrapolation)
        // is as good as forever.
        Duration::try_from_secs_f64((total_ms - elapsed_ms).max(0.0) / 1e3).unwrap_or(Duration::MAX)
    }

    /// The candidate rows the policies see, for every worker.
    pub fn candidates(
        &self,
        request: &RouteRequest<'_>,
        overlaps: &OverlapScores,
        now: Duration,
    ) -> Vec<Candidate> {
        self.candidates_among(&self.workers, request, overlaps, now)
    }

    /// Candidate rows for a subset of workers (unknown ones are skipped).
    pub fn candidates_among(
        &self,
        workers: &[WorkerKey],
        request: &RouteRequest<'_>,
        overlaps: &OverlapScores,
        now: Duration,
    ) -> Vec<Candidate> {
        workers
            .iter()
            .filter(|w| self.active.has_worker(**w))
            .map(|&worker| {
                let load = self.active.load(worker);
                // Media waiting behind the requests that arrive meanwhile are ahead of a
                // request only if it too waits for its media.
                let held = if request.overrides.media_pending {
                    load.held_prefill_tokens
                } else {
                    0
                };
                Candidate {
                    worker,
                    overlap_blocks: overlaps.score(worker),
                    cached_blocks: overlaps.cached(worker),
                    active_blocks: load.active_blocks,
                    new_blocks: self.active.new_blocks(worker, request.seq_hashes),
                    prefill_tokens: load.prefill_tokens + held,
                    prefill_elapsed_ms: if load.prefill_tokens > 0 {
                        now.saturating_sub(load.prefill_since).as_secs_f64() * 1e3
                    } else {
                        0.0
                    },
                    active_requests: load.requests,
                    timing: self.timing_of.get(&worker).copied().unwrap_or(0),
                }
            })
            .collect()
    }

    /// Chooses among `candidates` without recording anything.
    pub fn select(
        &mut self,
        request: &RouteRequest<'_>,
        candidates: &[Candidate],
    ) -> Result<RouteDecision, RouteError> {
        let kind = request.overrides.policy.unwrap_or(self.config.policy);
        let selection = Selection {
            isl_tokens: request.isl_tokens,
            block_size: self.config.block_size,
            candidates,
            overrides: &request.overrides,
            timings: &self.timings,
        };
        let policy =
            &mut self.policies[PolicyKind::ALL.iter().position(|k| *k == kind).unwrap_or(0)];
        let index = policy
            .select(&selection, &mut self.rng)
            .ok_or(RouteError::NoWorkers)?;
        let chosen = candidates[index];
        let cached_tokens = u64::from(chosen.overlap_blocks) * u64::from(self.config.block_size);
        Ok(RouteDecision {
            worker: chosen.worker,
            policy: kind,
            overlap_blocks: chosen.overlap_blocks,
            prefill_tokens: request.isl_tokens.saturating_sub(cached_tokens),
        })
    }

    /// The `latency` policy's predicted time to first token on a candidate and its cost
    /// (the TTFT plus the weighted delay to running decodes, and past 90 % of the KV
    /// blocks a penalty), in milliseconds, whatever the policy in force.
    pub fn latency_prediction(
        &self,
        request: &RouteRequest<'_>,
        candidate: &Candidate,
    ) -> (f64, f64) {
        let selection = Selection {
            isl_tokens: request.isl_tokens,
            block_size: self.config.block_size,
            candidates: std::slice::from_ref(candidate),
            overrides: &request.overrides,
            timings: &self.timings,
        };
        policy::LatencyPolicy {
            config: self.config.latency,
        }
        .predict(&selection, candidate)
    }

    /// Chooses a worker and records the request as active on it.
    pub fn route(
        &mut self,
        request: &RouteRequest<'_>,
        overlaps: &OverlapScores,
        now: Duration,
    ) -> Result<RouteDecision, RouteError> {
        let candidates = self.candidates(request, overlaps, now);
        let decision = self.select(request, &candidates)?;
        self.record(request, &decision, now)?;
        Ok(decision)
    }

    /// Records a decision taken by [`Router::select`].
    pub fn record(
        &mut self,
        request: &RouteRequest<'_>,
        decision: &RouteDecision,
        now: Duration,
    ) -> Result<(), RouteError> {
        self.active.add_request(
            request.id,
            decision.worker,
            request.seq_hashes,
            decision.prefill_tokens,
            now,
        )?;
        Ok(())
    }

    pub fn mark_prefill_completed(&mut self, id: RequestId, now: Duration) -> bool {
        self.active.mark_prefill_completed(id, now)
    }

    /// See [`ActiveSequences::hold_prefill`].
    pub fn hold_prefill(&mut self, id: RequestId, tokens: u64) -> bool {
        self.active.hold_prefill(id, tokens)
    }

    /// See [`ActiveSequences::release_prefill`].
    pub fn release_prefill(&mut self, id: RequestId, now: Duration) -> bool {
        self.active.release_prefill(id, now)
    }

    pub fn free(&mut self, id: RequestId) -> Option<WorkerKey> {
        self.active.free(id)
    }

    /// Frees requests older than the TTL; returns them.
    pub fn expire(&mut self, now: Duration) -> Vec<RequestId> {
        self.active.expire(now)
    }
}
