//! The `openai` engine against a scripted OpenAI-compatible server: what it sends upstream
//! (prompt as text or token ids, sampling), the streamed text, errors as typed engine
//! errors, cancellation reaching the upstream, and load read from the upstream's metrics or
//! counted locally.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{Value, json};
use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateOutput, GenerateRequest, SamplingParams,
};
use switchyard_core::{RequestId, WorkerKey};
use switchyard_worker::Engine;
use switchyard_worker::upstream::{OpenAiConfig, OpenAiUpstream, PromptFormat};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Default)]
struct Upstream {
    bodies: Mutex<Vec<Value>>,
    /// Streams still open (a dropped connection ends one).
    open: AtomicU32,
    /// Answer every request with this status and body instead.
    fail: Mutex<Option<(StatusCode, String)>>,
    metrics: Mutex<Option<String>>,
    endless: AtomicBool,
    /// Finish as vLLM does: the finishing chunk without usage, then a usage-only chunk
    /// (with this many cached prompt tokens), then `[DONE]`.
    trailing_usage: Mutex<Option<u64>>,
    /// Finish without usage, then keep the connection open, saying nothing more.
    silent_after_finish: AtomicBool,
    /// Finish without usage, then keep sending chunks with neither text nor usage.
    chatty_after_finish: AtomicBool,
}

struct Open(Arc<Upstream>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn completions(State(up): State<Arc<Upstream>>, Json(body): Json<Value>) -> Response {
    up.bodies.lock().push(body.clone());
    if let Some((status, text)) = up.fail.lock().clone() {
        return (status, text).into_response();
    }
    let max = body["max_tokens"].as_u64().unwrap();
    let endless = up.endless.load(Ordering::SeqCst);
    let trailing = *up.trailing_usage.lock();
    let chatty = up.chatty_after_finish.load(Ordering::SeqCst);
    let silent = up.silent_after_finish.load(Ordering::SeqCst) || chatty;
    up.open.fetch_add(1, Ordering::SeqCst);
    let open = Open(Arc::clone(&up));
    let events = futures::stream::unfold((0u64, open), move |(i, open)| async move {
        let last = match (trailing, silent) {
            (Some(_), _) => max + 2,
            (None, true) if chatty => u64::MAX,
            (None, true) => max + 1,
            (None, false) => max,
        };
        if !endless && i > last {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(if endless { 20 } else { 1 })).await;
        let data = match (trailing, silent) {
            _ if endless || i < max => {
                json!({"choices": [{"text": format!(" w{i}"), "finish_reason": null}], "usage": null})
                    .to_string()
            }
            (None, false) => json!({"choices": [{"text": "", "finish_reason": "length"}],
                "usage": {"completion_tokens": max}})
            .to_string(),
            _ if i == max => {
                json!({"choices": [{"text": "", "finish_reason": "length"}], "usage": null})
                    .to_string()
            }
            (Some(cached), _) if i == max + 1 => json!({"choices": [], "usage": {
                "prompt_tokens": 3, "completion_tokens": max, "total_tokens": 3 + max,
                "prompt_tokens_details": {"cached_tokens": cached}}})
            .to_string(),
            (Some(_), _) => "[DONE]".to_string(),
            (None, _) if chatty => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                json!({"choices": [], "usage": null}).to_string()
            }
            (None, _) => {
                // Silence, the connection open, until the client hangs up.
                std::future::pending::<()>().await;
                unreachable!()
            }
        };
        Some((
            Ok::<_, std::convert::Infallible>(Event::default().data(data)),
            (i + 1, open),
        ))
    });
    Sse::new(events).into_response()
}

async fn metrics(State(up): State<Arc<Upstream>>) -> Response {
    match up.metrics.lock().clone() {
        Some(text) => text.into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn serve(up: Arc<Upstream>) -> String {
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route("/metrics", get(metrics))
        .with_state(up);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/v1")
}

async fn start(
    upstream: &str,
    prompt: PromptFormat,
    tracker: &TaskTracker,
    cancel: &CancellationToken,
) -> switchyard_worker::RunningEngine {
    let config = OpenAiConfig {
        upstream: upstream.into(),
        upstream_model: Some("upstream-name".into()),
        prompt,
        max_num_seqs: Some(1),
        metrics_interval: Duration::from_millis(50),
        ..OpenAiConfig::default()
    };
    let engine = OpenAiUpstream::new(WorkerKey::new(1, 0), "served-name", config).unwrap();
    assert!(engine.capabilities().prompt_text == (prompt == PromptFormat::Text));
    Box::new(engine)
        .start(tracker, cancel.clone())
        .await
        .unwrap()
}

fn request(text: Option<&str>) -> GenerateRequest {
    let mut r = GenerateRequest::text(RequestId(7), vec![1, 2, 3], 3);
    r.prompt.text = text.map(str::to_owned);
    r.sampling = SamplingParams {
        temperature: Some(0.5),
        seed: Some(11),
        top_k: Some(4),
        ..SamplingParams::default()
    };
    r
}

/// The text an engine streams for `request`, and its last item.
async fn answer(
    engine: &switchyard_worker::RunningEngine,
    request: GenerateRequest,
) -> (String, Option<Result<GenerateOutput, EngineError>>) {
    let items: Vec<_> = engine
        .service
        .generate(request)
        .await
        .unwrap()
        .collect()
        .await;
    let text = items
        .iter()
        .filter_map(|i| match i {
            Ok(GenerateOutput::Text { text, .. }) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    (text, items.last().cloned())
}

#[tokio::test]
async fn streams_text_and_sends_what_the_upstream_needs() {
    let up = Arc::new(Upstream::default());
    let url = serve(Arc::clone(&up)).await;
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());

    let text = start(&url, PromptFormat::Text, &tracker, &cancel).await;
    let (streamed, last) = answer(&text, request(Some("<|im_start|>hi"))).await;
    assert_eq!(streamed, " w0 w1 w2");
    assert_eq!(
        last,
        Some(Ok(GenerateOutput::Finished {
            reason: FinishReason::Length,
            completion_tokens: 3,
            cached_tokens: None,
        }))
    );
    let body = up.bodies.lock()[0].clone();
    assert_eq!(body["prompt"], "<|im_start|>hi");
    assert_eq!(body["model"], "upstream-name");
    assert_eq!(body["stream"], true);
    assert_eq!(body["seed"], 11);
    assert_eq!(body["top_k"], 4);
    assert_eq!(body["temperature"], 0.5);
    // A text worker cannot serve a request without its text: another worker might.
    let err = text.service.generate(request(None)).await.err().unwrap();
    assert!(matches!(err, EngineError::Unsupported(_)), "{err}");

    let ids = start(&url, PromptFormat::TokenIds, &tracker, &cancel).await;
    let _ = ids
        .service
        .generate(request(None))
        .await
        .unwrap()
        .collect::<Vec<_>>()
        .await;
    assert_eq!(up.bodies.lock()[1]["prompt"], json!([1, 2, 3]));
    cancel.cancel();
}

#[tokio::test]
async fn usage_after_the_finish_is_read_and_silence_after_it_ends_the_answer() {
    let up = Arc::new(Upstream::default());
    let url = serve(Arc::clone(&up)).await;
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let engine = start(&url, PromptFormat::TokenIds, &tracker, &cancel).await;

    // vLLM's and SGLang's order: the finish, then the usage with the cached prompt tokens.
    *up.trailing_usage.lock() = Some(2);
    let (text, last) = answer(&engine, request(None)).await;
    assert_eq!(text, " w0 w1 w2");
    assert_eq!(
        last,
        Some(Ok(GenerateOutput::Finished {
            reason: FinishReason::Length,
            completion_tokens: 3,
            cached_tokens: Some(2),
        }))
    );

    // A finish followed by nothing (the connection left open): complete all the same,
    // within the wait for a usage chunk, and the connection closed.
    *up.trailing_usage.lock() = None;
    up.silent_after_finish.store(true, Ordering::SeqCst);
    // Then a finish followed by chunks that say nothing (neither text nor usage), on and
    // on: the wait for the usage is bounded all the same.
    for chatty in [false, true] {
        up.chatty_after_finish.store(chatty, Ordering::SeqCst);
        let started = std::time::Instant::now();
        let (text, last) =
            tokio::time::timeout(Duration::from_secs(10), answer(&engine, request(None)))
                .await
                .unwrap();
        assert_eq!(text, " w0 w1 w2");
        assert_eq!(
            last,
            Some(Ok(GenerateOutput::Finished {
                reason: FinishReason::Length,
                completion_tokens: 0,
                cached_tokens: None,
            }))
        );
        // Well inside the frontend's stall timeout (a second at least), which would
        // otherwise take the finished answer for a stalled one.
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "chatty {chatty}: {:?}",
            started.elapsed()
        );
    }
    for _ in 0..100 {
        if up.open.load(Ordering::SeqCst) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(up.open.load(Ordering::SeqCst), 0);
    cancel.cancel();
}

#[tokio::test]
async fn upstream_errors_are_typed() {
    let up = Arc::new(Upstream::default());
    let url = serve(Arc::clone(&up)).await;
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let engine = start(&url, PromptFormat::TokenIds, &tracker, &cancel).await;
    let cases = [
        (
            StatusCode::BAD_REQUEST,
            r#"{"error":{"message":"prompt too long"}}"#,
        ),
        (StatusCode::SERVICE_UNAVAILABLE, "busy"),
        (StatusCode::INTERNAL_SERVER_ERROR, "boom"),
    ];
    let mut errors = Vec::new();
    for (status, body) in cases {
        *up.fail.lock() = Some((status, body.into()));
        errors.push(engine.service.generate(request(None)).await.err().unwrap());
    }
    assert_eq!(errors[0], EngineError::Invalid("prompt too long".into()));
    assert!(
        matches!(errors[1], EngineError::Overloaded(_)),
        "{}",
        errors[1]
    );
    assert!(
        matches!(errors[2], EngineError::Internal(_)),
        "{}",
        errors[2]
    );
    // Nobody listening: the worker is unreachable (retryable elsewhere).
    let dead = start(
        "http://127.0.0.1:9",
        PromptFormat::TokenIds,
        &tracker,
        &cancel,
    )
    .await;
    let err = dead.service.generate(request(None)).await.err().unwrap();
    assert!(matches!(err, EngineError::Unreachable(_)), "{err}");
    cancel.cancel();
}

#[tokio::test]
async fn dropping_the_stream_cancels_upstream_and_load_is_counted() {
    let up = Arc::new(Upstream::default());
    up.endless.store(true, Ordering::SeqCst);
    let url = serve(Arc::clone(&up)).await;
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let engine = start(&url, PromptFormat::TokenIds, &tracker, &cancel).await;
    let mut load = engine.load.unwrap();

    // No metrics upstream: the load is what is in flight here (one runs, one waits).
    let mut first = engine.service.generate(request(None)).await.unwrap();
    let second = engine.service.generate(request(None)).await.unwrap();
    first.next().await.unwrap().unwrap();
    let wait_for = |load: &mut tokio::sync::watch::Receiver<_>,
                    f: fn(&switchyard_core::LoadSnapshot) -> bool| {
        let mut load = load.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(5), load.wait_for(f))
                .await
                .expect("the load report never came")
                .unwrap();
        }
    };
    wait_for(&mut load, |l| l.running == 1 && l.waiting == 1).await;
    assert_eq!(up.open.load(Ordering::SeqCst), 2);

    // The client went away: the upstream sees its connections close.
    drop(first);
    drop(second);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while up.open.load(Ordering::SeqCst) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the upstream streams were not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for(&mut load, |l| l.running == 0 && l.waiting == 0).await;

    // With vLLM's metrics, the load is the engine's own.
    *up.metrics.lock() = Some(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3.0\n\
         # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 2.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n"
            .into(),
    );
    // It looks at the metrics again within 30 reports.
    tokio::time::timeout(
        Duration::from_secs(10),
        load.wait_for(|l| l.running == 3 && l.waiting == 2),
    )
    .await
    .expect("the upstream's metrics were never read")
    .unwrap();
    assert!((load.borrow().kv_usage() - 0.5).abs() < 1e-9);
    cancel.cancel();
}

#[tokio::test]
async fn constraints_go_upstream_in_its_dialect_or_not_at_all() {
    use switchyard_core::protocol::{Constraint, ConstraintKind};
    use switchyard_worker::upstream::ConstraintDialect;
    let up = Arc::new(Upstream::default());
    let url = serve(Arc::clone(&up)).await;
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let schema = r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#;
    let constrained = |constraint: Constraint| {
        let mut r = request(Some("hi"));
        r.sampling.constraint = Some(constraint);
        r
    };
    let mut bodies = Vec::new();
    for dialect in [
        ConstraintDialect::Vllm,
        ConstraintDialect::Sglang,
        ConstraintDialect::LlamaCpp,
    ] {
        let config = OpenAiConfig {
            upstream: url.clone(),
            constraints: dialect,
            ..OpenAiConfig::default()
        };
        let engine = OpenAiUpstream::new(WorkerKey::new(1, 0), "m", config).unwrap();
        let kinds = engine.capabilities().constraints;
        assert!(
            kinds.contains(ConstraintKind::JsonSchema) && kinds.contains(ConstraintKind::Choice)
        );
        assert!(
            !kinds.contains(ConstraintKind::Grammar),
            "Lark grammars are not passed"
        );
        let engine = Box::new(engine)
            .start(&tracker, cancel.clone())
            .await
            .unwrap();
        for constraint in [
            Constraint::JsonSchema(schema.into()),
            Constraint::Choice(vec!["a.b".into(), "c|d".into()]),
            Constraint::JsonObject,
            Constraint::Regex("[0-9]+".into()),
        ] {
            answer(&engine, constrained(constraint)).await;
            bodies.push(up.bodies.lock().last().unwrap().clone());
        }
        let refused = engine
            .service
            .generate(constrained(Constraint::Grammar("start: \"x\"".into())))
            .await
            .err()
            .unwrap();
        assert!(matches!(refused, EngineError::Unsupported(_)), "{refused}");
    }
    let schema: Value = serde_json::from_str(schema).unwrap();
    assert_eq!(bodies[0]["structured_outputs"], json!({"json": schema}));
    assert_eq!(
        bodies[1]["structured_outputs"],
        json!({"choice": ["a.b", "c|d"]})
    );
    assert_eq!(
        bodies[2]["structured_outputs"],
        json!({"json_object": true})
    );
    assert_eq!(bodies[3]["structured_outputs"], json!({"regex": "[0-9]+"}));
    assert_eq!(
        bodies[4]["json_schema"]
            .as_str()
            .map(|t| serde_json::from_str::<Value>(t).unwrap()),
        Some(schema.clone())
    );
    assert_eq!(bodies[5]["regex"], r"(a\.b|c\|d)");
    assert_eq!(bodies[6]["json_schema"], r#"{"type":"object"}"#);
    assert_eq!(bodies[7]["regex"], "[0-9]+");
    // llama.cpp: each as the GBNF grammar the translation prints.
    for (body, constraint) in bodies[8..].iter().zip([
        Constraint::JsonSchema(serde_json::to_string(&schema).unwrap()),
        Constraint::Choice(vec!["a.b".into(), "c|d".into()]),
        Constraint::JsonObject,
        Constraint::Regex("[0-9]+".into()),
    ]) {
        let expected = switchyard_grammar::gbnf::gbnf(&constraint).unwrap();
        assert_eq!(body["grammar"], expected, "{constraint:?}");
        assert!(expected.starts_with("root ::= "), "{expected}");
    }
    // A schema the translation cannot say is the client's to change.
    let config = OpenAiConfig {
        upstream: url.clone(),
        constraints: ConstraintDialect::LlamaCpp,
        ..OpenAiConfig::default()
    };
    let engine = Box::new(OpenAiUpstream::new(WorkerKey::new(3, 0), "m", config).unwrap())
        .start(&tracker, cancel.clone())
        .await
        .unwrap();
    let dated = r#"{"type":"string","format":"date"}"#;
    let refused = engine
        .service
        .generate(constrained(Constraint::JsonSchema(dated.into())))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&refused, EngineError::Invalid(m) if m.contains("`format`")),
        "{refused}"
    );
    // Told none: it states no kinds, and a constrained request that reaches it anyway is
    // refused, never answered unconstrained.
    let plain = OpenAiUpstream::new(
        WorkerKey::new(2, 0),
        "m",
        OpenAiConfig {
            upstream: url.clone(),
            ..OpenAiConfig::default()
        },
    )
    .unwrap();
    assert!(plain.capabilities().constraints.is_empty());
    let plain = Box::new(plain)
        .start(&tracker, cancel.clone())
        .await
        .unwrap();
    let refused = plain
        .service
        .generate(constrained(Constraint::JsonObject))
        .await
        .err()
        .unwrap();
    assert!(matches!(refused, EngineError::Unsupported(_)), "{refused}");
    cancel.cancel();
}
