//! Failures of real processes under a distributed deployment (NATS, etcd, a frontend and
//! mocker workers): `kill -9` in a loop, SIGSTOP, silent corruption, a black-holed request
//! plane, most of the fleet lost. Clients see whole answers, byte for byte those of a
//! fault-free run, or a clear refusal, and never wait on a failed worker for long.
//!
//! The chaos run prints its figures (completion, tokens lost or repeated, added latency,
//! detection times); docs/benchmarks.md records them.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use serde_json::{Value, json};
use support::cluster::*;
use support::process::Process;
use support::{Streamed, client, metric_value, parse_stream, scrape, seeded_completion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MODEL: &str = "switchyard-mock";

fn prompt(i: u64) -> String {
    format!("Stream {i} of the chaos run: tell me about switching yards. ").repeat(3)
}

/// One streamed completion: what the client saw, and the longest wait between two of its
/// chunks.
async fn stream_one(url: &str, body: &Value) -> (Streamed, Duration) {
    let response = client().post(url).json(body).send().await.unwrap();
    let status = response.status();
    if status != 200 {
        let text = response.text().await.unwrap_or_default();
        panic!("HTTP {status}: {text}");
    }
    let mut chunks = response.bytes_stream();
    // Bytes, decoded once at the end: a network chunk may end inside a character.
    let mut bytes = Vec::new();
    // From the first chunk on: time to first token is not a gap.
    let mut last: Option<Instant> = None;
    let mut longest = Duration::ZERO;
    while let Some(chunk) = chunks.next().await {
        let now = Instant::now();
        if let Some(last) = last {
            longest = longest.max(now - last);
        }
        last = Some(now);
        match chunk {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(e) => {
                // The connection broke mid-answer: a failure to report with the others.
                let mut streamed = parse_stream(&String::from_utf8_lossy(&bytes));
                streamed
                    .errors
                    .push(json!({ "connection": format!("{e:?}") }));
                return (streamed, longest);
            }
        }
    }
    (parse_stream(&String::from_utf8_lossy(&bytes)), longest)
}

/// Streams requests `0..n` at once.
async fn stream_all(url: &str, n: u64, max_tokens: u32) -> Vec<(Streamed, Duration)> {
    let bodies: Vec<Value> = (0..n)
        .map(|i| seeded_completion(MODEL, &prompt(i), i, max_tokens))
        .collect();
    futures::future::join_all(bodies.iter().map(|b| stream_one(url, b))).await
}

fn check_whole(
    what: &str,
    got: &Streamed,
    reference: &Streamed,
    max_tokens: u64,
) -> Result<(), String> {
    if !got.errors.is_empty() {
        return Err(format!("{what}: errors {:?}", got.errors));
    }
    if !got.done {
        return Err(format!("{what}: no [DONE]"));
    }
    if got.completion_tokens != Some(max_tokens) {
        return Err(format!(
            "{what}: usage says {:?} tokens",
            got.completion_tokens
        ));
    }
    if got.text != reference.text {
        let common = got
            .text
            .chars()
            .zip(reference.text.chars())
            .take_while(|(a, b)| a == b)
            .count();
        return Err(format!(
            "{what}: differs from the fault-free run after {common} characters ({} vs {})",
            got.text.chars().count(),
            reference.text.chars().count()
        ));
    }
    Ok(())
}

async fn workers(frontend: &Process) -> Vec<Value> {
    get_json(&frontend.url(switchyard_frontend::http::WORKERS_PATH))
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The frontend's record of the worker process announced at `address`.
async fn record_of(frontend: &Process, address: &str) -> Option<Value> {
    workers(frontend)
        .await
        .into_iter()
        .find(|w| w["address"] == json!(address))
}

async fn status_of(frontend: &Process, address: &str) -> String {
    record_of(frontend, address).await.map_or_else(
        || "gone".into(),
        |w| w["status"].as_str().unwrap().to_string(),
    )
}

/// Polls (every 10 ms) until the worker at `address` is in one of `states`; returns how long.
async fn until_status(
    frontend: &Process,
    address: &str,
    states: &[&str],
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let now = status_of(frontend, address).await;
        if states.contains(&now.as_str()) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "worker at {address} is {now}, not {states:?}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The worker (by address) in rotation with the most requests in flight, once one has any
/// (the listing's loads lag dispatch on a busy machine; a victim with nothing in flight
/// would make a hang undetectable by its streams). Suspicious workers count: on a starved
/// machine the fleet's cap keeps some in rotation that way.
async fn busiest(frontend: &Process) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let best = workers(frontend)
            .await
            .into_iter()
            .filter(|w| w["status"] == "healthy" || w["status"] == "suspicious")
            .map(|w| {
                let requests = w["loads"]
                    .as_array()
                    .map(|loads| {
                        loads
                            .iter()
                            .map(|l| l[1]["requests"].as_u64().unwrap_or(0))
                            .sum::<u64>()
                    })
                    .unwrap_or(0);
                (
                    requests,
                    w["address"].as_str().unwrap_or_default().to_string(),
                )
            })
            .max();
        match best {
            Some((requests, address)) if requests > 0 => return address,
            _ => {
                assert!(
                    Instant::now() < deadline,
                    "no worker in rotation with requests in flight within 10 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Requests the frontend sent (or tried to send) to the worker with this id.
async fn sent_to(frontend: &Process, worker_id: u64) -> f64 {
    let text = scrape(&frontend.url("/metrics")).await;
    let label = format!("worker=\"{worker_id:x}/0\"");
    metric_value(&text, "switchyard_dispatched_requests", Some(&label))
        + metric_value(&text, "switchyard_dispatch_failures", Some(&label))
}

/// A quantile of a Prometheus histogram, as the upper bound of the bucket it falls in.
fn histogram_quantile(text: &str, name: &str, q: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, count)| *count >= q * total)
        .map(|(le, _)| *le)
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

/// Waits until the frontend routes to `n` healthy workers.
async fn until_healthy(frontend: &Process, n: usize) {
    eventually(Duration::from_secs(20), "healthy workers", || async {
        let healthy = workers(frontend)
            .await
            .iter()
            .filter(|w| w["status"] == "healthy")
            .count();
        if healthy >= n {
            Ok(())
        } else {
            Err(format!("{healthy} healthy"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_a_loop_loses_no_request_and_no_token() {
    const STREAMS: u64 = 200;
    const TOKENS: u32 = 200;
    const KILLS: usize = 20;
    const KILL_EVERY: Duration = Duration::from_millis(2500);
    let cluster = Cluster::start();
    let spawn_worker = {
        let cluster = &cluster;
        move |n: usize| cluster.worker_with(&format!("worker-{n}"), &["--speedup-ratio", "1"])
    };
    let live: Arc<Mutex<Vec<Process>>> = Arc::new(Mutex::new((0..4).map(spawn_worker).collect()));
    // This test is about migration; graceful degradation is off. With it on, a fresh-clone
    // CI run still reached level 4 (503) once near the end of the loop, after the 2 s
    // escalation hold, although it passed every local run under a CPU hog: open, see the
    // degradation log lines this prints on failure.
    // The fleet's migration budget is sized for occasional failures (0.5 moves per admitted
    // request); a kill every 2.5 s moves a quarter of all streams each time, and on a slow
    // CI machine (streams slower, fewer admissions) it ran dry and cut 19 of 4,172 streams.
    // The budget has its own test; here it is sized for this failure rate. Its cap, too:
    // the clients send the same prompts again and again, so routing keeps them where their
    // prefixes are cached and the busiest worker often holds nearly all 200 streams; the
    // default cap (the requests in flight at the last admission) then leaves no room for a
    // stream caught by two kills in a row.
    let frontend = cluster.frontend_with(
        "frontend",
        0,
        &[
            ("SWITCHYARD_FRONTEND__DEGRADATION__ENABLED", "false"),
            ("SWITCHYARD_FRONTEND__MIGRATION__BUDGET_RATIO", "2"),
            ("SWITCHYARD_FRONTEND__MIGRATION__BUDGET_MAX", "1000"),
        ],
    );
    until_healthy(&frontend, 4).await;
    let url = frontend.url("/v1/completions");

    let started = Instant::now();
    let reference = stream_all(&url, STREAMS, TOKENS).await;
    let reference_time = started.elapsed();
    for (i, (r, _)) in reference.iter().enumerate() {
        check_whole(&format!("reference {i}"), r, r, u64::from(TOKENS)).unwrap();
    }
    let mut reference_gaps: Vec<Duration> = reference.iter().map(|(_, g)| *g).collect();
    reference_gaps.sort();
    let reference: Arc<Vec<Streamed>> = Arc::new(reference.into_iter().map(|(s, _)| s).collect());

    // Clients: each streams its request again and again until the kills are over.
    let stop = Arc::new(AtomicBool::new(false));
    let results: Arc<Mutex<Vec<Result<Duration, String>>>> = Arc::default();
    let clients: Vec<_> = (0..STREAMS)
        .map(|i| {
            let (url, stop, results, reference) = (
                url.clone(),
                Arc::clone(&stop),
                Arc::clone(&results),
                Arc::clone(&reference),
            );
            tokio::spawn(async move {
                let body = seeded_completion(MODEL, &prompt(i), i, TOKENS);
                while !stop.load(Ordering::Relaxed) {
                    let (got, gap) = stream_one(&url, &body).await;
                    let checked = check_whole(
                        &format!("stream {i}"),
                        &got,
                        &reference[i as usize],
                        u64::from(TOKENS),
                    );
                    results.lock().push(checked.map(|()| gap));
                }
            })
        })
        .collect();

    // The killer: every few seconds, kill -9 the busiest worker and start another.
    let mut detections = Vec::new();
    for spawned in 4..4 + KILLS {
        tokio::time::sleep(KILL_EVERY).await;
        let victim = busiest(&frontend).await;
        let killed_at = {
            let mut live = live.lock();
            let index = live.iter().position(|p| p.address == victim).unwrap();
            let mut dead = live.remove(index);
            dead.kill9();
            Instant::now()
        };
        until_status(
            &frontend,
            &victim,
            &["unhealthy", "dead", "gone"],
            Duration::from_secs(10),
        )
        .await;
        detections.push(killed_at.elapsed());
        let fresh = tokio::task::block_in_place(|| spawn_worker(spawned));
        live.lock().push(fresh);
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }

    let results = std::mem::take(&mut *results.lock());
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    let mut gaps: Vec<Duration> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    gaps.sort();
    let metrics = scrape(&frontend.url("/metrics")).await;
    let migrated = metric_value(&metrics, "switchyard_migrations", None);
    let refused = metric_value(&metrics, "switchyard_migrations", Some("outcome=\"limit\""))
        + metric_value(
            &metrics,
            "switchyard_migrations",
            Some("outcome=\"budget\""),
        );
    let latency = |q| {
        histogram_quantile(&metrics, "switchyard_migration_latency_seconds", q)
            .map_or("-".into(), |s| ms(Duration::from_secs_f64(s)))
    };
    detections.sort();
    eprintln!(
        "chaos: {} requests over {KILLS} kills ({} s), {} completed whole, {} failed; {} moves ({} refused); \
         migration latency p50 <= {}, p99 <= {}; longest chunk gap per stream p50 {} / p99 {} (fault-free run: {} / {}, {:.1} s); \
         crash detection p50 {} / max {}",
        results.len(),
        started.elapsed().as_secs(),
        results.len() - failures.len(),
        failures.len(),
        migrated as u64,
        refused as u64,
        latency(0.5),
        latency(0.99),
        ms(percentile(&gaps, 0.5)),
        ms(percentile(&gaps, 0.99)),
        ms(percentile(&reference_gaps, 0.5)),
        ms(percentile(&reference_gaps, 0.99)),
        reference_time.as_secs_f64(),
        ms(percentile(&detections, 0.5)),
        ms(*detections.last().unwrap()),
    );
    assert!(
        failures.is_empty(),
        "{} of {} failed, first: {}",
        failures.len(),
        results.len(),
        failures[0]
    );
    assert!(
        results.len() as u64 >= 2 * STREAMS,
        "only {} requests",
        results.len()
    );
    assert!(migrated > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_worker_loses_its_streams_gets_nothing_new_and_rejoins_after_sigcont() {
    let cluster = Cluster::start();
    let workers: Vec<Process> = (1..=3)
        .map(|n| {
            cluster.worker_with(
                &format!("worker-{n}"),
                &["--speedup-ratio", "1", "--lease-ttl", "30s"],
            )
        })
        .collect();
    let frontend = cluster.frontend_with(
        "frontend",
        0,
        &[
            ("SWITCHYARD_FRONTEND__HEALTH__RECOVERY_TIMEOUT", "2s"),
            ("SWITCHYARD_FRONTEND__HEALTH__RECOVERY_JITTER", "0"),
        ],
    );
    until_healthy(&frontend, 3).await;
    let url = frontend.url("/v1/completions");
    let reference = stream_all(&url, 30, 300).await;

    let run = tokio::spawn({
        let url = url.clone();
        async move { stream_all(&url, 30, 300).await }
    });
    // Frozen once its streams have their first tokens (a hang before the first token
    // waits out the first-token timeout) and long before they end: at real speed the run
    // takes about 2 s here, and the freeze comes at about 0.4 s. (At twice the speed an
    // optimised build finished the victim's streams before it was frozen, now and then.)
    tokio::time::sleep(Duration::from_millis(400)).await;
    let victim = busiest(&frontend).await;
    let frozen = workers.iter().find(|p| p.address == victim).unwrap();
    let id = record_of(&frontend, &victim).await.unwrap()["worker_id"]
        .as_u64()
        .unwrap();
    frozen.signal("STOP");
    let detected = until_status(&frontend, &victim, &["unhealthy"], Duration::from_secs(10)).await;
    let got = run.await.unwrap();
    for (i, ((g, _), (r, _))) in got.iter().zip(&reference).enumerate() {
        check_whole(&format!("stream {i}"), g, r, 300).unwrap();
    }
    eprintln!("hang (SIGSTOP) detected after {}", ms(detected));
    // The stall timeout's floor is a second (the mocker's inter-token latency is far less).
    assert!(detected < Duration::from_secs(3), "{detected:?}");

    // Nothing new goes to it while it is frozen.
    let before = sent_to(&frontend, id).await;
    for i in 0..10 {
        let (got, _) = stream_one(&url, &seeded_completion(MODEL, &prompt(i), i, 300)).await;
        check_whole(
            &format!("new request {i}"),
            &got,
            &reference[i as usize].0,
            300,
        )
        .unwrap();
    }
    assert_eq!(sent_to(&frontend, id).await, before);

    // Continued, it passes its half-open canary and takes requests again.
    frozen.signal("CONT");
    let rejoined = until_status(&frontend, &victim, &["healthy"], Duration::from_secs(15)).await;
    eprintln!("rejoined {} after SIGCONT", ms(rejoined));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_turning_out_wrong_tokens_is_caught_within_one_canary_interval() {
    let cluster = Cluster::start();
    let corrupt = cluster.worker_with(
        "worker-corrupt",
        &[
            "--speedup-ratio",
            "10",
            "--fault-admin-token",
            "chaos-token",
        ],
    );
    let _others: Vec<Process> = (2..=3)
        .map(|n| cluster.worker_with(&format!("worker-{n}"), &["--speedup-ratio", "10"]))
        .collect();
    let frontend = cluster.frontend_with(
        "frontend",
        0,
        &[("SWITCHYARD_FRONTEND__HEALTH__CANARY_INTERVAL", "2s")],
    );
    until_healthy(&frontend, 3).await;
    // Each has answered its first canary.
    eventually(Duration::from_secs(10), "first canaries", || async {
        let text = scrape(&frontend.url("/metrics")).await;
        let passed = metric_value(&text, "switchyard_canaries", Some("outcome=\"passed\""));
        if passed >= 3.0 {
            Ok(())
        } else {
            Err(format!("{passed} passed"))
        }
    })
    .await;
    // Without the token, the admin endpoint injects nothing.
    let faults = corrupt.url(switchyard_worker::faults::FAULTS_PATH);
    let refused = client()
        .post(&faults)
        .json(&json!({"fault": "corrupt"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let injected = client()
        .post(&faults)
        .bearer_auth("chaos-token")
        .json(&json!({"fault": "corrupt"}))
        .send()
        .await
        .unwrap();
    assert_eq!(injected.status(), 200);
    let found = until_status(
        &frontend,
        &corrupt.address,
        &["unhealthy"],
        Duration::from_secs(10),
    )
    .await;
    eprintln!("corruption detected after {}", ms(found));
    assert!(found <= Duration::from_secs(3), "{found:?}");
    let text = scrape(&frontend.url("/metrics")).await;
    assert!(
        metric_value(
            &text,
            "switchyard_worker_failures",
            Some("kind=\"wrong_output\"")
        ) >= 1.0
    );
    assert!(text.contains("switchyard_worker_breaker{"), "{text}");
}

/// A TCP proxy that can black-hole its traffic: once set, nothing is forwarded either way
/// and connections stay open (packets dropped on the floor, as by a broken network path).
struct BlackHoleProxy {
    address: String,
    holed: Arc<AtomicBool>,
}

impl BlackHoleProxy {
    async fn start(target: String) -> BlackHoleProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let holed = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&holed);
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (target, flag) = (target.clone(), Arc::clone(&flag));
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::join!(pipe(ri, wo, Arc::clone(&flag)), pipe(ro, wi, flag));
                });
            }
        });
        BlackHoleProxy { address, holed }
    }
}

/// Copies `from` to `to` until black-holed, then holds both ends open forever.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    holed: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        if holed.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        let n = match tokio::time::timeout(Duration::from_millis(20), from.read(&mut buffer)).await
        {
            Err(_) => continue,
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(n)) => n,
        };
        if holed.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_worker_is_out_within_the_stall_timeout_and_waited_on_once_at_most() {
    let cluster = Cluster::start();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let proxy = BlackHoleProxy::start(format!("127.0.0.1:{port}")).await;
    let listen = format!("127.0.0.1:{port}");
    let holed_worker = cluster.worker_with(
        "worker-behind-proxy",
        &[
            "--speedup-ratio",
            "2",
            "--lease-ttl",
            "30s",
            "--listen",
            &listen,
            "--advertise",
            &proxy.address,
        ],
    );
    assert_eq!(holed_worker.address, proxy.address);
    let _others: Vec<Process> = (2..=3)
        .map(|n| cluster.worker_with(&format!("worker-{n}"), &["--speedup-ratio", "2"]))
        .collect();
    let frontend = cluster.frontend("frontend", 0);
    until_healthy(&frontend, 3).await;
    let url = frontend.url("/v1/completions");
    let reference = stream_all(&url, 30, 300).await;
    let id = record_of(&frontend, &proxy.address).await.unwrap()["worker_id"]
        .as_u64()
        .unwrap();

    let run = tokio::spawn({
        let url = url.clone();
        async move { stream_all(&url, 30, 300).await }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        sent_to(&frontend, id).await > 0.0,
        "no stream went through the proxy"
    );
    proxy.holed.store(true, Ordering::Relaxed);
    let out = until_status(
        &frontend,
        &proxy.address,
        &["unhealthy"],
        Duration::from_secs(10),
    )
    .await;
    let got = run.await.unwrap();
    for (i, ((g, _), (r, _))) in got.iter().zip(&reference).enumerate() {
        check_whole(&format!("stream {i}"), g, r, 300).unwrap();
    }
    eprintln!("black-holed worker out of routing after {}", ms(out));
    assert!(out < Duration::from_secs(3), "{out:?}");
    // Its lease is alive (it is listed), yet nothing goes its way any more.
    assert_eq!(status_of(&frontend, &proxy.address).await, "unhealthy");
    let before = sent_to(&frontend, id).await;
    let started = Instant::now();
    let requests = (0..12).map(|i| {
        let url = url.clone();
        async move { stream_one(&url, &seeded_completion(MODEL, &prompt(i), i, 50)).await }
    });
    for (got, _) in futures::future::join_all(requests).await {
        assert!(got.errors.is_empty() && got.done);
    }
    assert_eq!(sent_to(&frontend, id).await, before);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_three_of_four_workers_under_load_sheds_best_effort_and_serves_premium() {
    let cluster = Cluster::start();
    let mut workers: Vec<Process> = (1..=4)
        .map(|n| cluster.worker_with(&format!("worker-{n}"), &["--speedup-ratio", "2"]))
        .collect();
    let frontend = cluster.frontend("frontend", 0);
    until_healthy(&frontend, 4).await;
    let url = frontend.url("/v1/completions");
    // Load on every worker, then three of them die under it.
    let load = tokio::spawn({
        let url = url.clone();
        async move { stream_all(&url, 40, 300).await }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    for mut dead in workers.drain(1..) {
        dead.kill9();
    }
    // The streams they held finish on the survivor.
    for (i, (got, _)) in load.await.unwrap().iter().enumerate() {
        assert!(got.errors.is_empty() && got.done, "stream {i}: {got:?}");
    }
    let ask = |priority: &'static str, i: u64| {
        let url = url.clone();
        async move {
            let body = json!({
                "model": MODEL, "prompt": prompt(i), "max_tokens": 20,
                "switchyard": {"priority": priority},
            });
            let response = client().post(&url).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").cloned();
            (priority, status, retry_after)
        }
    };
    let asks = (0..20).map(|i| ask(if i % 2 == 0 { "premium" } else { "best_effort" }, i));
    let outcomes = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(asks))
        .await
        .expect("nothing hangs");
    for (priority, status, retry_after) in outcomes {
        if priority == "premium" {
            assert_eq!(status, 200);
        } else {
            assert_eq!(status, 429);
            assert!(retry_after.is_some());
        }
    }
}
