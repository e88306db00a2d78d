//! A stock OpenAI-compatible server (llama.cpp's server, vLLM, SGLang, llama-cpp-python) as
//! a worker's engine.
//!
//! Each generate request becomes a streamed `/v1/completions` call upstream: the prompt as
//! text (the frontend sends it rendered, special tokens included, to workers that announce
//! they take text) or as token ids (vLLM, SGLang and llama.cpp's server accept them, which
//! is exact), the sampling options, `stream_options.include_usage`. The answer streams back
//! as text ([`GenerateOutput::Text`]), the frontend counting its tokens. Dropping the
//! response stream drops the upstream connection, which cancels the request there.
//!
//! Load: the upstream's Prometheus `/metrics` when it has one (vLLM's
//! `vllm:num_requests_running` / `_waiting` / `vllm:kv_cache_usage_perc`, SGLang's and
//! llama.cpp's equivalents), else the worker's own count of requests in flight. KV events:
//! from the engine's ZMQ publisher when `kv_events` names one (vLLM, SGLang), else none and
//! the router keeps its approximate view of this worker's cache.
//!
//! - `constraint`: structured output in the upstream's own fields (vLLM's, SGLang's).
//! - `stream`: one request: its body upstream, and the streamed answer as generate output.
//! - `load`: the load reports, from the upstream's metrics or the requests in flight.

mod constraint;
mod load;
mod stream;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use switchyard_core::{KvEvent, KvEventData, LoadSnapshot, WorkerKey, WorkerRole};
use switchyard_runtime::vllm::{Update, ZmqEventsConfig, ZmqStats};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::{Engine, EngineCapabilities, RunningEngine};
pub use crate::error::UpstreamConfigError;
use crate::error::WorkerError;
pub use constraint::ConstraintDialect;
pub use load::load_from_metrics;
use load::watch_load;
use stream::UpstreamService;

/// How the prompt goes upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptFormat {
    /// As text, rendered by the frontend (every OpenAI-compatible server takes it).
    #[default]
    Text,
    /// As token ids (vLLM, SGLang, llama.cpp's server): exactly the frontend's tokens.
    TokenIds,
}

/// A worker forwarding to an OpenAI-compatible server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The server's base URL, e.g. `http://127.0.0.1:8080` (a trailing `/v1` is fine).
    pub upstream: String,
    /// The model name upstream, when it differs from the one this worker serves.
    pub upstream_model: Option<String>,
    /// A bearer token for the upstream.
    pub api_key: Option<String>,
    pub prompt: PromptFormat,
    /// The engine's KV event publisher (`zmq://HOST:PORT`), if it has one.
    pub kv_events: Option<String>,
    /// Its replay socket (`zmq://HOST:PORT`, or `none`); the next port by default.
    pub kv_events_replay: Option<String>,
    /// Tokens per KV block of the engine (vLLM's default: 16); the frontend hashes prompts
    /// in blocks of this size.
    pub block_size: u32,
    /// The engine's KV capacity in blocks, when known (the load reports scale its cache
    /// usage on it).
    pub capacity_blocks: Option<u64>,
    /// Most requests the engine runs at once, when known.
    pub max_num_seqs: Option<u32>,
    /// How often the upstream's metrics are read.
    #[serde(with = "humantime_serde")]
    pub metrics_interval: Duration,
    /// Longest wait for the upstream's response headers.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How the upstream is told a request's constraint (structured output), if at all.
    pub constraints: ConstraintDialect,
    /// The upstream answers the completions API's `logprobs` (vLLM, SGLang and llama.cpp
    /// do): requests asking for log probabilities may come here, and canaries check them.
    /// A server that answers without them must say false: asked and not given, they fail
    /// the request.
    pub logprobs: bool,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            upstream: String::new(),
            upstream_model: None,
            api_key: None,
            prompt: PromptFormat::Text,
            kv_events: None,
            kv_events_replay: None,
            block_size: 16,
            capacity_blocks: None,
            max_num_seqs: None,
            metrics_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(10),
            constraints: ConstraintDialect::None,
            logprobs: true,
        }
    }
}

impl OpenAiConfig {
    /// The base URL without a trailing `/` or `/v1`.
    fn base(&self) -> Result<String, UpstreamConfigError> {
        let url = self.upstream.trim_end_matches('/');
        let url = url.strip_suffix("/v1").unwrap_or(url);
        let parsed = reqwest::Url::parse(url).map_err(|source| UpstreamConfigError::NotAUrl {
            upstream: self.upstream.clone(),
            source,
        })?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(UpstreamConfigError::NotHttp(self.upstream.clone()));
        }
        Ok(url.to_owned())
    }

    pub fn validate(&self) -> Result<(), UpstreamConfigError> {
        self.base()?;
        if self.block_size == 0 {
            return Err(UpstreamConfigError::NoBlockSize);
        }
        self.zmq_events()?;
        if self.metrics_interval.is_zero() {
            return Err(UpstreamConfigError::NoMetricsInterval);
        }
        Ok(())
    }

    /// The engine's KV event subscription, when `kv_events` names a publisher.
    fn zmq_events(&self) -> Result<Option<ZmqEventsConfig>, UpstreamConfigError> {
        self.kv_events
            .as_deref()
            .map(|url| {
                ZmqEventsConfig::parse(url, self.kv_events_replay.as_deref(), self.block_size)
            })
            .transpose()
            .map_err(UpstreamConfigError::from)
    }
}

/// The engine.
#[derive(Debug)]
pub struct OpenAiUpstream {
    worker: WorkerKey,
    model: String,
    config: OpenAiConfig,
    base: String,
    events: Option<ZmqEventsConfig>,
    /// The ZMQ subscription's counters (tests and diagnostics).
    pub zmq_stats: Arc<ZmqStats>,
}

impl OpenAiUpstream {
    pub fn new(worker: WorkerKey, model: &str, config: OpenAiConfig) -> Result<Self, WorkerError> {
        config.validate()?;
        let base = config.base()?;
        let events = config.zmq_events()?;
        Ok(OpenAiUpstream {
            worker,
            model: model.to_owned(),
            config,
            base,
            events,
            zmq_stats: Arc::default(),
        })
    }
}

#[async_trait]
impl Engine for OpenAiUpstream {
    fn capabilities(&self) -> EngineCapabilities {
        EngineCapabilities {
            role: WorkerRole::Aggregated,
            kv_events: self.events.is_some(),
            reports_load: true,
            block_size: Some(self.config.block_size),
            capacity_blocks: self.config.capacity_blocks,
            max_num_seqs: self.config.max_num_seqs,
            dp_size: 1,
            prompt_text: self.config.prompt == PromptFormat::Text,
            media_embeddings: false,
            modalities: switchyard_core::Modalities::default(),
            // It enforces them over text, whatever the frontend's vocabulary.
            constraints: self.config.constraints.kinds(),
            vocabularies: Vec::new(),
            // Passed through from its answers; not a prompt's (an echoed prompt is the
            // upstream's text, not this protocol's).
            logprobs: self.config.logprobs,
            prompt_logprobs: false,
        }
    }

    async fn start(
        self: Box<Self>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<RunningEngine, WorkerError> {
        let client = reqwest::Client::builder()
            .connect_timeout(self.config.connect_timeout)
            .build()
            .map_err(WorkerError::HttpClient)?;
        let in_flight = Arc::new(AtomicU32::new(0));
        let service = Arc::new(UpstreamService {
            client: client.clone(),
            completions: format!("{}/v1/completions", self.base),
            model: self
                .config
                .upstream_model
                .clone()
                .unwrap_or_else(|| self.model.clone()),
            api_key: self.config.api_key.clone(),
            prompt: self.config.prompt,
            constraints: self.config.constraints,
            in_flight: Arc::clone(&in_flight),
            timeout: self.config.connect_timeout,
        });
        let (load_tx, load_rx) = watch::channel(LoadSnapshot::default());
        tracker.spawn(watch_load(
            client,
            format!("{}/metrics", self.base),
            self.config.clone(),
            in_flight,
            load_tx,
            cancel.clone(),
        ));
        let events = match self.events.clone() {
            Some(zmq) => {
                let (updates_tx, updates_rx) = mpsc::channel(1024);
                let (events_tx, events_rx) = mpsc::channel(1024);
                tracker.spawn(switchyard_runtime::vllm::subscribe(
                    zmq,
                    updates_tx,
                    Arc::clone(&self.zmq_stats),
                    cancel.clone(),
                ));
                tracker.spawn(number_events(self.worker, updates_rx, events_tx));
                Some(events_rx)
            }
            None => None,
        };
        Ok(RunningEngine {
            service,
            events,
            load: Some(load_rx),
        })
    }
}

/// Turns the engine's batches into this worker's numbered KV events (one stream per
/// data-parallel rank); a lost view clears every rank's cache.
async fn number_events(
    worker: WorkerKey,
    mut updates: mpsc::Receiver<Update>,
    events: mpsc::Sender<Vec<KvEvent>>,
) {
    let mut next_id: BTreeMap<u32, u64> = BTreeMap::new();
    let event = |next_id: &mut BTreeMap<u32, u64>, dp_rank: u32, tier, data| {
        let id = next_id.entry(dp_rank).or_insert(0);
        *id += 1;
        KvEvent {
            worker_id: worker.worker_id,
            dp_rank,
            event_id: *id,
            tier,
            data,
        }
    };
    while let Some(update) = updates.recv().await {
        let batch: Vec<KvEvent> = match update {
            Update::Batch(batch) => batch
                .events
                .into_iter()
                .map(|(tier, data)| event(&mut next_id, batch.dp_rank, tier, data))
                .collect(),
            Update::Lost { reason } => {
                tracing::warn!(%worker, %reason, "the engine's cache view is reset");
                let mut ranks: Vec<u32> = next_id.keys().copied().collect();
                if ranks.is_empty() {
                    ranks.push(worker.dp_rank);
                }
                ranks
                    .into_iter()
                    .map(|rank| event(&mut next_id, rank, Default::default(), KvEventData::Cleared))
                    .collect()
            }
        };
        if !batch.is_empty() && events.send(batch).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_checked() {
        let ok = OpenAiConfig {
            upstream: "http://127.0.0.1:8080/v1/".into(),
            ..OpenAiConfig::default()
        };
        assert_eq!(ok.base().unwrap(), "http://127.0.0.1:8080");
        for bad in ["", "127.0.0.1:8080", "ftp://h/"] {
            let config = OpenAiConfig {
                upstream: bad.into(),
                ..OpenAiConfig::default()
            };
            assert!(config.validate().is_err(), "{bad}");
        }
        let events = OpenAiConfig {
            kv_events: Some("http://h:1".into()),
            ..ok.clone()
        };
        assert!(
            events
                .validate()
                .unwrap_err()
                .to_string()
                .contains("zmq://")
        );
    }
}
