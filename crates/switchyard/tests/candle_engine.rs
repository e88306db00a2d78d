//! The CPU engine (feature `candle`) end to end on the real SmolLM2 GGUF
//! (`SWITCHYARD_SMOLLM2_GGUF`, fetched by `scripts/test`): through `serve` with the official
//! `openai` client, and two workers where a repeated long prompt goes to the one holding its
//! cache. Run with `cargo test -p switchyard --features candle --test candle_engine`.

#![cfg(feature = "candle")]
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

fn model() -> String {
    let path = std::env::var("SWITCHYARD_SMOLLM2_GGUF").unwrap_or_default();
    assert!(
        std::path::Path::new(&path).is_file(),
        "SWITCHYARD_SMOLLM2_GGUF must name the SmolLM2-135M-Instruct Q4_1 GGUF (got {path:?}); run scripts/test, which fetches it"
    );
    path
}

async fn serve(workers: &str) -> switchyard::deploy::Deployment {
    let model = model();
    support::start(&[
        ("WORKERS__ENGINE", "candle"),
        ("WORKERS__COUNT", workers),
        ("WORKERS__CANDLE__MODEL", &model),
        ("FRONTEND__MODEL", "smollm2"),
    ])
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_a_real_model_to_the_openai_client() {
    let d = serve("1").await;
    support::python_checks(&d, "candle_e2e.py", "smollm2").await;

    // A prompt longer than the model's context is the client's error.
    let long = "train ".repeat(9000);
    let (status, _, body) = support::post(
        &d,
        "/v1/completions",
        &json!({"model": "smollm2", "prompt": long, "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_long_prompt_goes_to_the_worker_holding_its_cache() {
    let d = serve("2").await;
    let prompt = "Freight yards sort railway cars onto tracks by destination. ".repeat(24);
    let client = support::client();
    let mut routed = BTreeMap::new();
    for i in 0..4 {
        let response = client
            .post(support::url(&d, "/v1/completions"))
            .json(&json!({"model": "smollm2", "prompt": prompt, "max_tokens": 2, "temperature": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let worker = response.headers()["x-switchyard-worker"]
            .to_str()
            .unwrap()
            .to_owned();
        let body: serde_json::Value = response.json().await.unwrap();
        let cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        if i > 0 {
            assert!(
                cached >= 256,
                "request {i} (on worker {worker}, the first on {:?}) computed its prompt again: {body}",
                routed.get(&0)
            );
        }
        routed.insert(i, worker);
        if i == 0 {
            // The worker's KV events reach the router before the next request (a fixed
            // wait was too short when the machine is busy).
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let index =
                    support::cluster::get_json(&support::url(&d, "/v1/internal/kv/index")).await;
                let blocks: usize = index["streams"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|s| s["blocks"].as_array().map_or(0, Vec::len))
                    .sum();
                if blocks >= 16 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the prompt's blocks never reached the index: {index}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let first = &routed[&0];
    assert!(routed.values().all(|w| w == first), "{routed:?}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
