//! Responses, streamed and not, against the mocker and echo engines.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

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
async fn n_choices_are_seeded_apart_and_counted_together() {
    let d = start(&[
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "50"),
    ])
    .await;
    let body = |n: u32, seed: u64| {
        let mut body = chat(MODEL, "Name three things found in a rail yard.", 6);
        body["n"] = json!(n);
        body["seed"] = json!(seed);
        body["ignore_eos"] = json!(true);
        body
    };
    let (s, _, three) = post(&d, "/v1/chat/completions", &body(3, 7)).await;
    assert_eq!(s, 200, "{three}");
    let choices = three["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3, "{three}");
    let texts: Vec<&str> = choices
        .iter()
        .zip(0..)
        .map(|(c, i)| {
            assert_eq!(c["index"], i, "{three}");
            assert_eq!(c["finish_reason"], "length", "{three}");
            c["message"]["content"].as_str().unwrap()
        })
        .collect();
    assert!(
        texts[0] != texts[1] && texts[1] != texts[2] && texts[0] != texts[2],
        "seeded choices differ: {texts:?}"
    );
    // Choice i is the request alone with seed + i; the prompt counts once, every choice's
    // completion counts.
    for i in 0..3u64 {
        let (_, _, one) = post(&d, "/v1/chat/completions", &body(1, 7 + i)).await;
        assert_eq!(one["choices"].as_array().unwrap().len(), 1, "{one}");
        assert_eq!(one["choices"][0]["message"]["content"], texts[i as usize]);
        assert_eq!(
            one["usage"]["prompt_tokens"],
            three["usage"]["prompt_tokens"]
        );
    }
    assert_eq!(three["usage"]["completion_tokens"], 18, "{three}");
    assert_eq!(
        three["usage"]["total_tokens"].as_u64().unwrap(),
        three["usage"]["prompt_tokens"].as_u64().unwrap() + 18
    );

    // Streamed: each choice opens with its role, ends once, and the usage of all comes
    // once at the end, before [DONE].
    let mut streamed = body(3, 7);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (s, events) = sse(&d, "/v1/chat/completions", &streamed).await;
    assert_eq!(s, 200);
    assert_eq!(events.last().unwrap(), "[DONE]");
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let usage: Vec<&Value> = chunks.iter().filter(|c| !c["usage"].is_null()).collect();
    assert_eq!(usage.len(), 1, "{chunks:?}");
    for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(
            chunks.last().unwrap()["usage"][field],
            three["usage"][field]
        );
    }
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    let by_index = streamed_choices(&chunks, "delta");
    assert_eq!(by_index.len(), 3);
    for (i, (text, reasons, roles)) in by_index.iter().enumerate() {
        assert_eq!(text, texts[i], "choice {i}");
        assert_eq!(reasons, &["length"], "choice {i}");
        assert_eq!(*roles, 1, "choice {i}");
    }

    // Text completions: the same, streamed and not.
    let completion = json!({"model": MODEL, "prompt": "Rail yards", "max_tokens": 4,
        "n": 2, "seed": 3, "ignore_eos": true});
    let (s, _, b) = post(&d, "/v1/completions", &completion).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["choices"].as_array().unwrap().len(), 2, "{b}");
    assert_ne!(b["choices"][0]["text"], b["choices"][1]["text"], "{b}");
    assert_eq!(b["usage"]["completion_tokens"], 8, "{b}");
    let mut stream = completion.clone();
    stream["stream"] = json!(true);
    let (_, events) = sse(&d, "/v1/completions", &stream).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let by_index = streamed_choices(&chunks, "text");
    assert_eq!(by_index.len(), 2);
    for (i, (text, reasons, _)) in by_index.iter().enumerate() {
        assert_eq!(
            text,
            b["choices"][i]["text"].as_str().unwrap(),
            "choice {i}"
        );
        assert_eq!(reasons, &["length"], "choice {i}");
    }
    // `best_of` equal to `n` is the same request; above it needs a ranking.
    let mut best_of = completion.clone();
    best_of["best_of"] = json!(2);
    let (s, _, same) = post(&d, "/v1/completions", &best_of).await;
    assert_eq!(s, 200, "{same}");
    assert_eq!(same["choices"], b["choices"]);
    best_of["best_of"] = json!(3);
    let (s, _, refused) = post(&d, "/v1/completions", &best_of).await;
    assert_eq!(s, 400, "{refused}");
    assert_eq!(refused["error"]["param"], "best_of", "{refused}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_requests_choices_share_the_first_choices_worker() {
    use futures::StreamExt;
    let d = start(&[("WORKERS__COUNT", "3")]).await;
    // Round-robin would send three requests to three workers; the choices stay together.
    let mut body = chat(MODEL, "Describe a hump yard.", 2000);
    body["n"] = json!(3);
    body["stream"] = json!(true);
    body["switchyard"] = json!({"routing": {"policy": "round-robin"}});
    let response = client()
        .post(url(&d, "/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let mut stream = response.bytes_stream();
    let _ = stream.next().await;
    let mut requests: Vec<u32> = d
        .frontend
        .routing
        .loads()
        .iter()
        .map(|(_, load, _)| load.requests)
        .collect();
    requests.sort_unstable();
    assert_eq!(requests, [0, 0, 3]);
    // The client goes away: every choice is cancelled on the worker, long before its
    // 2,000 tokens would have ended.
    drop(stream);
    support::cluster::eventually(Duration::from_secs(3), "the choices cancelled", || async {
        // The router's count and the engines' own reports of what they run.
        let loads: Vec<(u32, Option<u32>)> = d
            .frontend
            .routing
            .loads()
            .iter()
            .map(|(_, load, engine)| (load.requests, engine.map(|e| e.running + e.waiting)))
            .collect();
        if loads
            .iter()
            .all(|&(ours, theirs)| ours == 0 && theirs == Some(0))
        {
            Ok(())
        } else {
            Err(format!("in flight: {loads:?}"))
        }
    })
    .await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn more_choices_than_the_fleet_runs_at_once_are_all_answered() {
    // One worker running two sequences at a time: the fleet is busy once two choices run,
    // and the later choices must not queue behind their own request's earlier ones.
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        ("WORKERS__MOCKER__MAX_NUM_SEQS", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "50"),
        ("FRONTEND__ADMISSION__QUEUE_TIMEOUT", "3s"),
    ])
    .await;
    let mut body = chat(MODEL, "List the tracks of a classification yard.", 8);
    body["n"] = json!(5);
    body["ignore_eos"] = json!(true);
    let started = std::time::Instant::now();
    let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["choices"].as_array().unwrap().len(), 5, "{b}");
    assert_eq!(b["usage"]["completion_tokens"], 40, "{b}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
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
