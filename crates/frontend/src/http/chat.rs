//! `/v1/chat/completions`, streamed (SSE) or not: the answer's text parsed into reasoning,
//! content and tool calls ([`crate::tools`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::StreamExt;
use switchyard_core::Token;
use tracing::Instrument;

use super::body;
use super::completions::{
    Choices, apply_grant, collect_all, convert_sized, dispatch, json_event, request_span, sse,
    with_worker,
};
use super::service::unix_now;
use crate::auth::Grant;
use crate::convert::{self, Mode};
use crate::media::OnEncoderFailure;
use crate::openai::ApiError;
use crate::openai::logprobs::ChatLogprobs;
use crate::openai::request::ChatCompletionRequest;
use crate::openai::response::{
    ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta, ChatMessageOut,
    Usage,
};
use crate::pipeline::encode::{MediaStatus, resized_warning, text_only_warning};
use crate::pipeline::{Frontend, Generation, Piece, Scored, WARNING_HEADER};
use crate::tools::output::AnswerParser;

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
        start(
            &frontend,
            grant.as_ref().map(|g| &g.0),
            size,
            request,
            None,
            false,
        )
        .await
    }
    .instrument(span)
    .await;
    let Started {
        dispatched,
        mode,
        answer,
        warning,
        pending,
        ..
    } = match result {
        Ok(ok) => ok,
        Err(e) => return e.into_response(),
    };
    let id = format!("chatcmpl-{:016x}", dispatched.id.0);
    let worker = dispatched.worker;
    let parser = || answer.parser(&frontend);
    let response = if mode.stream {
        let generations = dispatched
            .generations
            .into_iter()
            .map(|generation| parsed(generation, parser()))
            .collect();
        chat_stream(Arc::clone(&frontend), id, generations, mode).into_response()
    } else {
        match collect_all(dispatched.generations).await {
            Ok((answers, usage)) => {
                let mut choices = Vec::with_capacity(answers.len());
                for (answer, index) in answers.into_iter().zip(0..) {
                    let mut parser = parser();
                    let logprobs = mode
                        .logprobs
                        .map(|_| ChatLogprobs::of(&frontend.preprocessor, &answer.scored));
                    let whole = parser.parse_whole(answer.text).await;
                    choices.push(ChatChoice {
                        index,
                        message: ChatMessageOut::of(whole),
                        finish_reason: Some(parser.finish_reason(answer.reason)),
                        logprobs,
                    });
                }
                Json(ChatCompletion {
                    id,
                    object: "chat.completion",
                    created: unix_now(),
                    model: frontend.config.model.clone(),
                    choices,
                    usage,
                })
                .into_response()
            }
            Err(e) => e.into_response(),
        }
    };
    with_warning(&frontend, with_worker(response, worker), warning, pending)
}

/// A chat request on its way: dispatched, with what its answer is parsed with.
pub(super) struct Started {
    pub dispatched: Choices,
    pub mode: Mode,
    pub answer: convert::ChatAnswer,
    pub warning: Option<String>,
    pub pending: Option<tokio::sync::watch::Receiver<MediaStatus>>,
    /// Its prompt as rendered, and as tokens when asked to keep them (a conversation that
    /// goes on: they are kept for its next turn; none for a prompt with media).
    pub rendered: String,
    pub prompt_ids: Option<Vec<Token>>,
}

/// Prepares and dispatches a parsed chat request (its media fetched and encoded, its
/// prompt tokenized, continuing `known` when given, the API key's grant applied); `keep`:
/// its prompt's and answer's tokens are kept (see [`Started::prompt_ids`]).
pub(super) async fn start(
    frontend: &Arc<Frontend>,
    grant: Option<&Grant>,
    size: usize,
    request: ChatCompletionRequest,
    known: Option<Arc<convert::Known>>,
    keep: bool,
) -> Result<Started, ApiError> {
    convert::check_model(frontend, &request.model)?;
    convert::check_messages(&request)?;
    convert::refuse_messages_by_length(frontend, &request)?;
    let media = tracing::Instrument::instrument(
        frontend
            .media
            .prepare_chat(&request, || convert::media_room(frontend, &request)),
        tracing::info_span!("media"),
    )
    .await?;
    let items = media.clone();
    let (mut prepared, mode, answer, rendered) = tracing::Instrument::instrument(
        convert_sized(frontend, size, (request, media, known), convert::chat_turn),
        tracing::info_span!("preprocess"),
    )
    .await?;
    let prompt_ids = (keep && items.is_empty()).then(|| prepared.prompt.token_ids.clone());
    prepared.keep_generated = keep;
    let ready = tracing::Instrument::instrument(
        frontend.encode_or_fall_back(&items, &mut prepared.prompt),
        tracing::info_span!("encode"),
    )
    .await?;
    prepared.add_media(&ready);
    prepared.keep_special_tokens = frontend.parsers.keeps_special_tokens(answer.tools.as_ref());
    let (warning, pending) = (ready.warning, ready.pending);
    prepared.span = tracing::Span::current();
    apply_grant(grant, &mut prepared, mode.choices)?;
    let dispatched = dispatch(frontend, prepared, mode.choices).await?;
    Ok(Started {
        dispatched,
        mode,
        answer,
        warning,
        pending,
        rendered,
        prompt_ids,
    })
}

/// The `Warning` header of a response whose media failed or were resized.
pub(super) fn with_warning(
    frontend: &Frontend,
    mut response: Response,
    warning: Option<String>,
    pending: Option<tokio::sync::watch::Receiver<MediaStatus>>,
) -> Response {
    let text_only = frontend.media.on_encoder_failure().0 == OnEncoderFailure::TextOnly;
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

/// A choice's stream with its text parsed: `Text` pieces become `Parts`, and the finish
/// reason says when the answer called tools. A plain parser passes the stream as it is.
pub(super) fn parsed(generation: Generation, parser: AnswerParser) -> Generation {
    if parser.is_plain() {
        return generation;
    }
    futures::stream::unfold(
        (generation, parser, false),
        |(mut generation, mut parser, ended)| async move {
            if ended {
                return None;
            }
            let out = match generation.next().await? {
                Ok(Piece::Text { text, scored }) => vec![Ok(Piece::Parts {
                    parts: parser.push(&text).await,
                    scored,
                })],
                Ok(Piece::Finished {
                    reason,
                    usage,
                    worker,
                    generated,
                }) => {
                    let rest = parser.finish().await;
                    let reason = parser.finish_reason(reason);
                    let end = Piece::Finished {
                        reason,
                        usage,
                        worker,
                        generated,
                    };
                    return Some((
                        vec![
                            Ok(Piece::Parts {
                                parts: rest,
                                scored: Vec::new(),
                            }),
                            Ok(end),
                        ],
                        (generation, parser, true),
                    ));
                }
                other => vec![other],
            };
            Some((out, (generation, parser, false)))
        },
    )
    .flat_map(futures::stream::iter)
    .boxed()
}

fn chat_stream(
    frontend: Arc<Frontend>,
    id: String,
    generations: Vec<Generation>,
    mode: Mode,
) -> Response {
    let created = unix_now();
    let model = frontend.config.model.clone();
    let chunk = Arc::new(
        move |choice: Option<(u32, ChatDelta, Option<ChatLogprobs>)>,
              finish_reason: Option<&'static str>,
              usage: Option<Usage>| {
            let choices = choice
                .map(|(index, delta, logprobs)| ChatChunkChoice {
                    index,
                    delta,
                    finish_reason,
                    logprobs,
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
        },
    );
    let opening = (0..generations.len() as u32)
        .map(|index| {
            let delta = ChatDelta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..ChatDelta::default()
            };
            chunk(Some((index, delta, None)), None, None)
        })
        .collect();
    let usage_chunk = Arc::clone(&chunk);
    let usage = mode
        .include_usage
        .then_some(move |usage| usage_chunk(None, None, Some(usage)));
    sse(
        generations,
        opening,
        move |index, piece| {
            // Log probabilities go with the first chunk of the text they came with (alone
            // when the parsers hold that text back).
            let logprobs = |scored: &[Scored]| {
                mode.logprobs
                    .map(|_| ChatLogprobs::of(&frontend.preprocessor, scored))
            };
            match piece {
                Piece::Text { text, scored } => {
                    let delta = ChatDelta {
                        content: Some(text),
                        ..ChatDelta::default()
                    };
                    vec![chunk(Some((index, delta, logprobs(&scored))), None, None)]
                }
                Piece::Parts { parts, scored } => {
                    let mut scored = Some(scored);
                    let mut chunks: Vec<_> = parts
                        .into_iter()
                        .map(|part| {
                            let logprobs = scored.take().and_then(|s| logprobs(&s));
                            chunk(Some((index, ChatDelta::of(part), logprobs)), None, None)
                        })
                        .collect();
                    if let Some(scored) = scored.filter(|s| !s.is_empty()) {
                        let logprobs = logprobs(&scored);
                        chunks.push(chunk(
                            Some((index, ChatDelta::default(), logprobs)),
                            None,
                            None,
                        ));
                    }
                    chunks
                }
                // Chat asks for no prompt log probabilities.
                Piece::Prompt { .. } => Vec::new(),
                Piece::Finished { reason, .. } => {
                    vec![chunk(
                        Some((index, ChatDelta::default(), None)),
                        Some(reason),
                        None,
                    )]
                }
            }
        },
        usage,
    )
    .into_response()
}
