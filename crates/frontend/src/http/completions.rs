//! `/v1/completions`, streamed (SSE) or not, and what it shares with `/v1/chat/completions`
//! (`super::chat`): conversion, dispatch of the choices, collection, the SSE merge.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use switchyard_core::{Token, WorkerKey};
use tracing::Instrument;

use super::body;
use super::service::unix_now;
use crate::auth::Grant;
use crate::convert::{self, Mode};
use crate::openai::ApiError;
use crate::openai::logprobs::CompletionLogprobs;
use crate::openai::request::CompletionRequest;
use crate::openai::response::{Completion, CompletionChoice, Usage};
use crate::pipeline::{Frontend, Generation, Piece, Prepared, Scored};

/// Bodies at least this large are converted (chat template, tokenizer) on the blocking
/// pool: a long prompt takes milliseconds to tokenize, which must not stall the async
/// threads serving every other stream.
const BLOCKING_CONVERT_BYTES: usize = 16 << 10;

/// The header naming the worker a response came from.
pub const WORKER_HEADER: &str = "x-switchyard-worker";

/// Validates and tokenizes a parsed request (see [`convert`]).
type Convert<R, O> = fn(&Frontend, R) -> Result<O, ApiError>;

/// Validates and tokenizes a parsed request, off the async threads when it is large.
pub(super) async fn convert_sized<R: Send + 'static, O: Send + 'static>(
    frontend: &Arc<Frontend>,
    size: usize,
    request: R,
    convert: Convert<R, O>,
) -> Result<O, ApiError> {
    if size < BLOCKING_CONVERT_BYTES {
        return convert(frontend, request);
    }
    // One large conversion per core at a time; a request whose client goes while it waits
    // for its turn is dropped here and never tokenized.
    let _turn = frontend
        .tokenizing
        .acquire()
        .await
        .map_err(|e| ApiError::internal(format!("Cannot tokenize the prompt: {e}")))?;
    let frontend = Arc::clone(frontend);
    tokio::task::spawn_blocking(move || convert(&frontend, request))
        .await
        .map_err(|e| ApiError::internal(format!("Cannot tokenize the prompt: {e}")))?
}

pub(super) fn with_worker(mut response: Response, worker: WorkerKey) -> Response {
    if let Ok(value) = HeaderValue::from_str(&worker.to_string()) {
        response.headers_mut().insert(WORKER_HEADER, value);
    }
    response
}

/// A request's trace span: the root of its trace (see [`Prepared::span`]).
pub(super) fn request_span(route: &'static str) -> tracing::Span {
    tracing::info_span!(
        "request",
        route,
        request_id = tracing::field::Empty,
        prompt_tokens = tracing::field::Empty,
        ttft_ms = tracing::field::Empty,
        completion_tokens = tracing::field::Empty,
    )
}

/// Applies the API key's tier, token budget and tenant to a converted request of
/// `choices` choices (the prompt is charged once, the completion once a choice).
pub(super) fn apply_grant(
    grant: Option<&Grant>,
    prepared: &mut Prepared,
    choices: u32,
) -> Result<(), ApiError> {
    let Some(Grant(key)) = grant else {
        return Ok(());
    };
    prepared.priority = Some(key.priority(prepared.priority));
    let tokens = (prepared.prompt.len() as u64
        + u64::from(prepared.max_tokens) * u64::from(choices.max(1)))
    .min(u64::from(u32::MAX)) as u32;
    key.charge_tokens(tokens)?;
    prepared.tenant = Some(Arc::clone(&key.tenant));
    Ok(())
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
        let (mut prepared, mode, echo) = tracing::Instrument::instrument(
            convert_sized(&frontend, size, request, convert::completion),
            tracing::info_span!("preprocess"),
        )
        .await?;
        prepared.span = tracing::Span::current();
        apply_grant(grant.as_ref().map(|g| &g.0), &mut prepared, mode.choices)?;
        let dispatched = dispatch(&frontend, prepared, mode.choices).await?;
        let id = format!("cmpl-{:016x}", dispatched.id.0);
        Ok::<_, ApiError>((id, dispatched, (mode, echo)))
    }
    .instrument(span)
    .await;
    let (id, dispatched, (mode, echo)) = match result {
        Ok(ok) => ok,
        Err(e) => return e.into_response(),
    };
    let worker = dispatched.worker;
    let response = if mode.stream {
        completion_stream(frontend, id, dispatched.generations, (mode, echo)).into_response()
    } else {
        match collect_all(dispatched.generations).await {
            Ok((answers, usage)) => {
                let model = frontend.config.model.clone();
                let preprocessor = &frontend.preprocessor;
                let echo = echo.unwrap_or_default();
                let shift = echo.chars().count() as u32;
                let choices = answers
                    .into_iter()
                    .zip(0..)
                    .map(|(answer, index)| CompletionChoice {
                        index,
                        logprobs: mode.logprobs.map(|top| {
                            let mut logprobs = match &answer.prompt {
                                Some((first, prompt)) => CompletionLogprobs::of_prompt(
                                    preprocessor,
                                    *first,
                                    prompt,
                                    top > 0,
                                ),
                                None => CompletionLogprobs::default(),
                            };
                            logprobs.extend(preprocessor, &answer.scored, top > 0, shift);
                            if top > 0 {
                                logprobs.top_logprobs.get_or_insert_with(Vec::new);
                            }
                            logprobs
                        }),
                        text: format!("{echo}{}", answer.text),
                        finish_reason: Some(answer.reason),
                    })
                    .collect();
                Json(Completion {
                    id: &id,
                    object: "text_completion",
                    created: unix_now(),
                    model: &model,
                    choices,
                    usage: Some(usage),
                })
                .into_response()
            }
            Err(e) => e.into_response(),
        }
    };
    with_worker(response, worker)
}

/// One choice's whole answer.
pub(super) struct Collected {
    pub text: String,
    pub reason: &'static str,
    /// Its tokens' log probabilities, when the request asked.
    pub scored: Vec<Scored>,
    /// Its prompt's first token and the others' log probabilities, when asked (`echo`).
    pub prompt: Option<(Token, Vec<Scored>)>,
    pub usage: Usage,
    /// Its token ids, when the request kept them ([`Prepared::keep_generated`]).
    pub generated: Vec<Token>,
}

/// The whole response, for non-streamed requests.
pub(super) async fn collect(mut generation: Generation) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut all = Vec::new();
    let mut prompt = None;
    while let Some(piece) = generation.next().await {
        match piece? {
            Piece::Prompt { first, scored } => prompt = Some((first, scored)),
            Piece::Text { text: t, scored } => {
                text.push_str(&t);
                all.extend(scored);
            }
            // Collected answers are parsed whole, after.
            Piece::Parts { .. } => {}
            Piece::Finished {
                reason,
                usage,
                generated,
                ..
            } => {
                return Ok(Collected {
                    text,
                    reason,
                    scored: all,
                    prompt,
                    usage,
                    generated,
                });
            }
        }
    }
    Err(ApiError::internal("The response ended early."))
}

/// Every choice's whole answer, in order, and their usage together.
pub(super) async fn collect_all(
    generations: Vec<Generation>,
) -> Result<(Vec<Collected>, Usage), ApiError> {
    let answers = futures::future::try_join_all(generations.into_iter().map(collect)).await?;
    let usage = combined(answers.iter().map(|answer| answer.usage));
    Ok((answers, usage))
}

/// The usage of a request's choices together: its prompt once (with what the first choice
/// found cached of it), every choice's completion.
pub(super) fn combined(usages: impl IntoIterator<Item = Usage>) -> Usage {
    let mut usages = usages.into_iter();
    let Some(first) = usages.next() else {
        return Usage::new(0, 0, None);
    };
    let completion = usages.fold(first.completion_tokens, |sum, u| {
        sum.saturating_add(u.completion_tokens)
    });
    Usage::new(
        first.prompt_tokens,
        completion,
        first
            .prompt_tokens_details
            .as_ref()
            .map(|details| details.cached_tokens),
    )
}

/// A request's choices on their way: the first's id and worker, every choice's stream.
pub(super) struct Choices {
    pub(super) id: switchyard_core::RequestId,
    pub(super) worker: WorkerKey,
    pub(super) generations: Vec<Generation>,
}

/// Dispatches a request's `choices` (OpenAI's `n`): the first where the router sends it,
/// through admission for all of them; then the others at once, to the same worker, where
/// its prompt's KV is being computed (as an engine serving `n` samples keeps them
/// together), unless that worker cannot take them. One that fails fails the whole
/// request, and the choices already dispatched are cancelled as their streams drop.
pub(super) async fn dispatch(
    frontend: &Arc<Frontend>,
    prepared: Prepared,
    choices: u32,
) -> Result<Choices, ApiError> {
    let others: Vec<Prepared> = (1..choices).map(|i| prepared.choice(i)).collect();
    let first = frontend.generate(prepared).await?;
    let others = futures::future::try_join_all(others.into_iter().map(|mut choice| {
        choice.overrides.worker = Some(first.worker.worker_id);
        frontend.generate(choice)
    }))
    .await?;
    let generations = std::iter::once(first.generation)
        .chain(others.into_iter().map(|d| d.generation))
        .collect();
    Ok(Choices {
        id: first.id,
        worker: first.worker,
        generations,
    })
}

pub(super) fn json_event<T: serde::Serialize>(value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(json) => Event::default().data(json),
        Err(e) => Event::default().data(ApiError::internal(e.to_string()).body()),
    }
}

/// SSE around a request's generations (its choices): the opening events, one per piece,
/// each choice's end, then, once every choice has ended, their usage together (when asked)
/// and `[DONE]`.
///
/// A failure midway (a stream no worker could continue) is sent as an event whose data is
/// an OpenAI error object (`{"error": {"message", "type", "code", ...}}`, code never null)
/// and the stream closes there, without `[DONE]`, the other choices cancelled: `[DONE]`
/// means the answer is complete, and a client that waits for it must not take a truncated
/// answer for a whole one. The OpenAI SDKs raise an `APIError` on such an event.
pub(super) fn sse<P, U>(
    generations: Vec<Generation>,
    opening: Vec<Event>,
    piece: P,
    usage: Option<U>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    P: Fn(u32, Piece) -> Vec<Event> + Send + 'static,
    U: Fn(Usage) -> Event + Send + 'static,
{
    let open = generations.len();
    let merged = futures::stream::select_all(
        generations
            .into_iter()
            .zip(0u32..)
            .map(|(generation, index)| generation.map(move |item| (index, item)).boxed()),
    );
    let merge = Merge {
        merged,
        open,
        ended: false,
        usages: vec![None; open],
        piece,
        usage,
    };
    let body = futures::stream::unfold(merge, |mut merge| async move {
        if merge.ended {
            return None;
        }
        let item = merge.merged.next().await;
        let events = merge.step(item);
        Some((futures::stream::iter(events), merge))
    })
    .flatten();
    Sse::new(futures::stream::iter(opening).chain(body).map(Ok))
}

/// The choices of a streamed response, merged as their pieces come.
struct Merge<P, U> {
    merged: futures::stream::SelectAll<BoxStream<'static, (u32, Result<Piece, ApiError>)>>,
    /// Choices not ended yet.
    open: usize,
    /// The response is over (every choice ended, or one failed).
    ended: bool,
    usages: Vec<Option<Usage>>,
    piece: P,
    usage: Option<U>,
}

impl<P, U> Merge<P, U>
where
    P: Fn(u32, Piece) -> Vec<Event>,
    U: Fn(Usage) -> Event,
{
    /// The events for one choice's item, or for the end of them all.
    fn step(&mut self, item: Option<(u32, Result<Piece, ApiError>)>) -> Vec<Event> {
        match item {
            Some((
                index,
                Ok(Piece::Finished {
                    reason,
                    usage,
                    worker,
                    generated,
                }),
            )) => {
                if let Some(slot) = self.usages.get_mut(index as usize) {
                    *slot = Some(usage);
                }
                self.open = self.open.saturating_sub(1);
                (self.piece)(
                    index,
                    Piece::Finished {
                        reason,
                        usage,
                        worker,
                        generated,
                    },
                )
            }
            Some((index, Ok(piece))) => (self.piece)(index, piece),
            Some((_, Err(e))) => {
                self.ended = true;
                vec![Event::default().data(e.body())]
            }
            // Every stream has ended (each after its `Finished`, so its request is done
            // with on its worker and in the metrics): the usage of all, then `[DONE]`.
            None if self.open == 0 => {
                self.ended = true;
                let mut events = Vec::new();
                if let Some(usage) = &self.usage {
                    events.push(usage(combined(self.usages.iter().flatten().copied())));
                }
                events.push(Event::default().data("[DONE]"));
                events
            }
            // Every stream ends with `Finished` or an error: one that stops short is not a
            // whole answer.
            None => {
                self.ended = true;
                vec![Event::default().data(ApiError::internal("The response ended early.").body())]
            }
        }
    }
}

/// A completion's stream; with `echo`, the prompt's text first (with its log probabilities
/// when asked, once they come).
fn completion_stream(
    frontend: Arc<Frontend>,
    id: String,
    generations: Vec<Generation>,
    (mode, echo): (Mode, Option<String>),
) -> Response {
    let created = unix_now();
    let model = frontend.config.model.clone();
    let chunk = Arc::new(
        move |choice: Option<(u32, String, Option<CompletionLogprobs>)>,
              finish_reason: Option<&'static str>,
              usage: Option<Usage>| {
            let choices = choice
                .map(|(index, text, logprobs)| CompletionChoice {
                    index,
                    text,
                    finish_reason,
                    logprobs,
                })
                .into_iter()
                .collect();
            json_event(&Completion {
                id: &id,
                object: "text_completion",
                created,
                model: &model,
                choices,
                usage,
            })
        },
    );
    let usage_chunk = Arc::clone(&chunk);
    let usage = mode
        .include_usage
        .then_some(move |usage| usage_chunk(None, None, Some(usage)));
    let echo = echo.unwrap_or_default();
    let shift = echo.chars().count() as u32;
    // Echoed text without log probabilities goes first; with them, when they come.
    let opening = match mode.logprobs {
        None if !echo.is_empty() => (0..generations.len() as u32)
            .map(|index| chunk(Some((index, echo.clone(), None)), None, None))
            .collect(),
        _ => Vec::new(),
    };
    sse(
        generations,
        opening,
        move |index, piece| match piece {
            Piece::Prompt { first, scored } => {
                let logprobs = mode.logprobs.map(|top| {
                    CompletionLogprobs::of_prompt(&frontend.preprocessor, first, &scored, top > 0)
                });
                vec![chunk(Some((index, echo.clone(), logprobs)), None, None)]
            }
            Piece::Text { text, scored } => {
                let logprobs = mode.logprobs.map(|top| {
                    CompletionLogprobs::of(&frontend.preprocessor, &scored, top > 0, shift)
                });
                vec![chunk(Some((index, text, logprobs)), None, None)]
            }
            // Only chat answers are parsed into parts.
            Piece::Parts { .. } => Vec::new(),
            Piece::Finished { reason, .. } => {
                vec![chunk(
                    Some((index, String::new(), None)),
                    Some(reason),
                    None,
                )]
            }
        },
        usage,
    )
    .into_response()
}
