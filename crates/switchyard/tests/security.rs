//! API keys (401, per-key request, token and concurrency limits with 429 and Retry-After,
//! tenant metrics) and the split between the public and the admin listener.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::*;

const MODEL: &str = "switchyard-mock";

async fn call(
    d: &switchyard::deploy::Deployment,
    key: Option<&str>,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = client().post(url(d, "/v1/completions")).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let value = response.json().await.unwrap_or(Value::Null);
    (status, headers, value)
}

/// Opens a 200-token stream under `key` (its body not yet read).
async fn open_stream(d: &switchyard::deploy::Deployment, key: &str) -> reqwest::Response {
    let mut body = completion(200);
    body["stream"] = json!(true);
    let open = client()
        .post(url(d, "/v1/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(open.status().as_u16(), 200);
    open
}

fn completion(max_tokens: u32) -> Value {
    json!({"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens, "ignore_eos": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_gate_the_api_and_each_limit_answers_429() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.toml");
    std::fs::write(
        &keys,
        r#"
[[keys]]
key = "sk-acme"
tenant = "acme"
priority = "best_effort"
requests_per_minute = 3

[[keys]]
key = "sk-beta"
tenant = "beta"
tokens_per_minute = 100

[[keys]]
key = "sk-solo"
tenant = "solo"
max_concurrent = 1

[[keys]]
key = "sk-both"
tenant = "both"
max_concurrent = 1
requests_per_minute = 2
"#,
    )
    .unwrap();
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__AUTH__KEYS_FILE", keys.to_str().unwrap()),
    ])
    .await;

    // No key, a wrong key, a malformed header: 401 naming the problem; health stays open.
    let (s, _, b) = call(&d, None, &completion(2)).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (401, Some("invalid_api_key")),
        "{b}"
    );
    let (s, _, b) = call(&d, Some("sk-nope"), &completion(2)).await;
    assert_eq!(s, 401, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Incorrect API key")
    );
    let models = client().get(url(&d, "/v1/models")).send().await.unwrap();
    assert_eq!(models.status().as_u16(), 401);
    let health = client().get(url(&d, "/health")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);

    // Requests per minute: three pass, the fourth waits about 20 s for the bucket to refill.
    for _ in 0..3 {
        let (s, _, b) = call(&d, Some("sk-acme"), &completion(2)).await;
        assert_eq!(s, 200, "{b}");
    }
    let (s, h, b) = call(&d, Some("sk-acme"), &completion(2)).await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (429, Some("rate_limit_exceeded")),
        "{b}"
    );
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "Retry-After {retry}");
    // Another key is not affected.
    let (s, _, _) = call(&d, Some("sk-beta"), &completion(2)).await;
    assert_eq!(s, 200);

    // Tokens per minute: prompt plus max_tokens are charged; one request larger than the
    // whole minute is a 400, not a 429 that could never pass.
    let (s, _, b) = call(&d, Some("sk-beta"), &completion(500)).await;
    assert_eq!(s, 400, "{b}");
    let (s, _, b) = call(&d, Some("sk-beta"), &completion(80)).await;
    assert_eq!(s, 200, "{b}");
    let (s, h, b) = call(&d, Some("sk-beta"), &completion(80)).await;
    assert_eq!(s, 429, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tokens_per_minute"),
        "{b}"
    );
    assert!(h.contains_key("retry-after"));

    // Concurrent requests: a second one while a stream is open is refused; once the stream
    // ends, the slot is free again.
    let open = open_stream(&d, "sk-solo").await;
    let (s, _, b) = call(&d, Some("sk-solo"), &completion(2)).await;
    assert_eq!(s, 429, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("in flight"),
        "{b}"
    );
    let streamed = open.text().await.unwrap();
    assert!(streamed.ends_with("data: [DONE]\n\n"), "{streamed}");
    let (s, _, b) = call(&d, Some("sk-solo"), &completion(2)).await;
    assert_eq!(s, 200, "{b}");

    // A request refused for one limit spends no other: refusals for concurrency leave
    // the requests-per-minute budget whole.
    let open = open_stream(&d, "sk-both").await;
    for _ in 0..3 {
        let (s, _, b) = call(&d, Some("sk-both"), &completion(2)).await;
        assert_eq!(s, 429, "{b}");
        assert!(
            b["error"]["message"]
                .as_str()
                .unwrap()
                .contains("in flight"),
            "{b}"
        );
    }
    open.text().await.unwrap();
    let (s, _, b) = call(&d, Some("sk-both"), &completion(2)).await;
    assert_eq!(s, 200, "the second of two requests a minute: {b}");

    // Tenants in the metrics: outcomes and tokens.
    let text = scrape(&url(&d, "/metrics")).await;
    let tenant = |labels: &str| metric_value(&text, "switchyard_tenant_requests", Some(labels));
    assert_eq!(
        tenant("tenant=\"acme\",outcome=\"accepted\""),
        3.0,
        "{text}"
    );
    assert_eq!(
        tenant("tenant=\"acme\",outcome=\"requests_per_minute\""),
        1.0
    );
    assert_eq!(tenant("tenant=\"solo\",outcome=\"max_concurrent\""), 1.0);
    assert_eq!(tenant("tenant=\"\",outcome=\"unauthorized\""), 3.0);
    let tokens = |labels: &str| metric_value(&text, "switchyard_tenant_tokens", Some(labels));
    assert!(
        tokens("tenant=\"solo\",kind=\"completion\"") >= 202.0,
        "{text}"
    );
    assert!(tokens("tenant=\"acme\",kind=\"prompt\"") > 0.0);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn internal_endpoints_are_never_on_the_public_port() {
    let workers = switchyard_frontend::http::WORKERS_PATH;
    // Without an admin listener: metrics on the public port, internal endpoints nowhere.
    let mut config = support::config(&[("WORKERS__COUNT", "1")]);
    config.frontend.admin.port = None;
    let d = switchyard::deploy::start_local(config).await.unwrap();
    assert!(d.admin_address.is_none());
    let public = |path: &str| format!("http://{}{path}", d.address);
    let status =
        |url: String| async move { client().get(url).send().await.unwrap().status().as_u16() };
    assert_eq!(status(public(workers)).await, 404);
    assert_eq!(
        status(public(switchyard_runtime::net::kv::INDEX_PATH)).await,
        404
    );
    assert_eq!(status(public("/metrics")).await, 200);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();

    // With one: metrics and internal endpoints there, and not on the public port.
    let d = start(&[("WORKERS__COUNT", "1")]).await;
    let admin = d.admin_address.unwrap();
    assert!(admin.ip().is_loopback());
    let public = |path: &str| format!("http://{}{path}", d.address);
    let private = |path: &str| format!("http://{admin}{path}");
    assert_eq!(status(public(workers)).await, 404);
    assert_eq!(status(public("/metrics")).await, 404);
    assert_eq!(status(private(workers)).await, 200);
    assert_eq!(status(private("/metrics")).await, 200);
    assert_eq!(status(private("/v1/completions")).await, 404);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
