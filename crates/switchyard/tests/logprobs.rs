//! Log probabilities on `serve`'s mocker engines, whose distribution is known exactly:
//! uniform over its 32,000 tokens, reshaped by biases and masked by constraints. Chat and
//! completions, streamed and not, a stream moved off a crashed worker, a disaggregated
//! request's first token, and a constrained answer.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::*;
use switchyard::deploy::SHUTDOWN_GRACE;
use switchyard_worker::faults::Fault;

const MODEL: &str = "switchyard-mock";

/// The mocker's log probability of any token when nothing reshapes its draw.
fn uniform() -> f64 {
    -(f64::from(switchyard_mocker::tokens::VOCAB_SIZE)).ln()
}

fn close(a: &Value, b: f64) -> bool {
    (a.as_f64().unwrap() - b).abs() < 1e-3
}

/// An SSE body again, from its `data:` payloads.
fn body_of(events: &[String]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

/// The chat entries of a streamed body, in order.
fn streamed_entries(body: &str) -> Vec<Value> {
    sse_chunks(body)
        .iter()
        .flat_map(|chunk| chunk["choices"].as_array().unwrap().clone())
        .filter_map(|choice| choice["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect()
}

/// The id of the token that spells `text`.
async fn token_id(d: &switchyard::deploy::Deployment, text: &str) -> u64 {
    let (status, _, body) = post(
        d,
        "/v1/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let tokens = body["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 1, "{body}");
    tokens[0].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_completions_report_the_mockers_exact_distribution() {
    let d = start(&[("WORKERS__COUNT", "1")]).await;
    let mut body = chat(MODEL, "Tell me about rail yards.", 8);
    for (k, v) in json!({"seed": 3, "ignore_eos": true, "logprobs": true, "top_logprobs": 3})
        .as_object()
        .unwrap()
    {
        body[k] = v.clone();
    }
    let (status, _, whole) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let entries = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(entries.len(), 8, "{whole}");
    for entry in entries {
        assert!(close(&entry["logprob"], uniform()), "{entry}");
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{entry}");
        assert!(
            top.iter().all(|t| close(&t["logprob"], uniform())),
            "{entry}"
        );
        // Among equals, the chosen token first.
        assert_eq!(top[0]["bytes"], entry["bytes"], "{entry}");
    }

    // Streamed: the same entries, spread over the chunks.
    body["stream"] = json!(true);
    let (status, chunks) = sse(&d, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let streamed = streamed_entries(&body_of(&chunks));
    assert_eq!(&streamed, entries);

    // Without the request asking, no entries.
    body["stream"] = json!(false);
    body.as_object_mut().unwrap().remove("logprobs");
    body.as_object_mut().unwrap().remove("top_logprobs");
    let (_, _, plain) = post(&d, "/v1/chat/completions", &body).await;
    assert!(plain["choices"][0]["logprobs"].is_null(), "{plain}");

    // A +100 bias makes its token certain, and every other token 100 less likely.
    let hello = token_id(&d, " hello").await;
    let biased = json!({
        "model": MODEL, "prompt": "Say it.", "max_tokens": 5, "ignore_eos": true,
        "logprobs": 2, "logit_bias": {hello.to_string(): 100},
    });
    let (status, _, body) = post(&d, "/v1/completions", &biased).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], " hello".repeat(5), "{body}");
    let logprobs = &choice["logprobs"];
    assert_eq!(logprobs["tokens"], json!(vec![" hello"; 5]), "{body}");
    assert_eq!(logprobs["text_offset"], json!([0, 6, 12, 18, 24]), "{body}");
    // log(1 / (e^100 + 31,999)) for each of the others: −100 to the precision reported.
    let others = -100.0;
    for (i, top) in logprobs["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert!(close(&logprobs["token_logprobs"][i], 0.0), "{body}");
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 2, "{body}");
        assert!(close(&top[" hello"], 0.0), "{body}");
        assert!(top.values().any(|v| close(v, others)), "{body}");
    }

    // Echoed: the prompt's tokens first (the first with none), offsets over the whole text.
    let echoed = json!({
        "model": MODEL, "prompt": "Rail yards sort cars.", "max_tokens": 3, "seed": 2,
        "ignore_eos": true, "logprobs": 1, "echo": true,
    });
    let (status, _, body) = post(&d, "/v1/completions", &echoed).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    let logprobs = &choice["logprobs"];
    let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let tokens: Vec<&str> = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), prompt + 3, "{body}");
    assert_eq!(tokens[..prompt].concat(), "Rail yards sort cars.", "{body}");
    assert!(
        choice["text"]
            .as_str()
            .unwrap()
            .starts_with("Rail yards sort cars.")
    );
    assert_eq!(logprobs["token_logprobs"][0], Value::Null, "{body}");
    assert_eq!(logprobs["top_logprobs"][0], Value::Null, "{body}");
    assert!(close(&logprobs["token_logprobs"][1], uniform()), "{body}");
    let offsets: Vec<u64> = logprobs["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    let mut at = 0;
    for (token, offset) in tokens.iter().zip(&offsets) {
        assert_eq!(*offset, at, "{body}");
        at += token.chars().count() as u64;
    }
    // Streamed: the echoed text and its entries come first, then the answer's.
    let mut streamed = echoed.clone();
    streamed["stream"] = json!(true);
    let (_, chunks) = sse(&d, "/v1/completions", &streamed).await;
    let first = serde_json::from_str::<Value>(&chunks[0]).unwrap();
    assert_eq!(first["choices"][0]["text"], "Rail yards sort cars.");
    assert_eq!(
        first["choices"][0]["logprobs"]["tokens"]
            .as_array()
            .unwrap()
            .len(),
        prompt
    );
    let text: String = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| {
            serde_json::from_str::<Value>(c).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_eq!(text, choice["text"].as_str().unwrap());
    // Echo without log probabilities: the prompt's text only.
    let mut plain = echoed.clone();
    plain.as_object_mut().unwrap().remove("logprobs");
    let (_, _, body) = post(&d, "/v1/completions", &plain).await;
    assert_eq!(body["choices"][0]["text"], choice["text"], "{body}");
    assert!(body["choices"][0]["logprobs"].is_null(), "{body}");
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// A completion's streamed log probabilities: one per token.
fn token_logprobs(body: &str) -> Vec<f64> {
    sse_chunks(body)
        .iter()
        .filter_map(|chunk| {
            chunk["choices"][0]["logprobs"]["token_logprobs"]
                .as_array()
                .cloned()
        })
        .flatten()
        // An echoed prompt's first token has none.
        .filter_map(|v| v.as_f64())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_moved_off_a_crashed_worker_keeps_reporting_them() {
    let d = start(&[
        ("WORKERS__COUNT", "3"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "2"),
    ])
    .await;
    let url = url(&d, "/v1/completions");
    let bodies: Vec<Value> = (0..12)
        .map(|i| {
            let mut body =
                seeded_completion(MODEL, &format!("Track {i} of the yard. ").repeat(8), i, 120);
            body["logprobs"] = json!(0);
            // Half of them echo their prompt, with its log probabilities once.
            body["echo"] = json!(i % 2 == 0);
            body
        })
        .collect();
    let open = futures::future::join_all(bodies.iter().map(|b| open_stream(&url, b))).await;
    inject(&d, busiest(&d), Fault::Crash);
    let bodies = futures::future::join_all(open.into_iter().map(OpenStream::finish)).await;
    assert_a_stream_moved(&d).await;
    for (i, body) in bodies.iter().enumerate() {
        assert_completed(body, 120);
        let logprobs = token_logprobs(body);
        let prompt = parse_stream(body).usage.unwrap()["prompt_tokens"]
            .as_u64()
            .unwrap() as usize;
        // The prompt's first token has none.
        let echoed = if i % 2 == 0 { prompt - 1 } else { 0 };
        assert_eq!(logprobs.len(), echoed + 120, "{body}");
        // A prompt token's under the mocker's plain model: uniform over its vocabulary,
        // none for a token beyond it (−9999 reported).
        let (prompt, answer) = logprobs.split_at(echoed);
        assert!(
            prompt
                .iter()
                .all(|&l| (l - uniform()).abs() < 1e-3 || l == -9999.0),
            "{prompt:?}"
        );
        assert!(
            answer.iter().all(|&l| (l - uniform()).abs() < 1e-3),
            "{answer:?}"
        );
    }
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_requests_first_token_and_prompt_bring_their_entries_from_the_prefill_worker()
 {
    let d = start(&[("WORKERS__COUNT", "2"), ("WORKERS__PREFILL", "1")]).await;
    let mut body = seeded_completion(
        MODEL,
        &"Far past the local-prefill threshold of 512 tokens. ".repeat(60),
        5,
        6,
    );
    body["logprobs"] = json!(1);
    body["echo"] = json!(true);
    let (status, chunks) = sse(&d, "/v1/completions", &body).await;
    assert_eq!(status, 200);
    let body = body_of(&chunks);
    assert_completed(&body, 6);
    // The prompt's (after its first token), from the prefill worker too.
    let prompt = parse_stream(&body).usage.unwrap()["prompt_tokens"]
        .as_u64()
        .unwrap() as usize;
    assert_eq!(token_logprobs(&body).len(), prompt - 1 + 6, "{body}");
    let metrics = scrape(&support::url(&d, "/metrics")).await;
    assert!(
        metric_value(
            &metrics,
            "switchyard_disagg_prefills",
            Some("outcome=\"remote\"")
        ) > 0.0,
        "the request was not disaggregated: {metrics}"
    );
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_constrained_answers_entries_are_the_masked_distribution() {
    let d = start(&[("WORKERS__COUNT", "1")]).await;
    let mut body = chat(MODEL, "Pick one.", 16);
    for (k, v) in json!({
        "seed": 1, "logprobs": true, "top_logprobs": 5,
        "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema":
            {"type": "string", "enum": ["north", "south"]}}},
    })
    .as_object()
    .unwrap()
    {
        body[k] = v.clone();
    }
    let (status, _, whole) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text == "\"north\"" || text == "\"south\"", "{whole}");
    let entries = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert!(!entries.is_empty(), "{whole}");
    for entry in entries {
        // Few tokens are allowed at each step: far likelier than 1 in 32,000, and the
        // alternatives are only the allowed ones.
        let logprob = entry["logprob"].as_f64().unwrap();
        assert!(logprob > uniform() / 2.0 && logprob <= 0.0, "{entry}");
        let top = entry["top_logprobs"].as_array().unwrap();
        assert!(!top.is_empty() && top.len() <= 5, "{entry}");
        let total: f64 = top
            .iter()
            .map(|t| t["logprob"].as_f64().unwrap().exp())
            .sum();
        assert!(total <= 1.0 + 1e-4, "{entry}");
    }
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}
