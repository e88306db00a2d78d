//! Runs one scenario both ways: through `serve`'s deployment (`deploy::start_local`: the
//! frontend, in-process planes, mocker and encoder workers) on tokio's paused clock, and
//! through the simulator with the settings `switchyard sim --config` takes from the same
//! configuration; and compares what happened to each request.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use switchyard::config::Config;
use switchyard::replay::{SimOnly, sim_config};
use switchyard_core::WorkerKey;
use switchyard_core::trace::session::{After, Turn};
use switchyard_frontend::Frontend;
use switchyard_frontend::media::MediaItem;
use switchyard_frontend::pipeline::{Piece, Prepared};
use switchyard_sim::{FaultConfig, FaultKind, PreparedWorkload, PromptRequest, ScheduledFault};
use switchyard_worker::faults::Fault;

/// Model time runs this many times slower on both sides: tokio's timer works in whole
/// milliseconds, so a millisecond of rounding is a microsecond of model time.
pub const SLOWDOWN: u32 = 1000;
/// The `bytes` tokenizer's end of sequence, as the frontend passes it to engines.
pub const EOS: u32 = 257;

/// A worker failing during the run (a crash or a hang): the worker (numbered from 1) and
/// when, from the first arrival's reference instant.
#[derive(Debug, Clone, Copy)]
pub struct WorkerFault {
    pub worker: u32,
    pub at: Duration,
    pub kind: FaultKind,
}

/// What happened to one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Served {
        /// The worker it ended on.
        worker: WorkerKey,
        completion_tokens: u32,
        cached_tokens: u32,
        /// From arrival to its first token, and to its end.
        ttft: Duration,
        e2e: Duration,
    },
    /// Refused or given up, with the reason's name.
    Refused(String),
}

/// The deployment's configuration for a scenario: every duration of the frontend slowed
/// down like the engines, canaries off (the simulator sends none).
pub fn config(workers: u32, max_num_seqs: u32) -> Config {
    let mut config = Config::default();
    let f = &mut config.frontend;
    f.model = "m".into();
    f.port = 0;
    f.builtin_tokenizer = switchyard_frontend::config::BuiltinTokenizer::Bytes;
    f.router.request_ttl *= SLOWDOWN;
    f.admission.queue_timeout *= SLOWDOWN;
    // Queue-length rules only: the wait target's release-rate window is wall time.
    f.admission.wait_target = None;
    let h = &mut f.health;
    h.stall_floor *= SLOWDOWN;
    h.first_token_timeout *= SLOWDOWN;
    h.recovery_timeout *= SLOWDOWN;
    h.canary_interval = Duration::ZERO;
    f.degradation.ttft_target *= SLOWDOWN;
    f.degradation.lost_memory *= SLOWDOWN;
    f.degradation.escalation_hold *= SLOWDOWN;
    f.degradation.replacement_window *= SLOWDOWN;
    let m = &mut f.migration;
    m.dispatch_timeout *= SLOWDOWN;
    m.backoff_initial *= SLOWDOWN;
    m.backoff_max *= SLOWDOWN;
    // Jitter draws from different generators on the two sides.
    m.backoff_jitter = 0.0;
    config.workers.count = workers;
    let args = &mut config.workers.mocker.args;
    args.num_gpu_blocks = 1024;
    args.max_num_seqs = max_num_seqs;
    args.speedup_ratio = 1.0 / f64::from(SLOWDOWN);
    config.workers.mocker.load_report_interval *= SLOWDOWN;
    config
}

/// Runs the requests through `serve`'s deployment of `config`; returns each one's outcome.
pub async fn serve(
    requests: &[PromptRequest],
    config: &Config,
    fault: Option<WorkerFault>,
) -> Vec<Outcome> {
    serve_sessions(requests, &[], config, fault).await
}

/// [`serve`], with request `i` sent `after[i]`'s wait after the requests it names end (a
/// session's turns, closed loop), when `after` names any; the others at their arrival.
pub async fn serve_sessions(
    requests: &[PromptRequest],
    after: &[Option<After>],
    config: &Config,
    fault: Option<WorkerFault>,
) -> Vec<Outcome> {
    let deployment = switchyard::deploy::start_local(config.clone())
        .await
        .unwrap();
    let frontend = Arc::clone(&deployment.frontend);
    // Discovery and the initial resynchronisation settle before the first arrival.
    tokio::time::sleep(Duration::from_secs(1)).await;
    frontend.set_next_request_id(0);
    let start = tokio::time::Instant::now();
    if let Some(fault) = fault {
        let faults = deployment.workers[fault.worker as usize - 1]
            .faults()
            .clone();
        let kind = match fault.kind {
            FaultKind::Crash => Fault::Crash,
            FaultKind::Hang => Fault::Hang,
            FaultKind::Drain => unimplemented!("a drain is not a worker fault"),
        };
        tokio::spawn(async move {
            tokio::time::sleep_until(start + fault.at).await;
            faults.start(kind);
        });
    }
    // Each request's end, for the turns waiting for it.
    let ends: Vec<_> = requests
        .iter()
        .map(|_| tokio::sync::watch::channel(None::<tokio::time::Instant>))
        .collect();
    let tasks: Vec<_> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let frontend = Arc::clone(&frontend);
            let request = r.clone();
            let after = after.get(i).cloned().flatten();
            let parents: Vec<_> = after
                .iter()
                .flat_map(|a| &a.parents)
                .map(|&p| ends[p as usize].1.clone())
                .collect();
            let end = ends[i].0.clone();
            tokio::spawn(async move {
                let arrival = match &after {
                    None => start + request.arrival,
                    Some(after) => {
                        let mut last = start;
                        for mut parent in parents {
                            let ended = *parent.wait_for(Option::is_some).await.unwrap();
                            last = last.max(ended.unwrap_or(start));
                        }
                        last + after.wait()
                    }
                };
                tokio::time::sleep_until(arrival).await;
                let outcome = one(&frontend, &request).await;
                end.send_replace(Some(tokio::time::Instant::now()));
                match outcome {
                    Ok((worker, completion_tokens, cached_tokens, first)) => Outcome::Served {
                        worker,
                        completion_tokens,
                        cached_tokens,
                        ttft: first - arrival,
                        e2e: tokio::time::Instant::now() - arrival,
                    },
                    Err(code) => Outcome::Refused(code),
                }
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    deployment.shutdown(Duration::from_secs(1)).await.unwrap();
    outcomes
}

/// One request, as the chat handler takes it once converted: its media to the encode
/// stage, then the pipeline. Returns its worker, completion and cached tokens and when its
/// first piece came, or the error code it got.
async fn one(
    frontend: &Arc<Frontend>,
    r: &PromptRequest,
) -> Result<(WorkerKey, u32, u32, tokio::time::Instant), String> {
    let mut prepared = Prepared {
        prompt: r.prompt.clone(),
        max_tokens: r.max_tokens,
        priority: Some(r.priority),
        sampling: switchyard_core::protocol::SamplingParams {
            stop_token_ids: vec![EOS],
            ..Default::default()
        },
        ..Prepared::text(Vec::new(), r.max_tokens)
    };
    if !r.prompt.media.is_empty() {
        let items: Vec<MediaItem> = r
            .prompt
            .media
            .iter()
            .map(|span| MediaItem {
                modality: span.modality,
                tokens: span.length,
                hash: span.media_hash,
                input: None,
            })
            .collect();
        let ready = frontend
            .encode_or_fall_back(&items, &mut prepared.prompt)
            .await
            .map_err(|e| e.code.unwrap_or("media").to_string())?;
        prepared.add_media(&ready);
    }
    let dispatched = frontend
        .generate(prepared)
        .await
        .map_err(|e| e.code.unwrap_or("error").to_string())?;
    let mut generation = dispatched.generation;
    let mut end = None;
    let mut first = None;
    while let Some(piece) = generation.next().await {
        first.get_or_insert_with(tokio::time::Instant::now);
        match piece {
            Ok(Piece::Finished { usage, worker, .. }) => end = Some((usage, worker)),
            Ok(Piece::Text { .. } | Piece::Parts { .. } | Piece::Prompt { .. }) => {}
            Err(e) => return Err(e.code.unwrap_or("stream").to_string()),
        }
    }
    let (usage, worker) = end.ok_or("no end")?;
    Ok((
        worker.unwrap_or(dispatched.worker),
        usage.completion_tokens,
        usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
        first.unwrap_or_else(tokio::time::Instant::now),
    ))
}

/// Runs the requests through the simulator with the settings `switchyard sim --config`
/// takes from `config`.
pub fn sim(
    requests: &[PromptRequest],
    config: &Config,
    fault: Option<WorkerFault>,
) -> (Vec<Outcome>, switchyard_sim::SimReport) {
    sim_sessions(requests, &[], config, fault)
}

/// [`sim`], with request `i` released by `after[i]` (see [`serve_sessions`]).
pub fn sim_sessions(
    requests: &[PromptRequest],
    after: &[Option<After>],
    config: &Config,
    fault: Option<WorkerFault>,
) -> (Vec<Outcome>, switchyard_sim::SimReport) {
    let faults = FaultConfig {
        schedule: fault
            .map(|f| ScheduledFault {
                worker: f.worker,
                kind: f.kind,
                at: f.at,
                down_for: None,
            })
            .into_iter()
            .collect(),
        // An in-process worker's streams break at once.
        crash_detection: Duration::ZERO,
        ..FaultConfig::default()
    };
    let only = SimOnly {
        eos_token_ids: vec![EOS],
        record_requests: true,
        faults,
        ..SimOnly::default()
    };
    let sim_config = sim_config(config, only).unwrap();
    let mut workload =
        PreparedWorkload::from_prompts(requests, sim_config.engine.block_size).unwrap();
    for (i, after) in after.iter().enumerate() {
        workload.requests[i].turn = Some(Turn {
            session: 0,
            turn: i as u32,
            after: after.clone(),
        });
    }
    let report = switchyard_sim::simulate(
        &sim_config,
        &workload,
        config.frontend.router.policy,
        &mut |_| {},
    )
    .unwrap();
    let outcomes = report
        .request_records
        .iter()
        .map(|r| match (r.worker, r.finished) {
            (Some(worker), Some(finished)) if r.outcome == "length" || r.outcome == "stop" => {
                Outcome::Served {
                    worker,
                    completion_tokens: r.output_tokens,
                    cached_tokens: r.cached_tokens,
                    ttft: r.first_token.unwrap_or(finished) - r.arrival,
                    e2e: finished - r.arrival,
                }
            }
            _ => Outcome::Refused(r.outcome.to_string()),
        })
        .collect();
    (outcomes, report)
}

/// Served times differ from simulated ones by the timers' rounding: up to a millisecond
/// (a microsecond of model time at the slowdown) per timer a request's path waits on.
pub const ONE_HOP: Duration = Duration::from_millis(2);

/// The same decisions, workers and tokens per request, and the same times within
/// `tolerance`.
pub fn assert_agree(served: &[Outcome], simulated: &[Outcome], tolerance: Duration) {
    assert_eq!(served.len(), simulated.len());
    let key = |o: &Outcome| match o {
        Outcome::Served {
            worker,
            completion_tokens,
            cached_tokens,
            ..
        } => format!("{worker:?} {completion_tokens} {cached_tokens}"),
        Outcome::Refused(_) => "refused".to_string(),
    };
    // Decisions and tokens first: a different decision shows as a time difference in
    // other requests too.
    for (i, (a, b)) in served.iter().zip(simulated).enumerate() {
        assert_eq!(key(a), key(b), "request {i}: served {a:?}, simulated {b:?}");
    }
    for (i, (a, b)) in served.iter().zip(simulated).enumerate() {
        if let (
            Outcome::Served {
                ttft: t, e2e: x, ..
            },
            Outcome::Served {
                ttft: u, e2e: y, ..
            },
        ) = (a, b)
        {
            assert!(
                t.abs_diff(*u) <= tolerance,
                "request {i}: first token after {t:?} served, {u:?} simulated"
            );
            assert!(
                x.abs_diff(*y) <= tolerance,
                "request {i}: end to end {x:?} served, {y:?} simulated"
            );
        }
    }
}
