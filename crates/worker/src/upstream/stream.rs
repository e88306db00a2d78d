//! One request to the upstream: a streamed `/v1/completions` call whose server-sent events
//! become the request's generate output, the answer's usage (its completion and cached
//! tokens) read from the chunk that carries it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateOutput, GenerateRequest, Phase, TextLogprob,
};
use switchyard_runtime::{EngineService, ResponseStream};

use super::PromptFormat;

/// The request service: each request a call to `completions`, counted in `in_flight`
/// while it lasts.
#[derive(Debug)]
pub(super) struct UpstreamService {
    pub(super) client: reqwest::Client,
    pub(super) completions: String,
    pub(super) model: String,
    pub(super) api_key: Option<String>,
    pub(super) prompt: PromptFormat,
    pub(super) constraints: super::ConstraintDialect,
    pub(super) in_flight: Arc<AtomicU32>,
    pub(super) timeout: Duration,
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
            // The completions API's count of alternatives (its answer gives the token's).
            ("logprobs", s.logprobs.map(|v| json!(v))),
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
            if let Some(constraint) = &s.constraint {
                let (name, value) = self.constraints.field(constraint)?;
                map.insert(name.into(), value);
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
        if request.sampling.prompt_logprobs.is_some() {
            return Err(EngineError::Unsupported(
                "this worker does not report a prompt's log probabilities".into(),
            ));
        }
        let asked = request.sampling.logprobs.is_some();
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
        let stream = futures::stream::unfold(state, move |mut state| async move {
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
                match chunk_items(&event.data, asked) {
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

/// A completions chunk's `logprobs` (`tokens`, `token_logprobs`, `top_logprobs` as an
/// object per token), one entry per token, alternatives likeliest first.
fn text_logprobs(logprobs: &Value) -> Option<Vec<TextLogprob>> {
    let tokens = logprobs.get("tokens")?.as_array()?;
    let values = logprobs.get("token_logprobs")?.as_array()?;
    let tops = logprobs.get("top_logprobs").and_then(Value::as_array);
    tokens
        .iter()
        .enumerate()
        .map(|(i, token)| {
            let mut top: Vec<(String, f32)> = tops
                .and_then(|t| t.get(i)?.as_object())
                .into_iter()
                .flatten()
                .filter_map(|(text, l)| Some((text.clone(), l.as_f64()? as f32)))
                .collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            Some(TextLogprob {
                token: token.as_str()?.to_owned(),
                logprob: values
                    .get(i)?
                    .as_f64()
                    .map_or(f32::NEG_INFINITY, |l| l as f32),
                top,
            })
        })
        .collect()
}

/// The items one streamed chunk stands for, whether the request finished with it, and
/// whether the chunk had a usage. `asked`: the request asked for log probabilities, so
/// text without them is an error.
fn chunk_items(data: &str, asked: bool) -> Result<(Vec<GenerateOutput>, bool, bool), EngineError> {
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
    let logprobs = choice
        .and_then(|c| c.get("logprobs"))
        .filter(|l| asked && !l.is_null())
        .map(|l| {
            text_logprobs(l).ok_or_else(|| {
                EngineError::Internal(format!(
                    "the upstream sent log probabilities this worker cannot read: {l}"
                ))
            })
        })
        .transpose()?
        .unwrap_or_default();
    if let Some(text) = choice.and_then(|c| c.get("text")).and_then(Value::as_str)
        && (!text.is_empty() || !logprobs.is_empty())
    {
        if asked && logprobs.is_empty() && !text.is_empty() {
            return Err(EngineError::Internal(
                "the upstream sent text without the log probabilities asked for".into(),
            ));
        }
        items.push(GenerateOutput::Text {
            text: text.to_owned(),
            tokens: None,
            cached_tokens: usage.and_then(|u| u.cached_tokens),
            logprobs,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks() {
        let (items, done, usage) = chunk_items(
            r#"{"choices":[{"text":"Hel","finish_reason":null}],"usage":null}"#,
            false,
        )
        .unwrap();
        assert!(!done && !usage);
        assert_eq!(
            items,
            vec![GenerateOutput::Text {
                text: "Hel".into(),
                tokens: None,
                cached_tokens: None,
                logprobs: Vec::new(),
            }]
        );
        let (items, done, usage) = chunk_items(
            r#"{"choices":[{"text":"","finish_reason":"length"}],"usage":{"completion_tokens":5,
                "prompt_tokens_details":{"cached_tokens":16}}}"#,
            false,
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
        let (items, done, usage) = chunk_items(
            r#"{"choices":[{"text":"!","finish_reason":"stop"}],"usage":null}"#,
            false,
        )
        .unwrap();
        assert!(done && !usage);
        assert_eq!(items.len(), 2);
        // The usage-only chunk after the finish: no item of its own; its usage is read.
        let (items, done, usage) =
            chunk_items(r#"{"choices":[],"usage":{"prompt_tokens":3}}"#, false).unwrap();
        assert!(items.is_empty() && !done && usage);
        assert!(chunk_items("not json", false).is_err());
        let err = chunk_items(r#"{"error":{"message":"boom"}}"#, false).unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
    }

    /// llama.cpp's server's streamed chunk, as it sends it.
    const WITH_LOGPROBS: &str = r#"{"choices": [{"text": " Paris", "index": 0, "logprobs":
        {"tokens": [" Paris"], "text_offset": [24], "token_logprobs": [-0.3013],
        "top_logprobs": [{" the": -2.5071, " Paris": -0.3013}]}, "finish_reason": null}]}"#;

    #[test]
    fn log_probabilities_pass_through_and_their_absence_is_an_error() {
        let (items, _, _) = chunk_items(WITH_LOGPROBS, true).unwrap();
        let GenerateOutput::Text { text, logprobs, .. } = &items[0] else {
            panic!("{items:?}");
        };
        assert_eq!(text, " Paris");
        assert_eq!(
            logprobs,
            &vec![TextLogprob {
                token: " Paris".into(),
                logprob: -0.3013,
                top: vec![(" Paris".into(), -0.3013), (" the".into(), -2.5071)],
            }]
        );
        // Not asked: not passed on.
        let (items, _, _) = chunk_items(WITH_LOGPROBS, false).unwrap();
        assert!(matches!(&items[0], GenerateOutput::Text { logprobs, .. } if logprobs.is_empty()));
        // Asked, and the upstream sent text without them.
        let bare = r#"{"choices":[{"text":"Hel","finish_reason":null}]}"#;
        assert!(chunk_items(bare, true).is_err());
        // The finishing chunk has none and no text: fine.
        let end = r#"{"choices":[{"text":"","logprobs":null,"finish_reason":"length"}]}"#;
        assert!(chunk_items(end, true).is_ok());
        let unreadable = r#"{"choices":[{"text":"a","logprobs":{"tokens":"a"}}]}"#;
        assert!(chunk_items(unreadable, true).is_err());
    }
}
