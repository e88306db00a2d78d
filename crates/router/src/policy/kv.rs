//! The `kv` policy: the worker where the request should finish soonest, counted in blocks.

use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};

use super::choice::choose;
use super::{Policy, PolicyKind, Selection};
use crate::InvalidConfig;

/// Settings of the `kv` policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvPolicyConfig {
    /// Weight of prefill work against decode load in the cost.
    pub overlap_weight: f64,
    /// 0 picks the cheapest worker; above 0 samples from a softmax over normalised costs.
    pub temperature: f64,
}

impl KvPolicyConfig {
    /// Checks the ranges serde cannot.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        InvalidConfig::check_at_least("router.kv.overlap_weight", self.overlap_weight, 0.0)?;
        InvalidConfig::check_at_least("router.kv.temperature", self.temperature, 0.0)
    }
}

impl Default for KvPolicyConfig {
    fn default() -> Self {
        KvPolicyConfig {
            overlap_weight: 1.0,
            temperature: 0.0,
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
