//! Why a worker or its engine cannot start, and the configuration checks behind it.
//!
//! This module depends on nothing else in the crate, so every module can return these
//! errors without importing the module that starts workers (which imports them all).

use thiserror::Error;

#[derive(Debug, Error)]
pub enum WorkerError {
    #[error("invalid engine arguments: {0}")]
    Engine(#[from] switchyard_mocker::config::InvalidArgs),
    #[error(transparent)]
    Profile(#[from] switchyard_mocker::perf::ProfileError),
    #[error("the engine cannot start: {0}")]
    Start(String),
    /// A worker setting does not hold.
    #[error("the engine cannot start: {0}")]
    Config(#[from] InvalidConfig),
    /// The settings of a worker forwarding to an OpenAI-compatible server do not hold.
    #[error("the engine cannot start: {0}")]
    Upstream(#[from] UpstreamConfigError),
    #[error("the engine cannot start: cannot build an HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
    /// The configuration names an engine this build has not registered; `how` says how to
    /// get one.
    #[error("this build has no {name} engine: {how}")]
    NotBuilt { name: String, how: String },
    /// Building the engine failed (a model file that does not load, a panic while loading
    /// it): that failure as it is.
    #[error(transparent)]
    Build(Box<dyn std::error::Error + Send + Sync>),
    #[error(transparent)]
    Discovery(#[from] switchyard_runtime::DiscoveryError),
    #[error("cannot serve requests: {0}")]
    Io(#[from] std::io::Error),
}

/// A setting in [`crate::config`] that does not hold.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum InvalidConfig {
    #[error("kv_transfer.bandwidth_gbps must be a number of GB/s of at least 0.000001, got {0}")]
    KvBandwidth(f64),
    #[error("kv_transfer: layers, kv_heads, head_dim and dtype_bytes must be at least 1")]
    KvShape,
    #[error("the candle engine needs a model file (--model PATH.gguf)")]
    NoModelFile,
    #[error("block_size and max_num_seqs must be at least 1")]
    NoBlocksOrSequences,
    #[error("step_target must be more than 0")]
    NoStepTarget,
    #[error(
        "max_batched_tokens ({max_batched_tokens}) must be at least max_num_seqs ({max_num_seqs}): every running sequence decodes a token per step"
    )]
    BatchBelowSequences {
        max_batched_tokens: u32,
        max_num_seqs: u32,
    },
}

/// A setting of a worker forwarding to an OpenAI-compatible server
/// ([`crate::upstream::OpenAiConfig`]) that does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UpstreamConfigError {
    #[error("the upstream {upstream:?} is not a URL: {source}")]
    NotAUrl {
        upstream: String,
        #[source]
        source: url::ParseError,
    },
    #[error("the upstream must be an http(s)://HOST:PORT URL, got {0:?}")]
    NotHttp(String),
    #[error("block_size must be at least 1")]
    NoBlockSize,
    /// The KV event endpoints do not parse.
    #[error(transparent)]
    KvEvents(#[from] switchyard_runtime::vllm::EndpointError),
    #[error("metrics_interval must be more than 0")]
    NoMetricsInterval,
}
