//! `switchyard planner --connector local` end to end: a frontend, the planner starting and
//! stopping real worker processes under a load ramp up and down, and no request lost.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::client;
use support::cluster::*;
use support::process::Process;

const MODEL: &str = "switchyard-mock";

/// Kills the workers the planner left running (they are not this test's children).
struct Leftovers(PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for pid in listed(&self.0) {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
        }
    }
}

fn listed(state: &Path) -> Vec<u64> {
    std::fs::read_to_string(state)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| {
            v["workers"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
        })
        .unwrap_or_default()
}

/// The planner with the local connector, watching the fleet through `frontend`'s admin
/// listener, or through the planes when `None`.
fn planner(cluster: &Cluster, frontend: Option<&Process>, state: &Path, log: &Path) -> Process {
    let mut args = vec!["planner".to_string()];
    match frontend {
        Some(frontend) => args.extend([
            "--frontend".to_string(),
            format!("http://{}", frontend.admin.clone().unwrap()),
        ]),
        None => args.extend(cluster.planes()),
    }
    args.extend(
        [
            "--connector",
            "local",
            "--mode",
            "load",
            "--metric-interval",
            "500ms",
            "--adjustment-interval",
            "3s",
            "--min-workers",
            "1",
            "--max-workers",
            "3",
            "--state-file",
            state.to_str().unwrap(),
            "--decision-log",
            log.to_str().unwrap(),
            "--metrics-port",
            "0",
            "--",
        ]
        .map(str::to_string),
    );
    args.extend(cluster.planes());
    args.extend(
        [
            "--lease-ttl",
            "2s",
            "--max-num-seqs",
            "2",
            "--speedup-ratio",
            "1",
        ]
        .map(str::to_string),
    );
    Process::spawn("planner", &args, cluster.dir.path())
}

/// Clients asking for 40 tokens each, back to back, until `stop`; every answer checked.
fn clients(
    frontend: &Process,
    n: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(u32, Vec<String>)>> {
    clients_of(&[frontend], n, false, stop)
}

/// `n` clients spread over `frontends`; with `streams`, every other one streams its answers
/// (a stream still running on a worker being drained away must end whole).
fn clients_of(
    frontends: &[&Process],
    n: usize,
    streams: bool,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(u32, Vec<String>)>> {
    (0..n)
        .map(|i| {
            let url = frontends[i % frontends.len()].url("/v1/completions");
            let stream = streams && i % 2 == 1;
            let stop = Arc::clone(stop);
            tokio::spawn(async move {
                let (mut done, mut errors) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let mut body = json!({
                        "model": MODEL,
                        "prompt": format!("client {i} request {done}: tell me about planners"),
                        "max_tokens": 40,
                        "ignore_eos": true,
                    });
                    if stream {
                        body["stream"] = json!(true);
                        body["stream_options"] = json!({"include_usage": true});
                    }
                    match client().post(&url).json(&body).send().await {
                        Ok(r) if stream => {
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            let streamed = support::parse_stream(&text);
                            if status != 200
                                || !streamed.errors.is_empty()
                                || streamed.completion_tokens != Some(40)
                                || !streamed.done
                            {
                                errors.push(format!("stream {status}: {text}"));
                            }
                        }
                        Ok(r) => {
                            let status = r.status();
                            let v: Value = r.json().await.unwrap_or_default();
                            if status != 200 || v["usage"]["completion_tokens"] != 40 {
                                errors.push(format!("{status}: {v}"));
                            }
                        }
                        Err(e) => errors.push(e.to_string()),
                    }
                    done += 1;
                }
                (done, errors)
            })
        })
        .collect()
}

async fn stop_clients(
    stop: &Arc<AtomicBool>,
    handles: Vec<tokio::task::JoinHandle<(u32, Vec<String>)>>,
) -> u32 {
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for h in handles {
        let (done, errors) = h.await.unwrap();
        assert!(errors.is_empty(), "requests failed: {errors:?}");
        total += done;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_connector_follows_a_ramp_up_and_down_without_losing_a_request() {
    let cluster = Cluster::start();
    let frontend = cluster.frontend("frontend", 0);
    let state = cluster.dir.path().join("planner-state.json");
    let log = cluster.dir.path().join("decisions.jsonl");
    let _leftovers = Leftovers(state.clone());
    let mut first = planner(&cluster, Some(&frontend), &state, &log);
    // It starts its minimum: one worker.
    wait_for_workers(&frontend, 1, Duration::from_secs(20)).await;

    // Load: 8 clients on engines that run 2 requests at a time; the queues grow.
    let stop = Arc::new(AtomicBool::new(false));
    let busy = clients(&frontend, 8, &stop);
    wait_for_workers(&frontend, 3, Duration::from_secs(60)).await;
    assert_eq!(listed(&state).len(), 3);
    // The budget holds: no fourth.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(workers_seen(&frontend).await, 3);
    let served = stop_clients(&stop, busy).await;

    // Light load while the fleet shrinks: every request of it completes, though the
    // workers it runs on are drained away under it.
    let stop = Arc::new(AtomicBool::new(false));
    let light = clients(&frontend, 1, &stop);
    wait_for_workers(&frontend, 1, Duration::from_secs(90)).await;
    let served_light = stop_clients(&stop, light).await;
    assert!(served > 0 && served_light > 0);
    assert_eq!(listed(&state).len(), 1);

    let decisions = decisions(&log);
    let asked = asked(&decisions);
    // Up one at a time, then down one at a time.
    assert!(asked.starts_with(&[2, 3]), "{asked:?}");
    assert!(asked.ends_with(&[2, 1]), "{asked:?}");

    // Its metrics say what it did.
    let text = support::scrape(&first.url("/metrics")).await;
    let value = |name: &str, label: Option<&str>| support::metric_value(&text, name, label);
    assert_eq!(
        value("switchyard_planner_replicas", Some("role=\"aggregated\"")),
        1.0
    );
    assert!(
        value(
            "switchyard_planner_decisions_total",
            Some("outcome=\"scale_up\"")
        ) >= 2.0
    );
    assert!(
        value(
            "switchyard_planner_decisions_total",
            Some("outcome=\"scale_down\"")
        ) >= 2.0
    );
    assert_eq!(value("switchyard_planner_scaling_errors_total", None), 0.0);

    // A planner restarted on the same state file adopts the worker left running.
    first.sigterm();
    assert!(first.wait(Duration::from_secs(10)).success());
    let pid = listed(&state);
    let second = planner(&cluster, Some(&frontend), &state, &log);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(listed(&state), pid);
    assert_eq!(workers_seen(&frontend).await, 1);
    drop(second);
}

/// The decision log's lines.
fn decisions(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The replica counts the decisions asked for, in order.
fn asked(decisions: &[Value]) -> Vec<u64> {
    decisions
        .iter()
        .flat_map(|d| d["actions"].as_array().unwrap().clone())
        .map(|a| a["replicas"].as_u64().unwrap())
        .collect()
}

/// Every generation request a frontend answered, by status (its `/metrics`).
async fn answered(frontend: &Process) -> (f64, f64) {
    let text = support::scrape(&frontend.url("/metrics")).await;
    let (mut ok, mut not_ok) = (0.0, 0.0);
    for line in text.lines().filter(|l| {
        l.starts_with("switchyard_http_requests_total{")
            && (l.contains("route=\"/v1/completions\"")
                || l.contains("route=\"/v1/chat/completions\""))
    }) {
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        if line.contains("status=\"200\"") {
            ok += value;
        } else {
            not_ok += value;
        }
    }
    (ok, not_ok)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_the_planes_it_sums_two_frontends_and_scales_down_under_streams_without_a_loss() {
    let cluster = Cluster::start();
    let a = cluster.frontend("frontend-a", 0);
    let b = cluster.frontend("frontend-b", 0);
    let state = cluster.dir.path().join("planner-state.json");
    let log = cluster.dir.path().join("decisions.jsonl");
    let _leftovers = Leftovers(state.clone());
    // No frontend named: the workers from etcd, their loads and both frontends' traffic
    // and queues from NATS.
    let _planner = planner(&cluster, None, &state, &log);
    // Both frontends know the first worker before any client asks either of them.
    wait_for_workers(&a, 1, Duration::from_secs(20)).await;
    wait_for_workers(&b, 1, Duration::from_secs(20)).await;

    // Load through both frontends: each holds part of the backlog in its queue.
    let stop = Arc::new(AtomicBool::new(false));
    let busy = clients_of(&[&a, &b], 8, false, &stop);
    wait_for_workers(&a, 3, Duration::from_secs(60)).await;
    assert_eq!(listed(&state).len(), 3);
    let served = stop_clients(&stop, busy).await;

    // Two clients, one streaming, while the fleet shrinks to one worker (which runs two
    // requests at a time: no queue, so the planner keeps going down).
    let stop = Arc::new(AtomicBool::new(false));
    let light = clients_of(&[&a, &b], 2, true, &stop);
    wait_for_workers(&a, 1, Duration::from_secs(90)).await;
    let served_light = stop_clients(&stop, light).await;
    assert!(served > 0 && served_light > 0);
    assert_eq!(listed(&state).len(), 1);

    // The frontends answered every request they were sent, every one with a 200.
    let (ok_a, not_ok_a) = answered(&a).await;
    let (ok_b, not_ok_b) = answered(&b).await;
    assert_eq!((not_ok_a, not_ok_b), (0.0, 0.0));
    assert_eq!(ok_a + ok_b, f64::from(served + served_light));

    let decisions = decisions(&log);
    let asked = asked(&decisions);
    assert!(asked.starts_with(&[2, 3]), "{asked:?}");
    assert!(asked.ends_with(&[2, 1]), "{asked:?}");
    // It counted the traffic of both frontends: more requests than either one answered
    // (though not those after its last decision).
    let counted: f64 = decisions
        .iter()
        .map(|d| d["interval"]["traffic"]["requests"].as_f64().unwrap())
        .sum();
    assert!(
        counted > ok_a.max(ok_b) && counted <= ok_a + ok_b,
        "counted {counted}, answered {ok_a} + {ok_b}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_noop_connector_only_decides_and_bad_settings_are_named() {
    let cluster = Cluster::start();
    let _worker = cluster.worker(1, "10");
    let frontend = cluster.frontend("frontend", 0);
    wait_for_workers(&frontend, 1, Duration::from_secs(20)).await;
    let log = cluster.dir.path().join("noop.jsonl");
    let admin = frontend.admin.clone().unwrap();
    let args: Vec<String> = [
        "planner",
        "--frontend",
        &format!("http://{admin}"),
        "--min-workers",
        "2",
        "--metric-interval",
        "200ms",
        "--adjustment-interval",
        "1s",
        "--decision-log",
        log.to_str().unwrap(),
    ]
    .map(str::to_string)
    .to_vec();
    let mut noop = Process::spawn("planner-noop", &args, cluster.dir.path());
    eventually(Duration::from_secs(15), "three decisions", || async {
        let n = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count();
        if n >= 3 { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    // It wants a second worker (its minimum) but starts nothing.
    let first: Value = serde_json::from_str(
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["replicas"]["aggregated"], 2, "{first}");
    assert_eq!(workers_seen(&frontend).await, 1);
    noop.sigterm();
    assert!(noop.wait(Duration::from_secs(10)).success());

    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .arg("planner")
            .args(args)
            .output()
            .unwrap()
    };
    let frontend_url = format!("http://{admin}");
    let out = run(&["--frontend", &frontend_url, "--connector", "local"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("arguments after `--`"));
    let out = run(&[
        "--frontend",
        &frontend_url,
        "--min-workers",
        "5",
        "--max-workers",
        "2",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("planner.budget.min_gpus"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["--frontend", &frontend_url, "--connector", "kubernetes"]);
    assert!(!out.status.success());
    let expected = if cfg!(feature = "kubernetes") {
        "--k8s-deployment"
    } else {
        "built without the kubernetes connector"
    };
    assert!(String::from_utf8_lossy(&out.stderr).contains(expected));
    // Neither a frontend nor the planes to watch, or half the planes.
    let out = run(&["--min-workers", "1"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--frontend http://HOST:PORT"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["--discovery", "etcd://127.0.0.1:9"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--event-plane nats://HOST:PORT"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["--frontend", "http://127.0.0.1:9"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/v1/internal/workers"));
}

/// The state file's process ids of one pool (`workers`, `prefill`, `decode`).
fn listed_pool(state: &Path, pool: &str) -> Vec<u64> {
    std::fs::read_to_string(state)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| {
            v[pool]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disaggregated_fleet_is_planned_and_started_pool_by_pool() {
    let cluster = Cluster::start();
    let frontend = cluster.frontend("frontend", 0);
    let state = cluster.dir.path().join("disagg.json");
    let log = cluster.dir.path().join("disagg.jsonl");
    // Whatever happens, the workers it started go with the test.
    struct Pools(PathBuf);
    impl Drop for Pools {
        fn drop(&mut self) {
            for pool in ["prefill", "decode"] {
                for pid in listed_pool(&self.0, pool) {
                    let _ = std::process::Command::new("kill")
                        .args(["-9", &pid.to_string()])
                        .status();
                }
            }
        }
    }
    let _pools = Pools(state.clone());
    let admin = frontend.admin.clone().unwrap();
    let mut args: Vec<String> = [
        "planner",
        "--frontend",
        &format!("http://{admin}"),
        "--connector",
        "local",
        "--disagg",
        "--mode",
        "load",
        "--metric-interval",
        "500ms",
        "--adjustment-interval",
        "2s",
        "--min-workers",
        "1",
        "--max-workers",
        "4",
        "--state-file",
        state.to_str().unwrap(),
        "--decision-log",
        log.to_str().unwrap(),
        "--",
    ]
    .map(str::to_string)
    .to_vec();
    args.extend(cluster.planes());
    args.extend(["--lease-ttl", "2s", "--speedup-ratio", "20"].map(str::to_string));
    let mut planner = Process::spawn("planner", &args, cluster.dir.path());

    // One worker of each pool, started with its role, listed by the frontend as such.
    let listing = frontend.url("/v1/internal/workers");
    eventually(
        Duration::from_secs(20),
        "a prefill and a decode worker",
        || {
            let listing = listing.clone();
            async move {
                let listed = get_json(&listing).await;
                let mut roles: Vec<String> = listed
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|w| w["role"].as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                roles.sort();
                if roles == ["decode", "prefill"] {
                    Ok(())
                } else {
                    Err(format!("{roles:?}"))
                }
            }
        },
    )
    .await;
    assert_eq!(listed_pool(&state, "prefill").len(), 1);
    assert_eq!(listed_pool(&state, "decode").len(), 1);
    assert!(listed_pool(&state, "workers").is_empty());

    // A long prompt goes through the pair.
    let body = json!({
        "model": MODEL,
        "prompt": "A long prompt for the planned pools to share between them. ".repeat(80),
        "max_tokens": 8,
        "ignore_eos": true,
    });
    let response = client()
        .post(frontend.url("/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let metrics = support::scrape(&frontend.url("/metrics")).await;
    assert_eq!(
        support::metric_value(
            &metrics,
            "switchyard_disagg_prefills",
            Some("outcome=\"remote\"")
        ),
        1.0,
        "{metrics}"
    );
    // Its decisions name both pools.
    eventually(Duration::from_secs(15), "a decision", || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        match text.lines().next() {
            Some(line) => {
                let d: Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
                if d["replicas"]["prefill"] == 1 && d["replicas"]["decode"] == 1 {
                    Ok(())
                } else {
                    Err(d.to_string())
                }
            }
            None => Err("none yet".into()),
        }
    })
    .await;
    planner.sigterm();
    assert!(planner.wait(Duration::from_secs(10)).success());
}
