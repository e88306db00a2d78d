//! Distributed tracing (feature `otel`): a frontend and a worker process export their spans
//! over OTLP/HTTP to a receiver in the test, and one request's trace holds the frontend's
//! stages (preprocess, admission, route, dispatch, first token) with the worker's span as a
//! child of the dispatch, across the request plane. The deployment also uses a request-plane
//! secret: a frontend without it gets nothing from the worker.

#![cfg(feature = "otel")]
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use parking_lot::Mutex;
use prost::Message;
use serde_json::json;
use support::cluster::*;

type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

async fn receive(State(received): State<Received>, body: Bytes) -> StatusCode {
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            received.lock().push(request);
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

/// Every span received, with its service's name.
fn spans(received: &Received) -> Vec<(String, Span)> {
    let mut out = Vec::new();
    for request in received.lock().iter() {
        for resource in &request.resource_spans {
            let service = resource
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                    AnyValue::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in &resource.scope_spans {
                out.extend(scope.spans.iter().map(|s| (service.clone(), s.clone())));
            }
        }
    }
    out
}

/// Waits until the frontend sees a worker.
async fn ready(frontend: &support::process::Process) {
    let url = frontend.url("/health");
    eventually(Duration::from_secs(20), "a worker", || {
        let url = url.clone();
        async move {
            match support::client().get(&url).send().await {
                Ok(r) if r.status() == 200 => Ok(()),
                Ok(r) => Err(format!("{}", r.status())),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_is_one_trace_across_frontend_and_worker() {
    let received: Received = Arc::default();
    let app = axum::Router::new()
        .route("/v1/traces", post(receive))
        .with_state(Arc::clone(&received));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    const SECRET: &str = "a-test-request-plane-secret";
    let cluster = Cluster::start();
    let env = [
        ("SWITCHYARD_LOG__OTLP_ENDPOINT", endpoint.as_str()),
        ("SWITCHYARD_RUNTIME__REQUEST_SECRET", SECRET),
    ];
    let mut worker = cluster.worker_with_env("worker", &["--speedup-ratio", "10"], &env);
    let mut frontend = cluster.frontend_with("frontend", 0, &env);
    ready(&frontend).await;
    let body = json!({"model": "switchyard-mock", "prompt": "Trace me through the fleet.",
                      "max_tokens": 8, "ignore_eos": true});
    let response = support::client()
        .post(frontend.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let answer: serde_json::Value = response.json().await.unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 8, "{answer}");

    // A frontend without the secret: the worker refuses it.
    let outsider = cluster.frontend_with("outsider", 0, &[]);
    ready(&outsider).await;
    let refused = support::client()
        .post(outsider.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 503);
    drop(outsider);

    // Both flush their spans on the way out.
    frontend.sigterm();
    worker.sigterm();
    assert!(frontend.wait(Duration::from_secs(15)).success());
    assert!(worker.wait(Duration::from_secs(15)).success());
    let spans = spans(&received);
    let named = |name: &str| {
        spans
            .iter()
            .find(|(_, s)| s.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "no `{name}` span in {:?}",
                    spans.iter().map(|(_, s)| &s.name).collect::<Vec<_>>()
                )
            })
    };
    let (front, request) = named("request");
    assert_eq!(front, "switchyard-frontend");
    for stage in [
        "preprocess",
        "admission",
        "route",
        "dispatch",
        "first_token",
    ] {
        let (service, span) = named(stage);
        assert_eq!(service, "switchyard-frontend");
        assert_eq!(
            span.trace_id, request.trace_id,
            "{stage} is in the request's trace"
        );
        assert_eq!(
            span.parent_span_id, request.span_id,
            "{stage} is a child of the request"
        );
    }
    // The worker also serves the frontend's canaries, each its own trace: the request's
    // generate span is the one in the request's trace, and there is exactly one.
    let (_, dispatch) = named("dispatch");
    let generates: Vec<&(String, Span)> = spans
        .iter()
        .filter(|(_, s)| s.name == "worker.generate" && s.trace_id == request.trace_id)
        .collect();
    assert_eq!(
        generates.len(),
        1,
        "one trace across the request plane: the worker's span in the request's trace"
    );
    let (service, generate) = generates[0];
    assert_eq!(service, "switchyard-worker");
    assert_eq!(generate.parent_span_id, dispatch.span_id);
    // The request span carries what a latency breakdown needs, and no prompt text.
    let attributes: Vec<&str> = request
        .attributes
        .iter()
        .map(|kv| kv.key.as_str())
        .collect();
    for key in [
        "request_id",
        "prompt_tokens",
        "ttft_ms",
        "completion_tokens",
    ] {
        assert!(
            attributes.contains(&key),
            "{key} missing from {attributes:?}"
        );
    }
    let everything = format!("{spans:?}");
    assert!(
        !everything.contains("Trace me through"),
        "prompt text in the spans"
    );
}
