//! Service routes: models, health, liveness, metrics.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::openai::response::{ModelCard, ModelList};
use crate::pipeline::Frontend;

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The model this deployment serves.
#[utoipa::path(get, path = "/v1/models", tag = "openai",
    responses((status = 200, description = "The served model", body = ModelList)))]
pub async fn models(State(frontend): State<Arc<Frontend>>) -> Json<ModelList> {
    let card = ModelCard {
        id: frontend.config.model.clone(),
        object: "model",
        created: unix_now(),
        owned_by: "switchyard",
    };
    Json(ModelList {
        object: "list",
        data: vec![card],
    })
}

/// Ready when at least one worker serves the model.
#[utoipa::path(get, path = "/health", tag = "service", responses(
    (status = 200, description = "Ready: at least one worker serves the model", body = serde_json::Value),
    (status = 503, description = "No worker serves the model yet", body = serde_json::Value)))]
pub async fn health(State(frontend): State<Arc<Frontend>>) -> Response {
    let workers = frontend.routing.worker_count();
    let body = json!({
        "model": frontend.config.model,
        "workers": workers,
        "resyncing": frontend.routing.resyncing(),
        "status": if workers > 0 { "ready" } else { "no workers" },
    });
    let status = if workers > 0 {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// The KV index, per worker stream, as sorted block hashes: for comparing frontends with
/// each other and with the workers.
pub async fn kv_index(
    State(frontend): State<Arc<Frontend>>,
) -> Json<switchyard_runtime::IndexView> {
    Json(frontend.routing.index_view())
}

/// Every worker the frontend knows, with its role, health, draining flag, cache view and
/// loads (the router's count and the engine's own report).
pub async fn workers(
    State(frontend): State<Arc<Frontend>>,
) -> Json<Vec<crate::routing::WorkerStatus>> {
    Json(frontend.routing.workers())
}

/// The process is up (whether or not it can serve).
#[utoipa::path(get, path = "/live", tag = "service",
    responses((status = 200, description = "Alive", body = serde_json::Value)))]
pub async fn live() -> Json<serde_json::Value> {
    Json(json!({ "status": "live" }))
}

/// Prometheus metrics (see docs/metrics.md); here unless an admin listener serves them.
#[utoipa::path(get, path = "/metrics", tag = "service",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub async fn metrics(State(frontend): State<Arc<Frontend>>) -> Response {
    let text = frontend.metrics.render(&frontend.routing);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
