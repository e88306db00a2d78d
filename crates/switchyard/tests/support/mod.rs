//! Starting a deployment for a test, and talking to it.

#![allow(dead_code)]

pub mod cluster;
pub mod process;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use switchyard::config::{self, Config};
use switchyard::deploy::{self, Deployment};

/// A configuration for tests: any free port, the given overrides as `SWITCHYARD_*` pairs.
pub fn config(overrides: &[(&str, &str)]) -> Config {
    let mut env: BTreeMap<String, String> = overrides
        .iter()
        .map(|(k, v)| (format!("SWITCHYARD_{k}"), v.to_string()))
        .collect();
    env.entry("SWITCHYARD_FRONTEND__PORT".into())
        .or_insert_with(|| "0".into());
    // Metrics and the internal endpoints on their own listener, as in production.
    env.entry("SWITCHYARD_FRONTEND__ADMIN__PORT".into())
        .or_insert_with(|| "0".into());
    config::load(None, &env, toml::Table::new()).expect("valid test configuration")
}

pub async fn start(overrides: &[(&str, &str)]) -> Deployment {
    deploy::start_local(config(overrides))
        .await
        .expect("deployment starts")
}

/// Makes `worker` of an in-process deployment fail as `fault` says, now and for good.
pub fn inject(
    d: &Deployment,
    worker: switchyard_core::WorkerId,
    fault: switchyard_worker::faults::Fault,
) {
    let w = d
        .workers
        .iter()
        .find(|w| w.worker_id() == worker)
        .expect("a worker of the deployment");
    let spec = switchyard_worker::faults::FaultSpec {
        fault,
        at: Duration::ZERO,
        lasts: None,
    };
    w.faults().inject(
        spec,
        &tokio_util::task::TaskTracker::new(),
        &tokio_util::sync::CancellationToken::new(),
    );
}

/// The worker with the most requests in flight.
pub fn busiest(d: &Deployment) -> switchyard_core::WorkerId {
    d.frontend
        .routing
        .loads()
        .into_iter()
        .max_by_key(|(_, load, _)| load.requests)
        .expect("a worker")
        .0
        .worker_id
}

/// A URL of the deployment: `/metrics` and `/v1/internal/*` on its admin listener when it
/// has one, everything else on the public one.
pub fn url(d: &Deployment, path: &str) -> String {
    match d.admin_address {
        Some(admin) if is_admin_path(path) => format!("http://{admin}{path}"),
        _ => format!("http://{}{path}", d.address),
    }
}

pub fn is_admin_path(path: &str) -> bool {
    path.starts_with("/metrics") || path.starts_with("/v1/internal/")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// Posts JSON; returns status, headers and the body parsed as JSON (or as a string).
pub async fn post(
    d: &Deployment,
    path: &str,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = client()
        .post(url(d, path))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, headers, value)
}

/// Posts raw bytes.
pub async fn post_raw(d: &Deployment, path: &str, body: Vec<u8>) -> (u16, Value) {
    let response = client()
        .post(url(d, path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Reads an SSE response to the end: the `data:` payloads in order.
pub async fn sse(d: &Deployment, path: &str, body: &Value) -> (u16, Vec<String>) {
    let response = client()
        .post(url(d, path))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    let mut text = String::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
    }
    let events = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect();
    (status, events)
}

/// The value of an unlabelled metric, or the sum of a labelled family.
pub async fn metric(d: &Deployment, name: &str) -> f64 {
    metric_value(&scrape(&url(d, "/metrics")).await, name, None)
}

pub async fn scrape(url: &str) -> String {
    client()
        .get(url)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("body")
}

/// Asserts that the deployment moved at least one stream off a worker that went away.
pub async fn assert_a_stream_moved(d: &Deployment) {
    let metrics = scrape(&url(d, "/metrics")).await;
    let moved = metric_value(
        &metrics,
        "switchyard_migrations_total",
        Some("disconnected"),
    );
    assert!(moved > 0.0, "a stream moved");
}

/// A metric (`name`, or counter `name_total`) in Prometheus text: summed over its series,
/// or only those with `label` (like `worker="1/0"`); 0 when absent.
pub fn metric_value(text: &str, name: &str, label: Option<&str>) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let series = l.split(['{', ' ']).next().unwrap_or_default();
            series == name || series.strip_suffix("_total") == Some(name)
        })
        .filter(|l| label.is_none_or(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// A streamed response being read.
pub struct OpenStream {
    stream: futures::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    /// What arrived so far (a chunk may end inside a character: decoded as a whole).
    bytes: Vec<u8>,
}

/// Posts a streamed request and waits for its first bytes: it is then in flight.
pub async fn open_stream(url: &str, body: &Value) -> OpenStream {
    let response = client()
        .post(url)
        .json(body)
        .send()
        .await
        .expect("request sent");
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream().boxed();
    let first = stream.next().await.expect("a first chunk").expect("chunk");
    let bytes = first.to_vec();
    assert!(
        !String::from_utf8_lossy(&bytes).contains("[DONE]"),
        "still streaming"
    );
    OpenStream { stream, bytes }
}

impl OpenStream {
    /// What arrived so far, as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// Reads to the end; returns the whole text.
    pub async fn finish(mut self) -> String {
        while let Some(chunk) = self.stream.next().await {
            self.bytes.extend_from_slice(&chunk.expect("chunk"));
        }
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Checks a finished stream: no error event, `completion_tokens` tokens, `[DONE]` last.
/// Reads the events (a generated token may well be the text `error`).
pub fn assert_completed(text: &str, completion_tokens: u32) {
    let streamed = parse_stream(text);
    assert!(streamed.errors.is_empty(), "{text}");
    assert_eq!(
        streamed.completion_tokens,
        Some(u64::from(completion_tokens)),
        "{text}"
    );
    assert!(
        streamed.done && text.ends_with("data: [DONE]\n\n"),
        "{text}"
    );
}

pub fn chat(model: &str, content: &str, max_tokens: u32) -> Value {
    serde_json::json!({ "model": model, "messages": [{ "role": "user", "content": content }], "max_tokens": max_tokens })
}

/// A streamed completion as the client saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Streamed {
    /// The text of every chunk, in order.
    pub text: String,
    pub completion_tokens: Option<u64>,
    /// The last `usage` object sent.
    pub usage: Option<Value>,
    /// Error events (their `error` objects).
    pub errors: Vec<Value>,
    /// Whether `[DONE]` came last.
    pub done: bool,
}

/// Reads an SSE body of `/v1/completions` (or chat) chunks.
pub fn parse_stream(body: &str) -> Streamed {
    let mut streamed = Streamed {
        text: String::new(),
        completion_tokens: None,
        usage: None,
        errors: Vec::new(),
        done: false,
    };
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        streamed.done = data == "[DONE]";
        if streamed.done {
            continue;
        }
        let chunk: Value = serde_json::from_str(data).expect("JSON event");
        if let Some(error) = chunk.get("error") {
            streamed.errors.push(error.clone());
            continue;
        }
        if let Some(choice) = chunk["choices"].get(0) {
            let piece = choice["text"]
                .as_str()
                .or_else(|| choice["delta"]["content"].as_str())
                .unwrap_or_default();
            streamed.text.push_str(piece);
        }
        if let Some(n) = chunk["usage"]["completion_tokens"].as_u64() {
            streamed.completion_tokens = Some(n);
        }
        if chunk["usage"].is_object() {
            streamed.usage = Some(chunk["usage"].clone());
        }
    }
    streamed
}

/// The texts of a streamed response's choices, by index, with each choice's finish reasons
/// and its opening role deltas.
pub fn streamed_choices(chunks: &[Value], field: &str) -> Vec<(String, Vec<String>, usize)> {
    let mut choices: Vec<(String, Vec<String>, usize)> = Vec::new();
    for chunk in chunks {
        for choice in chunk["choices"].as_array().unwrap() {
            let index = choice["index"].as_u64().unwrap() as usize;
            if choices.len() <= index {
                choices.resize(index + 1, (String::new(), Vec::new(), 0));
            }
            let text = if field == "delta" {
                if choice["delta"]["role"] == "assistant" {
                    choices[index].2 += 1;
                }
                choice["delta"]["content"].as_str()
            } else {
                choice["text"].as_str()
            };
            choices[index].0.push_str(text.unwrap_or_default());
            if let Some(reason) = choice["finish_reason"].as_str() {
                choices[index].1.push(reason.to_string());
            }
        }
    }
    choices
}

/// The chunks of an SSE body (`[DONE]` and error events left out).
pub fn sse_chunks(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str::<Value>(data).expect("JSON event"))
        .filter(|chunk| chunk.get("error").is_none())
        .collect()
}

/// A streamed completion request with a fixed seed (its tokens depend on nothing else on
/// the mocker), usage in the last chunk, and no stop at end-of-sequence.
pub fn seeded_completion(model: &str, prompt: &str, seed: u64, max_tokens: u32) -> Value {
    serde_json::json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "seed": seed,
        "stream": true,
        "stream_options": {"include_usage": true},
        "ignore_eos": true,
    })
}

/// Runs a client script of `tests/python` with the test virtualenv's Python
/// (`SWITCHYARD_PYTHON`, made by `scripts/test`) against a deployment's `/v1` and `model`;
/// fails unless the script passes every check (its output says "all checks passed").
pub async fn python_checks(d: &Deployment, script: &str, model: &str) {
    let python = std::env::var("SWITCHYARD_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = std::process::Command::new(&python)
        .args(["-c", "import openai"])
        .output();
    assert!(
        probe.as_ref().is_ok_and(|o| o.status.success()),
        "the `openai` package is not importable with {python}; run scripts/test (it creates the virtualenv) or set SWITCHYARD_PYTHON"
    );
    let script = format!("{}/../../tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let base = format!("http://{}/v1", d.address);
    let output = tokio::process::Command::new(&python)
        .args([script.as_str(), &base, model])
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
    // What the script measured, for `--nocapture`.
    eprintln!("{stdout}");
}

/// A PNG whose pixels depend on `seed`.
pub fn png(width: u32, height: u32, seed: u8) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([
            (x % 251) as u8,
            (y % 241) as u8,
            seed.wrapping_add((x ^ y) as u8),
        ])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img)
        .write_to(&mut out, image::ImageFormat::Png)
        .unwrap();
    out.into_inner()
}

pub fn data_url(bytes: &[u8]) -> String {
    format!(
        "data:image/png;base64,{}",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
    )
}
