//! Worker configuration.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_mocker::EngineArgs;

use crate::error::InvalidConfig;

/// One worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// The model name it serves.
    pub model: String,
    /// What part of the work it takes: aggregated (prefill and decode), prefill or decode.
    #[serde(default)]
    pub role: switchyard_core::WorkerRole,
    pub engine: EngineConfig,
    /// Fault injection (tests, chaos runs, demos).
    #[serde(default)]
    pub faults: crate::faults::FaultSettings,
}

/// Which engine a worker hosts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum EngineConfig {
    Mocker(MockerConfig),
    Echo(EchoConfig),
    /// A stock OpenAI-compatible server (llama.cpp, vLLM, SGLang).
    Openai(crate::upstream::OpenAiConfig),
    /// A GGUF model on the CPU: built by the binary (its `candle` feature), which registers
    /// the engine in an [`crate::EngineRegistry`].
    Candle(CandleConfig),
    /// A mock media encoder (role `encoder`).
    Encoder(crate::encoder::EncoderConfig),
}

impl EngineConfig {
    /// The engine's name: its `kind` in configuration files, and its name in an
    /// [`crate::EngineRegistry`].
    pub fn kind(&self) -> &'static str {
        match self {
            EngineConfig::Mocker(_) => "mocker",
            EngineConfig::Echo(_) => "echo",
            EngineConfig::Openai(_) => "openai",
            EngineConfig::Candle(_) => "candle",
            EngineConfig::Encoder(_) => "encoder",
        }
    }

    /// Shortest interval between two load reports on the event plane.
    pub fn load_report_interval(&self) -> Duration {
        match self {
            EngineConfig::Mocker(mocker) => mocker.load_report_interval,
            EngineConfig::Echo(_) => MockerConfig::default().load_report_interval,
            EngineConfig::Openai(openai) => openai.metrics_interval,
            EngineConfig::Candle(_) | EngineConfig::Encoder(_) => {
                MockerConfig::default().load_report_interval
            }
        }
    }
}

/// The simulated engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MockerConfig {
    #[serde(flatten)]
    pub args: EngineArgs,
    /// Seed of the generated tokens, the model's: the same on every worker, so a stream
    /// resumed on another worker continues the same sequence.
    pub seed: u64,
    /// A timing profile (JSON or NPZ) instead of the polynomial model.
    pub perf_profile: Option<PathBuf>,
    /// Shortest interval between two load reports on the event plane.
    #[serde(with = "humantime_serde")]
    pub load_report_interval: Duration,
    /// How KV moves to this worker when it decodes a request prefilled elsewhere.
    pub kv_transfer: KvTransferConfig,
    /// A Hugging Face model directory (the frontend's `tokenizer`) whose vocabulary it
    /// enforces constraints over, besides the built-in ones (`serve` passes the
    /// frontend's).
    pub tokenizer: Option<PathBuf>,
}

impl Default for MockerConfig {
    fn default() -> Self {
        MockerConfig {
            args: EngineArgs::default(),
            seed: 0,
            perf_profile: None,
            load_report_interval: Duration::from_millis(100),
            kv_transfer: KvTransferConfig::default(),
            tokenizer: None,
        }
    }
}

/// The timing of a KV transfer between workers (disaggregated serving): the bytes of a
/// token's KV, from the model's shape, over a link's bandwidth, plus a fixed latency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KvTransferConfig {
    /// The link's bandwidth, in GB/s (InfiniBand NDR: 50; NVLink: 900).
    pub bandwidth_gbps: f64,
    /// Fixed cost of one transfer (connection, registration, metadata).
    #[serde(with = "humantime_serde")]
    pub latency: Duration,
    /// The model's shape: layers, KV heads, head dimension, bytes per value (Llama 3 8B
    /// in bf16 by default).
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub dtype_bytes: u32,
}

impl Default for KvTransferConfig {
    fn default() -> Self {
        KvTransferConfig {
            bandwidth_gbps: 50.0,
            latency: Duration::from_millis(1),
            layers: 32,
            kv_heads: 8,
            head_dim: 128,
            dtype_bytes: 2,
        }
    }
}

impl KvTransferConfig {
    /// A key and a value per layer and KV head.
    pub fn bytes_per_token(&self) -> u64 {
        2 * u64::from(self.layers)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }

    /// How long moving the KV of `tokens` tokens takes (in model time).
    pub fn time(&self, tokens: u32) -> Duration {
        let bytes = u64::from(tokens) * self.bytes_per_token();
        let seconds = bytes as f64 / (self.bandwidth_gbps * 1e9);
        self.latency
            .saturating_add(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
    }

    pub fn validate(&self) -> Result<(), InvalidConfig> {
        // 1 kB/s at the least: slower is a typo, and would overflow the transfer times.
        if !(self.bandwidth_gbps.is_finite() && self.bandwidth_gbps >= 1e-6) {
            return Err(InvalidConfig::KvBandwidth(self.bandwidth_gbps));
        }
        if [self.layers, self.kv_heads, self.head_dim, self.dtype_bytes].contains(&0) {
            return Err(InvalidConfig::KvShape);
        }
        Ok(())
    }
}

/// An engine that streams the prompt back, for tests and for measuring the serving path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EchoConfig {
    /// Tokens per KV block it announces (it keeps no cache).
    pub block_size: u32,
    /// Wait before the first token.
    #[serde(with = "humantime_serde")]
    pub first_token_delay: Duration,
    /// Wait between tokens.
    #[serde(with = "humantime_serde")]
    pub token_delay: Duration,
}

impl Default for EchoConfig {
    fn default() -> Self {
        EchoConfig {
            block_size: 16,
            first_token_delay: Duration::ZERO,
            token_delay: Duration::ZERO,
        }
    }
}

/// The CPU engine (`switchyard-candle`, built with the binary's `candle` feature): a GGUF
/// model computed with candle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CandleConfig {
    /// The GGUF model file.
    pub model: PathBuf,
    /// Tokens per cached KV block.
    pub block_size: u32,
    /// Memory for the prefix cache, in MiB.
    pub cache_mib: u64,
    /// Sequences running at once.
    pub max_num_seqs: u32,
    /// Tokens one step computes at most (prompt chunks plus one per decoding sequence).
    pub max_batched_tokens: u32,
    /// Keep an f32 copy of the weights (4 bytes a parameter) for steps of many tokens, on
    /// CPUs without VNNI: there candle's quantized product costs the same per row whatever
    /// the batch, and prompt chunks run several times faster on the copy. With VNNI
    /// (AVX-512 or AVX) the quantized weights take repacked kernels faster than the copy
    /// at every batch size, and no copy is kept.
    pub dense_weights: bool,
    /// Longest a step should take: prompt chunks are sized from the measured cost of a
    /// token so that running streams get their next token at least this often.
    #[serde(with = "humantime_serde")]
    pub step_target: Duration,
    /// This engine's timing profile on this machine (`switchyard profile`'s profile.json,
    /// or NPZ): announced at registration, so routers and frontends predict its latency
    /// (and the mocker replays it); prompt chunks are then sized from it, the same every
    /// step, instead of from a running measurement.
    pub perf_profile: Option<PathBuf>,
}

impl Default for CandleConfig {
    fn default() -> Self {
        CandleConfig {
            model: PathBuf::new(),
            block_size: 16,
            cache_mib: 1024,
            max_num_seqs: 16,
            max_batched_tokens: 512,
            dense_weights: true,
            step_target: Duration::from_millis(250),
            perf_profile: None,
        }
    }
}

impl CandleConfig {
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if self.model.as_os_str().is_empty() {
            return Err(InvalidConfig::NoModelFile);
        }
        if self.block_size == 0 || self.max_num_seqs == 0 {
            return Err(InvalidConfig::NoBlocksOrSequences);
        }
        if self.step_target.is_zero() {
            return Err(InvalidConfig::NoStepTarget);
        }
        if self.max_batched_tokens < self.max_num_seqs {
            return Err(InvalidConfig::BatchBelowSequences {
                max_batched_tokens: self.max_batched_tokens,
                max_num_seqs: self.max_num_seqs,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engines_kind_is_its_tag_in_configuration_files() {
        for engine in [
            EngineConfig::Mocker(MockerConfig::default()),
            EngineConfig::Echo(EchoConfig::default()),
            EngineConfig::Openai(Default::default()),
            EngineConfig::Candle(CandleConfig::default()),
            EngineConfig::Encoder(Default::default()),
        ] {
            let tagged = serde_json::to_value(&engine).unwrap();
            assert_eq!(tagged["kind"], engine.kind());
        }
    }
}
