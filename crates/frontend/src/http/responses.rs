//! `/v1/responses`: create (streamed as typed events, or not), retrieve and delete. A
//! request is lowered into a chat request ([`crate::responses::lower`]) and served by the
//! chat endpoint's [`start`]; its answer's parsed parts become output items
//! ([`ResponseBuilder`]); a stored response keeps its conversation and tokens for
//! `previous_response_id`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::StreamExt;
use openai_protocol::responses::{ResponsesRequest, ResponsesResponse};
use serde_json::{Value, json};
use switchyard_core::Token;
use tracing::Instrument;

use super::body;
use super::chat::{Started, parsed, start, with_warning};
use super::completions::{collect, request_span, with_worker};
use crate::auth::Grant;
use crate::convert::Known;
use crate::openai::ApiError;
use crate::pipeline::{Frontend, Piece};
use crate::responses::{ResponseBuilder, Stored, lower, new_id};
use crate::tools::output::Part;

/// Create a response: JSON, or typed server-sent events when `stream` is true.
#[utoipa::path(post, path = "/v1/responses", tag = "openai",
    request_body(content = crate::responses::doc::ResponsesRequest, content_type = "application/json",
        description = "OpenAI's Responses request: `input` (text or items: messages, `function_call`, `function_call_output`), `instructions`, function `tools`, `tool_choice`, `parallel_tool_calls`, `text.format`, `max_output_tokens`, `temperature`, `top_p`, `stream`, `store`, `previous_response_id`; see docs/api-parameters.md",
        examples(
            ("plain" = (value = json!({"model": "switchyard-mock", "input": "Hi", "max_output_tokens": 8}))),
            ("stream" = (value = json!({"model": "switchyard-mock", "input": "Hi", "max_output_tokens": 8, "stream": true}))))),
    responses((status = 200, description = "The response, or its event stream when `stream` is true",
        content((crate::responses::doc::ResponseObject = "application/json"), (crate::responses::doc::ResponseEvent = "text/event-stream")))))]
pub async fn create(
    State(frontend): State<Arc<Frontend>>,
    grant: Option<Extension<Grant>>,
    headers: HeaderMap,
    request: Result<Bytes, BytesRejection>,
) -> Response {
    let size = request.as_ref().map_or(0, Bytes::len);
    let span = request_span("/v1/responses");
    let result = async {
        let request: Value = body::parse(&headers, request, frontend.config.max_body_bytes)?;
        crate::responses::lower::check_shape(&request)?;
        let request: ResponsesRequest = body::from_value(request)?;
        let previous =
            match &request.previous_response_id {
                Some(id) => Some(frontend.responses.get(id, Instant::now()).ok_or_else(|| {
                    ApiError::response_not_found(id, Some("previous_response_id"))
                })?),
                None => None,
            };
        let lowered = lower(&request, previous.as_ref().map_or(&[], |p| &p.history[..]))?;
        let store = request.store.unwrap_or(true);
        let known = previous.and_then(|p| p.known.clone());
        let grant = grant.as_ref().map(|g| &g.0);
        let started = start(&frontend, grant, size, lowered.chat, known, store)
            .await
            .map_err(crate::responses::lower::renamed)?;
        Ok::<_, ApiError>((request, lowered.history, store, started))
    }
    .instrument(span)
    .await;
    let (request, history, store, started) = match result {
        Ok(ok) => ok,
        Err(e) => return e.into_response(),
    };
    let Started {
        dispatched,
        mode,
        answer,
        warning,
        pending,
        rendered,
        prompt_ids,
    } = started;
    let worker = dispatched.worker;
    let response = ResponsesResponse::builder(new_id("resp"), frontend.config.model.clone())
        .copy_from_request(&request)
        .build();
    let turn = Turn {
        frontend: Arc::clone(&frontend),
        builder: ResponseBuilder::new(response),
        history,
        store,
        prompt: prompt_ids.map(|ids| (rendered, ids)),
    };
    let Some(generation) = dispatched.generations.into_iter().next() else {
        return ApiError::internal("no generation was dispatched").into_response();
    };
    let response = if mode.stream {
        stream(turn, parsed(generation, answer.parser(&frontend))).into_response()
    } else {
        match collect(generation).await {
            Ok(collected) => {
                let mut turn = turn;
                let mut parser = answer.parser(&frontend);
                let mut parts = parser.push(&collected.text).await;
                parts.extend(parser.finish().await);
                for part in parts {
                    turn.builder.push(part);
                }
                let reason = parser.finish_reason(collected.reason);
                let (_, response) = turn.builder.finish(reason, collected.usage);
                let value = serde_json::to_value(&response).unwrap_or_default();
                turn.keep(response, collected.generated);
                Json(value).into_response()
            }
            Err(e) => e.into_response(),
        }
    };
    with_warning(&frontend, with_worker(response, worker), warning, pending)
}

/// One turn of a conversation under way: its response being built, and what is stored
/// when it ends.
struct Turn {
    frontend: Arc<Frontend>,
    builder: ResponseBuilder,
    /// The conversation so far, this turn's input included.
    history: Vec<Value>,
    store: bool,
    /// Its prompt, rendered and as tokens (none: not kept).
    prompt: Option<(String, Vec<Token>)>,
}

impl Turn {
    /// Stores the finished response (unless `store: false`), with the conversation and
    /// the tokens its next turn continues from.
    fn keep(mut self, response: ResponsesResponse, generated: Vec<Token>) {
        if !self.store {
            return;
        }
        self.history.push(self.builder.assistant_message());
        let known = self.prompt.take().map(|(prompt, prompt_ids)| {
            // The answer's text as the client read it (special tokens within it unseen),
            // then the special tokens that end it (its end of turn), which the template
            // writes after the answer's text too.
            let preprocessor = &self.frontend.preprocessor;
            let seen = generated
                .iter()
                .rposition(|&t| !preprocessor.is_special_token(t))
                .map_or(0, |i| i + 1);
            let mut answer = preprocessor.decode(&generated[..seen]).unwrap_or_default();
            answer.push_str(
                &preprocessor
                    .render_tokens(&generated[seen..])
                    .unwrap_or_default(),
            );
            Arc::new(Known {
                prompt,
                prompt_ids,
                answer,
                answer_ids: generated,
            })
        });
        self.frontend.responses.insert(
            Stored {
                response,
                history: self.history,
                known,
            },
            Instant::now(),
        );
    }
}

fn sse_event((name, data): crate::responses::events::Event) -> Result<Event, Infallible> {
    Ok(Event::default().event(name).data(data.to_string()))
}

/// The typed events of a streamed response; it is stored once its last event is out.
fn stream(
    mut turn: Turn,
    generation: crate::pipeline::Generation,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let opening = turn.builder.opening();
    let events = futures::stream::unfold(
        (generation, Some(turn)),
        |(mut generation, turn)| async move {
            let mut turn = turn?;
            let events = match generation.next().await {
                Some(Ok(Piece::Parts { parts, .. })) => parts
                    .into_iter()
                    .flat_map(|part| turn.builder.push(part))
                    .collect(),
                Some(Ok(Piece::Text { text, .. })) => turn.builder.push(Part::Content(text)),
                Some(Ok(Piece::Prompt { .. })) => Vec::new(),
                Some(Ok(Piece::Finished {
                    reason,
                    usage,
                    generated,
                    ..
                })) => {
                    let (events, response) = turn.builder.finish(reason, usage);
                    turn.keep(response, generated);
                    return Some((events, (generation, None)));
                }
                Some(Err(e)) => return Some((vec![turn.builder.fail(&e)], (generation, None))),
                None => {
                    let e = ApiError::internal("the response stream ended without its end");
                    return Some((vec![turn.builder.fail(&e)], (generation, None)));
                }
            };
            Some((events, (generation, Some(turn))))
        },
    )
    .flat_map(futures::stream::iter);
    Sse::new(futures::stream::iter(opening).chain(events).map(sse_event))
}

/// A stored response.
#[utoipa::path(get, path = "/v1/responses/{response_id}", tag = "openai",
    params(("response_id" = String, Path, description = "The response's id")),
    responses((status = 200, description = "The stored response", content((crate::responses::doc::ResponseObject = "application/json"))),
        (status = 404, description = "No such stored response (`response_not_found`)", content((crate::openai::error::Body = "application/json")))))]
pub async fn retrieve(
    State(frontend): State<Arc<Frontend>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        return ApiError::invalid(format!(
            "query parameters are not supported here (got `{}`): a stored response is returned whole",
            crate::openai::error::echo(&query)
        ))
        .into_response();
    }
    match frontend.responses.get(&id, Instant::now()) {
        Some(stored) => Json(&stored.response).into_response(),
        None => ApiError::response_not_found(&id, None).into_response(),
    }
}

/// Deletes a stored response.
#[utoipa::path(delete, path = "/v1/responses/{response_id}", tag = "openai",
    params(("response_id" = String, Path, description = "The response's id")),
    responses((status = 200, description = "Deleted", content((Object = "application/json"))),
        (status = 404, description = "No such stored response (`response_not_found`)", content((crate::openai::error::Body = "application/json")))))]
pub async fn delete(State(frontend): State<Arc<Frontend>>, Path(id): Path<String>) -> Response {
    if frontend.responses.delete(&id) {
        Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        ApiError::response_not_found(&id, None).into_response()
    }
}
