//! SGLang's router's `cache-aware` policy, as a baseline.

use rand::rngs::SmallRng;
use serde::{Deserialize, Serialize};

use super::choice::{argmin_all, pick};
use super::{Policy, PolicyKind, Selection};
use crate::InvalidConfig;

/// Settings of the SGLang-style `cache-aware` policy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheAwareConfig {
    /// Minimum fraction of the prompt cached on the best worker to route by cache.
    pub cache_threshold: f64,
    /// The load is imbalanced when max − min exceeds this many requests …
    pub balance_abs_threshold: u32,
    /// … and max exceeds min times this.
    pub balance_rel_threshold: f64,
}

impl CacheAwareConfig {
    /// Checks the ranges serde cannot.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if !(0.0..=1.0).contains(&self.cache_threshold) {
            return Err(InvalidConfig::new(
                "router.cache_aware.cache_threshold",
                format!("must be in [0, 1], got {}", self.cache_threshold),
            ));
        }
        InvalidConfig::check_at_least(
            "router.cache_aware.balance_rel_threshold",
            self.balance_rel_threshold,
            1.0,
        )
    }
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
