//! The knobs of `switchyard synth generate`.

use serde::Serialize;
use switchyard_core::trace::MOONCAKE_BLOCK_SIZE;

use super::SynthError;
use crate::stats::Sampling;

/// How to scale the learned structure when sampling.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SynthConfig {
    /// Requests to generate; `None` generates as many as the source has.
    pub num_requests: Option<usize>,
    pub seed: u64,
    /// Scales the length (in blocks) of every core radix node; each keeps at least one block.
    pub prefix_len_multiplier: f64,
    /// Makes this many disjoint copies of the core tree (offset hash ids); each request picks
    /// one uniformly.
    pub prefix_root_multiplier: u32,
    /// Scales the length (in blocks) of each unique prompt; each keeps at least one block.
    pub prompt_len_multiplier: f64,
    /// Scales output lengths.
    pub osl_multiplier: f64,
    /// Divides inter-arrival gaps: 2 makes the trace twice as fast.
    pub speedup_ratio: f64,
    /// Bursts: the arrivals of every `burst_period_ms` are squeezed into its first
    /// `burst_duty` (a share in (0, 1]; 1: no bursts). The mean rate stays the same; the
    /// rate within a burst is 1 / `burst_duty` times it.
    pub burst_period_ms: f64,
    pub burst_duty: f64,
    /// Rate over time: from each `(at_ms, multiplier)` on (in output time, sorted), the
    /// request rate is `multiplier` times the learned one (1 before the first). The same
    /// requests, their arrivals compressed or stretched: `[(600_000, 5), (1_200_000, 1)]`
    /// is a 5× burst from the tenth to the twentieth minute.
    pub rate_profile: Vec<(f64, f64)>,
    /// How the rate moves from one point of `rate_profile` to the next.
    pub rate_shape: RateShape,
    /// How arrivals are spaced before `burst_duty` and `rate_profile` reshape them.
    pub arrivals: Arrivals,
    /// Tokens per hash id, of the source and of the output.
    pub block_size: u32,
    /// How every learned distribution is drawn from.
    pub sampling: Sampling,
}

/// How a rate profile moves between its points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RateShape {
    /// Each multiplier holds from its point to the next.
    #[default]
    Steps,
    /// The multiplier changes linearly from each point to the next (from 1 at time 0 to
    /// the first point), and holds after the last: `[(300_000, 1), (1_200_000, 5)]` is
    /// five minutes at the learned rate, then a ramp to five times it over fifteen.
    Linear,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            num_requests: None,
            seed: 0,
            prefix_len_multiplier: 1.0,
            prefix_root_multiplier: 1,
            prompt_len_multiplier: 1.0,
            osl_multiplier: 1.0,
            speedup_ratio: 1.0,
            burst_period_ms: 60_000.0,
            burst_duty: 1.0,
            rate_profile: Vec::new(),
            rate_shape: RateShape::Steps,
            arrivals: Arrivals::Learned,
            block_size: MOONCAKE_BLOCK_SIZE,
            sampling: Sampling::Stratified,
        }
    }
}

/// How a synthetic trace spaces its arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Arrivals {
    /// Gaps drawn from the source's gaps. A source whose timestamps are coarse keeps its
    /// lumps: the Mooncake traces stamp arrivals in steps of 3 s, so about ten requests
    /// share each stamp.
    Learned,
    /// A renewal process at the source's mean rate: gaps drawn from a gamma distribution
    /// of that mean with this shape (1: Poisson arrivals; below 1 burstier, above 1 more
    /// regular; vLLM's benchmark calls the shape its burstiness). The requests are those
    /// the same seed gives with learned gaps: only their times differ.
    Gamma { shape: f64 },
}

impl SynthConfig {
    /// Rejects values that would make sampling meaningless, naming the CLI flag.
    pub fn validate(&self) -> Result<(), SynthError> {
        let positive = [
            ("--prefix-len-multiplier", self.prefix_len_multiplier),
            ("--prompt-len-multiplier", self.prompt_len_multiplier),
            ("--osl-multiplier", self.osl_multiplier),
            ("--speedup-ratio", self.speedup_ratio),
            ("--burst-period", self.burst_period_ms),
        ];
        for (flag, value) in positive {
            if !(value.is_finite() && value > 0.0) {
                return Err(SynthError::InvalidKnob {
                    flag,
                    requirement: "a finite number above 0",
                    value: value.to_string(),
                });
            }
        }
        let mut previous = 0.0;
        for &(at, multiplier) in &self.rate_profile {
            if !(at.is_finite() && at >= previous) {
                return Err(SynthError::InvalidKnob {
                    flag: "--rate-profile",
                    requirement: "times from 0, in increasing order",
                    value: format!("{at} ms"),
                });
            }
            if !(multiplier.is_finite() && multiplier > 0.0) {
                return Err(SynthError::InvalidKnob {
                    flag: "--rate-profile",
                    requirement: "multipliers above 0",
                    value: multiplier.to_string(),
                });
            }
            previous = at;
        }
        if !(self.burst_duty > 0.0 && self.burst_duty <= 1.0) {
            return Err(SynthError::InvalidKnob {
                flag: "--burst-duty",
                requirement: "a share in (0, 1]",
                value: self.burst_duty.to_string(),
            });
        }
        if let Arrivals::Gamma { shape } = self.arrivals
            && !(shape.is_finite() && shape > 0.0)
        {
            return Err(SynthError::InvalidKnob {
                flag: "--burstiness",
                requirement: "a finite number above 0",
                value: shape.to_string(),
            });
        }
        let at_least_one = [
            ("--num-requests", self.num_requests.map_or(1, |n| n as u64)),
            (
                "--prefix-root-multiplier",
                u64::from(self.prefix_root_multiplier),
            ),
            ("--block-size", u64::from(self.block_size)),
        ];
        for (flag, value) in at_least_one {
            if value == 0 {
                return Err(SynthError::InvalidKnob {
                    flag,
                    requirement: "at least 1",
                    value: value.to_string(),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_knobs_name_their_flag() {
        assert!(SynthConfig::default().validate().is_ok());
        let bad = SynthConfig {
            osl_multiplier: -1.0,
            ..SynthConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "--osl-multiplier must be a finite number above 0, got -1"
        );
        let bad = SynthConfig {
            speedup_ratio: f64::NAN,
            ..SynthConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .starts_with("--speedup-ratio")
        );
        let bad = SynthConfig {
            prefix_root_multiplier: 0,
            ..SynthConfig::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "--prefix-root-multiplier must be at least 1, got 0"
        );
        let bad = SynthConfig {
            num_requests: Some(0),
            ..SynthConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .starts_with("--num-requests")
        );
    }
}
