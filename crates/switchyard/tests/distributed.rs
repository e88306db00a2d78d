//! Distributed mode end to end: `switchyard frontend` and `switchyard worker` processes on
//! real NATS and etcd servers, killed and restarted underneath them.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::cluster::*;
use support::process::Process;
use support::{OpenStream, assert_completed, client, metric_value, open_stream, scrape};
use switchyard_runtime::IndexView;
use switchyard_runtime::net::kv::INDEX_PATH;

const MODEL: &str = "switchyard-mock";

async fn index(url: String) -> IndexView {
    serde_json::from_value(get_json(&url).await).unwrap()
}

/// The union of the workers' own records of their caches.
async fn workers_index(workers: &[&Process]) -> IndexView {
    let mut view = IndexView::default();
    for worker in workers {
        view.streams
            .extend(index(worker.url(INDEX_PATH)).await.streams);
    }
    view.streams.sort_by_key(|s| s.worker);
    view
}

/// Waits until every frontend's index is exactly the workers' caches.
async fn indexes_converge(frontends: &[&Process], workers: &[&Process]) {
    eventually(
        Duration::from_secs(15),
        "indexes matching the workers' caches",
        || async {
            let truth = workers_index(workers).await;
            if truth.streams.is_empty() {
                return Err("the workers hold nothing".into());
            }
            for frontend in frontends {
                let seen = index(frontend.url(INDEX_PATH)).await;
                if seen != truth {
                    return Err(format!(
                        "{}: {} streams / {} blocks, workers: {} / {}",
                        frontend.name,
                        seen.streams.len(),
                        seen.streams.iter().map(|s| s.blocks.len()).sum::<usize>(),
                        truth.streams.len(),
                        truth.streams.iter().map(|s| s.blocks.len()).sum::<usize>(),
                    ));
                }
            }
            Ok(())
        },
    )
    .await;
}

fn document(d: usize) -> String {
    (0..40)
        .map(|i| {
            format!(
                "doc {d} line {i} holds value {}",
                (d * 7919 + i * 104_729) % 1000
            )
        })
        .collect::<Vec<_>>()
        .join(". ")
}

/// A completion on a document with a question; returns its cached prompt tokens.
async fn ask(frontend: &Process, d: usize, question: usize) -> u64 {
    let body = json!({
        "model": MODEL,
        "prompt": format!("{}. Question {question}: what does line {question} hold?", document(d)),
        "max_tokens": 8,
        "ignore_eos": true,
    });
    let response = client()
        .post(frontend.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let value: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{} answered {value}", frontend.name);
    assert_eq!(value["usage"]["completion_tokens"], 8, "{value}");
    value["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// Starts a streamed completion of `max_tokens`, in flight once this returns.
async fn start_stream(frontend: &Process, max_tokens: u32) -> OpenStream {
    let body = json!({
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "stream": true,
        "ignore_eos": true,
        "stream_options": {"include_usage": true},
    });
    open_stream(&frontend.url("/v1/completions"), &body).await
}

/// A metric's value at a frontend, for one worker or summed.
async fn metric(frontend: &Process, name: &str, worker: Option<&str>) -> f64 {
    let label = worker.map(|w| format!("worker=\"{w}\""));
    metric_value(
        &scrape(&frontend.url("/metrics")).await,
        name,
        label.as_deref(),
    )
}

/// An OpenAI-compatible engine answering as vLLM does with `include_usage`: the text, a
/// finishing chunk without usage, then a usage-only chunk saying 7 prompt tokens were
/// cached, then `[DONE]`.
async fn vllm_like_upstream() -> String {
    use axum::response::sse::{Event, Sse};
    let completions = axum::routing::post(|| async {
        let chunks = [
            json!({"choices": [{"index": 0, "text": " a", "finish_reason": null}], "usage": null}),
            json!({"choices": [{"index": 0, "text": " b", "finish_reason": "length"}], "usage": null}),
            json!({"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 2,
                "total_tokens": 22, "prompt_tokens_details": {"cached_tokens": 7}}}),
        ]
        .map(|c| c.to_string())
        .into_iter()
        .chain(["[DONE]".to_string()])
        .map(|data| Ok::<_, std::convert::Infallible>(Event::default().data(data)));
        Sse::new(futures::stream::iter(chunks))
    });
    let app = axum::Router::new().route("/v1/completions", completions);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}")
}

/// The prompt tokens an OpenAI-compatible engine says it cached reach the client's usage
/// and the frontend's metrics, though vLLM says so only after the answer's last token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_engines_cached_tokens_reach_the_client() {
    let cluster = Cluster::start();
    let upstream = vllm_like_upstream().await;
    let frontend = cluster.frontend("frontend", 0);
    let _worker = cluster.worker_with(
        "worker-openai",
        &[
            "--engine",
            "openai",
            "--upstream",
            &upstream,
            "--worker-id",
            "3",
        ],
    );
    wait_for_workers(&frontend, 1, Duration::from_secs(30)).await;
    // More tokens than the 7 cached: a count above the prompt's would be cut to it.
    const PROMPT: &str = "one two three four five six seven eight nine ten eleven twelve";
    for stream in [false, true] {
        let response = client()
            .post(frontend.url("/v1/completions"))
            .json(&json!({"model": MODEL, "prompt": PROMPT, "max_tokens": 2,
                "stream": stream, "stream_options": stream.then(|| json!({"include_usage": true}))}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let usage = if stream {
            let text = response.text().await.unwrap();
            let streamed = support::parse_stream(&text);
            assert_eq!(streamed.text, " a b", "{text}");
            streamed.usage.unwrap()
        } else {
            let value: Value = response.json().await.unwrap();
            assert_eq!(value["choices"][0]["text"], " a b", "{value}");
            value["usage"].clone()
        };
        assert_eq!(
            usage["prompt_tokens_details"]["cached_tokens"], 7,
            "{usage}"
        );
    }
    assert_eq!(
        metric(&frontend, "switchyard_cached_tokens", None).await,
        14.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_frontends_three_workers_agree_survive_a_crash_and_a_frontend_restart() {
    let cluster = Cluster::start();
    let workers: Vec<Process> = (1..=3).map(|id| cluster.worker(id, "20")).collect();
    let a = cluster.frontend("frontend-a", 0);
    let mut b = cluster.frontend("frontend-b", 0);
    for frontend in [&a, &b] {
        wait_for_workers(frontend, 3, Duration::from_secs(10)).await;
    }

    // Requests through both frontends, several at a time, on shared documents.
    for round in 0..4 {
        let batch = (0..6).map(|d| {
            let frontend = if (d + round) % 2 == 0 { &a } else { &b };
            ask(frontend, d, round)
        });
        futures::future::join_all(batch).await;
    }
    let all: Vec<&Process> = workers.iter().collect();
    indexes_converge(&[&a, &b], &all).await;

    // kill -9 a worker: both frontends drop it within the lease TTL (plus the watch).
    let mut workers = workers;
    let mut dead = workers.pop().unwrap();
    dead.kill9();
    let killed = Instant::now();
    for frontend in [&a, &b] {
        wait_for_workers(frontend, 2, Duration::from_secs(LEASE_TTL_SECS + 4)).await;
    }
    let gone_after = killed.elapsed();
    assert!(
        gone_after <= Duration::from_secs(LEASE_TTL_SECS + 3),
        "{gone_after:?}"
    );
    // From then on nothing is sent its way.
    let dead_key = "3/0";
    let mut before = Vec::new();
    for frontend in [&a, &b] {
        before.push((
            metric(frontend, "switchyard_dispatched_requests", Some(dead_key)).await,
            metric(frontend, "switchyard_dispatch_failures", Some(dead_key)).await,
        ));
    }
    for d in 0..6 {
        // Re-cache every document on the survivors, through both frontends.
        ask(&a, d, 10).await;
        ask(&b, d, 11).await;
    }
    for (i, frontend) in [&a, &b].into_iter().enumerate() {
        let after = (
            metric(frontend, "switchyard_dispatched_requests", Some(dead_key)).await,
            metric(frontend, "switchyard_dispatch_failures", Some(dead_key)).await,
        );
        assert_eq!(
            after, before[i],
            "{} sent requests to the dead worker",
            frontend.name
        );
    }
    let survivors: Vec<&Process> = workers.iter().collect();
    indexes_converge(&[&a, &b], &survivors).await;

    // Restart frontend b on its port: its index is rebuilt from the workers' dumps...
    let port: u16 = b.address.rsplit(':').next().unwrap().parse().unwrap();
    b.sigterm();
    assert!(b.wait(Duration::from_secs(10)).success());
    let b = cluster.frontend("frontend-b-again", port);
    wait_for_workers(&b, 2, Duration::from_secs(10)).await;
    indexes_converge(&[&a, &b], &survivors).await;
    // ...and routing finds the cached documents again.
    for d in 0..6 {
        let cached = ask(&b, d, 20).await;
        assert!(cached >= 128, "document {d}: only {cached} cached tokens");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_then_etcd_restart_and_the_deployment_recovers() {
    let mut cluster = Cluster::start();
    let w1 = cluster.worker(1, "20");
    let w2 = cluster.worker(2, "20");
    let frontend = cluster.frontend("frontend", 0);
    wait_for_workers(&frontend, 2, Duration::from_secs(10)).await;
    for d in 0..4 {
        ask(&frontend, d, 0).await;
    }
    indexes_converge(&[&frontend], &[&w1, &w2]).await;

    // NATS goes away. A stream in flight finishes; new requests still flow (they do not
    // use it); their events are lost.
    let in_flight = start_stream(&frontend, 1500).await;
    cluster.nats.kill();
    for d in 4..8 {
        ask(&frontend, d, 0).await;
    }
    assert_completed(&in_flight.finish().await, 1500);
    cluster.nats.start_again();
    // The reconnection triggers a resync: the frontend catches up on what it missed.
    indexes_converge(&[&frontend], &[&w1, &w2]).await;
    // Live events flow again.
    for d in 8..10 {
        ask(&frontend, d, 0).await;
    }
    indexes_converge(&[&frontend], &[&w1, &w2]).await;

    // etcd goes away: the frontend keeps the workers it knows and keeps serving.
    let in_flight = start_stream(&frontend, 1500).await;
    cluster.etcd.kill();
    for d in 0..3 {
        assert!(ask(&frontend, d, 1).await > 0, "still routed by cache");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.etcd.start_again();
    assert_completed(&in_flight.finish().await, 1500);
    // The workers keep (or renew) their registrations: still two, past a lease TTL.
    tokio::time::sleep(Duration::from_secs(LEASE_TTL_SECS + 1)).await;
    assert_eq!(workers_seen(&frontend).await, 2);
    // The watch works again: a new worker is seen and indexed.
    let w3 = cluster.worker(3, "20");
    wait_for_workers(&frontend, 3, Duration::from_secs(15)).await;
    for d in 0..6 {
        ask(&frontend, d, 2).await;
    }
    indexes_converge(&[&frontend], &[&w1, &w2, &w3]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_deregisters_a_worker_and_finishes_its_requests() {
    let cluster = Cluster::start();
    // Real time: a 48-token answer takes a while.
    let mut worker = cluster.worker(1, "1");
    let frontend = cluster.frontend("frontend", 0);
    wait_for_workers(&frontend, 1, Duration::from_secs(10)).await;

    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 48,
        "stream": true,
        "ignore_eos": true,
        "stream_options": {"include_usage": true},
    });
    // The first chunk arrives; then the worker is told to stop.
    let stream = open_stream(&frontend.url("/v1/chat/completions"), &body).await;
    worker.sigterm();
    let signalled = Instant::now();
    assert_completed(&stream.finish().await, 48);
    assert!(worker.wait(Duration::from_secs(10)).success());
    // Deregistered at once, not after a lease TTL.
    wait_for_workers(&frontend, 0, Duration::from_secs(LEASE_TTL_SECS)).await;
    assert!(signalled.elapsed() < Duration::from_secs(10));
    let response = client()
        .post(frontend.url("/v1/chat/completions"))
        .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontends_share_their_requests_and_do_not_pile_onto_one_worker() {
    let cluster = Cluster::start();
    let _workers: Vec<Process> = (1..=2).map(|id| cluster.worker(id, "1")).collect();
    let a = cluster.frontend("frontend-a", 0);
    let b = cluster.frontend("frontend-b", 0);
    for frontend in [&a, &b] {
        wait_for_workers(frontend, 2, Duration::from_secs(10)).await;
    }
    // A long answer streams through a...
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "A very long story."}],
        "max_tokens": 400,
        "stream": true,
        "ignore_eos": true,
    });
    let stream = open_stream(&a.url("/v1/chat/completions"), &body).await;
    let busy = if metric(&a, "switchyard_dispatched_requests", Some("1/0")).await == 1.0 {
        "1/0"
    } else {
        "2/0"
    };
    let idle = if busy == "1/0" { "2/0" } else { "1/0" };
    // ...and b counts it.
    eventually(Duration::from_secs(5), "b counting a's request", || async {
        let n = metric(&b, "switchyard_replica_requests", None).await;
        let load = metric(&b, "switchyard_worker_requests", Some(busy)).await;
        if n == 1.0 && load == 1.0 {
            Ok(())
        } else {
            Err(format!("replica requests {n}, load on {busy} {load}"))
        }
    })
    .await;
    // So b sends its own request to the idle worker.
    ask(&b, 0, 0).await;
    assert_eq!(
        metric(&b, "switchyard_dispatched_requests", Some(idle)).await,
        1.0
    );
    assert_eq!(
        metric(&b, "switchyard_dispatched_requests", Some(busy)).await,
        0.0
    );
    // a's client leaves: b stops counting the request.
    drop(stream);
    eventually(
        Duration::from_secs(5),
        "b forgetting a's request",
        || async {
            let n = metric(&b, "switchyard_replica_requests", None).await;
            if n == 0.0 {
                Ok(())
            } else {
                Err(format!("{n}"))
            }
        },
    )
    .await;
}
