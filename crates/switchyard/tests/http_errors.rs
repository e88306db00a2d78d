//! Every error path of the HTTP API answers OpenAI-style JSON with the right status.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::*;

const MODEL: &str = "switchyard-mock";

fn assert_error(status: u16, body: &Value, expected_status: u16, kind: &str) {
    assert_eq!(status, expected_status, "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn malformed_and_mistyped_bodies_are_400() {
    let d = start(&[("WORKERS__ENGINE", "echo"), ("WORKERS__COUNT", "1")]).await;
    let (s, b) = post_raw(&d, "/v1/chat/completions", b"{\"model\": ".to_vec()).await;
    assert_error(s, &b, 400, "invalid_request_error");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let (s, b) = post_raw(&d, "/v1/chat/completions", Vec::new()).await;
    assert_error(s, &b, 400, "invalid_request_error");
    let (s, _, b) = post(
        &d,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": "hi"}),
    )
    .await;
    assert_error(s, &b, 400, "invalid_request_error");
    assert_eq!(b["error"]["param"], "messages", "{b}");
    let (s, _, b) = post(&d, "/v1/chat/completions", &json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"})).await;
    assert_error(s, &b, 400, "invalid_request_error");
    assert_eq!(b["error"]["param"], "max_tokens", "{b}");
    let (s, _, b) = post(&d, "/v1/completions", &json!({"prompt": "no model"})).await;
    assert_error(s, &b, 400, "invalid_request_error");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn invalid_values_are_400_naming_the_parameter() {
    let d = start(&[("WORKERS__ENGINE", "echo"), ("WORKERS__COUNT", "1")]).await;
    let base = |extra: Value| {
        let mut body = chat(MODEL, "hello", 4);
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases = [
        (base(json!({"n": 129})), "n"),
        (base(json!({"temperature": 3.5})), "temperature"),
        (base(json!({"top_p": 0})), "top_p"),
        (base(json!({"top_k": -2})), "top_k"),
        (base(json!({"max_tokens": 0})), "max_tokens"),
        (base(json!({"stop": ["a", "b", "c", "d", "e"]})), "stop"),
        // No echo worker reports them; a chat takes a boolean.
        (base(json!({"logprobs": true})), "logprobs"),
        (base(json!({"logprobs": 1})), "logprobs"),
        (base(json!({"tools": [{"type": "function"}]})), "tools[0]"),
        (
            base(json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]})),
            "tools[0].type",
        ),
        (
            base(json!({"tool_choice": {"type": "function"}})),
            "tool_choice",
        ),
        // Unknown keys and mistyped known ones are refused, naming the key.
        (base(json!({"temperatur": 0.5})), "temperatur"),
        (base(json!({"user": {}})), "user"),
        (base(json!({"min_p": "x"})), "min_p"),
        (base(json!({"min_p": 0.2})), "min_p"),
        (
            base(json!({"repetition_penalty": 1.3})),
            "repetition_penalty",
        ),
        (base(json!({"min_tokens": 3})), "min_tokens"),
        (base(json!({"guided_json": {"type": "foo"}})), "guided_json"),
        (base(json!({"guided_regex": "a(b"})), "guided_regex"),
        (
            base(json!({"web_search_options": {}})),
            "web_search_options",
        ),
        (base(json!({"messages": []})), "messages"),
        (
            base(json!({"messages": [{"role": "wizard", "content": "x"}]})),
            "messages[0].role",
        ),
        (
            base(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})),
            "messages[0].content[0].image_url",
        ),
        (
            base(json!({"messages": [{"role": "user", "content": [{"type": "hologram"}]}]})),
            "messages[0].content",
        ),
        (
            base(json!({"switchyard": {"routing": {"policy": "fastest"}}})),
            "switchyard.routing.policy",
        ),
        (
            base(json!({"switchyard": {"priority": "vip"}})),
            "switchyard.priority",
        ),
        (
            base(json!({"max_completion_tokens": 0})),
            "max_completion_tokens",
        ),
        (
            base(json!({"stream_options": {"include_usage": true}})),
            "stream_options",
        ),
        (base(json!({"frequency_penalty": 100})), "frequency_penalty"),
        (base(json!({"presence_penalty": -2.5})), "presence_penalty"),
        (base(json!({"n": 0})), "n"),
        (base(json!({"top_logprobs": 3})), "top_logprobs"),
        (base(json!({"top_logprobs": 21})), "top_logprobs"),
        (base(json!({"logit_bias": {"5": 101}})), "logit_bias"),
        (base(json!({"logit_bias": {"dog": 1}})), "logit_bias"),
        (base(json!({"logit_bias": {"99999999": 1}})), "logit_bias"),
        (
            base(
                json!({"logit_bias": (0..1025).map(|t| (t.to_string(), json!(-100))).collect::<serde_json::Map<_, _>>()}),
            ),
            "logit_bias",
        ),
        (
            base(json!({"response_format": {"type": "xml"}})),
            "response_format",
        ),
        (
            base(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})),
            "response_format.json_schema.schema",
        ),
        (
            base(json!({"functions": [{"name": "f", "parameters": {}}]})),
            "functions",
        ),
        (
            base(json!({"function_call": {"name": "f"}})),
            "function_call",
        ),
        (base(json!({"tool_choice": "required"})), "tool_choice"),
        // A message field the server does not know is refused, never dropped from the prompt.
        (
            base(json!({"messages": [{"role": "user", "content": "x", "mood": "happy"}]})),
            "messages[0].mood",
        ),
        (
            base(json!({"messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": null,
                 "function_call": {"name": "f", "arguments": "{}"}},
                {"role": "user", "content": "y"}]})),
            "messages[1].function_call",
        ),
        (base(json!({"modalities": ["text", "audio"]})), "modalities"),
        (base(json!({"audio": {"voice": "alloy"}})), "audio"),
    ];
    for (body, param) in cases {
        let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
        assert_error(s, &b, 400, "invalid_request_error");
        assert_eq!(b["error"]["param"], param, "{b}");
    }
    // What the OpenAI SDKs send back in an assistant turn is taken (and changes nothing).
    let history = json!({"model": MODEL, "max_tokens": 2, "messages": [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "y", "refusal": null, "annotations": [],
         "audio": null, "function_call": null, "tool_calls": []},
        {"role": "user", "content": "z"}]});
    let (s, _, b) = post(&d, "/v1/chat/completions", &history).await;
    assert_eq!(s, 200, "{b}");
    let (s, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ["a", "b"]}),
    )
    .await;
    assert_error(s, &b, 400, "invalid_request_error");
    let (s, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": [1, 2, 99999999]}),
    )
    .await;
    assert_error(s, &b, 400, "invalid_request_error");
    let (s, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ""}),
    )
    .await;
    assert_error(s, &b, 400, "invalid_request_error");
    for (extra, param) in [
        (json!({"best_of": 3}), "best_of"),
        (json!({"best_of": 30}), "best_of"),
        (json!({"suffix": "}"}), "suffix"),
        // In range, but no echo worker reports them.
        (json!({"logprobs": 6}), "logprobs"),
        (json!({"logprobs": 0}), "logprobs"),
        (json!({"logprobs": 21}), "logprobs"),
        (json!({"logprobs": true}), "logprobs"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
    ] {
        let mut body = json!({"model": MODEL, "prompt": "hello", "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (s, _, b) = post(&d, "/v1/completions", &body).await;
        assert_error(s, &b, 400, "invalid_request_error");
        assert_eq!(b["error"]["param"], param, "{b}");
    }
    // A number beyond any float is refused while parsing (not taken as infinity).
    let mut body = chat(MODEL, "hello", 4).to_string();
    body.insert_str(1, "\"frequency_penalty\": 1e309, ");
    let (s, b) = post_raw(&d, "/v1/chat/completions", body.into_bytes()).await;
    assert_error(s, &b, 400, "invalid_request_error");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("out of range"),
        "{b}"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn neutral_values_of_unsupported_parameters_and_honoured_ones_pass() {
    let d = start(&[("WORKERS__COUNT", "1")]).await;
    let mut body = chat(MODEL, "hello", 6);
    for (k, v) in json!({
        "frequency_penalty": 0.5, "presence_penalty": -2, "seed": 7, "n": 1,
        "logprobs": false, "top_logprobs": 0, "tools": [], "tool_choice": "none",
        "response_format": {"type": "text"}, "modalities": ["text"], "user": "u-1",
        "stream_options": null, "ignore_eos": true,
    })
    .as_object()
    .unwrap()
    {
        body[k] = v.clone();
    }
    let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{b}");
    // `include_usage: null` reads as false.
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": null});
    let (s, _, _) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200);
    // `seed` keys the mocker's output: the same seed gives the same text.
    body["stream"] = json!(false);
    body.as_object_mut().unwrap().remove("stream_options");
    let text = |b: &Value| {
        b["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (_, _, again) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(text(&b), text(&again));
    // A neutral `logit_bias` changes nothing (the mocker's test checks that -100 bans).
    let mut completion = json!({
        "model": MODEL, "prompt": "hello", "max_tokens": 6, "seed": 7, "ignore_eos": true,
    });
    let (s, _, plain) = post(&d, "/v1/completions", &completion).await;
    assert_eq!(s, 200, "{plain}");
    completion["logit_bias"] = json!({"0": 0});
    let (_, _, neutral) = post(&d, "/v1/completions", &completion).await;
    assert_eq!(plain["choices"][0]["text"], neutral["choices"][0]["text"]);
    // Biases and penalties reach the mocker: a +100 bias makes its token all there is,
    // and negative penalties make the output repeat itself.
    completion["max_tokens"] = json!(300);
    completion["logit_bias"] = json!({"5000": 100});
    let (s, _, biased) = post(&d, "/v1/completions", &completion).await;
    assert_eq!(s, 200, "{biased}");
    let words: Vec<&str> = biased["choices"][0]["text"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .collect();
    assert!(words.len() >= 100, "{biased}");
    assert!(words.iter().all(|w| *w == words[0]), "{biased}");
    // Distinct runs of 6 characters, and all of them: repeated text has few distinct ones.
    let distinct = |b: &Value| {
        let chars: Vec<char> = b["choices"][0]["text"].as_str().unwrap().chars().collect();
        let mut runs: Vec<&[char]> = chars.windows(6).collect();
        let all = runs.len();
        runs.sort_unstable();
        runs.dedup();
        (runs.len(), all)
    };
    completion.as_object_mut().unwrap().remove("logit_bias");
    let (_, _, plain) = post(&d, "/v1/completions", &completion).await;
    completion["frequency_penalty"] = json!(-2);
    completion["presence_penalty"] = json!(-2);
    let (s, _, repetitive) = post(&d, "/v1/completions", &completion).await;
    assert_eq!(s, 200, "{repetitive}");
    let ((plain_distinct, plain_all), (rep_distinct, rep_all)) =
        (distinct(&plain), distinct(&repetitive));
    assert!(
        rep_distinct * plain_all * 4 < plain_distinct * rep_all * 3,
        "{plain_distinct} of {plain_all} runs distinct without the penalties, {rep_distinct} of {rep_all} with them"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn unknown_model_route_and_method() {
    let d = start(&[("WORKERS__ENGINE", "echo"), ("WORKERS__COUNT", "1")]).await;
    let (s, _, b) = post(&d, "/v1/chat/completions", &chat("gpt-7", "hi", 4)).await;
    assert_error(s, &b, 404, "invalid_request_error");
    assert_eq!(b["error"]["code"], "model_not_found");
    let (s, _, b) = post(&d, "/v1/embeddings", &json!({})).await;
    assert_error(s, &b, 404, "invalid_request_error");
    let response = client()
        .get(url(&d, "/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 405);
    let b: Value = response.json().await.unwrap();
    assert_eq!(b["error"]["code"], "method_not_allowed");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn bodies_not_declared_as_json_are_415_and_echoed_input_is_capped() {
    let d = start(&[("WORKERS__ENGINE", "echo"), ("WORKERS__COUNT", "1")]).await;
    let body = serde_json::to_vec(&chat(MODEL, "hi", 4)).unwrap();
    // What a web page can post cross-origin without a preflight, and no type at all.
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        // JSON is UTF-8 only.
        Some("application/json; charset=latin-1"),
        Some("application/json; charset=\"UTF-16\""),
        None,
    ] {
        let mut request = client().post(url(&d, "/v1/chat/completions"));
        if let Some(t) = content_type {
            request = request.header("content-type", t);
        }
        let response = request.body(body.clone()).send().await.unwrap();
        let status = response.status().as_u16();
        let b: Value = response.json().await.unwrap();
        assert_error(status, &b, 415, "invalid_request_error");
        assert_eq!(b["error"]["code"], "unsupported_media_type");
    }
    // JSON with parameters, in any case, is JSON.
    for content_type in [
        "Application/JSON; charset=utf-8",
        "application/json;charset=\"UTF-8\"",
        "application/json; foo=bar",
    ] {
        let response = client()
            .post(url(&d, "/v1/chat/completions"))
            .header("content-type", content_type)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{content_type}");
    }
    // A 100 KB model name is not sent back whole.
    let long = "m".repeat(100_000);
    let (s, _, b) = post(&d, "/v1/chat/completions", &chat(&long, "hi", 4)).await;
    assert_error(s, &b, 404, "invalid_request_error");
    let message = b["error"]["message"].as_str().unwrap();
    assert!(message.len() < 400, "{} bytes echoed", message.len());
    assert!(message.contains("100000 bytes"), "{message}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    let d = start(&[
        ("WORKERS__ENGINE", "echo"),
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__MAX_BODY_BYTES", "2048"),
    ])
    .await;
    let big = "x".repeat(4096);
    let (s, _, b) = post(&d, "/v1/chat/completions", &chat(MODEL, &big, 4)).await;
    assert_error(s, &b, 413, "invalid_request_error");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn prompts_beyond_the_context_are_400() {
    let d = start(&[
        ("WORKERS__ENGINE", "echo"),
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__CONTEXT_LENGTH", "64"),
        ("FRONTEND__BUILTIN_TOKENIZER", "bytes"),
    ])
    .await;
    let (s, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "0123456789", "max_tokens": 60}),
    )
    .await;
    assert_error(s, &b, 400, "invalid_request_error");
    assert_eq!(b["error"]["code"], "context_length_exceeded");
    let (s, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "x".repeat(100)}),
    )
    .await;
    assert_eq!(b["error"]["code"], "context_length_exceeded", "{s} {b}");
    // Within the context it works, and the default max_tokens fits what is left.
    let (s, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "0123456789"}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["usage"]["completion_tokens"], 54);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn overload_sheds_low_tiers_with_retry_after() {
    // One mocker engine that runs one request at a time, slowly: it is busy as soon as one
    // request is in flight.
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        ("WORKERS__MOCKER__MAX_NUM_SEQS", "1"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "0.2"),
        ("FRONTEND__ADMISSION__MAX_QUEUE", "2"),
        ("FRONTEND__ADMISSION__QUEUE_TIMEOUT", "30s"),
    ])
    .await;
    let first = {
        let body = chat(MODEL, "keep the worker busy", 20);
        let url = url(&d, "/v1/chat/completions");
        tokio::spawn(async move {
            client()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    // Wait until the first request holds the worker.
    for _ in 0..200 {
        if metric(&d, "switchyard_requests_in_flight").await >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let with = |priority: &str| {
        let mut body = chat(MODEL, "hi", 2);
        body["switchyard"] = json!({"priority": priority});
        body
    };
    let (s, headers, b) = post(&d, "/v1/chat/completions", &with("best_effort")).await;
    assert_error(s, &b, 429, "rate_limit_error");
    assert_eq!(headers.get("retry-after").unwrap(), "1");
    // A standard request queues (the queue is empty), and a second standard one is shed
    // because the queue is half full; a premium one still queues; the next premium finds
    // the queue full.
    let queued = {
        let (url, body) = (url(&d, "/v1/chat/completions"), with("standard"));
        tokio::spawn(async move {
            client()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    for _ in 0..200 {
        if metric(&d, "switchyard_requests_queued").await >= 1.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (s, _, b) = post(&d, "/v1/chat/completions", &with("standard")).await;
    assert_error(s, &b, 429, "rate_limit_error");
    let premium = {
        let (url, body) = (url(&d, "/v1/chat/completions"), with("premium"));
        tokio::spawn(async move {
            client()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    for _ in 0..200 {
        if metric(&d, "switchyard_requests_queued").await >= 2.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (s, headers, b) = post(&d, "/v1/chat/completions", &with("premium")).await;
    assert_error(s, &b, 503, "service_unavailable");
    assert!(headers.contains_key("retry-after"));
    // Everything admitted completes.
    assert_eq!(first.await.unwrap(), 200);
    assert_eq!(queued.await.unwrap(), 200);
    assert_eq!(premium.await.unwrap(), 200);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn service_routes_answer() {
    let d = start(&[("WORKERS__ENGINE", "echo"), ("WORKERS__COUNT", "2")]).await;
    let health: Value = client()
        .get(url(&d, "/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["workers"], 2);
    assert_eq!(
        client()
            .get(url(&d, "/live"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let models: Value = client()
        .get(url(&d, "/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    let metrics = client()
        .get(url(&d, "/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "switchyard_http_requests_total",
        "switchyard_requests_in_flight",
        "switchyard_time_to_first_token_seconds",
        "switchyard_workers",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn without_workers_health_and_requests_are_503() {
    use std::sync::Arc;
    use switchyard_runtime::local::{LocalDiscovery, LocalEventPlane, LocalRequestPlane};
    let config = support::config(&[]);
    let (tracker, cancel) = (
        tokio_util::task::TaskTracker::new(),
        tokio_util::sync::CancellationToken::new(),
    );
    let (frontend, listeners) = switchyard::deploy::start_frontend(
        &config.frontend,
        &LocalDiscovery::new(),
        &LocalEventPlane::new(),
        Arc::new(LocalRequestPlane::new()),
        switchyard::deploy::FrontendSync::default(),
        &tracker,
        &cancel,
    )
    .await
    .unwrap();
    let address = listeners.public.local_addr().unwrap();
    let stop = cancel.clone();
    let server = tokio::spawn(switchyard_frontend::server::serve(
        listeners.public,
        frontend,
        async move { stop.cancelled().await },
    ));
    let health = client()
        .get(format!("http://{address}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 503);
    let response = client()
        .post(format!("http://{address}/v1/chat/completions"))
        .json(&chat(MODEL, "hi", 4))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "service_unavailable");
    cancel.cancel();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_prompt_no_tokenization_fits_is_refused_by_its_length() {
    // SmolLM2's tokenizer (the default): byte-level, nothing dropped, so a token stands for
    // at most its longest entry's bytes.
    let d = start(&[("WORKERS__ENGINE", "echo"), ("WORKERS__COUNT", "1")]).await;
    let huge = "hello ".repeat((10 << 20) / 6);
    let bodies = [
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": huge, "max_tokens": 1}),
        ),
        ("/v1/chat/completions", chat(MODEL, &huge, 1)),
    ];
    for (path, body) in &bodies {
        let (s, _, b) = post(&d, path, body).await;
        assert_error(s, &b, 400, "invalid_request_error");
        assert_eq!(b["error"]["code"], "context_length_exceeded", "{b}");
        let message = b["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("at least") && message.contains("at any tokenization"),
            "{message}"
        );
    }
    // One the bound cannot refuse is tokenized and counted.
    let long = "hello ".repeat(40_000);
    let (s, _, b) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": long, "max_tokens": 1}),
    )
    .await;
    assert_error(s, &b, 400, "invalid_request_error");
    let message = b["error"]["message"].as_str().unwrap();
    assert!(message.contains("but the prompt has 400"), "{message}");
    assert!(!message.contains("at any tokenization"), "{message}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn configured_prompt_and_output_caps_are_400_and_cap_the_default() {
    let d = start(&[
        ("WORKERS__ENGINE", "echo"),
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__BUILTIN_TOKENIZER", "bytes"),
        ("FRONTEND__MAX_PROMPT_TOKENS", "32"),
        ("FRONTEND__MAX_OUTPUT_TOKENS", "8"),
    ])
    .await;
    let completion = |prompt: &str, max_tokens: Option<u32>| {
        let mut body = json!({"model": MODEL, "prompt": prompt});
        if let Some(m) = max_tokens {
            body["max_tokens"] = json!(m);
        }
        body
    };
    let (s, _, b) = post(&d, "/v1/completions", &completion(&"x".repeat(33), Some(2))).await;
    assert_error(s, &b, 400, "invalid_request_error");
    assert_eq!(b["error"]["code"], "context_length_exceeded", "{b}");
    let (s, _, b) = post(&d, "/v1/completions", &completion("hello", Some(9))).await;
    assert_error(s, &b, 400, "invalid_request_error");
    assert_eq!(b["error"]["param"], "max_tokens", "{b}");
    // At the caps it passes; without max_tokens the default is cut to the cap.
    let (s, _, b) = post(&d, "/v1/completions", &completion(&"x".repeat(32), Some(8))).await;
    assert_eq!(s, 200, "{b}");
    let (s, _, b) = post(&d, "/v1/completions", &completion(&"y".repeat(30), None)).await;
    assert_eq!(s, 200, "{b}");
    assert!(
        b["usage"]["completion_tokens"].as_u64().unwrap() <= 8,
        "{b}"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_refuses_at_once_what_would_wait_past_the_target() {
    // One engine running one request at a time, each taking a few hundred ms: 40 requests
    // at once are about 12 s of work, far past a 1 s wait target.
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        ("WORKERS__MOCKER__MAX_NUM_SEQS", "1"),
        ("FRONTEND__ADMISSION__WAIT_TARGET", "1s"),
        ("FRONTEND__ADMISSION__QUEUE_TIMEOUT", "60s"),
    ])
    .await;
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let url = url(&d, "/v1/chat/completions");
            let mut body = chat(MODEL, &format!("request {i}"), 30);
            body["ignore_eos"] = json!(true);
            tokio::spawn(async move {
                let response = client().post(url).json(&body).send().await.unwrap();
                let status = response.status().as_u16();
                let retry = response
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
                let body: Value = response.json().await.unwrap();
                (status, retry, body, started.elapsed())
            })
        })
        .collect();
    let mut served = Vec::new();
    let mut refused = Vec::new();
    for task in tasks {
        let (status, retry, body, took) = task.await.unwrap();
        match status {
            200 => served.push(took),
            429 => {
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("wait too long"),
                    "{body}"
                );
                refused.push((retry.unwrap(), took));
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert!(
        refused.len() >= 10,
        "{} refused, {} served",
        refused.len(),
        served.len()
    );
    assert!(served.len() >= 2, "{} served", served.len());
    // Refused quickly (not after the 60 s queue timeout), with the predicted wait as the
    // Retry-After; and what was served was not kept waiting for the whole backlog.
    for &(retry, took) in &refused {
        assert!(retry >= 1, "Retry-After {retry}");
        assert!(
            took < std::time::Duration::from_secs(8),
            "refused after {took:?}"
        );
    }
    let slowest = served.iter().max().unwrap();
    assert!(
        *slowest < std::time::Duration::from_secs(10),
        "served after {slowest:?}"
    );
    // The prompt tokens offered count the refused requests too (what a planner sizes
    // for); those served, only the served ones. The prompts are about the same length.
    let metrics = scrape(&url(&d, "/metrics")).await;
    let offered = metric_value(&metrics, "switchyard_offered_prompt_tokens_total", None);
    let input = metric_value(&metrics, "switchyard_input_tokens_total", None);
    let expected = input * 40.0 / served.len() as f64;
    assert!(
        input > 0.0 && (offered - expected).abs() < 0.1 * expected,
        "offered {offered}, served {input} for {} of 40 requests",
        served.len()
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
