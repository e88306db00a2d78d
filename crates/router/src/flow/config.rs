//! How far a request's life may go to survive failures: `[frontend.migration]`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::InvalidConfig;

/// Retries before the first token and moves of streams in flight.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MigrationConfig {
    /// Workers a request may move to after the one it started on (0: none).
    pub max_migrations: u32,
    /// Workers tried for a request before it fails, counting the first (a worker found
    /// unhealthy by others while the request was on its way does not count).
    pub max_dispatch_attempts: u32,
    /// Longest wait for a worker to accept a request (a worker that never answers is
    /// unreachable).
    #[serde(with = "humantime_serde")]
    pub dispatch_timeout: Duration,
    /// Wait before retrying a request that produced nothing yet, growing by
    /// `backoff_factor` per retry up to `backoff_max`, spread by `backoff_jitter`.
    #[serde(with = "humantime_serde")]
    pub backoff_initial: Duration,
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    pub backoff_factor: f64,
    pub backoff_jitter: f64,
    /// The fleet-wide budget, a token bucket: each request started adds this many moves
    /// to it (the sustained share of requests that may move)…
    pub budget_ratio: f64,
    /// …up to this many, or the number of requests in flight if more (so one failure,
    /// however large, can move everything it caught once); it starts here.
    pub budget_max: f64,
}

impl Default for MigrationConfig {
    fn default() -> Self {
        MigrationConfig {
            max_migrations: 3,
            max_dispatch_attempts: 3,
            dispatch_timeout: Duration::from_secs(3),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            backoff_factor: 1.5,
            backoff_jitter: 0.2,
            budget_ratio: 0.5,
            budget_max: 100.0,
        }
    }
}

impl MigrationConfig {
    /// Checks the ranges serde cannot; names the key under `[frontend]`.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.max_dispatch_attempts == 0 {
            return Err(InvalidConfig::new(
                "migration.max_dispatch_attempts",
                "must be at least 1",
            ));
        }
        InvalidConfig::check_at_least("migration.backoff_factor", self.backoff_factor, 1.0)?;
        if !(0.0..1.0).contains(&self.backoff_jitter) {
            return Err(InvalidConfig::new(
                "migration.backoff_jitter",
                format!("must be in [0, 1), got {}", self.backoff_jitter),
            ));
        }
        InvalidConfig::check_at_least("migration.budget_ratio", self.budget_ratio, 0.0)?;
        InvalidConfig::check_at_least("migration.budget_max", self.budget_max, 0.0)?;
        if self.dispatch_timeout.is_zero() {
            return Err(InvalidConfig::new(
                "migration.dispatch_timeout",
                "must be longer than zero",
            ));
        }
        Ok(())
    }

    /// The wait before the `retry`-th retry (from 1) of a request that produced nothing
    /// yet; `unit` is a uniform draw in [0, 1) for the jitter.
    pub fn backoff(&self, retry: u32, unit: f64) -> Duration {
        let exponent = i32::try_from(retry.saturating_sub(1)).unwrap_or(i32::MAX);
        let base = self
            .backoff_initial
            .mul_f64(self.backoff_factor.powi(exponent).min(1e9))
            .min(self.backoff_max);
        let jitter = self.backoff_jitter * (2.0 * unit - 1.0);
        base.mul_f64((1.0 + jitter).max(0.0))
    }
}

/// The fleet-wide migration budget: a token bucket of moves (see [`MigrationConfig`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MigrationBudget {
    moves: f64,
}

impl MigrationBudget {
    /// A full bucket.
    pub fn new(config: &MigrationConfig) -> Self {
        MigrationBudget {
            moves: config.budget_max,
        }
    }

    /// A request started, with `in_flight` requests under way in the fleet: the bucket
    /// gains `budget_ratio`, up to `budget_max` or `in_flight`, whichever is more.
    pub fn credit(&mut self, config: &MigrationConfig, in_flight: usize) {
        let cap = config.budget_max.max(in_flight as f64);
        self.moves = (self.moves + config.budget_ratio).min(cap);
    }

    /// Takes one move, if one is left.
    pub fn spend(&mut self) -> bool {
        if self.moves >= 1.0 {
            self.moves -= 1.0;
            true
        } else {
            false
        }
    }

    /// Moves left.
    pub fn left(&self) -> f64 {
        self.moves
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_by_its_factor_up_to_its_cap_within_its_jitter() {
        let config = MigrationConfig::default();
        // The middle of the jitter's range is no jitter.
        assert_eq!(config.backoff(1, 0.5), Duration::from_millis(50));
        assert_eq!(config.backoff(2, 0.5), Duration::from_millis(75));
        assert_eq!(config.backoff(30, 0.5), Duration::from_secs(2));
        assert_eq!(config.backoff(1, 0.0), Duration::from_millis(40));
        assert!(config.backoff(1, 0.999_999) < Duration::from_millis(60));
        assert!(config.backoff(1, 0.999_999) > Duration::from_millis(59));
    }

    #[test]
    fn the_budget_refills_by_its_ratio_up_to_the_larger_of_its_cap_and_the_load() {
        let config = MigrationConfig {
            budget_ratio: 0.5,
            budget_max: 2.0,
            ..MigrationConfig::default()
        };
        let mut budget = MigrationBudget::new(&config);
        assert!(budget.spend() && budget.spend());
        assert!(!budget.spend(), "two moves, then none");
        budget.credit(&config, 0);
        assert!(!budget.spend(), "half a move is not one");
        budget.credit(&config, 0);
        assert!(budget.spend());
        for _ in 0..100 {
            budget.credit(&config, 0);
        }
        assert_eq!(budget.left(), 2.0);
        for _ in 0..100 {
            budget.credit(&config, 10);
        }
        assert_eq!(budget.left(), 10.0, "a larger load raises the cap");
    }

    #[test]
    fn settings_out_of_range_name_their_key() {
        let bad = MigrationConfig {
            backoff_jitter: 1.0,
            ..MigrationConfig::default()
        };
        assert_eq!(bad.validate().unwrap_err().key, "migration.backoff_jitter");
        let bad = MigrationConfig {
            max_dispatch_attempts: 0,
            ..MigrationConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("at least 1")
        );
    }
}
