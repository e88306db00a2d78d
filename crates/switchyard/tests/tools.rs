//! Tool calls and reasoning through the HTTP API, on the echo engine: a `--chat-template`
//! that renders only the last message's text makes the engine answer with exactly that
//! text, so each test writes the model's answer and checks how it is parsed.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::*;

const MODEL: &str = "switchyard-mock";

/// Reads `tools` (so the tools are not written into the messages) and renders the last
/// message's text, then the end-of-turn token the echo engine stops at.
const TEMPLATE: &str = "{#- tools are the caller's business -#}\
{%- for m in messages %}{%- if loop.last %}{{ m.content }}{%- endif %}{%- endfor %}<|im_end|>";

const CALL: &str = "I will look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";

async fn deployment(extra: &[(&str, &str)]) -> (switchyard::deploy::Deployment, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("last.jinja");
    std::fs::write(&path, TEMPLATE).unwrap();
    let path = path.display().to_string();
    let mut overrides = vec![
        ("WORKERS__ENGINE", "echo"),
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__CHAT__TEMPLATE", path.as_str()),
    ];
    overrides.extend_from_slice(extra);
    (start(&overrides).await, dir)
}

fn tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }])
}

fn request(answer: &str) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": answer}],
        "max_tokens": 200,
        "tools": tools(),
    })
}

fn arguments(call: &Value) -> Value {
    serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn an_answer_with_a_call_comes_back_as_tool_calls() {
    let (d, _dir) = deployment(&[]).await;
    let (s, _, b) = post(&d, "/v1/chat/completions", &request(CALL)).await;
    assert_eq!(s, 200, "{b}");
    let choice = &b["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{b}");
    assert_eq!(
        choice["message"]["content"].as_str().unwrap().trim(),
        "I will look."
    );
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{b}");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(arguments(&calls[0]), json!({"city": "Paris", "days": 2}));
    assert!(!calls[0]["id"].as_str().unwrap().is_empty());

    // `tool_choice: none` parses nothing: the text comes back as it was written.
    let mut none = request(CALL);
    none["tool_choice"] = json!("none");
    let (s, _, b) = post(&d, "/v1/chat/completions", &none).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["choices"][0]["finish_reason"], "stop");
    assert_eq!(b["choices"][0]["message"]["content"], CALL);
    assert!(
        b["choices"][0]["message"].get("tool_calls").is_none(),
        "{b}"
    );

    // Two calls; `parallel_tool_calls: false` keeps the first.
    let second = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    let two = format!("{CALL}\n{second}");
    let (_, _, b) = post(&d, "/v1/chat/completions", &request(&two)).await;
    let calls = b["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{b}");
    assert_eq!(arguments(&calls[1]), json!({"city": "Oslo"}));
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    let mut one = request(&two);
    one["parallel_tool_calls"] = json!(false);
    let (_, _, b) = post(&d, "/v1/chat/completions", &one).await;
    let calls = b["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{b}");
    assert_eq!(arguments(&calls[0])["city"], "Paris");

    // A plain answer with tools offered is plain content.
    let (_, _, b) = post(&d, "/v1/chat/completions", &request("It is sunny.")).await;
    assert_eq!(b["choices"][0]["finish_reason"], "stop");
    assert_eq!(b["choices"][0]["message"]["content"], "It is sunny.");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn streamed_calls_send_the_name_first_then_argument_fragments() {
    let (d, _dir) = deployment(&[]).await;
    let mut body = request(CALL);
    body["stream"] = json!(true);
    let (s, events) = sse(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let mut content = String::new();
    let mut deltas = Vec::new();
    let mut reasons = Vec::new();
    for chunk in &chunks {
        let choice = &chunk["choices"][0];
        content.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        if let Some(calls) = choice["delta"]["tool_calls"].as_array() {
            deltas.extend(calls.iter().cloned());
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            reasons.push(reason.to_owned());
        }
    }
    assert_eq!(reasons, ["tool_calls"]);
    assert_eq!(content.trim(), "I will look.");
    assert!(!deltas.is_empty());
    let first = &deltas[0];
    assert_eq!(first["index"], 0);
    assert!(!first["id"].as_str().unwrap().is_empty(), "{first}");
    assert_eq!(first["type"], "function");
    assert_eq!(first["function"]["name"], "get_weather");
    // Later deltas carry only argument fragments.
    for delta in &deltas[1..] {
        assert!(delta.get("id").is_none_or(Value::is_null), "{delta}");
        assert!(
            delta["function"].get("name").is_none_or(Value::is_null),
            "{delta}"
        );
    }
    let joined: String = deltas
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect();
    let parsed: Value = serde_json::from_str(&joined).unwrap();
    assert_eq!(parsed, json!({"city": "Paris", "days": 2}));
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_tool_loop_history_is_accepted_and_checked() {
    let (d, _dir) = deployment(&[]).await;
    let mut body = request("It is 18 degrees in Paris.");
    body["messages"] = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        }]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "user", "content": "It is 18 degrees in Paris."},
    ]);
    let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        b["choices"][0]["message"]["content"],
        "It is 18 degrees in Paris."
    );
    // A tool result that names no call, and arguments that are not JSON, are refused.
    let mut bad = body.clone();
    bad["messages"][2]
        .as_object_mut()
        .unwrap()
        .remove("tool_call_id");
    let (s, _, b) = post(&d, "/v1/chat/completions", &bad).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["error"]["param"], "messages[2].tool_call_id");
    let mut bad = body.clone();
    bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("{city");
    let (s, _, b) = post(&d, "/v1/chat/completions", &bad).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(
        b["error"]["param"],
        "messages[1].tool_calls[0].function.arguments"
    );
    // A forced call is enforced by constrained decoding, which the echo engine does not do.
    let mut required = request(CALL);
    required["tool_choice"] = json!("required");
    let (s, _, b) = post(&d, "/v1/chat/completions", &required).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["error"]["param"], "tool_choice");
    assert!(
        b["error"]["message"].as_str().unwrap().contains("enforces"),
        "{b}"
    );
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn reasoning_is_split_into_reasoning_content() {
    let (d, _dir) = deployment(&[("FRONTEND__CHAT__REASONING_PARSER", "qwen3")]).await;
    let answer = "<think>The user wants a greeting.</think>Hello!";
    let mut body = chat(MODEL, answer, 200);
    let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{b}");
    let message = &b["choices"][0]["message"];
    assert_eq!(
        message["reasoning_content"].as_str().unwrap().trim(),
        "The user wants a greeting."
    );
    assert_eq!(message["content"].as_str().unwrap().trim(), "Hello!");
    body["stream"] = json!(true);
    let (_, events) = sse(&d, "/v1/chat/completions", &body).await;
    let (mut reasoning, mut content) = (String::new(), String::new());
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let delta = &chunk["choices"][0]["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        content.push_str(delta["content"].as_str().unwrap_or_default());
    }
    assert_eq!(reasoning.trim(), "The user wants a greeting.");
    assert_eq!(content.trim(), "Hello!");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_runs_a_tool_loop() {
    let (d, _dir) = deployment(&[]).await;
    python_checks(&d, "tools_e2e.py", MODEL).await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn tokenize_counts_what_a_chat_completion_is_given() {
    let d = start(&[("WORKERS__ENGINE", "echo"), ("WORKERS__COUNT", "1")]).await;
    let text = "Trains run on rails, mostly. <|im_start|> stays text here";
    let (s, _, b) = post(
        &d,
        "/v1/tokenize",
        &json!({"model": MODEL, "prompt": text, "add_special_tokens": false, "return_token_strs": true}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let tokens = b["tokens"].clone();
    assert_eq!(b["count"], tokens.as_array().unwrap().len());
    assert_eq!(
        b["token_strs"].as_array().unwrap().len(),
        tokens.as_array().unwrap().len()
    );
    assert!(b["max_model_len"].as_u64().unwrap() > 0);
    let (s, _, back) = post(&d, "/v1/detokenize", &json!({"tokens": tokens})).await;
    assert_eq!(s, 200, "{back}");
    assert_eq!(back["prompt"], text);

    // Messages and tools: the count is the prompt a chat completion is charged for.
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
    ]);
    let count = |body: Value| {
        let d = &d;
        async move {
            let (s, _, b) = post(d, "/v1/tokenize", &body).await;
            assert_eq!(s, 200, "{b}");
            b["count"].as_u64().unwrap()
        }
    };
    let with_tools = count(json!({"messages": messages, "tools": tools()})).await;
    let without = count(json!({"messages": messages})).await;
    let no_opening = count(json!({"messages": messages, "add_generation_prompt": false})).await;
    assert!(with_tools > without + 20, "{with_tools} vs {without}");
    assert!(no_opening < without);
    for (tools, expected) in [(Some(tools()), with_tools), (None, without)] {
        let mut chat = json!({"model": MODEL, "messages": messages, "max_tokens": 1});
        if let Some(tools) = tools {
            chat["tools"] = tools;
        }
        let (s, _, b) = post(&d, "/v1/chat/completions", &chat).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["usage"]["prompt_tokens"], expected, "{b}");
    }

    // Mistakes are 400s naming the parameter.
    for (path, body, param) in [
        (
            "/v1/tokenize",
            json!({"prompt": "a", "messages": messages}),
            "messages",
        ),
        ("/v1/tokenize", json!({}), "prompt"),
        (
            "/v1/tokenize",
            json!({"prompt": "a", "max_tokens": 3}),
            "max_tokens",
        ),
        (
            "/v1/tokenize",
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            "/v1/tokenize",
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}),
            "messages[0].content",
        ),
        (
            "/v1/detokenize",
            json!({"tokens": [1, 99999999]}),
            "tokens[1]",
        ),
        ("/v1/detokenize", json!({"tokens": "abc"}), "tokens"),
    ] {
        let (s, _, b) = post(&d, path, &body).await;
        assert_eq!(s, 400, "{body} -> {b}");
        assert_eq!(b["error"]["param"], param, "{body} -> {b}");
    }
    let (s, _, b) = post(
        &d,
        "/v1/tokenize",
        &json!({"model": "other", "prompt": "a"}),
    )
    .await;
    assert_eq!(s, 404, "{b}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// A model directory like the frontend's ChatML fixture, with Harmony's special tokens.
fn harmony_model(dir: &std::path::Path) {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../frontend/tests/fixtures/chatml-bpe");
    for name in ["tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(fixture.join(name), dir.join(name)).unwrap();
    }
    let text = std::fs::read_to_string(fixture.join("tokenizer.json")).unwrap();
    let mut tokenizer: Value = serde_json::from_str(&text).unwrap();
    let markers = [
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
        "<|constrain|>",
    ];
    let added = tokenizer["added_tokens"].as_array_mut().unwrap();
    for (marker, id) in markers.iter().zip(324..) {
        added.push(
            json!({"id": id, "content": marker, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}),
        );
    }
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = json!({"architectures": ["GptOssForCausalLM"], "eos_token_id": 323,
        "max_position_embeddings": 8192, "vocab_size": 331});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

#[tokio::test]
async fn harmony_answers_come_back_as_reasoning_content_and_calls() {
    let model = tempfile::tempdir().unwrap();
    harmony_model(model.path());
    let path = model.path().display().to_string();
    let (d, _dir) = deployment(&[
        ("FRONTEND__TOKENIZER", &path),
        ("FRONTEND__CHAT__TOOL_CALL_PARSER", "harmony"),
    ])
    .await;
    let answer = "<|channel|>analysis<|message|>The user wants the weather.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
        <|message|>{\"city\": \"Paris\", \"days\": 2}<|call|>";
    let (s, _, b) = post(&d, "/v1/chat/completions", &request(answer)).await;
    assert_eq!(s, 200, "{b}");
    let choice = &b["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{b}");
    let message = &choice["message"];
    assert_eq!(
        message["reasoning_content"], "The user wants the weather.",
        "{b}"
    );
    assert!(
        message["content"].as_str().unwrap_or_default().is_empty(),
        "{b}"
    );
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{b}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(arguments(&calls[0]), json!({"city": "Paris", "days": 2}));

    // Streamed: the call's id and name first, then its arguments.
    let mut body = request(answer);
    body["stream"] = json!(true);
    let (_, events) = sse(&d, "/v1/chat/completions", &body).await;
    let (mut reasoning, mut arguments_text, mut names) = (String::new(), String::new(), Vec::new());
    let mut finish = None;
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        assert!(
            delta["content"].as_str().unwrap_or_default().is_empty(),
            "{chunk}"
        );
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            if let Some(name) = call["function"]["name"].as_str() {
                assert!(arguments_text.is_empty(), "the name comes first");
                assert!(call["id"].is_string(), "{call}");
                names.push(name.to_owned());
            }
            arguments_text.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = Some(reason.to_owned());
        }
    }
    assert_eq!(reasoning, "The user wants the weather.");
    assert_eq!(names, ["get_weather"]);
    assert_eq!(
        serde_json::from_str::<Value>(&arguments_text).unwrap(),
        json!({"city": "Paris", "days": 2})
    );
    assert_eq!(finish.as_deref(), Some("tool_calls"));

    // A final answer is content; its end token is not text.
    let answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>";
    let (_, _, b) = post(&d, "/v1/chat/completions", &request(answer)).await;
    let message = &b["choices"][0]["message"];
    assert_eq!(b["choices"][0]["finish_reason"], "stop", "{b}");
    assert_eq!(message["content"], "It is sunny.", "{b}");
    assert_eq!(message["reasoning_content"], "Easy.", "{b}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
