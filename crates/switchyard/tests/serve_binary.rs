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
    assert!(!text.contains("\"error\""), "{text}");
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
