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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateOutput, GenerateRequest, Phase,
};
use switchyard_core::{KvEvent, KvEventData, LoadSnapshot, WorkerKey, WorkerRole};
use switchyard_runtime::vllm::{Update, ZmqEventsConfig, ZmqStats};
use switchyard_runtime::{EngineService, ResponseStream};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::{Engine, EngineCapabilities, RunningEngine};
use crate::host::WorkerError;

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
        }
    }
}

impl OpenAiConfig {
    /// The base URL without a trailing `/` or `/v1`.
    fn base(&self) -> Result<String, String> {
        let url = self.upstream.trim_end_matches('/');
        let url = url.strip_suffix("/v1").unwrap_or(url);
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| format!("the upstream {:?} is not a URL: {e}", self.upstream))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            return Err(format!(
                "the upstream must be an http(s)://HOST:PORT URL, got {:?}",
                self.upstream
            ));
        }
        Ok(url.to_owned())
    }

    pub fn validate(&self) -> Result<(), String> {
        self.base()?;
        if self.block_size == 0 {
            return Err("block_size must be at least 1".into());
        }
        if let Some(url) = &self.kv_events {
            ZmqEventsConfig::parse(url, self.kv_events_replay.as_deref(), self.block_size)?;
        }
        if self.metrics_interval.is_zero() {
            return Err("metrics_interval must be more than 0".into());
        }
        Ok(())
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
        config.validate().map_err(WorkerError::Start)?;
        let base = config.base().map_err(WorkerError::Start)?;
        let events = config
            .kv_events
            .as_deref()
            .map(|url| {
                ZmqEventsConfig::parse(url, config.kv_events_replay.as_deref(), config.block_size)
            })
            .transpose()
            .map_err(WorkerError::Start)?;
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
            .map_err(|e| WorkerError::Start(format!("cannot build an HTTP client: {e}")))?;
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

#[derive(Debug)]
struct UpstreamService {
    client: reqwest::Client,
    completions: String,
    model: String,
    api_key: Option<String>,
    prompt: PromptFormat,
    in_flight: Arc<AtomicU32>,
    timeout: Duration,
}

/// Counts a request in flight for as long as it lives.
struct InFlight(Arc<AtomicU32>);

impl InFlight {
    fn new(counter: &Arc<AtomicU32>) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(counter))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl UpstreamService {
    fn body(&self, request: &GenerateRequest) -> Result<Value, EngineError> {
        let prompt = match self.prompt {
            PromptFormat::TokenIds => json!(request.prompt.token_ids),
            PromptFormat::Text => match &request.prompt.text {
                Some(text) => json!(text),
                None => {
                    return Err(EngineError::Unsupported(
                        "this worker forwards text, and the request came without its prompt text"
                            .into(),
                    ));
                }
            },
        };
        let s = &request.sampling;
        let mut body = json!({
            "model": self.model,
            "prompt": prompt,
            "max_tokens": request.max_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let fields = [
            ("temperature", s.temperature.map(|v| json!(v))),
            ("top_p", s.top_p.map(|v| json!(v))),
            ("top_k", s.top_k.map(|v| json!(v))),
            ("seed", s.seed.map(|v| json!(v))),
            ("frequency_penalty", s.frequency_penalty.map(|v| json!(v))),
            ("presence_penalty", s.presence_penalty.map(|v| json!(v))),
            (
                "logit_bias",
                (!s.logit_bias.is_empty()).then(|| {
                    json!(
                        s.logit_bias
                            .iter()
                            .map(|(t, b)| (t.to_string(), json!(b)))
                            .collect::<serde_json::Map<_, _>>()
                    )
                }),
            ),
        ];
        if let Some(map) = body.as_object_mut() {
            for (name, value) in fields {
                if let Some(value) = value {
                    map.insert(name.into(), value);
                }
            }
        }
        Ok(body)
    }
}

#[async_trait]
impl EngineService for UpstreamService {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError> {
        if !matches!(request.phase, Phase::Aggregated) {
            return Err(EngineError::Unsupported(
                "an OpenAI-compatible upstream serves aggregated requests only".into(),
            ));
        }
        if request.prompt.is_empty() {
            return Err(EngineError::Invalid("the prompt is empty".into()));
        }
        let body = self.body(&request)?;
        let guard = InFlight::new(&self.in_flight);
        let mut call = self.client.post(&self.completions).json(&body);
        if let Some(key) = &self.api_key {
            call = call.bearer_auth(key);
        }
        let response = tokio::time::timeout(self.timeout, call.send())
            .await
            .map_err(|_| EngineError::Unreachable(format!("no answer in {:?}", self.timeout)))?
            .map_err(|e| EngineError::Unreachable(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let message = upstream_message(&text);
            return Err(match status.as_u16() {
                400 | 422 => EngineError::Invalid(message),
                413 => EngineError::Unsupported(message),
                429 | 503 => EngineError::Overloaded(message),
                _ => EngineError::Internal(format!("the upstream answered {status}: {message}")),
            });
        }
        let state = Upstream {
            events: response.bytes_stream().eventsource().boxed(),
            _guard: guard,
            finished: false,
            pending: None,
        };
        let stream = futures::stream::unfold(state, |mut state| async move {
            if state.finished {
                return None;
            }
            loop {
                let next = match state.pending {
                    // The answer is complete; its usage may follow in a chunk of its own.
                    Some((_, until)) => tokio::time::timeout_at(until, state.events.next())
                        .await
                        .unwrap_or(None),
                    None => state.events.next().await,
                };
                let event = match next {
                    Some(Ok(event)) if event.data.trim() != "[DONE]" => event,
                    // Whatever ends the stream after the finish (its `[DONE]`, the end of
                    // the connection, a break, silence) leaves the answer complete.
                    _ if state.pending.is_some() => {
                        state.finished = true;
                        let finished = state.pending.take().map(|(f, _)| Ok(f));
                        return Some((finished.into_iter().collect(), state));
                    }
                    Some(Err(e)) => {
                        state.finished = true;
                        let error =
                            EngineError::Unreachable(format!("the upstream stream broke: {e}"));
                        return Some((vec![Err(error)], state));
                    }
                    // `[DONE]`, or the connection's end, before the upstream said it finished.
                    _ => {
                        state.finished = true;
                        return Some((vec![Err(EngineError::Disconnected)], state));
                    }
                };
                if let Some((finished, _)) = state.pending.as_mut() {
                    if let Ok(chunk) = serde_json::from_str::<Value>(&event.data)
                        && let Some(usage) = Usage::of(&chunk)
                    {
                        usage.fill(finished);
                        state.finished = true;
                        let finished = state.pending.take().map(|(f, _)| Ok(f));
                        return Some((finished.into_iter().collect(), state));
                    }
                    // Anything else after the finish is passed over, until the wait ends.
                    continue;
                }
                match chunk_items(&event.data) {
                    Ok((mut items, true, false)) => {
                        // vLLM and SGLang send the usage in a chunk after the finish.
                        let until = tokio::time::Instant::now() + TRAILING_USAGE_WAIT;
                        state.pending = items.pop().map(|finished| (finished, until));
                        if !items.is_empty() {
                            return Some((items.into_iter().map(Ok).collect(), state));
                        }
                    }
                    Ok((items, done, _)) if !items.is_empty() || done => {
                        state.finished = done;
                        return Some((items.into_iter().map(Ok).collect(), state));
                    }
                    Ok(_) => continue,
                    Err(error) => {
                        state.finished = true;
                        return Some((vec![Err(error)], state));
                    }
                }
            }
        })
        .flat_map(futures::stream::iter);
        Ok(stream.boxed())
    }
}

struct Upstream {
    events: futures::stream::BoxStream<
        'static,
        Result<eventsource_stream::Event, eventsource_stream::EventStreamError<reqwest::Error>>,
    >,
    _guard: InFlight,
    finished: bool,
    /// The `Finished` item of an answer whose finishing chunk had no usage, held for the
    /// usage chunk that follows it until the instant given (however much else comes).
    pending: Option<(GenerateOutput, tokio::time::Instant)>,
}

/// How long a finished answer waits for its trailing usage chunk (which vLLM and SGLang
/// send right after the finishing one) before it ends without it: well inside the
/// frontend's stall timeout (a second at least), which runs from the answer's last text.
const TRAILING_USAGE_WAIT: Duration = Duration::from_millis(250);

/// A chunk's `usage`: completion tokens, and the prompt tokens the upstream served from its
/// prefix cache (`prompt_tokens_details.cached_tokens`, which vLLM gives with
/// `--enable-prompt-tokens-details` and SGLang with `--enable-cache-report`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Usage {
    completion_tokens: Option<u32>,
    cached_tokens: Option<u32>,
}

impl Usage {
    fn of(chunk: &Value) -> Option<Usage> {
        let usage = chunk.get("usage").filter(|u| u.is_object())?;
        let count = |v: Option<&Value>| {
            v.and_then(Value::as_u64)
                .and_then(|c| u32::try_from(c).ok())
        };
        Some(Usage {
            completion_tokens: count(usage.get("completion_tokens")),
            cached_tokens: count(usage.pointer("/prompt_tokens_details/cached_tokens")),
        })
    }

    /// Completes a `Finished` item with what this usage says.
    fn fill(self, item: &mut GenerateOutput) {
        if let GenerateOutput::Finished {
            completion_tokens,
            cached_tokens,
            ..
        } = item
        {
            if let Some(c) = self.completion_tokens {
                *completion_tokens = c;
            }
            *cached_tokens = self.cached_tokens.or(*cached_tokens);
        }
    }
}

/// The upstream's error message, from an OpenAI-style error body if it is one.
fn upstream_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.pointer("/message"))
            .or_else(|| v.pointer("/detail"))
            .map(|m| match m {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
    });
    message.unwrap_or_else(|| body.chars().take(500).collect())
}

/// The items one streamed chunk stands for, whether the request finished with it, and
/// whether the chunk had a usage.
fn chunk_items(data: &str) -> Result<(Vec<GenerateOutput>, bool, bool), EngineError> {
    let chunk: Value = serde_json::from_str(data).map_err(|e| {
        EngineError::Internal(format!("the upstream sent a chunk that is not JSON: {e}"))
    })?;
    if let Some(error) = chunk.get("error") {
        let message = upstream_message(&json!({ "error": error }).to_string());
        return Err(EngineError::Internal(format!(
            "the upstream failed: {message}"
        )));
    }
    let mut items = Vec::new();
    let usage = Usage::of(&chunk);
    let choice = chunk.pointer("/choices/0");
    if let Some(text) = choice.and_then(|c| c.get("text")).and_then(Value::as_str)
        && !text.is_empty()
    {
        items.push(GenerateOutput::Text {
            text: text.to_owned(),
            tokens: None,
            cached_tokens: usage.and_then(|u| u.cached_tokens),
        });
    }
    let finish = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str);
    match finish {
        None => Ok((items, false, usage.is_some())),
        Some(reason) => {
            let reason = match reason {
                "length" => FinishReason::Length,
                "stop" | "eos" => FinishReason::Stop,
                "abort" | "cancelled" => FinishReason::Cancelled,
                other => {
                    return Err(EngineError::Internal(format!(
                        "the upstream finished for an unknown reason {other:?}"
                    )));
                }
            };
            let mut finished = GenerateOutput::Finished {
                reason,
                completion_tokens: 0,
                cached_tokens: None,
            };
            if let Some(usage) = usage {
                usage.fill(&mut finished);
            }
            items.push(finished);
            Ok((items, true, usage.is_some()))
        }
    }
}

/// Load names of the engines whose `/metrics` are understood: (running, waiting, KV cache
/// usage as a fraction).
const METRIC_NAMES: [(&str, &str, &[&str]); 3] = [
    (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    ),
    (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        &["sglang:token_usage"],
    ),
    (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        &["llamacpp:kv_cache_usage_ratio"],
    ),
];

/// The scale cache usage is reported on when the engine's capacity is unknown.
const USAGE_SCALE: u64 = 10_000;

/// What an engine's metrics say of its load: (running, waiting, cache usage).
pub fn load_from_metrics(text: &str) -> Option<(f64, f64, Option<f64>)> {
    use openmetrics_parser::PrometheusValue;
    let scrape = openmetrics_parser::prometheus::parse_prometheus(text).ok()?;
    // A gauge's samples summed over its labels (engines, data-parallel ranks).
    let sum = |name: &str| -> Option<f64> {
        let family = scrape.families.get(name)?;
        Some(
            family
                .iter_samples()
                .filter_map(|sample| match &sample.value {
                    PrometheusValue::Gauge(v) | PrometheusValue::Unknown(v) => Some(v.as_f64()),
                    PrometheusValue::Counter(c) => Some(c.value.as_f64()),
                    _ => None,
                })
                .sum(),
        )
    };
    METRIC_NAMES.iter().find_map(|(running, waiting, usage)| {
        let running = sum(running)?;
        let waiting = sum(waiting).unwrap_or(0.0);
        let usage = usage.iter().find_map(|name| sum(name));
        Some((running, waiting, usage))
    })
}

/// Reports the load: from the upstream's metrics while it serves them, else from the
/// requests in flight here.
async fn watch_load(
    client: reqwest::Client,
    metrics_url: String,
    config: OpenAiConfig,
    in_flight: Arc<AtomicU32>,
    load: watch::Sender<LoadSnapshot>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(config.metrics_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether the upstream has understood metrics (checked again now and then when not).
    let mut scrape = true;
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        ticks += 1;
        let mut snapshot = None;
        if scrape || ticks.is_multiple_of(30) {
            let answer = client
                .get(&metrics_url)
                .timeout(config.metrics_interval.max(Duration::from_millis(500)))
                .send()
                .await;
            let text = match answer {
                Ok(r) if r.status().is_success() => r.text().await.ok(),
                _ => None,
            };
            snapshot =
                text.as_deref()
                    .and_then(load_from_metrics)
                    .map(|(running, waiting, usage)| {
                        let capacity = config.capacity_blocks.unwrap_or(USAGE_SCALE);
                        LoadSnapshot {
                            running: running.max(0.0) as u32,
                            waiting: waiting.max(0.0) as u32,
                            active_blocks: (usage.unwrap_or(0.0).clamp(0.0, 1.0) * capacity as f64)
                                as u64,
                            capacity_blocks: capacity,
                            ..LoadSnapshot::default()
                        }
                    });
            scrape = snapshot.is_some();
        }
        let snapshot = snapshot.unwrap_or_else(|| {
            let n = in_flight.load(Ordering::Relaxed);
            let running = config.max_num_seqs.map_or(n, |max| n.min(max));
            LoadSnapshot {
                running,
                waiting: n - running,
                capacity_blocks: config.capacity_blocks.unwrap_or(0),
                ..LoadSnapshot::default()
            }
        });
        // Sent every time, changed or not: a frontend that missed a report (it started, or
        // saw the worker register, after it went out) gets the next one.
        load.send_replace(snapshot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_sglang_and_llamacpp_metrics() {
        let vllm = "# TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3\n\
            vllm:num_requests_running{model_name=\"m\",engine=\"1\"} 2\n\
            # TYPE vllm:num_requests_waiting gauge\n\
            vllm:num_requests_waiting{model_name=\"m\"} 4\n\
            # TYPE vllm:kv_cache_usage_perc gauge\n\
            vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n";
        assert_eq!(load_from_metrics(vllm), Some((5.0, 4.0, Some(0.25))));
        // As prometheus_client writes them (every family typed).
        let sglang = "# HELP sglang:num_running_reqs The number of running requests.\n\
            # TYPE sglang:num_running_reqs gauge\n\
            sglang:num_running_reqs{model_name=\"m\"} 7.0\n\
            # TYPE sglang:num_queue_reqs gauge\n\
            sglang:num_queue_reqs{model_name=\"m\"} 1.0\n\
            # TYPE sglang:token_usage gauge\n\
            sglang:token_usage{model_name=\"m\"} 0.5\n";
        assert_eq!(load_from_metrics(sglang), Some((7.0, 1.0, Some(0.5))));
        let llamacpp = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 0\n";
        assert_eq!(load_from_metrics(llamacpp), Some((1.0, 0.0, None)));
        assert_eq!(load_from_metrics("process_cpu_seconds_total 3\n"), None);
        assert_eq!(load_from_metrics("<html>not found</html>"), None);
    }

    #[test]
    fn chunks() {
        let (items, done, usage) =
            chunk_items(r#"{"choices":[{"text":"Hel","finish_reason":null}],"usage":null}"#)
                .unwrap();
        assert!(!done && !usage);
        assert_eq!(
            items,
            vec![GenerateOutput::Text {
                text: "Hel".into(),
                tokens: None,
                cached_tokens: None
            }]
        );
        let (items, done, usage) = chunk_items(
            r#"{"choices":[{"text":"","finish_reason":"length"}],"usage":{"completion_tokens":5,
                "prompt_tokens_details":{"cached_tokens":16}}}"#,
        )
        .unwrap();
        assert!(done && usage);
        assert_eq!(
            items,
            vec![GenerateOutput::Finished {
                reason: FinishReason::Length,
                completion_tokens: 5,
                cached_tokens: Some(16),
            }]
        );
        // A finish without usage (vLLM's and SGLang's usage comes in a chunk of its own).
        let (items, done, usage) =
            chunk_items(r#"{"choices":[{"text":"!","finish_reason":"stop"}],"usage":null}"#)
                .unwrap();
        assert!(done && !usage);
        assert_eq!(items.len(), 2);
        // The usage-only chunk after the finish: no item of its own; its usage is read.
        let (items, done, usage) =
            chunk_items(r#"{"choices":[],"usage":{"prompt_tokens":3}}"#).unwrap();
        assert!(items.is_empty() && !done && usage);
        assert!(chunk_items("not json").is_err());
        let err = chunk_items(r#"{"error":{"message":"boom"}}"#).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
    }

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
        assert!(events.validate().unwrap_err().contains("zmq://"));
    }
}
