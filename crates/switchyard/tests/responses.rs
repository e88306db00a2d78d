//! `/v1/responses` through the HTTP API: a conversation continued by
//! `previous_response_id` tokenizes only what is new and gives the engine the prompt a
//! full resend gives; the typed events add up to the response; what is not served is a
//! 400 naming it; the openai SDK's tool loop (on the echo engine).

#![allow(clippy::unwrap_used)]

mod support;

use serde_json::{Value, json};
use support::*;

const MODEL: &str = "switchyard-mock";

/// Tokens of each answer in the chained conversation (the mocker writes them all).
const ANSWER: u64 = 24;

fn turn_input(i: usize) -> String {
    format!("Turn {i}: tell me one more thing about the history of the river and its bridges.")
}

/// The output text of a response, its items' texts together.
fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap())
        .map(|part| part["text"].as_str().unwrap().to_string())
        .collect()
}

/// Ten turns through `previous_response_id`, then the same conversation resent in full as
/// items: each follow-up's prompt is as long as the resend's, its tokenizing stays flat
/// while the context grows, and most of its prompt is found in the worker's cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_conversation_tokenizes_only_what_is_new() {
    let d = start(&[("WORKERS__COUNT", "2")]).await;
    let instructions = "You are a patient historian.";
    let mut previous: Option<String> = None;
    let mut items: Vec<Value> = Vec::new();
    let mut chained = Vec::new();
    for i in 0..10 {
        let before = metric(&d, "switchyard_tokenized_prompt_tokens").await;
        let mut body = json!({"model": MODEL, "instructions": instructions,
            "input": turn_input(i), "max_output_tokens": ANSWER, "temperature": 0});
        if let Some(id) = &previous {
            body["previous_response_id"] = json!(id);
        }
        let (status, _, response) = post(&d, "/v1/responses", &body).await;
        assert_eq!(status, 200, "{response}");
        let tokenized = metric(&d, "switchyard_tokenized_prompt_tokens").await - before;
        let usage = &response["usage"];
        chained.push((
            usage["input_tokens"].as_u64().unwrap(),
            tokenized as u64,
            usage["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        ));
        items.push(json!({"role": "user", "content": turn_input(i)}));
        items.push(
            json!({"type": "message", "role": "assistant", "id": format!("msg_{i}"),
            "content": [{"type": "output_text", "text": output_text(&response)}]}),
        );
        previous = Some(response["id"].as_str().unwrap().to_string());
    }
    // The same conversation resent whole, turn by turn (no store).
    let mut resent = Vec::new();
    for i in 0..10 {
        let before = metric(&d, "switchyard_tokenized_prompt_tokens").await;
        let body = json!({"model": MODEL, "instructions": instructions, "store": false,
            "input": items[..2 * i + 1], "max_output_tokens": 1, "temperature": 0});
        let (status, _, response) = post(&d, "/v1/responses", &body).await;
        assert_eq!(status, 200, "{response}");
        let tokenized = metric(&d, "switchyard_tokenized_prompt_tokens").await - before;
        let usage = &response["usage"];
        resent.push((
            usage["input_tokens"].as_u64().unwrap(),
            tokenized as u64,
            usage["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        ));
    }
    eprintln!("turn, chained (prompt, tokenized, cached), resent (prompt, tokenized, cached)");
    for (i, (c, r)) in chained.iter().zip(&resent).enumerate() {
        eprintln!("{i}: {c:?} {r:?}");
    }
    for i in 1..10 {
        let (prompt, tokenized, cached) = chained[i];
        let (previous_prompt, ..) = chained[i - 1];
        // The engine sees the previous turn's prompt and answer as they were (its tokens),
        // then this turn's input: only that was tokenized, the same few tokens each turn,
        // where the resend tokenizes all of it.
        assert_eq!(
            prompt,
            previous_prompt + ANSWER + tokenized,
            "turn {i}: {chained:?}"
        );
        assert_eq!(resent[i].1, resent[i].0, "turn {i}");
        assert!(tokenized <= chained[1].1 + 2, "turn {i}: {chained:?}");
        // The resend re-tokenizes the answers' text, which can cut it differently.
        assert!(
            resent[i].0.abs_diff(prompt) <= ANSWER * i as u64 / 4,
            "turn {i}: {resent:?}"
        );
        // Its prefix, the previous turn's prompt and answer, is in the cache (whole blocks).
        assert!(
            cached >= (previous_prompt + ANSWER) / 16 * 16 - 16,
            "turn {i}: {chained:?}"
        );
    }
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// A streamed response's events: in order, numbered, and adding up to the response its
/// last event carries, which a retrieval returns as stored.
#[tokio::test]
async fn streamed_events_add_up_to_the_stored_response() {
    let d = start(&[]).await;
    let body = json!({"model": MODEL, "input": "Hello", "max_output_tokens": 12, "stream": true});
    let response = client()
        .post(url(&d, "/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.unwrap();
    // Each event is named (`event:`) by the type its data carries.
    let events: Vec<Value> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(
                Some(data["type"].as_str().unwrap()),
                name.strip_prefix("event: ")
            );
            data
        })
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        kinds[kinds.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete"
        ]
    );
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], i, "{event}");
    }
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let last = &events.last().unwrap()["response"];
    assert_eq!(last["status"], "incomplete");
    assert_eq!(last["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(last["usage"]["output_tokens"], 12);
    assert_eq!(output_text(last), deltas);
    assert!(!deltas.is_empty());
    let id = last["id"].as_str().unwrap();
    let stored: Value = client()
        .get(url(&d, &format!("/v1/responses/{id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(&stored, last);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// What is not served is a 400 naming it; an unknown response is a 404 naming it.
#[tokio::test]
async fn what_is_not_served_is_refused_by_name() {
    let d = start(&[]).await;
    let cases = [
        (json!({"background": true}), "background"),
        (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
        (
            json!({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}),
            "tools[0].type",
        ),
        (
            json!({"include": ["message.output_text.logprobs"]}),
            "include",
        ),
        (json!({"truncation": "auto"}), "truncation"),
        (json!({"reasoning": {"effort": "high"}}), "reasoning"),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
            "input[0].content[0]",
        ),
        (json!({"max_output_tokens": 0}), "max_output_tokens"),
        (json!({"input": 5}), "input"),
        (json!({"input": [{"type": 3}]}), "input[0].type"),
        (
            json!({"input": [{"type": "computer_call_output", "call_id": "c", "output": {}}]}),
            "input[0].type",
        ),
        (
            json!({"input": [{"role": "tool", "content": "x"}]}),
            "input[0].role",
        ),
        (json!({"input": ["Hi"]}), "input[0]"),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"unknown_knob": 1}), "unknown_knob"),
    ];
    for (extra, param) in cases {
        let mut body = json!({"model": MODEL, "input": "Hi", "max_output_tokens": 4});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, _, error) = post(&d, "/v1/responses", &body).await;
        assert_eq!(status, 400, "{body}: {error}");
        let named = error["error"]["param"].as_str().unwrap_or_default();
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(named, param, "{body}: {error}");
        assert!(!message.contains("untagged"), "{body}: {error}");
    }
    let body = json!({"model": MODEL, "input": "Hi", "previous_response_id": "resp_gone"});
    let (status, _, error) = post(&d, "/v1/responses", &body).await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["param"], "previous_response_id");
    assert_eq!(error["error"]["code"], "response_not_found");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("resp_gone")
    );
    let response = client()
        .delete(url(&d, "/v1/responses/resp_gone"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// A stored response lives for its TTL, then a follow-up to it is a 404.
#[tokio::test]
async fn a_stored_response_expires_after_its_ttl() {
    let d = start(&[("FRONTEND__RESPONSES__TTL", "1s")]).await;
    let body = json!({"model": MODEL, "input": "Hi", "max_output_tokens": 2});
    let (status, _, first) = post(&d, "/v1/responses", &body).await;
    assert_eq!(status, 200);
    let follow = json!({"model": MODEL, "input": "And?", "max_output_tokens": 2,
        "previous_response_id": first["id"]});
    let (status, _, _) = post(&d, "/v1/responses", &follow).await;
    assert_eq!(status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (status, _, error) = post(&d, "/v1/responses", &follow).await;
    assert_eq!(status, 404, "{error}");
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// The openai SDK: a function call, its output sent back with `previous_response_id`,
/// streamed and not, on an engine that answers with the last message's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_runs_a_tool_loop_through_responses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("last.jinja");
    std::fs::write(
        &path,
        "{#- tools are the caller's business -#}\
{%- for m in messages %}{%- if loop.last %}{{ m.content }}{%- endif %}{%- endfor %}<|im_end|>",
    )
    .unwrap();
    let path = path.display().to_string();
    let d = start(&[
        ("WORKERS__ENGINE", "echo"),
        ("WORKERS__COUNT", "1"),
        ("FRONTEND__CHAT__TEMPLATE", path.as_str()),
    ])
    .await;
    python_checks(&d, "responses_e2e.py", MODEL).await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}

/// Stored responses live in the frontend that answered them: a follow-up that reaches
/// another frontend is a 404 naming the id, never another conversation's continuation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_at_another_frontend_is_a_clear_404() {
    let (one, other) = (start(&[]).await, start(&[]).await);
    let body = json!({"model": MODEL, "input": "Hi", "max_output_tokens": 2});
    let (status, _, first) = post(&one, "/v1/responses", &body).await;
    assert_eq!(status, 200);
    // The other frontend has stored a response of its own.
    let (status, _, _) = post(&other, "/v1/responses", &body).await;
    assert_eq!(status, 200);
    let id = first["id"].as_str().unwrap();
    let follow = json!({"model": MODEL, "input": "And?", "previous_response_id": id});
    let (status, _, error) = post(&other, "/v1/responses", &follow).await;
    assert_eq!(status, 404, "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(id) && message.contains("another frontend"),
        "{message}"
    );
    let (status, _, _) = post(&one, "/v1/responses", &follow).await;
    assert_eq!(status, 200);
    for d in [one, other] {
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

/// The openai client's tool loop through `previous_response_id` (a forced call, then the
/// tool's output sent back; streamed and not) and an OpenAI Agents SDK agent with its
/// default (Responses) model, on the mocker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_client_and_an_agent_use_responses_on_the_mocker() {
    let d = start(&[]).await;
    python_checks(&d, "agent_responses_e2e.py", MODEL).await;
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
