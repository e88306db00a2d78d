//! Disaggregated serving end to end: `serve` with prefill and decode workers answers as
//! an aggregated deployment does, keeps short prompts on the decode worker, shows the roles;
//! and (distributed, real processes) a prefill worker killed while its KV is being pulled
//! costs a prefill, not the request.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::cluster::*;
use support::*;

const MODEL: &str = "switchyard-mock";

async fn streamed(d: &switchyard::deploy::Deployment, body: &Value) -> Streamed {
    let response = client()
        .post(url(d, "/v1/completions"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    let streamed = parse_stream(&text);
    assert!(streamed.errors.is_empty() && streamed.done, "{text}");
    streamed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disaggregated_serve_answers_as_aggregated_and_keeps_short_prompts_local() {
    let fast = ("WORKERS__MOCKER__SPEEDUP_RATIO", "50");
    let aggregated = start(&[("WORKERS__COUNT", "1"), fast]).await;
    let split = start(&[("WORKERS__COUNT", "3"), ("WORKERS__PREFILL", "1"), fast]).await;

    // Long: far past the local-prefill threshold (512 uncached tokens).
    let long = "Tell me everything about the switching yards of the northern line. ".repeat(60);
    let remote = |d| metric_value(d, "switchyard_disagg_prefills", Some("outcome=\"remote\""));
    let local = |d| {
        metric_value(
            d,
            "switchyard_disagg_prefills",
            Some("outcome=\"local_short\""),
        )
    };
    // Another long prompt, for one token only (the first one's KV is on a decode worker
    // now: it would be short there).
    let other = "Now something else entirely: the history of the signal boxes. ".repeat(60);
    for (i, (prompt, max_tokens)) in [(long.as_str(), 24), ("hi", 16), (other.as_str(), 1)]
        .into_iter()
        .enumerate()
    {
        let body = seeded_completion(MODEL, prompt, 40 + i as u64, max_tokens);
        let want = streamed(&aggregated, &body).await;
        let got = streamed(&split, &body).await;
        assert_eq!(got.text, want.text, "request {i}: the same tokens");
        assert_eq!(got.completion_tokens, want.completion_tokens);
        assert!(want.completion_tokens.unwrap() >= 1);
    }
    let metrics = scrape(&url(&split, "/metrics")).await;
    // The two long prompts went to the prefill worker; the short one stayed local.
    assert_eq!(remote(&metrics), 2.0, "{metrics}");
    assert_eq!(local(&metrics), 1.0);
    assert!(
        metric_value(&metrics, "switchyard_disagg_handoff_seconds_count", None) >= 1.0,
        "a hand-off to the decode worker was timed"
    );
    for (worker, role) in [("1", "prefill"), ("2", "decode"), ("3", "decode")] {
        let series = format!("worker=\"{worker}\",role=\"{role}\"");
        assert_eq!(
            metric_value(&metrics, "switchyard_worker_role", Some(&series)),
            1.0,
            "{series}"
        );
    }
    let listing = get_json(&url(&split, "/v1/internal/workers")).await;
    let roles: Vec<&str> = listing
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["prefill", "decode", "decode"], "{listing}");
    // The aggregated deployment never disaggregates.
    let plain = scrape(&url(&aggregated, "/metrics")).await;
    assert_eq!(remote(&plain) + local(&plain), 0.0);
    for d in [aggregated, split] {
        d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn a_split_without_a_decode_worker_is_refused() {
    let env = [
        ("SWITCHYARD_WORKERS__COUNT".to_string(), "2".to_string()),
        ("SWITCHYARD_WORKERS__PREFILL".to_string(), "2".to_string()),
    ]
    .into_iter()
    .collect();
    let err = switchyard::config::load(None, &env, toml::Table::new()).unwrap_err();
    assert!(err.to_string().contains("workers.prefill (2)"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_worker_killed_mid_transfer_costs_a_prefill_not_the_request() {
    let cluster = Cluster::start();
    // A slow KV link (2 MB/s): pulling a ~1,000-token prompt's KV takes seconds even at
    // this speedup, so the prefill worker can be killed while it is being pulled.
    let worker = |id: u64, role: &str| {
        cluster.worker_with(
            &format!("{role}-{id}"),
            &[
                "--worker-id",
                &id.to_string(),
                "--speedup-ratio",
                "20",
                "--role",
                role,
                "--kv-bandwidth-gbps",
                "0.002",
            ],
        )
    };
    let mut prefill = worker(1, "prefill");
    let _decode = worker(2, "decode");
    let frontend = cluster.frontend("frontend", 0);
    // Only the decode worker serves requests; the listing shows both.
    wait_for_workers(&frontend, 1, Duration::from_secs(10)).await;
    let listing = frontend.url("/v1/internal/workers");
    eventually(Duration::from_secs(10), "both workers listed", || {
        let listing = listing.clone();
        async move {
            let listed = get_json(&listing).await;
            let n = listed.as_array().map_or(0, Vec::len);
            if n == 2 {
                Ok(())
            } else {
                Err(format!("{n} listed"))
            }
        }
    })
    .await;

    let body = json!({
        "model": MODEL,
        "prompt": "A long prompt about the yards, to be prefilled remotely. ".repeat(80),
        "max_tokens": 12,
        "seed": 5,
        "stream": true,
        "ignore_eos": true,
        "stream_options": {"include_usage": true},
    });
    // The first token comes from the prefill worker; the decode worker is now pulling.
    let stream = open_stream(&frontend.url("/v1/completions"), &body).await;
    // Well into the pull (it checks the source when it starts and when it ends).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = std::time::Instant::now();
    prefill.kill9();
    assert_completed(&stream.finish().await, 12);
    // It went on once the pull ended and found the source gone (~3 s of transfer).
    assert!(
        killed.elapsed() > Duration::from_secs(1),
        "{:?}",
        killed.elapsed()
    );
    let metrics = scrape(&frontend.url("/metrics")).await;
    assert_eq!(
        metric_value(
            &metrics,
            "switchyard_disagg_prefills",
            Some("outcome=\"remote\"")
        ),
        1.0,
        "{metrics}"
    );
    assert!(
        metric_value(
            &metrics,
            "switchyard_migrations",
            Some("outcome=\"kv_lost\"")
        ) >= 1.0,
        "{metrics}"
    );
}
