//! Fault tolerance in one process (`serve`'s deployment, mocker workers with injected
//! faults): streams move off failed workers and arrive whole, failures are detected and
//! classified, invalid requests never count against workers, and a fleet that lost most of
//! its capacity degrades by priority.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;
use switchyard::deploy::{Deployment, SHUTDOWN_GRACE};
use switchyard_core::WorkerId;
use switchyard_worker::faults::Fault;

const MODEL: &str = "switchyard-mock";

fn clear(d: &Deployment, worker: WorkerId) {
    let w = d.workers.iter().find(|w| w.worker_id() == worker).unwrap();
    w.faults().clear();
}

fn prompt(i: u64) -> String {
    format!("Request {i}: tell me everything about switching yards, track {i}. ").repeat(4)
}

/// Streams `n` seeded completions at once; calls `during` once every one has its first
/// bytes; returns what each client saw.
async fn stream_all<F: FnOnce()>(
    d: &Deployment,
    n: u64,
    max_tokens: u32,
    during: F,
) -> Vec<Streamed> {
    let url = url(d, "/v1/completions");
    let bodies: Vec<Value> = (0..n)
        .map(|i| seeded_completion(MODEL, &prompt(i), i, max_tokens))
        .collect();
    let open: Vec<_> = bodies.iter().map(|body| open_stream(&url, body)).collect();
    let open = futures::future::join_all(open).await;
    during();
    let bodies = futures::future::join_all(open.into_iter().map(OpenStream::finish)).await;
    bodies.iter().map(|b| parse_stream(b)).collect()
}

async fn workers(d: &Deployment) -> Vec<Value> {
    client()
        .get(url(d, switchyard_frontend::http::WORKERS_PATH))
        .send()
        .await
        .unwrap()
        .json::<Vec<Value>>()
        .await
        .unwrap()
}

async fn status_of(d: &Deployment, worker: WorkerId) -> String {
    workers(d)
        .await
        .iter()
        .find(|w| w["worker_id"] == json!(worker.0))
        .map(|w| w["status"].as_str().unwrap().to_string())
        .unwrap_or_else(|| "gone".into())
}

/// Polls until `worker` has `status`; returns how long it took.
async fn until_status(
    d: &Deployment,
    worker: WorkerId,
    status: &str,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let now = status_of(d, worker).await;
        if now == status {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "worker {worker} is {now}, not {status}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn assert_whole(got: &[Streamed], reference: &[Streamed], max_tokens: u64) {
    for (i, (g, r)) in got.iter().zip(reference).enumerate() {
        assert!(g.errors.is_empty(), "stream {i}: {:?}", g.errors);
        assert!(g.done, "stream {i} did not end with [DONE]");
        assert_eq!(g.completion_tokens, Some(max_tokens), "stream {i}");
        assert_eq!(g.text, r.text, "stream {i} differs from the fault-free run");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_move_off_a_crashed_worker_and_arrive_whole() {
    let d = start(&[
        ("WORKERS__COUNT", "4"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "2"),
    ])
    .await;
    let reference = stream_all(&d, 24, 150, || {}).await;
    assert_whole(&reference, &reference, 150);
    let mut crashed = None;
    let got = stream_all(&d, 24, 150, || {
        let worker = busiest(&d);
        inject(&d, worker, Fault::Crash);
        crashed = Some(worker);
    })
    .await;
    assert_whole(&got, &reference, 150);
    let text = scrape(&url(&d, "/metrics")).await;
    assert!(
        metric_value(&text, "switchyard_migrations_total", Some("disconnected")) > 0.0,
        "{text}"
    );
    // The crash counted against the worker at once: it is out of rotation.
    assert_eq!(status_of(&d, crashed.unwrap()).await, "unhealthy");
    // A non-streamed request is never a 500 either.
    for i in 0..8 {
        let mut body = seeded_completion(MODEL, &prompt(i), i, 20);
        body["stream"] = json!(false);
        body.as_object_mut().unwrap().remove("stream_options");
        let (status, _, value) = post(&d, "/v1/completions", &body).await;
        assert_eq!(status, 200, "{value}");
    }
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// A worker lost between a stream's last token and its finish (a `kill -9` between two
/// writes): the answer is whole, so it is completed, not moved and asked for one token more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_finish_is_lost_after_its_last_token_completes_as_it_is() {
    let d = start(&[
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "10"),
        // Every stream of both workers loses its finish, and each loss counts against the
        // worker: with the default threshold both could be out of rotation before the last
        // of the 8 streams is sent, which would then find no worker.
        ("FRONTEND__HEALTH__FAILURE_THRESHOLD", "100"),
    ])
    .await;
    let reference = stream_all(&d, 8, 40, || {}).await;
    assert_whole(&reference, &reference, 40);
    for worker in [WorkerId(1), WorkerId(2)] {
        inject(&d, worker, Fault::Truncate);
    }
    let got = stream_all(&d, 8, 40, || {}).await;
    assert_whole(&got, &reference, 40);
    let text = scrape(&url(&d, "/metrics")).await;
    assert_eq!(
        metric_value(&text, "switchyard_migrations_total", Some("disconnected")),
        0.0,
        "nothing was moved: {text}"
    );
    // The worker was lost all the same: that counts against it.
    assert!(
        metric_value(
            &text,
            "switchyard_worker_failures_total",
            Some("disconnected")
        ) >= 1.0,
        "{text}"
    );
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// Crashes the busiest worker under 16 streams of 150 tokens; returns what the clients saw
/// and the moves refused, by outcome label.
async fn crash_under(env: &[(&str, &str)]) -> (Vec<Streamed>, f64, f64) {
    let mut env = env.to_vec();
    env.extend([
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "2"),
    ]);
    let d = start(&env).await;
    let got = stream_all(&d, 16, 150, || inject(&d, busiest(&d), Fault::Crash)).await;
    let text = scrape(&url(&d, "/metrics")).await;
    let limit = metric_value(&text, "switchyard_migrations_total", Some("limit"));
    let budget = metric_value(&text, "switchyard_migrations_total", Some("budget"));
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
    (got, limit, budget)
}

/// Streams cut short: each ends with an error event with a code and no `[DONE]`.
fn cut_short(got: &[Streamed]) -> usize {
    let mut n = 0;
    for s in got {
        if s.errors.is_empty() {
            assert!(s.done && s.completion_tokens == Some(150));
            continue;
        }
        n += 1;
        assert!(!s.done, "a stream cut short ended with [DONE]");
        assert_eq!(s.errors.len(), 1);
        assert_eq!(s.errors[0]["code"], "stream_interrupted", "{:?}", s.errors);
        assert!(s.completion_tokens.is_none_or(|t| t < 150));
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_cannot_move_end_with_a_coded_error_and_no_done() {
    // No moves allowed per request.
    let (got, limit, budget) = crash_under(&[("FRONTEND__MIGRATION__MAX_MIGRATIONS", "0")]).await;
    let n = cut_short(&got);
    assert!(n > 0 && n < got.len(), "{n} of {} cut short", got.len());
    assert_eq!((limit, budget), (n as f64, 0.0));
    // No budget for the fleet.
    let (got, limit, budget) = crash_under(&[
        ("FRONTEND__MIGRATION__BUDGET_RATIO", "0"),
        ("FRONTEND__MIGRATION__BUDGET_MAX", "0"),
    ])
    .await;
    let n = cut_short(&got);
    assert!(n > 0, "nothing was refused");
    assert_eq!((limit, budget), (0.0, n as f64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_worker_is_found_within_the_stall_timeout_and_rejoins_after_a_canary() {
    let d = start(&[
        ("WORKERS__COUNT", "3"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "2"),
        ("FRONTEND__HEALTH__RECOVERY_TIMEOUT", "1s"),
        ("FRONTEND__HEALTH__RECOVERY_JITTER", "0"),
    ])
    .await;
    let reference = stream_all(&d, 18, 200, || {}).await;
    let mut hung = None;
    let mut frozen = None;
    let got = stream_all(&d, 18, 200, || {
        let worker = busiest(&d);
        inject(&d, worker, Fault::Hang);
        hung = Some(worker);
        frozen = Some(Instant::now());
    })
    .await;
    let (hung, frozen) = (hung.unwrap(), frozen.unwrap());
    let resumed_after = frozen.elapsed();
    assert_whole(&got, &reference, 200);
    // Every stream went on elsewhere well before the frozen worker came back (it never
    // did on its own); the stall timeout's floor is a second.
    assert!(resumed_after < Duration::from_secs(5), "{resumed_after:?}");
    assert_eq!(status_of(&d, hung).await, "unhealthy");
    let text = scrape(&url(&d, "/metrics")).await;
    assert!(
        metric_value(&text, "switchyard_worker_failures_total", Some("hung")) > 0.0,
        "{text}"
    );
    // No new request goes to it while it is out.
    let before = d.frontend.routing.loads();
    let sent_before = dispatched(&d, hung).await;
    for i in 0..6 {
        let (status, _, _) = post(
            &d,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": prompt(i), "max_tokens": 5}),
        )
        .await;
        assert_eq!(status, 200);
    }
    assert_eq!(dispatched(&d, hung).await, sent_before, "{before:?}");
    // Continued: the breaker half-opens after a second, a canary passes, it rejoins.
    clear(&d, hung);
    until_status(&d, hung, "healthy", Duration::from_secs(10)).await;
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// Requests the frontend dispatched to `worker`.
async fn dispatched(d: &Deployment, worker: WorkerId) -> f64 {
    let text = scrape(&url(d, "/metrics")).await;
    metric_value(
        &text,
        "switchyard_dispatched_requests_total",
        Some(&format!("{worker}/0")),
    )
}

/// Three mocker workers with canaries every second, each having answered its first
/// (recorded as its expected answer).
async fn checked_every_second() -> Deployment {
    let d = start(&[
        ("WORKERS__COUNT", "3"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "10"),
        ("FRONTEND__HEALTH__CANARY_INTERVAL", "1s"),
        ("FRONTEND__HEALTH__CANARY_IDLE", "1s"),
    ])
    .await;
    let start = Instant::now();
    loop {
        let text = scrape(&url(&d, "/metrics")).await;
        if metric_value(&text, "switchyard_canaries_total", Some("passed")) >= 6.0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    d
}

/// `fault` on worker 2 is caught by its next canary as wrong output: it is out of
/// rotation, the others stay in.
async fn assert_caught_by_the_canary(d: &Deployment, fault: Fault) {
    let bad = WorkerId(2);
    inject(d, bad, fault);
    let found = until_status(d, bad, "unhealthy", Duration::from_secs(5)).await;
    // Within one check interval (plus the check itself).
    assert!(found <= Duration::from_millis(1500), "{fault}: {found:?}");
    let text = scrape(&url(d, "/metrics")).await;
    assert!(
        metric_value(
            &text,
            "switchyard_worker_failures_total",
            Some("wrong_output")
        ) >= 1.0
    );
    for other in [WorkerId(1), WorkerId(3)] {
        assert_eq!(status_of(d, other).await, "healthy");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_answering_wrong_tokens_is_caught_by_the_canary() {
    let d = checked_every_second().await;
    assert_caught_by_the_canary(&d, Fault::Corrupt).await;
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// Logits perturbed without changing a greedy token: only the canaries' log probabilities
/// show it. A drift within `health.canary_logprob_tolerance` (0.5) is not corruption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_logits_drift_is_caught_by_the_canary() {
    let d = checked_every_second().await;
    inject(&d, WorkerId(2), Fault::Drift { by: 0.3 });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(status_of(&d, WorkerId(2)).await, "healthy");
    assert_caught_by_the_canary(&d, Fault::Drift { by: 1.0 }).await;
    // Out of rotation: new requests go to the others.
    let before = dispatched(&d, WorkerId(2)).await;
    for i in 0..6 {
        let (status, _, body) = post(
            &d,
            "/v1/completions",
            &json!({"model": MODEL, "prompt": prompt(i), "max_tokens": 2}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(dispatched(&d, WorkerId(2)).await, before);
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_never_count_against_workers() {
    let d = start(&[
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "20"),
        ("WORKERS__MOCKER__NUM_GPU_BLOCKS", "64"),
        ("FRONTEND__CONTEXT_LENGTH", "4096"),
    ])
    .await;
    // Longer than the context: refused by the frontend.
    let too_long = "word ".repeat(6000);
    // Within the context, but larger than any worker's KV cache (64 blocks of 16 tokens):
    // refused by every engine.
    let too_big = "word ".repeat(1500);
    for _ in 0..10 {
        for (prompt, status) in [(&too_long, 400), (&too_big, 400)] {
            let (s, _, body) = post(
                &d,
                "/v1/completions",
                &json!({"model": MODEL, "prompt": prompt, "max_tokens": 4}),
            )
            .await;
            assert_eq!(s, status, "{body}");
            assert_ne!(body["error"]["code"], Value::Null, "{body}");
        }
    }
    for w in workers(&d).await {
        assert_eq!(w["status"], "healthy", "{w}");
        assert_eq!(w["health"]["consecutive_failures"], 0, "{w}");
    }
    let text = scrape(&url(&d, "/metrics")).await;
    assert!(
        !text.contains("switchyard_worker_failures_total{"),
        "{text}"
    );
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_three_of_four_workers_sheds_best_effort_and_keeps_premium() {
    let d = start(&[
        ("WORKERS__COUNT", "4"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "10"),
        ("FRONTEND__HEALTH__CANARY_INTERVAL", "500ms"),
        ("FRONTEND__HEALTH__CANARY_IDLE", "500ms"),
    ])
    .await;
    for w in 2..=4 {
        inject(&d, WorkerId(w), Fault::Crash);
    }
    for w in 2..=4 {
        until_status(&d, WorkerId(w), "unhealthy", Duration::from_secs(10)).await;
    }
    let body = |priority: &str, i: u64| json!({"model": MODEL, "prompt": prompt(i), "max_tokens": 8, "switchyard": {"priority": priority}});
    let requests = (0..12).map(|i| {
        let priority = if i % 2 == 0 { "premium" } else { "best_effort" };
        let d = &d;
        let body = body(priority, i);
        async move {
            let response = client()
                .post(url(d, "/v1/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").is_some();
            (priority, status, retry_after)
        }
    });
    let outcomes =
        tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(requests))
            .await
            .expect("nothing hangs");
    for (priority, status, retry_after) in outcomes {
        match priority {
            "premium" => assert_eq!(status, 200),
            _ => {
                assert_eq!(status, 429);
                assert!(retry_after);
            }
        }
    }
    // Level 3 once a quarter of the capacity has been all there is for the escalation hold.
    let since = Instant::now();
    loop {
        let text = scrape(&url(&d, "/metrics")).await;
        if metric_value(&text, "switchyard_degradation_level", None) >= 3.0 {
            break;
        }
        assert!(since.elapsed() < Duration::from_secs(10), "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// A timing profile (the mocker's format) whose prefill costs `ms_per_token` a prompt token
/// and whose decode steps take 5 ms: a slow engine.
fn slow_profile(dir: &std::path::Path, ms_per_token: f64) -> std::path::PathBuf {
    let profile = dir.join("slow.json");
    std::fs::write(
        &profile,
        json!({
            "prefill_isl": [1.0, 1000.0],
            "prefill_ttft_ms": [ms_per_token, 1000.0 * ms_per_token],
            "decode_active_kv_tokens": [1.0, 100000.0],
            "decode_context_length": [1.0, 100000.0],
            "decode_itl": [[5.0, 5.0], [5.0, 5.0]],
        })
        .to_string(),
    )
    .unwrap();
    profile
}

/// The only worker is healthy and no failure of these kinds was counted against it.
async fn assert_healthy_without(d: &Deployment, kinds: &[&str]) {
    let text = scrape(&url(d, "/metrics")).await;
    for kind in kinds {
        assert_eq!(
            metric_value(&text, "switchyard_worker_failures_total", Some(kind)),
            0.0,
            "{kind}: {text}"
        );
    }
    assert_eq!(status_of(d, d.workers[0].worker_id()).await, "healthy");
}

/// A worker whose timing model says this prompt's prefill takes 1.5 s (25 ms a token) is not
/// taken for hung by a first-token timeout of 1 s: the deadline runs from when its first
/// token is predicted (a slow engine with prompts queued, such as the CPU engine, is not a
/// failed one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_token_predicted_late_by_the_workers_timing_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let profile = slow_profile(dir.path(), 25.0);
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        ("WORKERS__MOCKER__PERF_PROFILE", profile.to_str().unwrap()),
        ("FRONTEND__HEALTH__FIRST_TOKEN_TIMEOUT", "1s"),
    ])
    .await;
    let started = Instant::now();
    let (status, _, body) = post(
        &d,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt(1), "max_tokens": 3, "stream": true,
                "stream_options": {"include_usage": true}}),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    let streamed = parse_stream(body.as_str().unwrap());
    assert!(streamed.errors.is_empty(), "{:?}", streamed.errors);
    assert_eq!(streamed.completion_tokens, Some(3));
    assert!(took >= Duration::from_millis(1500), "{took:?}");
    assert_healthy_without(&d, &["stalled", "hung"]).await;
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// A canary sent to a worker busy with queued prompts waits behind them: with its timing
/// model predicting seconds of prefill, canaries with a 600 ms timeout do not take it out
/// (they did: a CPU engine under a burst failed three canaries and was found unhealthy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_wait_behind_the_prompts_queued_on_a_slow_worker() {
    let dir = tempfile::tempdir().unwrap();
    let profile = slow_profile(dir.path(), 20.0);
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        ("WORKERS__MOCKER__PERF_PROFILE", profile.to_str().unwrap()),
        // One prompt a step, so four prompts queue one behind the other. (One token each:
        // this is about canaries; streams waiting on their next token behind a prompt step
        // are stall detection's business.)
        ("WORKERS__MOCKER__MAX_NUM_BATCHED_TOKENS", "128"),
        ("FRONTEND__HEALTH__FIRST_TOKEN_TIMEOUT", "10s"),
        ("FRONTEND__HEALTH__CANARY_INTERVAL", "300ms"),
        ("FRONTEND__HEALTH__CANARY_TIMEOUT", "600ms"),
    ])
    .await;
    let started = Instant::now();
    let bodies: Vec<Value> = (0..4)
        .map(|i| json!({"model": MODEL, "prompt": prompt(i), "max_tokens": 1, "stream": true}))
        .collect();
    let requests = bodies.iter().map(|body| post(&d, "/v1/completions", body));
    let answers = futures::future::join_all(requests).await;
    let took = started.elapsed();
    let failures = |text: String| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("switchyard_worker_failures_total"))
            .map(str::to_owned)
            .collect()
    };
    for (status, _, body) in answers {
        let text = scrape(&url(&d, "/metrics")).await;
        assert_eq!(status, 200, "{body} {:?}", failures(text.clone()));
        let streamed = parse_stream(body.as_str().unwrap());
        assert!(
            streamed.errors.is_empty(),
            "{:?} {:?}",
            streamed.errors,
            failures(text)
        );
    }
    // The queue was long enough for canaries to meet it.
    assert!(took >= Duration::from_secs(3), "{took:?}");
    // The canary that met the queue comes back passed (it may end just after the burst).
    let metrics = url(&d, "/metrics");
    support::cluster::eventually(Duration::from_secs(10), "a canary passed", || async {
        let text = scrape(&metrics).await;
        match metric_value(&text, "switchyard_canaries_total", Some("passed")) {
            n if n >= 1.0 => Ok(()),
            _ => Err(text),
        }
    })
    .await;
    assert_healthy_without(&d, &["canary_timeout", "latency_spike", "hung", "stalled"]).await;
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// Streams whose only worker hung do not fail for want of another: they wait for a worker
/// (as a queued request would), and once it recovers (a canary passes) they go on there
/// and arrive whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_with_no_worker_left_wait_for_one_and_arrive_whole() {
    let d = start(&[
        ("WORKERS__COUNT", "1"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "2"),
        ("FRONTEND__HEALTH__RECOVERY_TIMEOUT", "1s"),
        ("FRONTEND__HEALTH__RECOVERY_JITTER", "0"),
    ])
    .await;
    let worker = d.workers[0].worker_id();
    let reference = stream_all(&d, 4, 100, || {}).await;
    let faults = d.workers[0].faults().clone();
    let workers_url = url(&d, switchyard_frontend::http::WORKERS_PATH);
    let mut healer = None;
    let got = stream_all(&d, 4, 100, || {
        inject(&d, worker, Fault::Hang);
        // Cleared once the frontend has found it unhealthy (every stream has left it).
        healer = Some(tokio::spawn(async move {
            let started = Instant::now();
            loop {
                let workers: Vec<Value> = client()
                    .get(&workers_url)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if workers[0]["status"] == "unhealthy" {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "never found hung"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            faults.clear();
        }));
    })
    .await;
    healer.unwrap().await.unwrap();
    assert_whole(&got, &reference, 100);
    let text = scrape(&url(&d, "/metrics")).await;
    assert!(
        metric_value(&text, "switchyard_worker_failures_total", Some("hung")) > 0.0,
        "{text}"
    );
    assert_eq!(status_of(&d, worker).await, "healthy");
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}

/// A request's choices, streamed: each choice's text by index, and what the stream ended
/// with.
async fn choices_through(
    d: &Deployment,
    body: &Value,
    during: impl FnOnce(),
) -> (Vec<String>, Streamed) {
    let open = open_stream(&url(d, "/v1/completions"), body).await;
    during();
    let text = open.finish().await;
    let texts = streamed_choices(&sse_chunks(&text), "text")
        .into_iter()
        .map(|(text, _, _)| text)
        .collect();
    (texts, parse_stream(&text))
}

/// A request's choices run together on one worker. When it crashes each moves on its own
/// and the stream still arrives whole, every choice as in a fault-free run; where no move
/// is allowed, the one stream ends with one coded error event and no `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_choices_move_off_a_crashed_worker_or_end_its_stream_with_one_error() {
    let mut body = seeded_completion(MODEL, &prompt(7), 7, 150);
    body["n"] = json!(3);
    let fleet = [
        ("WORKERS__COUNT", "2"),
        ("WORKERS__MOCKER__SPEEDUP_RATIO", "2"),
    ];
    let d = start(&fleet).await;
    let (reference, r) = choices_through(&d, &body, || {}).await;
    assert!(r.errors.is_empty() && r.done, "{r:?}");
    assert_eq!(reference.len(), 3);
    assert!(reference[0] != reference[1] && reference[1] != reference[2]);
    let (got, s) = choices_through(&d, &body, || inject(&d, busiest(&d), Fault::Crash)).await;
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert!(s.done, "no [DONE]");
    assert_eq!(s.completion_tokens, Some(450));
    assert_eq!(
        got, reference,
        "the moved choices differ from the fault-free run"
    );
    let text = scrape(&url(&d, "/metrics")).await;
    assert!(
        metric_value(&text, "switchyard_migrations_total", Some("disconnected")) >= 3.0,
        "every choice moved: {text}"
    );
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();

    let mut env = fleet.to_vec();
    env.push(("FRONTEND__MIGRATION__MAX_MIGRATIONS", "0"));
    let d = start(&env).await;
    let (got, s) = choices_through(&d, &body, || inject(&d, busiest(&d), Fault::Crash)).await;
    assert!(!s.done, "a stream cut short ended with [DONE]");
    assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
    assert_eq!(s.errors[0]["code"], "stream_interrupted", "{:?}", s.errors);
    assert!(s.usage.is_none(), "usage after an error: {:?}", s.usage);
    for (choice, whole) in got.iter().zip(&reference) {
        assert!(
            whole.starts_with(choice.as_str()),
            "{choice:?} is not a prefix of {whole:?}"
        );
    }
    d.shutdown(SHUTDOWN_GRACE).await.unwrap();
}
