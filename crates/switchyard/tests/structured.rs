//! Structured output on `serve`'s mocker engines: every answer follows its constraint, a
//! stream moved off a crashed worker goes on under it, and what no worker can enforce is
//! refused by name.

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::*;
use switchyard_worker::faults::Fault;

const MODEL: &str = "switchyard-mock";

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "tracks": {"type": "integer", "minimum": 0},
            "lines": {"type": "array", "items": {"enum": ["north", "south"]}, "minItems": 1},
            "open": {"type": "boolean"},
        },
        "required": ["city", "tracks", "lines", "open"],
        "additionalProperties": false,
    })
}

/// Checks `text` against [`schema`] member by member.
fn assert_follows_schema(text: &str) {
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let object = value.as_object().unwrap();
    assert_eq!(object.len(), 4, "{text}");
    assert!(object["city"].is_string(), "{text}");
    assert!(object["tracks"].is_u64(), "{text}");
    let lines = object["lines"].as_array().unwrap();
    assert!(!lines.is_empty(), "{text}");
    assert!(lines.iter().all(|l| l == "north" || l == "south"), "{text}");
    assert!(object["open"].is_boolean(), "{text}");
}

fn body(i: u64) -> Value {
    let prompt = format!("Yard {i}: describe its tracks as JSON. ").repeat(3);
    let mut body = seeded_completion(MODEL, &prompt, i, 200);
    body["guided_json"] = schema();
    body
}

async fn stream_all<F: FnOnce()>(d: &switchyard::deploy::Deployment, during: F) -> Vec<Streamed> {
    let url = url(d, "/v1/completions");
    let bodies: Vec<Value> = (0..12).map(body).collect();
    let open = futures::future::join_all(bodies.iter().map(|b| open_stream(&url, b))).await;
    during();
    let texts = futures::future::join_all(open.into_iter().map(OpenStream::finish)).await;
    texts.iter().map(|t| parse_stream(t)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_moved_off_a_crashed_worker_ends_as_the_same_valid_object() {
    let d = start(&[("WORKERS__COUNT", "4")]).await;
    let reference = stream_all(&d, || {}).await;
    for streamed in &reference {
        assert!(
            streamed.errors.is_empty() && streamed.done,
            "{:?}",
            streamed.errors
        );
        assert_follows_schema(&streamed.text);
    }
    let got = stream_all(&d, || inject(&d, busiest(&d), Fault::Crash)).await;
    for (g, r) in got.iter().zip(&reference) {
        assert!(g.errors.is_empty() && g.done, "{:?}", g.errors);
        assert_eq!(
            g.text, r.text,
            "the moved stream drew what the first worker would have"
        );
    }
    assert_a_stream_moved(&d).await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn constraints_are_honoured_in_each_spelling_and_refused_by_name_when_malformed() {
    let d = start(&[("WORKERS__COUNT", "2")]).await;
    let ask = |extra: Value| {
        let mut body = chat(MODEL, "Answer.", 120);
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let content = |b: &Value| {
        b["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let format = json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "yard", "schema": schema(), "strict": true}}});
    for seed in 0..5 {
        let mut request = ask(format.clone());
        request["seed"] = json!(seed);
        let (s, _, b) = post(&d, "/v1/chat/completions", &request).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["choices"][0]["finish_reason"], "stop", "{b}");
        assert_follows_schema(&content(&b));
    }
    let (s, _, b) = post(
        &d,
        "/v1/chat/completions",
        &ask(json!({"structured_outputs": {"choice": ["up", "down"]}})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert!(["up", "down"].contains(&content(&b).as_str()), "{b}");
    let (s, _, b) = post(
        &d,
        "/v1/chat/completions",
        &ask(json!({"guided_regex": "[a-c]{3}-[0-9]"})),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let text = content(&b);
    assert!(text.len() == 5 && text.as_bytes()[3] == b'-', "{text:?}");
    for (extra, param) in [
        (json!({"guided_regex": "a(b"}), "guided_regex"),
        (
            json!({"guided_grammar": "start: nowhere"}),
            "guided_grammar",
        ),
        (
            json!({"structured_outputs": {"json": {"type": "foo"}}}),
            "structured_outputs.json",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}),
            "guided_choice",
        ),
        (
            json!({"structured_outputs": {"structural_tag": "x"}}),
            "structured_outputs",
        ),
    ] {
        let (s, _, b) = post(&d, "/v1/chat/completions", &ask(extra.clone())).await;
        assert_eq!(s, 400, "{extra}: {b}");
        assert_eq!(b["error"]["param"], param, "{extra}: {b}");
    }
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_constraint_no_worker_enforces_is_refused_naming_it() {
    let d = start(&[("WORKERS__ENGINE", "echo"), ("WORKERS__COUNT", "1")]).await;
    let mut body = chat(MODEL, "Answer.", 20);
    body["response_format"] = json!({"type": "json_object"});
    let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["error"]["param"], "response_format", "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("json_object"),
        "{b}"
    );
    // Plain text needs no enforcing.
    body["response_format"] = json!({"type": "text"});
    let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{b}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_openai_client_parses_structured_answers() {
    let d = start(&[("WORKERS__COUNT", "2")]).await;
    python_checks(&d, "structured_e2e.py", MODEL).await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// One of the frontend crate's Hugging Face model directories.
fn fixture(model: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../frontend/tests/fixtures")
        .join(model)
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mockers_enforce_constraints_over_the_frontends_tokenizer() {
    // `serve --tokenizer DIR`: the mockers read the directory's vocabulary too.
    let d = start(&[
        ("WORKERS__COUNT", "2"),
        ("FRONTEND__TOKENIZER", &fixture("chatml-bpe")),
    ])
    .await;
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "yard", "schema": schema()}});
    for seed in 0..4 {
        let mut body = chat(MODEL, &format!("Describe yard {seed} as JSON."), 400);
        body["seed"] = json!(seed);
        body["response_format"] = format.clone();
        let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(b["choices"][0]["finish_reason"], "stop", "{b}");
        let whole = b["choices"][0]["message"]["content"].as_str().unwrap();
        assert_follows_schema(whole);
        body["stream"] = json!(true);
        let streamed = parse_stream(
            &open_stream(&url(&d, "/v1/chat/completions"), &body)
                .await
                .finish()
                .await,
        );
        assert!(
            streamed.errors.is_empty() && streamed.done,
            "{:?}",
            streamed.errors
        );
        assert_eq!(streamed.text, whole, "streamed as answered whole");
    }
    let mut body = chat(MODEL, "Pick one.", 20);
    body["guided_choice"] = json!(["north", "south"]);
    let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{b}");
    let answer = b["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(answer == "north" || answer == "south", "{b}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();

    // Mockers told another vocabulary than the frontend's enforce nothing it tokenizes.
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__TOKENIZER", &fixture("llama-spm")),
        ("WORKERS__MOCKER__TOKENIZER", &fixture("chatml-bpe")),
    ])
    .await;
    let mut body = chat(MODEL, "Answer.", 20);
    body["response_format"] = json!({"type": "json_object"});
    let (s, _, b) = post(&d, "/v1/chat/completions", &body).await;
    assert_eq!(s, 400, "{b}");
    assert_eq!(b["error"]["param"], "response_format", "{b}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
