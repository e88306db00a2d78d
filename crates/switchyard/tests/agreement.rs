//! The servers and the simulator run the same routing core and the same engine: a trace
//! slice through `serve`'s code path (the frontend shell, in-process planes, mocker workers on
//! the step driver) on tokio's paused clock, and through `switchyard sim`, gives the same
//! routing decisions, the same tokens per request, and the same times.
//!
//! Tokio's timer works in whole milliseconds, so the engines run 1,000 times slower than
//! the model (speedup 0.001) on both sides, arrivals likewise: a millisecond of rounding is
//! then a microsecond of model time, and the tolerance below is stated in those terms.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::Prompt;
use switchyard_core::{Priority, WorkerId, WorkerKey};
use switchyard_frontend::pipeline::{Piece, Prepared};
use switchyard_frontend::preprocess::Preprocessor;
use switchyard_frontend::routing::RoutingService;
use switchyard_frontend::{Frontend, FrontendConfig, server};
use switchyard_mocker::{EngineArgs, PerfModel};
use switchyard_runtime::local::{
    LocalDiscovery, LocalEventPlane, LocalKvSnapshots, LocalRequestPlane,
};
use switchyard_sim::{PreparedWorkload, PromptRequest, SimConfig, simulate};
use switchyard_worker::{EngineConfig, MockerConfig, Serving, Worker, WorkerConfig, WorkerPlanes};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Model time runs this many times slower on both sides.
const SLOWDOWN: u32 = 1000;
/// The built-in tokenizer's end of sequence, as `serve` passes it to engines.
const EOS: u32 = 257;

/// A slice with shared prefixes (four families of system prompts and conversations that
/// come back), prompts of 40 to 1,500 tokens, outputs of 4 to 120, arrivals at uneven
/// instants.
fn workload(n: usize, seed: u64) -> Vec<PromptRequest> {
    let mut x = seed;
    let mut next = move |m: u64| {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) % m
    };
    let families: Vec<Vec<u32>> = (0..4)
        .map(|f| {
            (0..(200 + 300 * f))
                .map(|t| 300 + (t * 7 + f * 1000) % 20_000)
                .collect()
        })
        .collect();
    let mut at_us = 0u64;
    (0..n)
        .map(|i| {
            at_us += 1 + next(40_000);
            let family = &families[next(4) as usize];
            let mut tokens: Vec<u32> =
                family[..family.len() / 2 + next(family.len() as u64 / 2) as usize].to_vec();
            tokens.extend(
                (0..40 + next(400) as u32).map(|t| 300 + (t * 31 + i as u32 * 977) % 30_000),
            );
            PromptRequest {
                arrival: Duration::from_micros(at_us) * SLOWDOWN,
                prompt: Prompt::tokens(tokens),
                max_tokens: 4 + next(117) as u32,
                priority: Priority::Standard,
            }
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    worker: WorkerKey,
    completion_tokens: u32,
    cached_tokens: u32,
    /// From arrival to the last token.
    e2e: Duration,
}

fn engine_args(max_num_seqs: u32) -> EngineArgs {
    EngineArgs {
        num_gpu_blocks: 1024,
        max_num_seqs,
        speedup_ratio: 1.0 / f64::from(SLOWDOWN),
        ..EngineArgs::default()
    }
}

/// Runs the requests through the frontend shell on in-process planes; returns each one's
/// outcome and the mean time to first token the frontend measured.
async fn serve(
    requests: &[PromptRequest],
    workers: u32,
    config: &FrontendConfig,
    args: EngineArgs,
) -> (Vec<Outcome>, Duration) {
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let discovery = Arc::new(LocalDiscovery::new());
    let events = Arc::new(LocalEventPlane::new());
    let plane = LocalRequestPlane::new();
    let snapshots = LocalKvSnapshots::new();
    let routing = RoutingService::new(config.model.clone(), config.routing()).with_resync(
        Arc::new(snapshots.clone()),
        tracker.clone(),
        cancel.clone(),
    );
    let frontend = Arc::new(Frontend::new(
        config.clone(),
        Arc::new(Preprocessor::builtin(1 << 20)),
        Arc::new(routing),
        Arc::new(plane.clone()),
    ));
    server::start_background(
        &frontend,
        discovery.as_ref(),
        events.as_ref(),
        None,
        &tracker,
        &cancel,
    )
    .await
    .unwrap();
    let planes = WorkerPlanes { discovery, events };
    let worker_config = WorkerConfig {
        model: config.model.clone(),
        role: Default::default(),
        engine: EngineConfig::Mocker(MockerConfig {
            args,
            seed: 0,
            ..MockerConfig::default()
        }),
        faults: Default::default(),
    };
    let mut running = Vec::new();
    for i in 0..workers {
        let serving = Serving::Local {
            requests: plane.clone(),
            snapshots: snapshots.clone(),
        };
        running.push(
            Worker::start(
                WorkerId(u64::from(i) + 1),
                &worker_config,
                &planes,
                serving,
                &tracker,
                cancel.clone(),
            )
            .await
            .unwrap(),
        );
    }
    // Discovery and the initial resynchronisation settle before the first arrival.
    tokio::time::sleep(Duration::from_secs(1)).await;
    frontend.set_next_request_id(0);
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = requests
        .iter()
        .map(|r| {
            let frontend = Arc::clone(&frontend);
            let prepared = Prepared {
                prompt: r.prompt.clone(),
                max_tokens: r.max_tokens,
                sampling: switchyard_core::protocol::SamplingParams {
                    stop_token_ids: vec![EOS],
                    ..Default::default()
                },
                ..Prepared::text(Vec::new(), r.max_tokens)
            };
            let arrival = start + r.arrival;
            tokio::spawn(async move {
                tokio::time::sleep_until(arrival).await;
                let dispatched = frontend.generate(prepared).await.unwrap();
                let mut generation = dispatched.generation;
                let mut usage = None;
                while let Some(piece) = generation.next().await {
                    if let Piece::Finished { usage: u, .. } = piece.unwrap() {
                        usage = Some(u);
                    }
                }
                let usage = usage.unwrap();
                Outcome {
                    worker: dispatched.worker,
                    completion_tokens: usage.completion_tokens,
                    cached_tokens: usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
                    e2e: tokio::time::Instant::now() - arrival,
                }
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let text = frontend.metrics.render(&frontend.routing);
    // Series carry the model label: `name{model="..."} value`.
    let metric = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.split(['{', ' ']).next() == Some(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    let ttft = metric("switchyard_time_to_first_token_seconds_sum")
        / metric("switchyard_time_to_first_token_seconds_count");
    drop(running);
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    (outcomes, Duration::from_secs_f64(ttft))
}

fn sim(
    requests: &[PromptRequest],
    workers: u32,
    config: &FrontendConfig,
    args: EngineArgs,
) -> (Vec<Outcome>, Duration, switchyard_sim::SimReport) {
    let workload = PreparedWorkload::from_prompts(requests, args.block_size).unwrap();
    let sim_config = SimConfig {
        encoders: None,
        workers,
        engine: args,
        perf: vec![PerfModel::Polynomial],
        routing: config.routing(),
        event_delay: Duration::ZERO,
        eos_token_ids: vec![EOS],
        seed: config.router.seed,
        record_requests: true,
        lazy_engines: true,
        faults: Default::default(),
        planner: None,
        sla_targets: None,
        disagg: None,
    };
    let report = simulate(&sim_config, &workload, config.router.policy, &mut |_| {}).unwrap();
    let outcomes = report
        .request_records
        .iter()
        .map(|r| Outcome {
            worker: r.worker.unwrap(),
            completion_tokens: r.output_tokens,
            cached_tokens: r.cached_tokens,
            e2e: r.finished.unwrap() - r.arrival,
        })
        .collect();
    let ttft = Duration::from_secs_f64(report.ttft_ms.mean / 1e3);
    (outcomes, ttft, report)
}

/// A millisecond of timer rounding on the serving side, at the slowdown: a microsecond of
/// model time, per request.
fn assert_agree(served: &[Outcome], simulated: &[Outcome]) {
    assert_eq!(served.len(), simulated.len());
    // Decisions and tokens first: a different decision shows as a time difference in
    // other requests too.
    for (i, (a, b)) in served.iter().zip(simulated).enumerate() {
        assert_eq!(
            (a.worker, a.completion_tokens, a.cached_tokens),
            (b.worker, b.completion_tokens, b.cached_tokens),
            "request {i}: served {a:?}, simulated {b:?}"
        );
    }
    for (i, (a, b)) in served.iter().zip(simulated).enumerate() {
        assert!(
            a.e2e.abs_diff(b.e2e) <= Duration::from_millis(2),
            "request {i}: end to end {:?} served, {:?} simulated",
            a.e2e,
            b.e2e
        );
    }
}

/// The frontend's settings, every duration slowed down like the engines.
fn frontend_config() -> FrontendConfig {
    let mut config = FrontendConfig {
        model: "m".into(),
        ..FrontendConfig::default()
    };
    config.router.request_ttl *= SLOWDOWN;
    config.admission.queue_timeout *= SLOWDOWN;
    // The simulator's default: queue-length rules only (its own test covers the target).
    config.admission.wait_target = None;
    let h = &mut config.health;
    h.stall_floor *= SLOWDOWN;
    h.first_token_timeout *= SLOWDOWN;
    h.recovery_timeout *= SLOWDOWN;
    // The simulator sends no canaries; they would change the engines' caches and loads.
    h.canary_interval = Duration::ZERO;
    config.degradation.ttft_target *= SLOWDOWN;
    config.degradation.lost_memory *= SLOWDOWN;
    let m = &mut config.migration;
    m.dispatch_timeout *= SLOWDOWN;
    m.backoff_initial *= SLOWDOWN;
    m.backoff_max *= SLOWDOWN;
    config
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn serve_and_sim_route_and_time_a_trace_alike() {
    let requests = workload(120, 7);
    let config = frontend_config();
    let args = engine_args(64);
    let (served, served_ttft) = serve(&requests, 4, &config, args).await;
    let (simulated, sim_ttft, report) = sim(&requests, 4, &config, args);
    assert_eq!(report.completed, 120);
    // The slice exercises what matters: cache reuse, several workers, end of sequence.
    assert!(report.cached_tokens > 0);
    assert!(
        served
            .iter()
            .map(|o| o.worker)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == 4
    );
    assert_agree(&served, &simulated);
    // Mean time to first token, as the frontend's histogram and the simulator's report
    // have it (the report's histogram keeps 3 significant digits).
    let tolerance = sim_ttft / 500 + Duration::from_millis(2);
    assert!(
        served_ttft.abs_diff(sim_ttft) <= tolerance,
        "mean TTFT {served_ttft:?} served, {sim_ttft:?} simulated"
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn serve_and_sim_queue_and_release_alike_under_overload() {
    // Two workers that each run four requests at once, and a burst: admission queues, and
    // completions release the queued requests in the same order on both sides.
    let requests: Vec<PromptRequest> = workload(60, 11)
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.arrival = Duration::from_micros(1 + 2_000 * i as u64) * SLOWDOWN;
            r
        })
        .collect();
    let config = frontend_config();
    let args = engine_args(4);
    let (served, _) = serve(&requests, 2, &config, args).await;
    let (simulated, _, report) = sim(&requests, 2, &config, args);
    assert!(report.queued > 10, "the burst queues: {report:?}");
    assert_eq!(report.completed, 60);
    assert_agree(&served, &simulated);
}
