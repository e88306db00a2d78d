//! Thousands of streamed requests, a share abandoned mid-stream: afterwards nothing is
//! left in flight anywhere.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use support::*;
use tokio::sync::Semaphore;

const MODEL: &str = "switchyard-mock";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_streams_free_every_slot() {
    let d = start(&[
        ("WORKERS__COUNT", "4"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "100"),
    ])
    .await;
    let requests = 2000usize;
    let limit = Arc::new(Semaphore::new(64));
    let client = client();
    let url = url(&d, "/v1/chat/completions");
    let mut tasks = Vec::new();
    for i in 0..requests {
        let permit = Arc::clone(&limit).acquire_owned().await.unwrap();
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            // Ten conversations share prefixes; every third request is abandoned after its
            // first chunk. Abandoned ones ask for far more tokens than the engines could
            // produce in the time the test waits for them to drain: only cancellation frees
            // them in time.
            let content = format!("{} question {i}", "A long shared system context. ".repeat(4 + i % 10));
            let max_tokens = if i % 3 == 0 { 20_000 } else { 24 };
            let body = json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "stream": true});
            let response = client.post(&url).json(&body).send().await.unwrap();
            assert_eq!(response.status().as_u16(), 200);
            let mut stream = response.bytes_stream();
            if i % 3 == 0 {
                let _ = stream.next().await;
                return false;
            }
            let mut text = String::new();
            while let Some(chunk) = stream.next().await {
                text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            }
            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
            true
        }));
    }
    let mut completed = 0;
    for task in tasks {
        completed += usize::from(task.await.unwrap());
    }
    assert_eq!(completed, requests - requests.div_ceil(3));

    // Everything drains: the router holds no request, no worker has active blocks, and
    // every engine reports nothing running or waiting.
    let mut settled = false;
    for _ in 0..40 {
        let values = [
            metric(&d, "switchyard_requests_in_flight").await,
            metric(&d, "switchyard_worker_requests").await,
            metric(&d, "switchyard_worker_active_blocks").await,
            metric(&d, "switchyard_worker_prefill_tokens").await,
            metric(&d, "switchyard_engine_running").await,
            metric(&d, "switchyard_engine_waiting").await,
        ];
        if values.iter().all(|&v| v == 0.0) {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(settled, "slots leaked");
    assert_eq!(d.frontend.routing.active_requests(), 0);
    assert!(metric(&d, "switchyard_engine_running").await == 0.0);
    d.shutdown(switchyard::deploy::SHUTDOWN_GRACE)
        .await
        .unwrap();
}
