//! Forced tool calls on `serve`'s mocker engines: `tool_choice` `required` or a named
//! function is enforced, so every answer is a well-formed call of an offered tool, streamed
//! or whole, and a stream moved off a crashed worker ends in the same calls.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::*;
use switchyard_worker::faults::Fault;

const MODEL: &str = "switchyard-mock";

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "strict": true, "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 0}},
            "required": ["city", "days"],
            "additionalProperties": false,
        }}},
        {"type": "function", "function": {"name": "get_time"}},
    ])
}

fn body(seed: u64, choice: Value) -> Value {
    let mut body = chat(MODEL, &format!("Plan trip {seed}. ").repeat(4), 200);
    body["seed"] = json!(seed);
    body["tools"] = tools();
    body["tool_choice"] = choice;
    body
}

/// Checks a call against its tool's parameters; returns its name and arguments.
fn checked(call: &Value) -> (String, Value) {
    let name = call["function"]["name"].as_str().unwrap().to_owned();
    let text = call["function"]["arguments"].as_str().unwrap();
    let arguments: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let object = arguments.as_object().unwrap();
    match name.as_str() {
        "get_weather" => {
            assert_eq!(object.len(), 2, "{text}");
            assert!(
                object["city"].is_string() && object["days"].is_u64(),
                "{text}"
            );
        }
        "get_time" => {}
        other => panic!("a call of `{other}`, which was not offered"),
    }
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    (name, arguments)
}

fn calls_of(message: &Value) -> Vec<(String, Value)> {
    message["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(checked)
        .collect()
}

/// The calls a stream adds up to, as the SDK assembles them (ids and names first).
fn streamed_calls(chunks: &[Value]) -> (Vec<Value>, Option<String>) {
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = None;
    for chunk in chunks {
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        for delta in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = delta["index"].as_u64().unwrap() as usize;
            if let Some(id) = delta["id"].as_str() {
                assert_eq!(index, calls.len(), "a new call comes with the next index");
                calls.push(json!({"id": id, "function": {"name": delta["function"]["name"], "arguments": ""}}));
            }
            let arguments = calls[index]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_owned()
                + delta["function"]["arguments"].as_str().unwrap_or_default();
            calls[index]["function"]["arguments"] = json!(arguments);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            finish = Some(reason.to_owned());
        }
    }
    (calls, finish)
}

#[tokio::test]
async fn a_forced_call_is_always_a_valid_call_of_an_offered_tool() {
    let d = start(&[("WORKERS__COUNT", "2")]).await;
    let mut several = 0;
    for seed in 0..12 {
        let required = body(seed, json!("required"));
        let (s, _, b) = post(&d, "/v1/chat/completions", &required).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["choices"][0]["finish_reason"], "tool_calls", "{b}");
        let message = &b["choices"][0]["message"];
        let calls = calls_of(message);
        assert!(!calls.is_empty(), "{b}");
        several += usize::from(calls.len() > 1);
        assert!(
            message["content"].is_null() || message["content"] == "",
            "{b}"
        );

        // Streamed, the same seed draws the same calls.
        let mut streamed = required.clone();
        streamed["stream"] = json!(true);
        let (s, events) = sse(&d, "/v1/chat/completions", &streamed).await;
        assert_eq!(s, 200);
        let chunks: Vec<Value> = events
            .iter()
            .filter_map(|e| serde_json::from_str(e).ok())
            .collect();
        let (got, finish) = streamed_calls(&chunks);
        assert_eq!(finish.as_deref(), Some("tool_calls"));
        let got: Vec<(String, Value)> = got.iter().map(checked).collect();
        assert_eq!(got, calls, "seed {seed}");

        // Without parallel calls, exactly one.
        let mut one = required.clone();
        one["parallel_tool_calls"] = json!(false);
        let (_, _, b) = post(&d, "/v1/chat/completions", &one).await;
        assert_eq!(calls_of(&b["choices"][0]["message"]).len(), 1, "{b}");

        // A named function: exactly that call.
        let named = body(
            seed,
            json!({"type": "function", "function": {"name": "get_weather"}}),
        );
        let (s, _, b) = post(&d, "/v1/chat/completions", &named).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["choices"][0]["finish_reason"], "tool_calls", "{b}");
        let calls = calls_of(&b["choices"][0]["message"]);
        assert_eq!(calls.len(), 1, "{b}");
        assert_eq!(calls[0].0, "get_weather");
    }
    assert!(
        several > 0,
        "`required` with parallel calls drew more than one call at least once"
    );
    // A forced call and another constraint at once: refused, naming the second.
    let mut both = body(0, json!("required"));
    both["response_format"] = json!({"type": "json_object"});
    let (s, _, b) = post(&d, "/v1/chat/completions", &both).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["error"]["param"], "tool_choice", "{b}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_call_moved_off_a_crashed_worker_ends_as_the_same_call() {
    let d = start(&[("WORKERS__COUNT", "4")]).await;
    let url = url(&d, "/v1/chat/completions");
    let bodies: Vec<Value> = (0..12)
        .map(|seed| {
            let mut b = body(seed, json!("required"));
            b["stream"] = json!(true);
            b
        })
        .collect();
    let run = |crash: bool| {
        let (url, bodies, d) = (&url, &bodies, &d);
        async move {
            let open = futures::future::join_all(bodies.iter().map(|b| open_stream(url, b))).await;
            if crash {
                inject(d, busiest(d), Fault::Crash);
            }
            let texts = futures::future::join_all(open.into_iter().map(OpenStream::finish)).await;
            texts
                .iter()
                .map(|t| {
                    let (calls, finish) = streamed_calls(&sse_chunks(t));
                    assert_eq!(finish.as_deref(), Some("tool_calls"), "{t}");
                    calls.iter().map(checked).collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        }
    };
    let reference = run(false).await;
    let moved = run(true).await;
    assert_eq!(
        moved, reference,
        "the moved streams drew what the first worker would have"
    );
    assert_a_stream_moved(&d).await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
