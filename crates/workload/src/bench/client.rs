//! One timed HTTP exchange with an OpenAI-compatible server.

use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;
use reqwest::Url;
use serde_json::{Map, Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::BenchError;
use super::config::{BenchConfig, Endpoint};
use super::plan::PlannedRequest;
use super::record::{ErrorKind, RequestError, RequestRecord};
use super::response::{Usage, parse_chunk, parse_completion, snippet};

/// Connecting longer than this is a failure even when the request deadline is longer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends requests and times them; shared by every task of a run.
#[derive(Debug)]
pub(crate) struct Client {
    http: reqwest::Client,
    url: Url,
    model: String,
    endpoint: Endpoint,
    stream: bool,
    api_key: Option<String>,
    ignore_eos: bool,
    extra_body: Map<String, Value>,
    timeout: Duration,
}

/// What a successful exchange measured.
#[derive(Debug, Default)]
struct Measured {
    ttft: Option<Duration>,
    itl: Vec<Duration>,
    /// Content chunks (streaming) or words (not streaming).
    pieces: u64,
    usage: Option<Usage>,
    /// The answer's text.
    text: String,
}

impl Client {
    pub fn new(config: &BenchConfig) -> Result<Self, BenchError> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT.min(config.request_timeout))
            // Token chunks are small writes; do not let Nagle hold them back.
            .tcp_nodelay(true)
            .build()
            .map_err(BenchError::Client)?;
        Ok(Self {
            http,
            url: config.endpoint_url()?,
            model: config.model.clone(),
            endpoint: config.endpoint,
            stream: config.stream,
            api_key: config.api_key.clone(),
            ignore_eos: config.ignore_eos,
            extra_body: config.extra_body.clone(),
            timeout: config.request_timeout,
        })
    }

    /// Sends one request and records what happened; never fails (failures are recorded).
    pub async fn send(
        &self,
        request: PlannedRequest,
        run_start: Instant,
        cancel: &CancellationToken,
    ) -> RequestRecord {
        self.send_for_answer(request, run_start, cancel).await.0
    }

    /// [`Self::send`], and the answer's text (empty when it failed).
    pub async fn send_for_answer(
        &self,
        request: PlannedRequest,
        run_start: Instant,
        cancel: &CancellationToken,
    ) -> (RequestRecord, String) {
        let sent = Instant::now();
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => Err(RequestError::new(
                ErrorKind::Cancelled,
                "cancelled before the response ended",
            )),
            outcome = self.exchange(&request, sent) => outcome,
        };
        let latency = sent.elapsed();
        let mut record = RequestRecord {
            index: request.index,
            scheduled: request.scheduled,
            start: sent.saturating_duration_since(run_start),
            ttft: None,
            itl: Vec::new(),
            latency,
            input_tokens: request.prompt_tokens,
            output_tokens: 0,
            usage_reported: false,
            cached_tokens: None,
            error: None,
        };
        let mut answer = String::new();
        match outcome {
            Ok(measured) => {
                answer = measured.text;
                record.ttft = measured.ttft;
                record.itl = measured.itl;
                record.output_tokens = measured.pieces;
                if let Some(usage) = measured.usage {
                    record.input_tokens = usage.prompt_tokens;
                    record.output_tokens = usage.completion_tokens;
                    record.usage_reported = true;
                    record.cached_tokens = usage.cached_tokens;
                }
            }
            Err(error) => record.error = Some(error),
        }
        (record, answer)
    }

    fn body(&self, request: &PlannedRequest) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": request.max_tokens,
            "stream": self.stream,
        });
        if let Value::Object(fields) = &mut body {
            match self.endpoint {
                Endpoint::Chat => fields.insert(
                    "messages".into(),
                    match &request.history {
                        None => json!([{"role": "user", "content": request.prompt}]),
                        Some(history) => {
                            let mut messages: Vec<Value> = history
                                .iter()
                                .map(|(role, content)| json!({"role": role, "content": content}))
                                .collect();
                            messages.push(json!({"role": "user", "content": request.prompt}));
                            Value::Array(messages)
                        }
                    },
                ),
                Endpoint::Completions => {
                    // A session's earlier turns, then this one's text, as one prompt.
                    let mut prompt = String::new();
                    for (_, content) in request.history.iter().flat_map(|h| h.iter()) {
                        prompt.push_str(content);
                        prompt.push(' ');
                    }
                    prompt.push_str(&request.prompt);
                    fields.insert("prompt".into(), json!(prompt))
                }
            };
            if self.stream {
                // Ask for a final usage chunk: exact token counts from the server.
                fields.insert("stream_options".into(), json!({"include_usage": true}));
            }
            if self.ignore_eos {
                fields.insert("ignore_eos".into(), json!(true));
            }
            for (key, value) in &self.extra_body {
                fields.insert(key.clone(), value.clone());
            }
        }
        body
    }

    async fn exchange(
        &self,
        request: &PlannedRequest,
        sent: Instant,
    ) -> Result<Measured, RequestError> {
        let mut builder = self
            .http
            .post(self.url.clone())
            .timeout(self.timeout)
            .json(&self.body(request));
        if let Some(key) = &self.api_key {
            builder = builder.bearer_auth(key);
        }
        let response = builder.send().await.map_err(transport_error)?;
        let status = response.status();
        if !status.is_success() {
            let body = response.bytes().await.unwrap_or_default();
            return Err(RequestError::new(
                ErrorKind::Http(status.as_u16()),
                error_message(&body),
            ));
        }
        if self.stream {
            read_stream(response, sent).await
        } else {
            let body = response.bytes().await.map_err(transport_error)?;
            let completion = parse_completion(&body)?;
            Ok(Measured {
                pieces: completion.words,
                usage: completion.usage,
                text: completion.text,
                ..Measured::default()
            })
        }
    }
}

/// Reads a server-sent-event stream, timing every chunk that carries text.
async fn read_stream(response: reqwest::Response, sent: Instant) -> Result<Measured, RequestError> {
    let mut events = std::pin::pin!(response.bytes_stream().eventsource());
    let mut measured = Measured::default();
    let mut last_token: Option<Instant> = None;
    let (mut done, mut finished) = (false, false);
    while let Some(event) = events.next().await {
        let event = event.map_err(stream_error)?;
        let now = Instant::now();
        let data = event.data.trim();
        if data == "[DONE]" {
            done = true;
            break;
        }
        if data.is_empty() {
            continue;
        }
        let chunk = parse_chunk(data)?;
        if chunk.content {
            measured.pieces += 1;
            match last_token {
                None => measured.ttft = Some(now.saturating_duration_since(sent)),
                Some(previous) => measured.itl.push(now.saturating_duration_since(previous)),
            }
            last_token = Some(now);
        }
        finished |= chunk.finished;
        measured.usage = chunk.usage.or(measured.usage);
        measured.text.push_str(&chunk.text);
    }
    if !done && !finished {
        return Err(RequestError::new(
            ErrorKind::Incomplete,
            format!(
                "the stream ended after {} chunks without [DONE] or a finish reason",
                measured.pieces
            ),
        ));
    }
    Ok(measured)
}

fn transport_error(error: reqwest::Error) -> RequestError {
    let kind = if error.is_timeout() {
        ErrorKind::Timeout
    } else if error.is_connect() {
        ErrorKind::Connect
    } else {
        ErrorKind::Dropped
    };
    RequestError::new(kind, error_chain(&error))
}

fn stream_error(error: EventStreamError<reqwest::Error>) -> RequestError {
    match error {
        EventStreamError::Transport(e) => transport_error(e),
        EventStreamError::Utf8(e) => RequestError::new(ErrorKind::Protocol, e.to_string()),
        EventStreamError::Parser(e) => RequestError::new(ErrorKind::Protocol, e.to_string()),
    }
}

/// The `error.message` of an OpenAI-style error body, else the start of the body.
fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| snippet(body))
}

/// The error and its causes on one line: reqwest's own message hides the useful part.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
