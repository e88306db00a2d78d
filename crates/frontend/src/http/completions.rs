//! `/v1/chat/completions` and `/v1/completions`, streamed (SSE) or not.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::{Stream, StreamExt};
use switchyard_core::WorkerKey;
use tracing::Instrument;

use super::body;
use super::service::unix_now;
use crate::auth::Grant;
use crate::convert::{self, Mode};
use crate::media::OnEncoderFailure;
use crate::openai::ApiError;
use crate::openai::request::{ChatCompletionRequest, CompletionRequest};
use crate::openai::response::{
    ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta, ChatMessageOut,
    Completion, CompletionChoice, Usage,
};
use crate::pipeline::encode::{MediaStatus, resized_warning, text_only_warning};
use crate::pipeline::{Frontend, Generation, Piece, Prepared, WARNING_HEADER};

/// Bodies at least this large are converted (chat template, tokenizer) on the blocking
/// pool: a long prompt takes milliseconds to tokenize, which must not stall the async
/// threads serving every other stream.
const BLOCKING_CONVERT_BYTES: usize = 16 << 10;

/// The header naming the worker a response came from.
pub const WORKER_HEADER: &str = "x-switchyard-worker";

/// Validates and tokenizes a parsed request (see [`convert`]).
type Convert<R> = fn(&Frontend, R) -> Result<(Prepared, Mode), ApiError>;

/// Validates and tokenizes a parsed request, off the async threads when it is large.
async fn convert_sized<R: Send + 'static>(
    frontend: &Arc<Frontend>,
    size: usize,
    request: R,
    convert: Convert<R>,
) -> Result<(Prepared, Mode), ApiError> {
    if size < BLOCKING_CONVERT_BYTES {
        return convert(frontend, request);
    }
    let frontend = Arc::clone(frontend);
    tokio::task::spawn_blocking(move || convert(&frontend, request))
        .await
        .map_err(|e| ApiError::internal(format!("Cannot tokenize the prompt: {e}")))?
}

fn with_worker(mut response: Response, worker: WorkerKey) -> Response {
    if let Ok(value) = HeaderValue::from_str(&worker.to_string()) {
        response.headers_mut().insert(WORKER_HEADER, value);
    }
    response
}

/// A request's trace span: the root of its trace (see [`Prepared::span`]).
fn request_span(route: &'static str) -> tracing::Span {
    tracing::info_span!(
        "request",
        route,
        request_id = tracing::field::Empty,
        prompt_tokens = tracing::field::Empty,
        ttft_ms = tracing::field::Empty,
        completion_tokens = tracing::field::Empty,
    )
}

/// Applies the API key's tier, token budget and tenant to a converted request.
fn apply_grant(grant: Option<&Grant>, prepared: &mut Prepared) -> Result<(), ApiError> {
    let Some(Grant(key)) = grant else {
        return Ok(());
    };
    prepared.priority = Some(key.priority(prepared.priority));
    let tokens = (prepared.prompt.len() as u64 + u64::from(prepared.max_tokens))
        .min(u64::from(u32::MAX)) as u32;
    key.charge_tokens(tokens)?;
    prepared.tenant = Some(Arc::clone(&key.tenant));
    Ok(())
}

/// Chat completion: JSON, or server-sent events when `stream` is true.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    request_body(content = ChatCompletionRequest, content_type = "application/json", examples(
        ("plain" = (value = json!({"model": "switchyard-mock", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}))),
        ("stream" = (value = json!({"model": "switchyard-mock", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true}))))),
    responses((status = 200, description = "The completion, or its event stream when `stream` is true",
        content((ChatCompletion = "application/json"), (super::SseEvent = "text/event-stream")))))]
pub async fn chat(
    State(frontend): State<Arc<Frontend>>,
    grant: Option<Extension<Grant>>,
    headers: HeaderMap,
    request: Result<Bytes, BytesRejection>,
) -> Response {
    let size = request.as_ref().map_or(0, Bytes::len);
    let span = request_span("/v1/chat/completions");
    let result = async {
        let request: ChatCompletionRequest =
            body::parse(&headers, request, frontend.config.max_body_bytes)?;
        convert::check_model(&frontend, &request.model)?;
        convert::check_messages(&request)?;
        let media = tracing::Instrument::instrument(
            frontend
                .media
                .prepare_chat(&request, || convert::media_room(&frontend, &request)),
            tracing::info_span!("media"),
        )
        .await?;
        let items = media.clone();
        let (mut prepared, mode) = tracing::Instrument::instrument(
            convert_sized(&frontend, size, (request, media), convert::chat),
            tracing::info_span!("preprocess"),
        )
        .await?;
        let ready = tracing::Instrument::instrument(
            frontend.encode_or_fall_back(&items, &mut prepared.prompt),
            tracing::info_span!("encode"),
        )
        .await?;
        // Media not encoded because a worker holds their KV go to that worker.
        prepared.overrides.worker = ready.worker;
        prepared.media = ready.pending.clone();
        prepared.features = ready.features.clone();
        // The media's features stay held until the response ends.
        prepared.hold = Some(ready.hold);
        let (warning, pending) = (ready.warning, ready.pending);
        prepared.span = tracing::Span::current();
        apply_grant(grant.as_ref().map(|g| &g.0), &mut prepared)?;
        let dispatched = frontend.generate(prepared).await?;
        Ok::<_, ApiError>((
            format!("chatcmpl-{:016x}", dispatched.id.0),
            dispatched,
            mode,
            warning,
            pending,
        ))
    }
    .instrument(span)
    .await;
    let (id, dispatched, mode, warning, pending) = match result {
        Ok(ok) => ok,
        Err(e) => return e.into_response(),
    };
    let text_only = frontend.media.on_encoder_failure().0 == OnEncoderFailure::TextOnly;
    let worker = dispatched.worker;
    let response = if mode.stream {
        chat_stream(frontend, id, dispatched.generation, mode).into_response()
    } else {
        match collect(dispatched.generation).await {
            Ok((text, reason, usage)) => Json(ChatCompletion {
                id,
                object: "chat.completion",
                created: unix_now(),
                model: frontend.config.model.clone(),
                choices: vec![ChatChoice {
                    index: 0,
                    message: ChatMessageOut {
                        role: "assistant",
                        content: text,
                    },
                    finish_reason: Some(reason),
                    logprobs: None,
                }],
                usage,
            })
            .into_response(),
            Err(e) => e.into_response(),
        }
    };
    let mut response = with_worker(response, worker);
    // Media that failed behind the request (sent ahead of them), known once it is
    // answered whole: a stream's headers went before.
    let warning = warning.or_else(|| match pending.as_ref().map(|p| p.borrow().clone()) {
        Some(MediaStatus::Failed(why)) if text_only => Some(text_only_warning(&why)),
        Some(MediaStatus::Ready(resized, _)) if !resized.is_empty() => {
            Some(resized_warning(resized.len()))
        }
        _ => None,
    });
    // Header values are visible ASCII: anything else becomes `?`.
    let warning = warning.map(|w| {
        w.chars()
            .map(|c| {
                if c == ' ' || c.is_ascii_graphic() {
                    c
                } else {
                    '?'
                }
            })
            .collect::<String>()
    });
    if let Some(value) = warning.and_then(|w| HeaderValue::from_str(&w).ok()) {
        response.headers_mut().insert(WARNING_HEADER, value);
    }
    response
}

/// Text completion: JSON, or server-sent events when `stream` is true.
#[utoipa::path(post, path = "/v1/completions", tag = "openai",
    request_body(content = CompletionRequest, content_type = "application/json", examples(
        ("plain" = (value = json!({"model": "switchyard-mock", "prompt": "Once upon a time", "max_tokens": 8}))),
        ("stream" = (value = json!({"model": "switchyard-mock", "prompt": "Once upon a time", "max_tokens": 8, "stream": true}))))),
    responses((status = 200, description = "The completion, or its event stream when `stream` is true",
        content((Completion<'static> = "application/json"), (super::SseEvent = "text/event-stream")))))]
pub async fn completion(
    State(frontend): State<Arc<Frontend>>,
    grant: Option<Extension<Grant>>,
    headers: HeaderMap,
    request: Result<Bytes, BytesRejection>,
) -> Response {
    let size = request.as_ref().map_or(0, Bytes::len);
    let span = request_span("/v1/completions");
    let result = async {
        let request: CompletionRequest =
            body::parse(&headers, request, frontend.config.max_body_bytes)?;
        let (mut prepared, mode) = tracing::Instrument::instrument(
            convert_sized(&frontend, size, request, convert::completion),
            tracing::info_span!("preprocess"),
        )
        .await?;
        prepared.span = tracing::Span::current();
        apply_grant(grant.as_ref().map(|g| &g.0), &mut prepared)?;
        let dispatched = frontend.generate(prepared).await?;
        Ok::<_, ApiError>((format!("cmpl-{:016x}", dispatched.id.0), dispatched, mode))
    }
    .instrument(span)
    .await;
    let (id, dispatched, mode) = match result {
        Ok(ok) => ok,
        Err(e) => return e.into_response(),
    };
    let worker = dispatched.worker;
    let response = if mode.stream {
        completion_stream(frontend, id, dispatched.generation, mode).into_response()
    } else {
        match collect(dispatched.generation).await {
            Ok((text, reason, usage)) => {
                let model = frontend.config.model.clone();
                let choice = CompletionChoice {
                    index: 0,
                    text,
                    finish_reason: Some(reason),
                    logprobs: None,
                };
                Json(Completion {
                    id: &id,
                    object: "text_completion",
                    created: unix_now(),
                    model: &model,
                    choices: vec![choice],
                    usage: Some(usage),
                })
                .into_response()
            }
            Err(e) => e.into_response(),
        }
    };
    with_worker(response, worker)
}

/// The whole response, for non-streamed requests.
async fn collect(mut generation: Generation) -> Result<(String, &'static str, Usage), ApiError> {
    let mut text = String::new();
    while let Some(piece) = generation.next().await {
        match piece? {
            Piece::Text(t) => text.push_str(&t),
            Piece::Finished { reason, usage } => return Ok((text, reason, usage)),
        }
    }
    Err(ApiError::internal("The response ended early."))
}

fn json_event<T: serde::Serialize>(value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(json) => Event::default().data(json),
        Err(e) => Event::default().data(ApiError::internal(e.to_string()).body()),
    }
}

/// SSE around a generation: an opening event, one per piece, the end (with usage when
/// asked), then `[DONE]`.
///
/// A failure midway (a stream no worker could continue) is sent as an event whose data is
/// an OpenAI error object (`{"error": {"message", "type", "code", ...}}`, code never null)
/// and the stream closes there, without `[DONE]`: `[DONE]` means the answer is complete,
/// and a client that waits for it must not take a truncated answer for a whole one. The
/// OpenAI SDKs raise an `APIError` on such an event.
fn sse(
    generation: Generation,
    first: Option<Event>,
    piece: impl Fn(Piece) -> Vec<Event> + Send + 'static,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failed_seen = Arc::clone(&failed);
    let body = futures::stream::iter(first)
        .chain(generation.flat_map(move |item| {
            let events = match item {
                Ok(p) => piece(p),
                Err(e) => {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                    vec![Event::default().data(e.body())]
                }
            };
            futures::stream::iter(events)
        }))
        .chain(
            futures::stream::once(async move {
                (!failed_seen.load(std::sync::atomic::Ordering::Relaxed))
                    .then(|| Event::default().data("[DONE]"))
            })
            .filter_map(futures::future::ready),
        )
        .map(Ok);
    Sse::new(body)
}

fn chat_stream(
    frontend: Arc<Frontend>,
    id: String,
    generation: Generation,
    mode: Mode,
) -> Response {
    let created = unix_now();
    let model = frontend.config.model.clone();
    let chunk = move |delta: Option<ChatDelta>,
                      finish_reason: Option<&'static str>,
                      usage: Option<Usage>| {
        let choices = delta
            .map(|delta| ChatChunkChoice {
                index: 0,
                delta,
                finish_reason,
                logprobs: None,
            })
            .into_iter()
            .collect();
        json_event(&ChatCompletionChunk {
            id: &id,
            object: "chat.completion.chunk",
            created,
            model: &model,
            choices,
            usage,
        })
    };
    let opening = chunk(
        Some(ChatDelta {
            role: Some("assistant"),
            content: Some(String::new()),
        }),
        None,
        None,
    );
    sse(generation, Some(opening), move |piece| match piece {
        Piece::Text(text) => vec![chunk(
            Some(ChatDelta {
                role: None,
                content: Some(text),
            }),
            None,
            None,
        )],
        Piece::Finished { reason, usage } => {
            let mut events = vec![chunk(Some(ChatDelta::default()), Some(reason), None)];
            if mode.include_usage {
                events.push(chunk(None, None, Some(usage)));
            }
            events
        }
    })
    .into_response()
}

fn completion_stream(
    frontend: Arc<Frontend>,
    id: String,
    generation: Generation,
    mode: Mode,
) -> Response {
    let created = unix_now();
    let model = frontend.config.model.clone();
    let chunk = move |text: String, finish_reason: Option<&'static str>, usage: Option<Usage>| {
        let choices = if usage.is_some() {
            vec![]
        } else {
            vec![CompletionChoice {
                index: 0,
                text,
                finish_reason,
                logprobs: None,
            }]
        };
        json_event(&Completion {
            id: &id,
            object: "text_completion",
            created,
            model: &model,
            choices,
            usage,
        })
    };
    sse(generation, None, move |piece| match piece {
        Piece::Text(text) => vec![chunk(text, None, None)],
        Piece::Finished { reason, usage } => {
            let mut events = vec![chunk(String::new(), Some(reason), None)];
            if mode.include_usage {
                events.push(chunk(String::new(), None, Some(usage)));
            }
            events
        }
    })
    .into_response()
}
