//! Responses, streamed and not, against the mocker and echo engines.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::*;

const MODEL: &str = "switchyard-mock";

#[tokio::test]
async fn chat_non_streamed_has_usage_and_cache_hits_on_repeats() {
    let d = start(&[
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "20"),
    ])
    .await;
    let prompt = "Tell me about the history of rail yards and how switching works. ".repeat(8);
    let (s, _, first) = post(&d, "/v1/chat/completions", &chat(MODEL, &prompt, 8)).await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["choices"][0]["message"]["role"], "assistant");
    assert!(
        first["choices"][0]["finish_reason"] == "length"
            || first["choices"][0]["finish_reason"] == "stop"
    );
    let usage = &first["usage"];
    // The default tokenizer is a real BPE (SmolLM2's): English counts about 4–5 characters
    // per token, plus the chat template's default system prompt (~20 tokens).
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(
        (prompt.len() / 6..prompt.len() / 3).contains(&prompt_tokens),
        "{prompt_tokens} tokens for {} bytes",
        prompt.len()
    );
    assert!(usage["completion_tokens"].as_u64().unwrap() <= 8);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    // The same prompt again: KV-aware routing sends it where its prefix is cached.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (_, _, second) = post(&d, "/v1/chat/completions", &chat(MODEL, &prompt, 8)).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached > 0 && cached + 64 > prompt_tokens as u64,
        "all but the last partial block is cached: {second}"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn chat_streamed_ends_with_done_and_reports_usage() {
    let d = start(&[
        ("WORKERS__ENGINE", "echo"),
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__BUILTIN_TOKENIZER", "bytes"),
    ])
    .await;
    let mut body = chat(MODEL, "héllo wörld", 12);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (s, events) = sse(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    // The echo engine returns the first 12 tokens (bytes) of the templated prompt.
    assert_eq!(text, "<|user|>\nhé");
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 12);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn completions_streamed_and_not_with_token_prompts_and_stops() {
    let d = start(&[
        ("WORKERS__ENGINE", "echo"),
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__BUILTIN_TOKENIZER", "bytes"),
    ])
    .await;
    let (s, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "abcdefgh", "max_tokens": 6}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["object"], "text_completion");
    assert_eq!(b["choices"][0]["text"], "abcdef");
    // Token ids are taken as is (the built-in tokenizer's ids are bytes).
    let (_, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": [104, 105], "max_tokens": 3}),
    )
    .await;
    assert_eq!(b["choices"][0]["text"], "hih");
    // The end-of-sequence token (257 in the built-in vocabulary) ends generation, unless
    // `ignore_eos` says otherwise.
    let (_, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": [104, 257, 105], "max_tokens": 3}),
    )
    .await;
    assert_eq!(b["choices"][0]["finish_reason"], "stop");
    assert_eq!(b["usage"]["completion_tokens"], 2);
    let (_, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": [104, 257, 105], "max_tokens": 3, "ignore_eos": true}),
    )
    .await;
    assert_eq!(b["choices"][0]["finish_reason"], "length");
    assert_eq!(b["usage"]["completion_tokens"], 3);
    // A stop string cuts the output and ends with finish_reason "stop".
    let (_, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "abcdefgh", "max_tokens": 8, "stop": "de"}),
    )
    .await;
    assert_eq!(b["choices"][0]["text"], "abc");
    assert_eq!(b["choices"][0]["finish_reason"], "stop");
    let (s, events) = sse(&d, "/v1/completions", &json!({"model": MODEL, "prompt": "abcdefgh", "max_tokens": 8, "stop": ["fg"], "stream": true})).await;
    assert_eq!(s, 200);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "abcde");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn routing_overrides_apply_per_request() {
    let d = start(&[("WORKERS__ENGINE", "echo"), ("WORKERS__COUNT", "3")]).await;
    for _ in 0..6 {
        let mut body = chat(MODEL, "same prompt every time", 2);
        body["switchyard"] = json!({"routing": {"policy": "round-robin"}, "priority": "premium"});
        let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
        assert_eq!(s, 200, "{b}");
    }
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_streams_in_flight() {
    // The mocker in real time: a 40-token answer takes a while.
    let d = start(&[("WORKERS__COUNT", "1")]).await;
    let mut body = chat(MODEL, "a story, please", 40);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let stream = open_stream(&url(&d, "/v1/chat/completions"), &body).await;
    let address = d.address;
    let shutdown = tokio::spawn(d.shutdown(switchyard::deploy::SHUTDOWN_GRACE));
    let text = stream.finish().await;
    assert_completed(&text, 40);
    shutdown.await.unwrap().unwrap();
    // And it no longer accepts anything.
    assert!(
        client()
            .get(format!("http://{address}/health"))
            .send()
            .await
            .is_err()
    );
}
