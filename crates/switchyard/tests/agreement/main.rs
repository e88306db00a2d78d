//! The servers and the simulator decide a request's life the same way: the same
//! configuration through `serve`'s deployment, on tokio's paused clock, and through
//! `switchyard sim`'s settings, gives the same routing decisions, the same tokens per
//! request, and the same times, for plain text, admission queueing and shedding, images
//! encoded beside the LLM workers, a worker crashing under its streams, and prefill/decode
//! pairs, sessions whose turns wait for the previous answer and a tool; and for a worker
//! that hangs, until its streams move (the two model a hang
//! differently from then on: see that test).
//!
//! The engines run 1,000 times slower than the model on both sides (see
//! [`harness::SLOWDOWN`]), so the tolerance, a millisecond, is a microsecond of model time.

#![allow(clippy::unwrap_used)]

mod harness;

use std::time::Duration;

use switchyard_core::protocol::Prompt;
use switchyard_core::{MediaSpan, Modality, Priority};
use switchyard_sim::PromptRequest;

use harness::{
    ONE_HOP, Outcome, SLOWDOWN, WorkerFault, assert_agree, config, serve, serve_sessions, sim,
    sim_sessions,
};
use switchyard_core::trace::session::After;
use switchyard_sim::FaultKind;

/// A slice with shared prefixes (four families of system prompts and conversations that
/// come back), prompts of 40 to 1,500 tokens, outputs of 4 to 120, arrivals at uneven
/// instants, `gap_us` apart on average.
fn workload(n: usize, seed: u64, gap_us: u64) -> Vec<PromptRequest> {
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
            at_us += 1 + next(2 * gap_us);
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

fn served(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Served { .. }))
        .count()
}

fn workers_used(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Served { worker, .. } => Some(*worker),
            Outcome::Refused(_) => None,
        })
        .collect::<std::collections::BTreeSet<_>>()
        .len()
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_text_trace_is_routed_and_timed_alike() {
    let requests = workload(120, 7, 20_000);
    let config = config(4, 64);
    let served_outcomes = serve(&requests, &config, None).await;
    let (simulated, report) = sim(&requests, &config, None);
    assert_eq!(report.completed, 120);
    // The slice exercises what matters: cache reuse, several workers, end of sequence.
    assert!(report.cached_tokens > 0);
    assert_eq!(workers_used(&simulated), 4);
    assert_agree(&served_outcomes, &simulated, ONE_HOP);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn admission_queues_and_releases_alike_under_overload() {
    // Two workers that each run four requests at once, and a burst: admission queues, and
    // completions release the queued requests in the same order on both sides.
    let requests: Vec<PromptRequest> = workload(60, 11, 20_000)
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.arrival = Duration::from_micros(1 + 2_000 * i as u64) * SLOWDOWN;
            r
        })
        .collect();
    let config = config(2, 4);
    let served_outcomes = serve(&requests, &config, None).await;
    let (simulated, report) = sim(&requests, &config, None);
    assert!(report.queued > 10, "the burst queues: {report:?}");
    assert_eq!(report.completed, 60);
    assert_agree(&served_outcomes, &simulated, ONE_HOP);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn admission_sheds_the_same_requests() {
    // The same burst against a short queue, premium, standard and best-effort requests
    // mixed: what is shed (best effort at once, standard past half the queue, the rest when
    // it is full) is the same request on both sides, and so is everything served.
    let tiers = [Priority::Premium, Priority::Standard, Priority::BestEffort];
    let requests: Vec<PromptRequest> = workload(60, 13, 20_000)
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r.arrival = Duration::from_micros(1 + 2_000 * i as u64) * SLOWDOWN;
            r.priority = tiers[i % 3];
            r
        })
        .collect();
    let mut config = config(2, 4);
    config.frontend.admission.max_queue = 6;
    let served_outcomes = serve(&requests, &config, None).await;
    let (simulated, report) = sim(&requests, &config, None);
    assert!(
        report.rejected > 5,
        "the queue sheds: {:?}",
        report.rejected_by_reason
    );
    assert!(report.completed > 10, "{}", report.completed);
    assert_agree(&served_outcomes, &simulated, ONE_HOP);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn images_encoded_beside_the_workers_overlap_and_hit_alike() {
    // One encoder worker, the request sent ahead of its image (overlap), joint routing on:
    // an image behind its family's text, four distinct images, so later ones are found
    // cached and skip the encoder.
    let mut requests = workload(40, 17, 40_000);
    for (i, r) in requests.iter_mut().enumerate() {
        if i % 2 == 1 {
            continue;
        }
        let offset = 160;
        let length = 144;
        let mut tokens = r.prompt.token_ids[..offset].to_vec();
        tokens.extend(std::iter::repeat_n(0, length));
        tokens.extend(&r.prompt.token_ids[offset..]);
        r.prompt = Prompt {
            media: vec![MediaSpan {
                modality: Modality::Image,
                media_hash: 1 + (i as u64 / 2) % 4,
                offset: offset as u32,
                length: length as u32,
            }],
            ..Prompt::tokens(tokens)
        };
    }
    let mut config = config(3, 64);
    let m = &mut config.frontend.multimodal;
    m.encoders = 1;
    m.overlap = true;
    m.joint_routing = true;
    // Each image a few milliseconds of encoding: slowed down like the engines.
    for point in &mut m.encoder_cost.image_batch_ms {
        point.1 *= f64::from(SLOWDOWN);
    }
    let served_outcomes = serve(&requests, &config, None).await;
    let (simulated, report) = sim(&requests, &config, None);
    assert_eq!(report.completed, 40);
    let media = report.media.as_ref().unwrap();
    assert_eq!(media.requests, 20);
    assert!(media.cached > 0, "some images are found cached: {media:?}");
    assert!(media.cached < 20, "some are encoded: {media:?}");
    assert_agree(&served_outcomes, &simulated, ONE_HOP);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_workers_streams_move_alike_when_it_crashes() {
    // Dense arrivals on four workers; worker 2 crashes with several streams under way:
    // they resume elsewhere after the tokens they streamed, the same way on both sides.
    let requests = workload(80, 19, 5_000);
    let config = config(4, 64);
    let crash = WorkerFault {
        worker: 2,
        at: Duration::from_millis(150) * SLOWDOWN,
        kind: FaultKind::Crash,
    };
    let served_outcomes = serve(&requests, &config, Some(crash)).await;
    let (simulated, report) = sim(&requests, &config, Some(crash));
    let failures = report.failures.as_ref().unwrap();
    assert!(failures.migrations >= 3, "{failures:?}");
    assert_eq!(report.completed, 80, "{:?}", report.failed_by_reason);
    assert_eq!(served(&served_outcomes), 80);
    assert_agree(&served_outcomes, &simulated, ONE_HOP);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hung_worker_is_found_and_left_alike_until_its_streams_move() {
    // Worker 2 stops answering with several streams under way. Until the first of its
    // streams is due (its last token plus the stall timeout: `flow::stall`), both sides
    // agree on every request; then its streams resume elsewhere after the tokens they
    // streamed, on both sides, and every request completes with the same tokens.
    //
    // After that instant the two differ, by the models of a hang (see
    // `switchyard_sim::faults`): `serve`'s injected hang withholds the worker's answers
    // while its engine goes on computing (its KV events still arrive), and its streams
    // leave in the order their tasks wake; the simulator freezes the engine and moves the
    // streams in request order. The moved requests land on other workers in another
    // order, and every request still running is timed differently from then on.
    let requests = workload(80, 19, 5_000);
    let config = config(4, 64);
    let hang = WorkerFault {
        worker: 2,
        at: Duration::from_millis(150) * SLOWDOWN,
        kind: FaultKind::Hang,
    };
    let served_outcomes = serve(&requests, &config, Some(hang)).await;
    let (simulated, report) = sim(&requests, &config, Some(hang));
    let failures = report.failures.as_ref().unwrap();
    assert!(failures.migrations >= 3, "{failures:?}");
    assert_eq!(report.completed, 80, "{:?}", report.failed_by_reason);
    assert_eq!(served(&served_outcomes), 80);
    // No stream is due before a stall timeout after its last token, which came within an
    // engine step (well under a tenth of the timeout here) before the hang.
    let found_after = hang.at + config.frontend.health.stall_floor * 9 / 10;
    let mut compared = (0, 0);
    for (i, (a, b)) in served_outcomes.iter().zip(&simulated).enumerate() {
        let (
            Outcome::Served {
                worker: w1,
                completion_tokens: c1,
                ttft: t1,
                e2e: e1,
                ..
            },
            Outcome::Served {
                worker: w2,
                completion_tokens: c2,
                ttft: t2,
                e2e: e2,
                ..
            },
        ) = (a, b)
        else {
            unreachable!("every request is served");
        };
        assert_eq!(c1, c2, "request {i}: served {a:?}, simulated {b:?}");
        let arrival = requests[i].arrival;
        if arrival + *t1 < hang.at {
            compared.0 += 1;
            assert!(
                t1.abs_diff(*t2) <= ONE_HOP,
                "request {i}: first token after {t1:?} served, {t2:?} simulated"
            );
        }
        if arrival + *e1 < found_after {
            compared.1 += 1;
            assert_eq!(w1, w2, "request {i}: served {a:?}, simulated {b:?}");
            assert!(
                e1.abs_diff(*e2) <= ONE_HOP,
                "request {i}: end to end {e1:?} served, {e2:?} simulated"
            );
        }
    }
    assert!(compared.0 >= 10 && compared.1 >= 5, "{compared:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn prefill_and_decode_pairs_are_chosen_and_timed_alike() {
    // One prefill and two decode workers: long uncached prompts are prefilled remotely and
    // their KV pulled by the decode worker, short ones prefilled where they decode.
    let requests = workload(40, 23, 30_000);
    let mut config = config(3, 64);
    config.workers.prefill = 1;
    let served_outcomes = serve(&requests, &config, None).await;
    let (simulated, report) = sim(&requests, &config, None);
    assert_eq!(report.completed, 40);
    let disagg = report.disagg.as_ref().unwrap();
    assert!(disagg.remote_prefills > 3, "{disagg:?}");
    assert!(disagg.local_short > 0, "{disagg:?}");
    // A remote prefill waits on two more timers: its prefill worker's step and the pull.
    assert_agree(&served_outcomes, &simulated, 2 * ONE_HOP);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_sessions_turns_are_released_and_timed_alike() {
    // Three sessions of three turns, turn-major: each turn's prompt is the previous one's
    // and 64 new tokens, sent 0.5 ms (the client) + 1.5 ms or more (a tool) of model time
    // after the previous turn ends.
    let (sessions, turns) = (3usize, 3usize);
    let mut requests = Vec::new();
    let mut after = Vec::new();
    for turn in 0..turns {
        for s in 0..sessions {
            let tokens: Vec<u32> = (0..400 + 64 * turn as u32)
                .map(|t| 300 + (t * 13 + s as u32 * 7919) % 30_000)
                .collect();
            requests.push(PromptRequest {
                arrival: Duration::from_micros(300 * s as u64) * SLOWDOWN,
                prompt: Prompt::tokens(tokens),
                max_tokens: 20 + 10 * s as u32,
                priority: Priority::Standard,
            });
            after.push((turn > 0).then(|| After {
                parents: vec![((turn - 1) * sessions + s) as u32],
                delay: Duration::from_micros(500) * SLOWDOWN,
                // Turns of different sessions ending on the same engine step are released
                // apart (a tie's order would be a coin toss on either side).
                tool_wait: Duration::from_micros(1500 + 130 * s as u64) * SLOWDOWN,
            }));
        }
    }
    let config = config(2, 64);
    let served_outcomes = serve_sessions(&requests, &after, &config, None).await;
    let (simulated, report) = sim_sessions(&requests, &after, &config, None);
    assert_eq!(report.completed, 9);
    // Later turns mostly find their previous turn's prompt in the cache (the router may
    // send one to a less loaded worker instead).
    let cached = |o: &Outcome| match o {
        Outcome::Served { cached_tokens, .. } => *cached_tokens,
        Outcome::Refused(_) => 0,
    };
    let reused = simulated[sessions..]
        .iter()
        .filter(|o| cached(o) >= 384)
        .count();
    assert!(reused >= 4, "{simulated:?}");
    assert_agree(&served_outcomes, &simulated, 2 * ONE_HOP);
}
