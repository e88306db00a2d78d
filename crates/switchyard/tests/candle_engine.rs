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

/// Tool calls on the real model: the openai client's tool loop (`required`, a named
/// function, a strict tool left to the model) and an OpenAI Agents SDK agent run to its
/// final answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_model_calls_tools_for_the_client_and_an_agent() {
    let d = serve("1").await;
    support::python_checks(&d, "agent_tools_e2e.py", "smollm2").await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// The Responses API on the real model: the openai client's tool loop through
/// `previous_response_id` (streamed and not), and an OpenAI Agents SDK agent with its default
/// (Responses) model run to its final answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_model_serves_the_responses_api_to_the_client_and_an_agent() {
    let d = serve("1").await;
    support::python_checks(&d, "agent_responses_e2e.py", "smollm2").await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// Log probabilities on the real model, read by the openai client (chat streamed and not,
/// completions), and against llama.cpp's on the same GGUF and prompt tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_models_log_probabilities_reach_the_client_and_match_llama_cpp() {
    let d = serve("1").await;
    support::python_checks(&d, "logprobs_e2e.py", "smollm2").await;
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

/// A chat request for the real model: `text`, then the image at `url`, answered greedily.
fn with_image(text: &str, url: &str) -> serde_json::Value {
    json!({
        "model": "smollm2",
        "max_tokens": 12,
        "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url}},
        ]}],
    })
}

fn answer(body: &serde_json::Value) -> (String, u64, u64) {
    (
        body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned(),
        body["usage"]["prompt_tokens"].as_u64().unwrap(),
        body["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

/// One CPU-engine worker and one encoder worker: real (DINOv2 on ONNX Runtime) when
/// `vision` names the model and `runtime` ONNX Runtime, modelled otherwise; `extra`
/// settings on top.
async fn with_encoder(
    vision: Option<(&str, &str)>,
    extra: &[(&str, &str)],
) -> switchyard::deploy::Deployment {
    let model = model();
    let mut settings = vec![
        ("WORKERS__ENGINE", "candle"),
        ("WORKERS__COUNT", "1"),
        ("WORKERS__CANDLE__MODEL", model.as_str()),
        ("FRONTEND__MODEL", "smollm2"),
        ("FRONTEND__MULTIMODAL__ENCODERS", "1"),
    ];
    if let Some((vision, runtime)) = vision {
        settings.extend([
            ("WORKERS__ENCODER__VISION", vision),
            ("WORKERS__ENCODER__ONNXRUNTIME", runtime),
            ("WORKERS__ENCODER__THREADS", "1"),
        ]);
    }
    settings.extend_from_slice(extra);
    support::start(&settings).await
}

/// With a real vision encoder (DINOv2 on ONNX Runtime, feature `encoders`), an image's
/// embeddings reach the CPU engine, which merges them into its prefill: the same image
/// comes back from the prefix cache, another image changes the answer, and with modelled
/// encoders (no embeddings) the engine says what it lacks.
#[cfg(feature = "encoders")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_encoders_embeddings_are_merged_into_the_real_models_prefill() {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("set {name} (scripts/test fetches it)"))
    };
    let (vision, runtime) = (var("SWITCHYARD_DINOV2_ONNX"), var("SWITCHYARD_ORT_DYLIB"));
    let real = Some((vision.as_str(), runtime.as_str()));
    let text = "Describe the picture in one word.";
    for overlap in ["true", "false"] {
        let settings = [
            ("FRONTEND__MULTIMODAL__OVERLAP", overlap),
            ("WORKERS__CANDLE__STEP_TARGET", "1h"),
        ];
        let d = with_encoder(real, &settings).await;
        let image = |seed| with_image(text, &support::data_url(&support::png(64, 64, seed)));
        let (s, _, b) = support::post(&d, "/v1/chat/completions", &image(1)).await;
        assert_eq!(s, 200, "{b}");
        let (_, prompt_tokens, _) = answer(&b);
        let (s, _, b) = support::post(&d, "/v1/chat/completions", &image(1)).await;
        assert_eq!(s, 200, "{b}");
        let (_, again_tokens, cached) = answer(&b);
        assert_eq!(again_tokens, prompt_tokens);
        // Everything but the last few tokens after the image, from the cache.
        assert!(
            cached + 16 >= prompt_tokens,
            "overlap {overlap}: {cached} of {prompt_tokens} cached"
        );
        // Other images change the answer. This model has no trained projector for the
        // encoder's rows (a fixed random one), so its answers to images are chaotic: a
        // prompt chunked otherwise may get another answer, and two images may share their
        // first tokens. So the chunks are fixed (a step target no step reaches: always
        // `max_batched_tokens`), three other images are compared among themselves (each
        // after the same cached text, so computed alike), over a dozen tokens each.
        let mut answers = Vec::new();
        for seed in [200, 77, 9] {
            let (s, _, b) = support::post(&d, "/v1/chat/completions", &image(seed)).await;
            assert_eq!(s, 200, "{b}");
            let (other, _, cached) = answer(&b);
            assert!(
                cached < prompt_tokens / 2,
                "another image shares no KV: {cached}"
            );
            answers.push((other, cached));
        }
        assert!(
            answers.iter().any(|a| a.0 != answers[0].0),
            "overlap {overlap}: three images, one answer: {answers:?}"
        );
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }

    // Features kept after the prefill (`keep_cpu`): the same image after other text (its
    // KV not cached) skips the encoder, and the store's copy of its embeddings is merged.
    let d = with_encoder(
        real,
        &[(
            "FRONTEND__MULTIMODAL__FEATURE_STORE__AFTER_PREFILL",
            "keep_cpu",
        )],
    )
    .await;
    let url = support::data_url(&support::png(64, 64, 9));
    let (s, _, b) = support::post(&d, "/v1/chat/completions", &with_image(text, &url)).await;
    assert_eq!(s, 200, "{b}");
    let metrics = |name: &str, text: &str| support::metric_value(text, name, None);
    let before = support::scrape(&support::url(&d, "/metrics")).await;
    let other_text = "Another turn, another question entirely: what colour dominates?";
    let (s, _, b) = support::post(&d, "/v1/chat/completions", &with_image(other_text, &url)).await;
    assert_eq!(s, 200, "{b}");
    let (_, _, cached) = answer(&b);
    assert!(
        cached < 32,
        "the second turn's prefix is new: {cached} cached"
    );
    let after = support::scrape(&support::url(&d, "/metrics")).await;
    assert_eq!(
        metrics("switchyard_encoder_jobs_total", &after),
        metrics("switchyard_encoder_jobs_total", &before),
        "{after}"
    );
    assert_eq!(
        metrics("switchyard_feature_store_hits_total", &after),
        metrics("switchyard_feature_store_hits_total", &before) + 1.0,
        "{after}"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();

    // Modelled encoders time the image but compute no embeddings: the engine cannot serve it.
    let d = with_encoder(None, &[]).await;
    let body = with_image(text, &support::data_url(&support::png(64, 64, 3)));
    let (s, _, b) = support::post(&d, "/v1/chat/completions", &body).await;
    assert_ne!(s, 200, "{b}");
    let message = b["error"]["message"].as_str().unwrap();
    assert!(message.contains("embeddings"), "{s} {message}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// Structured output on the real model: its logits are masked by the constraint, so every
/// answer that ends with `stop` follows it (one cut by `max_tokens` ends with `length`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_models_answers_follow_their_constraints() {
    let d = serve("1").await;
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    let ask = |seed: u64, extra: serde_json::Value| {
        let mut body = json!({
            "model": "smollm2",
            "messages": [{"role": "user", "content": "Give a person's name and age as JSON."}],
            "max_tokens": 64,
            "seed": seed,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let format = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "person", "schema": schema}}});
    let mut stopped = 0;
    for seed in 0..4 {
        let (status, _, body) =
            support::post(&d, "/v1/chat/completions", &ask(seed, format.clone())).await;
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        let text = choice["message"]["content"].as_str().unwrap();
        match choice["finish_reason"].as_str().unwrap() {
            "stop" => {
                stopped += 1;
                let value: serde_json::Value =
                    serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
                assert!(value["name"].is_string() && value["age"].is_i64(), "{text}");
                assert_eq!(value.as_object().unwrap().len(), 2, "{text}");
            }
            "length" => {}
            other => panic!("finish_reason {other}: {body}"),
        }
    }
    eprintln!("{stopped} of 4 schema answers ended with stop");
    let choices = ["red", "green", "blue"];
    let extra = json!({"structured_outputs": {"choice": choices}});
    let (status, _, body) = support::post(&d, "/v1/chat/completions", &ask(7, extra)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(choices.contains(&text), "{text:?}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
