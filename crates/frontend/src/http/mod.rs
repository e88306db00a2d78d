//! The HTTP surface: routes, body parsing with OpenAI-style errors, request counting.

mod body;
pub(crate) use body::from_value as body_from_value;
pub(crate) use service::unix_now;
mod chat;
mod completions;
mod responses;

pub use completions::WORKER_HEADER;
mod service;
mod tokenize;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};

use crate::openai::ApiError;
use crate::pipeline::Frontend;

/// The workers the frontend routes to: role, health, draining, cache view, loads.
pub const WORKERS_PATH: &str = "/v1/internal/workers";

/// The public routes: the OpenAI API (behind API keys when configured), health, and
/// `/metrics` unless an admin listener serves it. Internal endpoints are never here.
pub fn router(frontend: Arc<Frontend>) -> Router {
    let limit = frontend.config.max_body_bytes;
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/completions", post(completions::completion))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{response_id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route("/v1/models", get(service::models))
        .route("/v1/tokenize", post(tokenize::tokenize))
        .route("/v1/detokenize", post(tokenize::detokenize))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&frontend),
            crate::auth::authenticate,
        ));
    let mut public = Router::new()
        .merge(api)
        .route("/openapi.json", get(openapi_json))
        .route("/health", get(service::health))
        .route("/live", get(service::live));
    if frontend.config.admin.port.is_none() {
        public = public.route("/metrics", get(service::metrics));
    }
    finish(public, frontend, limit)
}

/// What answers connections past the limit (the overflow lane): `/health` and `/live`,
/// and a 503 for anything else.
pub fn probes_router(frontend: Arc<Frontend>) -> Router {
    Router::new()
        .route("/health", get(service::health))
        .route("/live", get(service::live))
        .fallback(|| async {
            ApiError::unavailable(
                "the server is at its connection limit; only /health and /live answer on this connection",
                std::time::Duration::from_secs(1),
            )
        })
        .with_state(frontend)
}

/// The admin listener's routes (`frontend.admin`): `/metrics`, health, and the internal
/// endpoints (`/v1/internal/*`: the router's view of the workers and of the KV index).
pub fn admin_router(frontend: Arc<Frontend>) -> Router {
    let limit = frontend.config.max_body_bytes;
    let admin = Router::new()
        .route("/health", get(service::health))
        .route("/live", get(service::live))
        .route("/metrics", get(service::metrics))
        .route(
            switchyard_runtime::net::kv::INDEX_PATH,
            get(service::kv_index),
        )
        .route(WORKERS_PATH, get(service::workers));
    finish(admin, frontend, limit)
}

fn finish(router: Router<Arc<Frontend>>, frontend: Arc<Frontend>, limit: usize) -> Router {
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(Arc::clone(&frontend), count))
        .with_state(frontend)
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(request.uri().path())
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// Counts every request by route and status.
async fn count(State(frontend): State<Arc<Frontend>>, request: Request, next: Next) -> Response {
    let route = match request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str)
    {
        Some("/v1/chat/completions") => "/v1/chat/completions",
        Some("/v1/completions") => "/v1/completions",
        Some("/v1/responses") => "/v1/responses",
        Some("/v1/responses/{response_id}") => "/v1/responses/{response_id}",
        Some("/v1/models") => "/v1/models",
        Some("/v1/tokenize") => "/v1/tokenize",
        Some("/v1/detokenize") => "/v1/detokenize",
        Some("/health") => "/health",
        Some("/live") => "/live",
        Some("/metrics") => "/metrics",
        _ => "other",
    };
    let response = next.run(request).await;
    frontend
        .metrics
        .count_request(route, response.status().as_u16());
    response
}

/// The public API's OpenAPI 3.1 document, generated from the handlers and the request and
/// response types (served at `/openapi.json`).
#[derive(Debug, utoipa::OpenApi)]
#[openapi(
    info(title = "Switchyard", description = "OpenAI-compatible inference frontend"),
    paths(
        chat::chat,
        completions::completion,
        responses::create,
        responses::retrieve,
        responses::delete,
        service::models,
        tokenize::tokenize,
        tokenize::detokenize,
        service::health,
        service::live,
        service::metrics
    ),
    components(schemas(
        crate::openai::error::Body,
        crate::openai::response::ChatCompletionChunk,
        crate::openai::response::Completion,
        SseEvent
    )),
    modifiers(&ErrorResponses),
)]
pub struct ApiDoc;

/// One server-sent event of a streamed response: `data` is a JSON chunk, an error body (a
/// failure midway: the last event), or `[DONE]`.
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)]
struct SseEvent {
    data: String,
}

/// Every error status the API answers with, on every POST, with the one error schema.
#[derive(Debug)]
struct ErrorResponses;

impl utoipa::Modify for ErrorResponses {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{content::Content, response::ResponseBuilder, schema::Ref};
        const CODES: &[(&str, &str)] = &[
            (
                "400",
                "Invalid request (`context_length_exceeded`, `unsupported_request`, or a named `param`)",
            ),
            (
                "401",
                "API keys are required and none or a wrong one was sent",
            ),
            ("404", "Unknown model (`model_not_found`)"),
            ("408", "The body did not arrive in time"),
            ("413", "The body is larger than `frontend.max_body_bytes`"),
            ("415", "The body is not `application/json`"),
            (
                "429",
                "Shed under load, or over an API key's limit; see `Retry-After`",
            ),
            ("500", "Internal error"),
            ("503", "No capacity or no worker; see `Retry-After`"),
        ];
        for item in doc.paths.paths.values_mut() {
            for operation in [item.post.as_mut(), item.get.as_mut()]
                .into_iter()
                .flatten()
            {
                let is_post = operation.request_body.is_some();
                for (code, text) in CODES {
                    // GETs fail only on keys (401 for /v1/models) and the 5xx.
                    if !is_post && !matches!(*code, "401" | "500") {
                        continue;
                    }
                    let response = ResponseBuilder::new()
                        .description(*text)
                        .content(
                            "application/json",
                            Content::new(Some(Ref::from_schema_name("ApiErrorBody"))),
                        )
                        .build();
                    operation
                        .responses
                        .responses
                        .entry((*code).to_string())
                        .or_insert(response.into());
                }
            }
        }
    }
}

/// `/openapi.json`: [`ApiDoc`], with the streamed events' `data` described as what it
/// carries (utoipa has no `contentSchema`), and `model` limited to the served model so
/// generated requests reach the engines.
async fn openapi_json(State(frontend): State<Arc<Frontend>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    use utoipa::OpenApi;
    let mut doc = match serde_json::to_value(ApiDoc::openapi()) {
        Ok(doc) => doc,
        Err(e) => return ApiError::internal(e.to_string()).into_response(),
    };
    if let Some(data) = doc.pointer_mut("/components/schemas/ResponseEvent/properties/data") {
        *data = serde_json::json!({"type": "string", "contentMediaType": "application/json",
            "contentSchema": {"type": "object", "required": ["type", "sequence_number"],
                "properties": {"type": {"type": "string"}, "sequence_number": {"type": "integer"}}}});
    }
    if let Some(data) = doc.pointer_mut("/components/schemas/SseEvent/properties/data") {
        *data = serde_json::json!({"anyOf": [
            {"const": "[DONE]"},
            {"type": "string", "contentMediaType": "application/json", "contentSchema": {"anyOf": [
                {"$ref": "#/components/schemas/ChatCompletionChunk"},
                {"$ref": "#/components/schemas/Completion"},
                {"$ref": "#/components/schemas/ApiErrorBody"}
            ]}}
        ]});
    }
    for request in [
        "ChatCompletionRequest",
        "CompletionRequest",
        "ResponsesRequest",
    ] {
        if let Some(model) =
            doc.pointer_mut(&format!("/components/schemas/{request}/properties/model"))
        {
            *model = serde_json::json!({"type": "string", "enum": [frontend.config.model]});
        }
    }
    axum::Json(doc).into_response()
}
