//! Real engines as workers: llama.cpp's server (llama-cpp-python) serving the SmolLM2 GGUF,
//! behind `switchyard worker --engine openai`, in a distributed deployment (etcd, NATS).
//!
//! `scripts/test` fetches the model (`SWITCHYARD_SMOLLM2_GGUF`) and installs the server into
//! its virtualenv (`SWITCHYARD_PYTHON`); without them the test fails and says so.

#![allow(clippy::unwrap_used)]

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::cluster::{Cluster, wait_for_workers};

/// llama.cpp's server on a free port, killed when dropped.
struct LlamaServer {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
}

impl LlamaServer {
    fn start(dir: &std::path::Path) -> LlamaServer {
        let python = std::env::var("SWITCHYARD_PYTHON").unwrap_or_else(|_| "python3".into());
        let model = std::env::var("SWITCHYARD_SMOLLM2_GGUF").unwrap_or_default();
        assert!(
            std::path::Path::new(&model).is_file(),
            "SWITCHYARD_SMOLLM2_GGUF must name the SmolLM2-135M-Instruct Q4_1 GGUF (got {model:?}); run scripts/test, which fetches it"
        );
        let probe = Command::new(&python)
            .args(["-c", "import llama_cpp.server"])
            .output();
        assert!(
            probe.is_ok_and(|o| o.status.success()),
            "llama-cpp-python[server] is not importable with {python}; run scripts/test (it builds and installs it) or set SWITCHYARD_PYTHON"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = dir.join("llama-server.log");
        let child = Command::new(python)
            .args(["-m", "llama_cpp.server", "--model", &model])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--n_ctx",
                "2048",
                "--n_threads",
                "1",
                "--interrupt_requests",
                "False",
            ])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.join("llama-server.err")).unwrap())
            .spawn()
            .unwrap();
        LlamaServer { child, port, log }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(r) = support::client().get(self.url("/v1/models")).send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "llama.cpp's server did not start: {}",
                std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A JSON answer to a JSON request.
async fn post_json(url: &str, body: &Value) -> Value {
    let response = support::client().post(url).json(body).send().await.unwrap();
    response.json().await.unwrap()
}

/// An SSE response's `data:` payloads.
async fn sse_at(url: &str, body: &Value) -> (u16, Vec<String>) {
    let response = support::client().post(url).json(body).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let events = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_owned)
        .collect();
    (status, events)
}

fn messages() -> Value {
    json!([{"role": "user", "content": "What is the capital of France?"}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_cpp_server_serves_through_an_openai_worker() {
    let cluster = Cluster::start();
    let llama = LlamaServer::start(cluster.dir.path());
    llama.wait_ready().await;

    // What the engine answers on its own (greedy), through its own chat template.
    let direct: Value = support::client()
        .post(llama.url("/v1/chat/completions"))
        .json(&json!({"messages": messages(), "max_tokens": 24, "temperature": 0.0}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let direct_text = direct["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!direct_text.trim().is_empty(), "{direct}");

    let frontend = cluster.frontend("frontend", 0);
    let upstream = llama.url("");
    let _worker = cluster.worker_with(
        "worker-llama",
        &[
            "--engine",
            "openai",
            "--upstream",
            &upstream,
            "--worker-id",
            "5",
        ],
    );
    wait_for_workers(&frontend, 1, Duration::from_secs(30)).await;

    // The same conversation through Switchyard, streamed: the frontend renders the chat
    // template (from the same model) and sends the text; the worker streams the engine's
    // text back. Greedy decoding: the same answer.
    let body = json!({
        "model": "switchyard-mock",
        "messages": messages(),
        "max_tokens": 24,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let response = support::client()
        .post(frontend.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let streamed = support::parse_stream(&text);
    assert!(streamed.errors.is_empty(), "{text}");
    assert!(streamed.done, "{text}");
    assert_eq!(streamed.text, direct_text, "{text}");
    // Words, not noise (greedy SmolLM2-135M answers in a sentence about the capital).
    assert!(
        streamed.text.split_whitespace().count() >= 3 && streamed.text.contains("capital"),
        "{:?}",
        streamed.text
    );
    let completion_tokens = streamed.completion_tokens.unwrap();
    assert!((1..=24).contains(&completion_tokens), "{text}");
    // llama-cpp-python's server says nothing of its prefix cache: no count is made up.
    let usage = streamed.usage.unwrap();
    assert!(usage.get("prompt_tokens_details").is_none(), "{usage}");

    // `top_k` reaches the engine: sampling hot (temperature 1.5) among the likeliest token
    // alone is greedy decoding, whatever the seed.
    for seed in [1, 2] {
        let sampled: Value = support::client()
            .post(frontend.url("/v1/chat/completions"))
            .json(&json!({
                "model": "switchyard-mock",
                "messages": messages(),
                "max_tokens": 24,
                "temperature": 1.5,
                "top_k": 1,
                "seed": seed,
            }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            sampled["choices"][0]["message"]["content"], direct_text,
            "seed {seed}: {sampled}"
        );
    }

    // A plain completion (no template), not streamed.
    let response: Value = support::client()
        .post(frontend.url("/v1/completions"))
        .json(&json!({"model": "switchyard-mock", "prompt": "The capital of France is", "max_tokens": 5, "temperature": 0.0}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let completion = response["choices"][0]["text"].as_str().unwrap_or_default();
    assert!(!completion.is_empty(), "{response}");
    assert!(
        response["usage"]["completion_tokens"].as_u64().unwrap() <= 5,
        "{response}"
    );

    // Log probabilities pass through: the server's own, as it gives them directly, for
    // a completion and a chat, streamed and not.
    let ask = json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0.0, "logprobs": 2});
    let direct: Value = post_json(&llama.url("/v1/completions"), &ask).await;
    let mut through = ask.clone();
    through["model"] = json!("switchyard-mock");
    let response: Value = post_json(&frontend.url("/v1/completions"), &through).await;
    let (theirs, ours) = (&direct["choices"][0], &response["choices"][0]);
    assert_eq!(ours["text"], theirs["text"], "{response}");
    let ours = &ours["logprobs"];
    assert_eq!(ours["tokens"], theirs["logprobs"]["tokens"], "{response}");
    assert_eq!(
        ours["text_offset"].as_array().unwrap().len(),
        4,
        "{response}"
    );
    for (a, b) in ours["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(theirs["logprobs"]["token_logprobs"].as_array().unwrap())
    {
        assert!(
            (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-4,
            "{response}"
        );
    }
    for (top, direct) in ours["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(theirs["logprobs"]["top_logprobs"].as_array().unwrap())
    {
        let (top, direct) = (top.as_object().unwrap(), direct.as_object().unwrap());
        assert_eq!(top.len(), direct.len(), "{response}");
        for (token, l) in direct {
            let ours = top[token].as_f64().unwrap();
            assert!((ours - l.as_f64().unwrap()).abs() < 1e-4, "{response}");
        }
    }
    let mut chat = json!({
        "model": "switchyard-mock", "messages": messages(), "max_tokens": 6,
        "temperature": 0.0, "logprobs": true, "top_logprobs": 2,
    });
    let whole: Value = post_json(&frontend.url("/v1/chat/completions"), &chat).await;
    let entries = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    let spelled: String = entries
        .iter()
        .map(|e| e["token"].as_str().unwrap())
        .collect();
    assert_eq!(
        spelled, whole["choices"][0]["message"]["content"],
        "{whole}"
    );
    assert!(
        entries
            .iter()
            .all(|e| e["top_logprobs"].as_array().unwrap().len() == 2)
    );
    chat["stream"] = json!(true);
    let (_, events) = sse_at(&frontend.url("/v1/chat/completions"), &chat).await;
    let streamed: Vec<Value> = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(&streamed, entries);
    // A prompt's log probabilities: this worker does not report them.
    let mut echo = through.clone();
    echo["echo"] = json!(true);
    let response = support::client()
        .post(frontend.url("/v1/completions"))
        .json(&echo)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["param"], "echo", "{body}");

    // The worker is listed, healthy, with load reports (its own count of requests in
    // flight: llama-cpp-python serves no /metrics).
    let url = frontend.url("/v1/internal/workers");
    support::cluster::eventually(Duration::from_secs(10), "a load report", || {
        let url = url.clone();
        async move {
            let workers = support::cluster::get_json(&url).await;
            let worker = workers
                .as_array()
                .and_then(|all| all.iter().find(|w| w["worker_id"] == 5))
                .ok_or_else(|| format!("worker 5 is not listed: {workers}"))?;
            if worker["status"] != "healthy" || worker["loads"][0][2].is_null() {
                return Err(worker.to_string());
            }
            Ok(())
        }
    })
    .await;
}

/// Structured output through llama.cpp: the worker tells the server each constraint as a
/// GBNF grammar (`--upstream-constraints llamacpp`), and the server's answers follow them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_cpp_server_answers_under_schemas_regexes_and_choices() {
    let cluster = Cluster::start();
    let llama = LlamaServer::start(cluster.dir.path());
    llama.wait_ready().await;
    let frontend = cluster.frontend("frontend", 0);
    let upstream = llama.url("");
    let _worker = cluster.worker_with(
        "worker-llama",
        &[
            "--engine",
            "openai",
            "--upstream",
            &upstream,
            "--upstream-constraints",
            "llamacpp",
            "--worker-id",
            "6",
        ],
    );
    wait_for_workers(&frontend, 1, Duration::from_secs(30)).await;
    let ask = |body: Value| {
        let url = frontend.url("/v1/chat/completions");
        async move {
            let response = support::client()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status();
            let answer: Value = response.json().await.unwrap();
            assert_eq!(status, 200, "{answer}");
            answer
        }
    };
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "population": {"type": "integer", "minimum": 0},
            "coastal": {"type": "boolean"},
            "rivers": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 2},
        },
        "required": ["city", "population", "coastal", "rivers"],
        "additionalProperties": false,
    });
    for (question, stream) in [("Describe Paris.", false), ("Describe Lisbon.", true)] {
        let body = json!({
            "model": "switchyard-mock",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 96,
            "temperature": 0.0,
            "stream": stream,
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": true}},
        });
        let (text, finish) = if stream {
            let response = support::client()
                .post(frontend.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let raw = response.text().await.unwrap();
            let streamed = support::parse_stream(&raw);
            assert!(streamed.errors.is_empty() && streamed.done, "{raw}");
            let choices = support::streamed_choices(&support::sse_chunks(&raw), "delta");
            let (text, reasons, _) = choices.into_iter().next().unwrap();
            (text, reasons.last().cloned().unwrap_or_default())
        } else {
            let answer = ask(body).await;
            let choice = &answer["choices"][0];
            (
                choice["message"]["content"].as_str().unwrap().to_owned(),
                choice["finish_reason"].as_str().unwrap().to_owned(),
            )
        };
        eprintln!("{question} -> {text}");
        assert_eq!(finish, "stop", "{text:?}");
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let object = value.as_object().unwrap();
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(keys, ["city", "population", "coastal", "rivers"], "{text}");
        assert!(
            object["city"]
                .as_str()
                .is_some_and(|c| c.chars().count() <= 24),
            "{text}"
        );
        assert!(object["population"].is_u64(), "{text}");
        assert!(object["coastal"].is_boolean(), "{text}");
        let rivers = object["rivers"].as_array().unwrap();
        assert!(
            rivers.len() <= 2 && rivers.iter().all(Value::is_string),
            "{text}"
        );
    }

    // A regular expression and a choice, in vLLM's spellings.
    let answer = ask(json!({
        "model": "switchyard-mock",
        "messages": [{"role": "user", "content": "Give a date."}],
        "max_tokens": 32,
        "temperature": 0.0,
        "guided_regex": "20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]",
    }))
    .await;
    let date = answer["choices"][0]["message"]["content"].as_str().unwrap();
    eprintln!("a date -> {date}");
    let whole = regex::Regex::new("^20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]$").unwrap();
    assert!(whole.is_match(date), "{answer}");
    let answer = ask(json!({
        "model": "switchyard-mock",
        "messages": [{"role": "user", "content": "Is Paris in France?"}],
        "max_tokens": 8,
        "temperature": 0.0,
        "guided_choice": ["yes, it is", "no"],
    }))
    .await;
    let choice = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(["yes, it is", "no"].contains(&choice), "{answer}");

    // A schema keyword a GBNF grammar cannot say here is a 400 naming it.
    let response = support::client()
        .post(frontend.url("/v1/chat/completions"))
        .json(&json!({
            "model": "switchyard-mock",
            "messages": messages(),
            "max_tokens": 8,
            "guided_json": {"type": "string", "format": "date"},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let error: Value = response.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`format`"),
        "{error}"
    );
}

/// Two workers in front of engines that publish vLLM's KV events over ZMQ: the frontend
/// indexes what the engines say they cache (stores, then removals) and routes a prompt to
/// the worker holding it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_kv_events_steer_routing_to_the_worker_holding_the_prompt() {
    use switchyard_runtime::testing::{VllmPublisher, vllm_removed_batch, vllm_stored_batch};
    const BLOCK: u32 = 16;
    let cluster = Cluster::start();
    let llama = LlamaServer::start(cluster.dir.path());
    let mut publishers = [VllmPublisher::start(), VllmPublisher::start()];
    let frontend = cluster.frontend("frontend", 0);
    let upstream = llama.url("");
    let _workers: Vec<_> = publishers
        .iter()
        .enumerate()
        .map(|(i, publisher)| {
            let (id, events, replay) =
                ((i + 1).to_string(), publisher.url(), publisher.replay_url());
            cluster.worker_with(
                &format!("worker-{id}"),
                &[
                    "--engine",
                    "openai",
                    "--upstream",
                    &upstream,
                    "--worker-id",
                    &id,
                    "--kv-events",
                    &events,
                    "--kv-events-replay",
                    &replay,
                    "--block-size",
                    "16",
                ],
            )
        })
        .collect();
    wait_for_workers(&frontend, 2, Duration::from_secs(30)).await;
    llama.wait_ready().await;

    // The prompt's tokens as the frontend makes them, in full blocks.
    let prompt = "Switchyard routes every request to the worker where it finishes soonest, \
        knowing what each engine holds in its KV cache from the events the engines publish. \
        A long shared prefix is worth routing for: recomputing it costs time to first token.";
    let preprocessor = switchyard_frontend::preprocess::Preprocessor::smollm2(None).unwrap();
    let tokens = preprocessor.encode_completion_prompt(prompt).unwrap();
    let blocks = tokens.len() / BLOCK as usize;
    assert!(blocks >= 3, "{} tokens", tokens.len());
    let cached = &tokens[..blocks * BLOCK as usize];
    let hashes = |base: u64| (0..blocks as u64).map(|i| base + i).collect::<Vec<_>>();

    let index = frontend.url("/v1/internal/kv/index");
    let holds = |index: Value, worker: u64| -> usize {
        index["streams"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["worker"]["worker_id"] == worker)
            .map(|s| s["blocks"].as_array().map_or(0, Vec::len))
            .sum()
    };
    let routed_to = |frontend: &support::process::Process| {
        let url = frontend.url("/v1/completions");
        async move {
            let response = support::client()
                .post(url)
                .json(&json!({"model": "switchyard-mock", "prompt": prompt, "max_tokens": 1}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            response.headers()["x-switchyard-worker"]
                .to_str()
                .unwrap()
                .to_owned()
        }
    };

    // Engine 2 caches the prompt (published until its worker's subscription is up; a
    // repeated sequence number is skipped).
    let stored = vllm_stored_batch(&hashes(1000), None, cached, BLOCK);
    support::cluster::eventually(Duration::from_secs(20), "worker 2's blocks indexed", || {
        publishers[1].publish(0, &stored, true);
        let index = index.clone();
        async move {
            let seen = holds(support::cluster::get_json(&index).await, 2);
            if seen == blocks {
                Ok(())
            } else {
                Err(format!("{seen} of {blocks} blocks"))
            }
        }
    })
    .await;
    for _ in 0..3 {
        assert_eq!(routed_to(&frontend).await, "2/0");
    }

    // Engine 2 evicts it and engine 1 computes it: the routing follows.
    publishers[1].publish(1, &vllm_removed_batch(&hashes(1000)), true);
    let stored = vllm_stored_batch(&hashes(2000), None, cached, BLOCK);
    support::cluster::eventually(Duration::from_secs(20), "the move indexed", || {
        publishers[0].publish(0, &stored, true);
        let index = index.clone();
        async move {
            let index = support::cluster::get_json(&index).await;
            let (one, two) = (holds(index.clone(), 1), holds(index, 2));
            if (one, two) == (blocks, 0) {
                Ok(())
            } else {
                Err(format!("{one} and {two} blocks"))
            }
        }
    })
    .await;
    for _ in 0..3 {
        assert_eq!(routed_to(&frontend).await, "1/0");
    }
}
