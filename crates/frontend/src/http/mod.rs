//! The HTTP surface: routes, body parsing with OpenAI-style errors, request counting.

mod body;
mod completions;

pub use completions::WORKER_HEADER;
mod service;

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
        .route("/v1/chat/completions", post(completions::chat))
        .route("/v1/completions", post(completions::completion))
        .route("/v1/models", get(service::models))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&frontend),
            crate::auth::authenticate,
        ));
    let mut public = Router::new()
        .merge(api)
        .route("/health", get(service::health))
        .route("/live", get(service::live));
    if frontend.config.admin.port.is_none() {
        public = public.route("/metrics", get(service::metrics));
    }
    finish(public, frontend, limit)
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
        Some("/v1/models") => "/v1/models",
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
