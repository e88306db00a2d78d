//! Engine arguments.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Which running request to preempt when decode runs out of KV blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptionMode {
    /// The most recently admitted (vLLM's default).
    #[default]
    Lifo,
    /// The earliest admitted.
    Fifo,
}

/// Engine arguments, with vLLM's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineArgs {
    /// KV cache capacity in blocks.
    pub num_gpu_blocks: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Most requests running at once.
    pub max_num_seqs: u32,
    /// Token budget of one step, shared by decodes and prefill chunks.
    pub max_num_batched_tokens: u32,
    pub enable_prefix_caching: bool,
    pub enable_chunked_prefill: bool,
    pub preemption_mode: PreemptionMode,
    /// Simulated time runs this many times faster than the timing model says.
    pub speedup_ratio: f64,
    /// Media positions whose encoded features the engine's staging memory holds at once (0:
    /// no limit; the default is 4 GiB of 8 KiB-a-token embeddings). A request's media are
    /// staged once encoded, and its prefill stops at them until they are; they leave when
    /// its prompt is computed. A request whose media alone exceed it is staged alone.
    pub staging_tokens: u64,
    /// A request held at its media while they were encoded (sent ahead of them) resumes,
    /// once they are ready, behind the requests that arrived before that moment rather
    /// than at the head of the batch: its media's prefill does not delay requests that
    /// were already waiting, as it would not had it arrived with its media encoded.
    pub defer_ready_media: bool,
}

impl Default for EngineArgs {
    fn default() -> Self {
        EngineArgs {
            num_gpu_blocks: 16_384,
            block_size: 16,
            max_num_seqs: 256,
            max_num_batched_tokens: 8_192,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            preemption_mode: PreemptionMode::Lifo,
            speedup_ratio: 1.0,
            staging_tokens: DEFAULT_STAGING_TOKENS,
            defer_ready_media: true,
        }
    }
}

/// 4 GiB of staging memory at 8 KiB a token (a 4,096-wide float16 embedding).
pub const DEFAULT_STAGING_TOKENS: u64 = (4 << 30) / 8192;

#[derive(Debug, Clone, PartialEq, Error)]
pub enum InvalidArgs {
    #[error("{name} must be at least 1, got {value}")]
    Zero { name: &'static str, value: u32 },
    #[error("speedup_ratio must be a finite number of at least 0.001, got {0}")]
    Speedup(f64),
}

impl EngineArgs {
    pub fn validate(&self) -> Result<(), InvalidArgs> {
        for (name, value) in [
            ("num_gpu_blocks", self.num_gpu_blocks),
            ("block_size", self.block_size),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
        ] {
            if value == 0 {
                return Err(InvalidArgs::Zero { name, value });
            }
        }
        // Below 0.001 a step would last hours: surely a typo.
        if !(self.speedup_ratio.is_finite() && self.speedup_ratio >= 0.001) {
            return Err(InvalidArgs::Speedup(self.speedup_ratio));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_zeroes_are_named() {
        assert!(EngineArgs::default().validate().is_ok());
        for speedup_ratio in [0.0, 1e-30, -1.0, f64::NAN, f64::INFINITY] {
            let bad = EngineArgs {
                speedup_ratio,
                ..EngineArgs::default()
            };
            assert!(
                bad.validate()
                    .unwrap_err()
                    .to_string()
                    .starts_with("speedup_ratio must be a finite number of at least 0.001"),
                "{speedup_ratio}"
            );
        }
        let bad = EngineArgs {
            max_num_seqs: 0,
            ..EngineArgs::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "max_num_seqs must be at least 1, got 0"
        );
        let bad = EngineArgs {
            speedup_ratio: f64::NAN,
            ..EngineArgs::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn partial_json_fills_defaults_and_unknown_fields_fail() {
        let args: EngineArgs = serde_json::from_str(r#"{"block_size": 64}"#).unwrap();
        assert_eq!(args.block_size, 64);
        assert_eq!(args.num_gpu_blocks, 16_384);
        assert!(serde_json::from_str::<EngineArgs>(r#"{"blocksize": 64}"#).is_err());
    }
}
