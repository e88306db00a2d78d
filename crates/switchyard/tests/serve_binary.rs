//! The `switchyard serve` binary itself: flags, environment, the banner, SIGTERM.

#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::process::Process;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_and_finishes_its_streams_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["serve", "--port", "0", "--workers", "2", "--model", "7"].map(str::to_string);
    // SWITCHYARD_CACHE belongs to scripts/test, not to the configuration; the model is
    // named like a number.
    let mut serve = Process::spawn_with_env(
        "serve",
        &args,
        &[("SWITCHYARD_CACHE", "/tmp/elsewhere")],
        dir.path(),
    );
    let client = reqwest::Client::new();
    let health: Value = client
        .get(serve.url("/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["workers"], 2);
    assert_eq!(health["model"], "7");

    let body = json!({
        "model": "7",
        "messages": [{"role": "user", "content": "A long story, please."}],
        "max_tokens": 40,
        "stream": true,
        "ignore_eos": true,
    });
    let stream = support::open_stream(&serve.url("/v1/chat/completions"), &body).await;
    serve.sigterm();
    let text = stream.finish().await;
    assert!(support::parse_stream(&text).errors.is_empty(), "{text}");
    assert!(text.contains("\"finish_reason\":\"length\""), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(serve.wait(Duration::from_secs(10)).success());
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = run(&["serve", "--workers", "0"], &[]);
    assert!(err.contains("workers.count must be at least 1"), "{err}");
    let err = run(&["serve"], &[("SWITCHYARD_FRONTEND__PORT", "http")]);
    assert!(err.contains("`frontend.port`"), "{err}");
    let err = run(&["frontend", "--event-plane", "nats://127.0.0.1:4222"], &[]);
    assert!(err.contains("--discovery etcd://HOST:PORT"), "{err}");
    let err = run(
        &[
            "worker",
            "--discovery",
            "127.0.0.1:2379",
            "--event-plane",
            "nats://127.0.0.1:4222",
        ],
        &[],
    );
    assert!(
        err.contains("runtime.discovery must look like etcd://HOST:PORT"),
        "{err}"
    );
    let err = run(&["serve", "--speedup-ratio", "0"], &[]);
    assert!(err.contains("speedup_ratio"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_and_hold_no_prompt_or_completion_text() {
    const SECRET: &str = "zebra-quartz-7781";
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "serve",
        "--port",
        "0",
        "--workers",
        "2",
        "--log-format",
        "json",
    ]
    .map(str::to_string);
    let mut serve = Process::spawn("serve", &args, dir.path());
    let client = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        let request = client.post(serve.url(path)).json(&body);
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    let model = "switchyard-mock";
    let (status, answer) = post(
        "/v1/chat/completions",
        json!({"model": model, "max_tokens": 40, "ignore_eos": true,
               "messages": [{"role": "user", "content": format!("Keep {SECRET} to yourself.")}]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let completion: Value = serde_json::from_str(&answer).unwrap();
    let generated = completion["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _) = post(
        "/v1/completions",
        json!({"model": model, "prompt": format!("{SECRET} again"), "max_tokens": 20,
               "stream": true, "stop": [SECRET]}),
    )
    .await;
    assert_eq!(status, 200);
    // Refused requests quote their input in the response, never in the log.
    let (status, _) = post("/v1/completions", json!({"model": SECRET, "prompt": "x"})).await;
    assert_eq!(status, 404);
    let (status, _) = post(
        "/v1/completions",
        json!({"model": model, "prompt": SECRET, "temperature": SECRET}),
    )
    .await;
    assert_eq!(status, 400);
    serve.sigterm();
    assert!(serve.wait(Duration::from_secs(10)).success());

    let log = serve.log_text();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 3, "{log}");
    for line in &lines {
        let event: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        assert!(event["timestamp"].is_string(), "{line}");
        assert!(
            ["INFO", "WARN", "ERROR"].contains(&event["level"].as_str().unwrap()),
            "{line}"
        );
        assert!(event["fields"]["message"].is_string(), "{line}");
    }
    assert!(
        log.contains("\"shutting down\""),
        "the shutdown was logged: {log}"
    );
    assert!(!log.contains(SECRET), "prompt text in the log: {log}");
    // The generated text (the mocker's tokens decoded) is not logged either.
    assert!(generated.len() >= 20, "{generated:?}");
    assert!(
        !log.contains(&generated),
        "completion text in the log: {log}"
    );
}

/// A model directory with a tokenizer but no config.json starts with the default context
/// length and a warning, or takes `--context-length`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokenizer_without_config_json_falls_back_or_takes_context_length() {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../frontend/tests/fixtures/chatml-bpe/tokenizer.json");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::copy(&fixture, model.join("tokenizer.json")).unwrap();
    let model = model.display().to_string();
    let client = reqwest::Client::new();
    for (extra, context) in [(None, 32_768u64), (Some("1000"), 1000)] {
        // The echo engine: the fixture's vocabulary is smaller than the mocker's.
        let mut args = vec![
            "serve",
            "--port",
            "0",
            "--workers",
            "1",
            "--engine",
            "echo",
            "--tokenizer",
            &model,
        ];
        if let Some(length) = extra {
            args.extend(["--context-length", length]);
        }
        let args: Vec<String> = args.into_iter().map(str::to_string).collect();
        let mut serve = Process::spawn("serve", &args, dir.path());
        // One token under the context is accepted as max_tokens; one over is refused
        // naming the context length.
        let ask = |max_tokens: u64| {
            client
                .post(serve.url("/v1/completions"))
                .json(&json!({"model": "switchyard-mock", "prompt": [5], "max_tokens": max_tokens}))
                .send()
        };
        let over: Value = ask(context).await.unwrap().json().await.unwrap();
        assert_eq!(over["error"]["code"], "context_length_exceeded", "{over}");
        assert!(
            over["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("maximum context length is {context} tokens")),
            "{over}"
        );
        let status = ask(1).await.unwrap().status();
        assert_eq!(status, 200);
        serve.sigterm();
        assert!(serve.wait(Duration::from_secs(10)).success());
        let log = serve.log_text();
        assert_eq!(
            log.contains("declare no context length"),
            extra.is_none(),
            "{log}"
        );
    }
}
