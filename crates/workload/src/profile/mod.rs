//! Profiling an engine through its OpenAI API: prefill time over prompt lengths, and
//! inter-token latency over batch sizes and context lengths, measured with the benchmark
//! client, turned into the timing profile the mocker runs and the planner sizes with
//! ([`switchyard_core::perf::Profile`]), and a report with plots and what the targets allow.
//!
//! - Prefill: at each prompt length, a few requests one at a time, each asking for one
//!   token (TTFT is then the prefill, plus the server's overhead); prompts are fresh text,
//!   so no prefix cache helps. The length is the server's own count (`usage`).
//! - Decode: at each context length and concurrency, that many streams started together;
//!   the ITL is read over the second half of each stream's tokens (after every prompt of
//!   the batch is in), its active KV tokens as concurrency × (context + ¾ of the output).
//! - Context: at each cached-prefix length p, one prompt of p words, then prompts of the
//!   same p words and a fresh chunk of t more, one at a time. The server computes only the
//!   chunk (its prefix cache holds the rest), whose queries also attend to the p cached
//!   keys: its TTFT less the prefill of t fresh tokens (the prefill curve) is that cost,
//!   k·p·t, and a least-squares fit over the points gives the profile's
//!   `prefill_context_ms` k. The cached count is the server's
//!   (`usage.prompt_tokens_details.cached_tokens`) when it says; a server that recomputes
//!   the prefix (no prefix caching, or too small a cache) leaves k at 0, with the reason in
//!   the report.
//!
//! Files: `sweep.rs` runs the sweeps ([`measure`]); `fit.rs` reads the measurements as a
//! profile ([`to_profile`]), a context cost ([`fit_context`]) and what the targets allow
//! ([`recommend`]); `report.rs` writes the Markdown report ([`report()`]).

mod fit;
mod report;
mod sweep;

use std::time::Duration;

use serde::Serialize;
use switchyard_core::perf::{InvalidProfile, Profile};

use crate::bench::BenchError;
use crate::bench::config::Endpoint;

pub use fit::{fit_context, recommend, to_profile};
pub use report::report;
pub use sweep::measure;

/// What to measure, where.
#[derive(Debug, Clone)]
pub struct ProfileConfig {
    pub url: String,
    pub model: String,
    pub endpoint: Endpoint,
    pub api_key: Option<String>,
    /// Prompt lengths (words of synthetic text) for the prefill sweep.
    pub prefill_isl: Vec<u64>,
    /// Requests per prompt length.
    pub prefill_samples: usize,
    /// Context lengths and concurrencies for the decode sweep.
    pub decode_context: Vec<u64>,
    pub decode_concurrency: Vec<usize>,
    /// Tokens each decode stream asks for.
    pub decode_output_tokens: u64,
    /// Cached-prefix lengths (words) for the context sweep; empty: not measured.
    pub context_prefix: Vec<u64>,
    /// Words of the fresh chunk after each cached prefix.
    pub context_chunk: u64,
    pub ttft_target: Duration,
    pub itl_target: Duration,
    pub request_timeout: Duration,
    pub seed: u64,
    /// The engine's KV cache in tokens, when known: KV thresholds are then given as the
    /// share of it the planner reads (its engines' `kv_usage`).
    pub kv_capacity_tokens: Option<u64>,
}

impl ProfileConfig {
    pub fn new(url: impl Into<String>, model: impl Into<String>) -> Self {
        ProfileConfig {
            url: url.into(),
            model: model.into(),
            endpoint: Endpoint::Completions,
            api_key: None,
            prefill_isl: vec![128, 512, 1024, 2048, 4096],
            prefill_samples: 3,
            decode_context: vec![512, 2048],
            decode_concurrency: vec![1, 4, 16],
            decode_output_tokens: 64,
            context_prefix: vec![1024, 2048],
            context_chunk: 512,
            ttft_target: Duration::from_millis(500),
            itl_target: Duration::from_millis(50),
            request_timeout: Duration::from_secs(600),
            seed: 0,
            kv_capacity_tokens: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PrefillPoint {
    /// Prompt tokens, as the server counted them (mean of the samples).
    pub isl: f64,
    /// Median time to the first token.
    pub ttft_ms: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DecodePoint {
    pub context: f64,
    pub concurrency: usize,
    pub active_kv_tokens: f64,
    /// Median over the streams of their mean ITL in the second half of their tokens.
    pub itl_ms: f64,
}

/// A chunk prefilled after a cached prefix.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ContextPoint {
    /// Tokens of the prefix prompt sent first.
    pub prefix: f64,
    /// Prompt tokens served from the cache (the server's count, or the prefix prompt's
    /// length when it gives none).
    pub cached: f64,
    /// Tokens computed: the prompt's less the cached.
    pub chunk: f64,
    /// Median time to the first token of the prompts (the prefix and a chunk).
    pub ttft_ms: f64,
    /// The same prompts sent again (now all cached but their last tokens): the server's
    /// own time for a prompt of that length.
    pub again_ms: f64,
    /// A fresh prompt of a chunk's words alone, and the same sent again.
    pub fresh_ms: f64,
    pub fresh_again_ms: f64,
    /// What attending to the cached tokens added: the median over the samples of
    /// `(ttft − again) − (fresh − fresh again)`, which leaves out what the server spends
    /// on a prompt's length outside the engine (reading, tokenizing, hashing it).
    pub extra_ms: f64,
    /// The same difference in cached × computed tokens (what k multiplies): cached ×
    /// chunk, less the last tokens the prompts sent again compute after their cached ones
    /// (when the server says what it cached).
    pub attended: f64,
    /// What recomputing the prefix would add, from the prefill curve: its time for the
    /// whole prompt less its time for the chunk.
    pub recompute_ms: f64,
    /// Whether the server said how many tokens it served from its cache.
    pub cached_reported: bool,
}

/// The context cost fitted over the points, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextFit {
    /// The profile's `prefill_context_ms`: milliseconds per cached token per chunk token.
    pub prefill_context_ms: f64,
    /// Why it is 0 without being measured as 0 (`None`: fitted).
    pub not_measured: Option<String>,
}

/// What the targets allow on this engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendations {
    /// Longest prompt whose prefill alone meets the TTFT target (`None`: not even the
    /// shortest measured).
    pub max_isl_within_ttft: Option<f64>,
    /// Per context length: the largest measured concurrency within the ITL target.
    pub max_concurrency_within_itl: Vec<(f64, Option<usize>)>,
    /// Per measured prompt length: how many prompts of that length may wait ahead of a new
    /// one on an engine while it still meets the TTFT target (its own prefill included).
    pub queue_within_ttft: Vec<(f64, u32)>,
    /// The most active KV tokens (streams × context) measured within the ITL target, over
    /// every context length (the smallest of their largest: holds at any of them).
    pub kv_tokens_within_itl: Option<f64>,
    /// Thresholds for the load planner (`[planner.load]`) from the above.
    pub load_planner: LoadThresholds,
}

/// Load-planner thresholds that hold the targets on this engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LoadThresholds {
    /// Waiting requests per worker above which one is added: the queue a prompt of the
    /// median measured length still meets the TTFT target behind.
    pub prefill_queue_up: f64,
    /// Below which one is removed: 40 % of the up threshold (Dynamo's defaults' ratio).
    pub prefill_queue_down: f64,
    /// KV usage above which a decode (or aggregated) worker is added: the share of the
    /// cache in use at the ITL target, when the capacity is known.
    pub kv_usage_up: Option<f64>,
    /// Below which one is removed: 55 % of the up threshold (0.5 / 0.9, Dynamo's).
    pub kv_usage_down: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileResult {
    /// The seed of the synthetic text (`--seed` repeats a run's prompts).
    pub seed: u64,
    pub prefill: Vec<PrefillPoint>,
    pub decode: Vec<DecodePoint>,
    pub context: Vec<ContextPoint>,
    pub context_fit: ContextFit,
    pub profile: Profile,
    pub recommendations: Recommendations,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Bench(#[from] BenchError),
    #[error("{what}: {failed} of {sent} requests failed (first: {first})")]
    Failed {
        what: String,
        failed: usize,
        sent: usize,
        first: String,
    },
    #[error("{0}: no timing came back (is the endpoint streaming tokens?)")]
    NoTiming(String),
    #[error("the measurements make no usable profile: {0}")]
    Shape(#[from] InvalidProfile),
    #[error("nothing to measure: {0}")]
    Empty(&'static str),
    #[error("stopped before the sweep ended")]
    Stopped,
}

#[cfg(test)]
mod tests;
