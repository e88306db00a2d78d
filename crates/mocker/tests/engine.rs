//! Scheduler behaviour on hand-built cases.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::protocol::FinishReason;
use switchyard_core::{HashSeed, KvEventData, RequestId, TokenBlocks, WorkerKey};
use switchyard_mocker::tokens::{TokenRules, token_at};
use switchyard_mocker::{
    EngineArgs, MockEngine, MockRequest, PerfModel, PreemptionMode, Rejected, StepOutput,
    TokenOutput,
};

const SEED: u64 = 7;

fn engine(args: EngineArgs) -> MockEngine {
    MockEngine::new(WorkerKey::new(1, 0), args, PerfModel::Polynomial, SEED).unwrap()
}

fn request(id: u64, prompt: &[u32], block_size: u32, max_output_tokens: u32) -> MockRequest {
    MockRequest::new(
        RequestId(id),
        TokenBlocks::new(prompt, block_size, HashSeed::default()).unwrap(),
        max_output_tokens,
    )
}

/// The tokens a request keyed `key` with a prompt of `prompt_len` tokens produces.
fn expected_stream(key: u64, prompt_len: u32, n: u32) -> Vec<u32> {
    (0..n)
        .map(|i| token_at(SEED, key, prompt_len + i))
        .collect()
}

/// Steps until idle; returns every token and the number of steps.
fn run(engine: &mut MockEngine) -> (Vec<TokenOutput>, Vec<StepOutput>) {
    let mut now = Duration::ZERO;
    let mut tokens = Vec::new();
    let mut steps = Vec::new();
    while engine.has_work() {
        let mut out = StepOutput::default();
        engine.step(now, &mut out);
        engine.validate().unwrap();
        now = out.finished_at();
        tokens.extend(out.tokens.iter().cloned());
        steps.push(out);
        assert!(steps.len() < 100_000, "engine does not converge");
    }
    (tokens, steps)
}

#[test]
fn chunked_prefill_then_decode_produces_deterministic_tokens() {
    let args = EngineArgs {
        block_size: 4,
        max_num_batched_tokens: 8,
        num_gpu_blocks: 64,
        ..EngineArgs::default()
    };
    let mut e = engine(args);
    let prompt: Vec<u32> = (0..20).collect();
    e.add_request(request(1, &prompt, 4, 5)).unwrap();
    let (tokens, steps) = run(&mut e);
    // 20 prompt tokens at 8 per step: 3 prefill steps, the last yields the first token.
    assert_eq!(steps[0].shape.prefill_tokens, 8);
    assert_eq!(steps[1].shape.prefill_tokens, 8);
    assert_eq!(steps[2].shape.prefill_tokens, 4);
    // Each chunk attends to the part of its prompt before it: 0·8, 8·8, 16·4.
    assert_eq!(
        steps[..3]
            .iter()
            .map(|s| s.shape.prefill_context)
            .collect::<Vec<_>>(),
        [0, 64, 64]
    );
    assert!(steps[0].tokens.is_empty() && steps[1].tokens.is_empty());
    assert_eq!(steps[2].tokens.len(), 1);
    // Then 4 decode steps of one token each.
    assert_eq!(steps.len(), 7);
    assert!(
        steps[3..]
            .iter()
            .all(|s| s.shape.decode_seqs == 1 && s.shape.prefill_tokens == 0)
    );
    let expected = expected_stream(1, 20, 5);
    assert_eq!(tokens.iter().map(|t| t.token).collect::<Vec<_>>(), expected);
    assert_eq!(
        tokens.iter().map(|t| t.index).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(tokens.last().unwrap().finish, Some(FinishReason::Length));
    assert!(tokens[..4].iter().all(|t| t.finish.is_none()));
    // Prefill steps are longer than decode steps.
    assert!(steps[0].duration > steps[4].duration);
    // All blocks are released but stay cached.
    let load = e.load();
    assert_eq!((load.active_blocks, load.running, load.waiting), (0, 0, 0));
    assert!(load.cached_blocks >= 5);
}

#[test]
fn a_shared_prefix_is_not_recomputed_and_events_describe_the_cache() {
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 64,
        ..EngineArgs::default()
    };
    let mut e = engine(args);
    let first: Vec<u32> = (0..16).collect();
    e.add_request(request(1, &first, 4, 1)).unwrap();
    let (_, steps) = run(&mut e);
    let stored: usize = steps
        .iter()
        .flat_map(|s| &s.events)
        .map(|ev| match &ev.data {
            KvEventData::Stored { blocks, .. } => blocks.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(stored, 4, "four full prompt blocks stored");
    // Same first 12 tokens: 3 blocks hit, 8 tokens left to compute.
    let mut second = first[..12].to_vec();
    second.extend([90, 91, 92, 93, 94, 95, 96, 97]);
    e.add_request(request(2, &second, 4, 1)).unwrap();
    let (tokens, steps) = run(&mut e);
    assert_eq!(tokens[0].cached_tokens, 12);
    assert_eq!(steps[0].shape.prefill_tokens, 8);
    // A fully cached prompt still recomputes its last block's worth.
    e.add_request(request(3, &first, 4, 1)).unwrap();
    let (tokens, steps) = run(&mut e);
    assert_eq!(tokens[0].cached_tokens, 12);
    assert_eq!(steps[0].shape.prefill_tokens, 4);
    assert_eq!(e.stats().cached_prompt_tokens, 24);
}

#[test]
fn without_prefix_caching_nothing_hits_and_nothing_is_published() {
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 64,
        enable_prefix_caching: false,
        ..EngineArgs::default()
    };
    let mut e = engine(args);
    let prompt: Vec<u32> = (0..16).collect();
    e.add_request(request(1, &prompt, 4, 3)).unwrap();
    e.add_request(request(2, &prompt, 4, 3)).unwrap();
    let (tokens, steps) = run(&mut e);
    assert!(tokens.iter().all(|t| t.cached_tokens == 0));
    assert!(steps.iter().all(|s| s.events.is_empty()));
    assert_eq!(e.load().cached_blocks, 0);
}

#[test]
fn max_num_seqs_and_budget_bound_the_batch() {
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 256,
        max_num_seqs: 3,
        max_num_batched_tokens: 64,
        ..EngineArgs::default()
    };
    let mut e = engine(args);
    for id in 0..6 {
        let prompt: Vec<u32> = (0..8).map(|t| t + id as u32 * 100).collect();
        e.add_request(request(id, &prompt, 4, 4)).unwrap();
    }
    let mut out = StepOutput::default();
    e.step(Duration::ZERO, &mut out);
    assert_eq!(e.load().running, 3);
    assert_eq!(e.load().waiting, 3);
    assert_eq!(out.shape.prefill_tokens, 24);
    let (tokens, _) = run(&mut e);
    assert_eq!(tokens.len() + out.tokens.len(), 24);
}

fn preemption_case(mode: PreemptionMode) -> (Vec<TokenOutput>, MockEngine) {
    // 6 blocks of 4 tokens: two requests of 8 prompt tokens that each grow to 16 tokens
    // cannot both fit.
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 6,
        preemption_mode: mode,
        ..EngineArgs::default()
    };
    let mut e = engine(args);
    e.add_request(request(1, &(0..8).collect::<Vec<_>>(), 4, 9))
        .unwrap();
    e.add_request(request(2, &(50..58).collect::<Vec<_>>(), 4, 9))
        .unwrap();
    let (tokens, _) = run(&mut e);
    (tokens, e)
}

#[test]
fn preemption_recomputes_and_streams_stay_complete() {
    for mode in [PreemptionMode::Lifo, PreemptionMode::Fifo] {
        let (tokens, e) = preemption_case(mode);
        assert!(e.stats().preemptions > 0, "{mode:?}");
        for id in [1, 2] {
            let stream: Vec<_> = tokens
                .iter()
                .filter(|t| t.request == RequestId(id))
                .collect();
            assert_eq!(stream.len(), 9, "{mode:?}");
            let expected = expected_stream(id, 8, 9);
            assert_eq!(stream.iter().map(|t| t.token).collect::<Vec<_>>(), expected);
        }
    }
    // LIFO preempts the later request first, so the earlier one finishes first; FIFO the
    // reverse.
    let last_of = |tokens: &[TokenOutput], id| {
        tokens
            .iter()
            .rposition(|t| t.request == RequestId(id))
            .unwrap()
    };
    let (lifo, _) = preemption_case(PreemptionMode::Lifo);
    assert!(last_of(&lifo, 1) < last_of(&lifo, 2));
    let (fifo, _) = preemption_case(PreemptionMode::Fifo);
    assert!(last_of(&fifo, 2) < last_of(&fifo, 1));
}

#[test]
fn cancellation_frees_blocks() {
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 32,
        ..EngineArgs::default()
    };
    let mut e = engine(args);
    e.add_request(request(1, &(0..10).collect::<Vec<_>>(), 4, 100))
        .unwrap();
    e.add_request(request(2, &(20..30).collect::<Vec<_>>(), 4, 100))
        .unwrap();
    let mut out = StepOutput::default();
    for _ in 0..3 {
        e.step(Duration::ZERO, &mut out);
    }
    assert!(e.load().active_blocks > 0);
    assert!(e.cancel(RequestId(1)));
    assert!(!e.cancel(RequestId(1)));
    assert!(e.cancel(RequestId(2)));
    e.validate().unwrap();
    assert_eq!(e.load().active_blocks, 0);
    assert!(!e.has_work());
    assert_eq!(e.stats().cancelled, 2);
}

#[test]
fn impossible_requests_are_rejected() {
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 4,
        ..EngineArgs::default()
    };
    let mut e = engine(args);
    assert_eq!(
        e.add_request(request(1, &[], 4, 1)),
        Err(Rejected::EmptyPrompt)
    );
    assert_eq!(
        e.add_request(request(1, &[1], 4, 0)),
        Err(Rejected::NoOutput)
    );
    assert!(matches!(
        e.add_request(request(1, &[1], 8, 1)),
        Err(Rejected::BlockSize {
            expected: 4,
            got: 8
        })
    ));
    assert!(matches!(
        e.add_request(request(1, &[1; 16], 4, 2)),
        Err(Rejected::TooLarge {
            needed: 5,
            capacity: 4
        })
    ));
    e.add_request(request(1, &[1; 4], 4, 1)).unwrap();
    assert_eq!(
        e.add_request(request(1, &[1; 4], 4, 1)),
        Err(Rejected::Duplicate(RequestId(1)))
    );
    let no_chunks = EngineArgs {
        enable_chunked_prefill: false,
        max_num_batched_tokens: 8,
        ..args
    };
    let mut e = engine(no_chunks);
    assert!(matches!(
        e.add_request(request(1, &[1; 8], 4, 2)),
        Err(Rejected::NoChunking { .. })
    ));
}

#[test]
fn a_stop_token_ends_the_request_and_frees_its_blocks_at_once() {
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 64,
        ..EngineArgs::default()
    };
    let prompt: Vec<u32> = (0..10).collect();
    let stream = expected_stream(3, 10, 20);
    // Stop on the fifth token the request would produce (the first time it appears).
    let stop = stream[4];
    let cut = stream.iter().position(|&t| t == stop).unwrap();
    let mut e = engine(args);
    let mut r = request(3, &prompt, 4, 20);
    r.stop_token_ids = vec![stop];
    e.add_request(r).unwrap();
    let (tokens, _) = run(&mut e);
    assert_eq!(tokens.len(), cut + 1, "the stop token is the last one");
    assert_eq!(tokens.last().unwrap().token, stop);
    assert_eq!(tokens.last().unwrap().finish, Some(FinishReason::Stop));
    assert_eq!(e.load().active_blocks, 0);
    assert_eq!(e.stats().finished, 1);
}

#[test]
fn a_resumed_request_continues_the_same_stream_on_another_engine() {
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 64,
        ..EngineArgs::default()
    };
    let prompt: Vec<u32> = (0..10).collect();
    let mut whole = engine(args);
    whole.add_request(request(5, &prompt, 4, 12)).unwrap();
    let (full, _) = run(&mut whole);
    // Another engine (another worker, same model seed) picks it up after 7 tokens: the
    // prompt plus those 7, 5 more to go, positions counted from 7.
    let mut resumed_prompt = prompt.clone();
    resumed_prompt.extend(full[..7].iter().map(|t| t.token));
    let mut other =
        MockEngine::new(WorkerKey::new(9, 0), args, PerfModel::Polynomial, SEED).unwrap();
    let mut r = request(5, &resumed_prompt, 4, 5);
    r.generated = 7;
    other.add_request(r).unwrap();
    let (rest, _) = run(&mut other);
    assert_eq!(
        rest.iter().map(|t| (t.index, t.token)).collect::<Vec<_>>(),
        full[7..]
            .iter()
            .map(|t| (t.index, t.token))
            .collect::<Vec<_>>()
    );
    assert_eq!(rest.last().unwrap().finish, Some(FinishReason::Length));
    // The stream key, not the request id, decides the tokens (a sampling seed).
    let mut keyed = engine(args);
    let mut r = request(77, &prompt, 4, 12);
    r.stream_key = 5;
    keyed.add_request(r).unwrap();
    let (same, _) = run(&mut keyed);
    assert_eq!(
        same.iter().map(|t| t.token).collect::<Vec<_>>(),
        full.iter().map(|t| t.token).collect::<Vec<_>>()
    );
}

#[test]
fn imported_kv_is_not_computed_but_the_stream_is_the_same() {
    let args = EngineArgs {
        block_size: 16,
        num_gpu_blocks: 256,
        ..EngineArgs::default()
    };
    let prompt: Vec<u32> = (0..2000).collect();
    let mut computed = engine(args);
    computed.add_request(request(3, &prompt, 16, 8)).unwrap();
    let (full, full_steps) = run(&mut computed);
    // The same request with its whole prompt's KV sent over: one token to compute, then
    // decode, and the very same tokens.
    let mut moved = engine(args);
    let mut r = request(3, &prompt, 16, 8);
    r.imported_tokens = 2000;
    moved.add_request(r).unwrap();
    let (tokens, steps) = run(&mut moved);
    assert_eq!(tokens, full);
    assert_eq!(full_steps[0].shape.prefill_tokens, 2000);
    assert_eq!(steps[0].shape.prefill_tokens, 1);
    assert!(steps[0].duration * 2 < full_steps[0].duration);
    // Imported KV is not a cache hit, and the blocks are held like computed ones: a later
    // request with the same prompt finds them cached.
    assert_eq!(moved.stats().cached_prompt_tokens, 0);
    moved.add_request(request(4, &prompt, 16, 2)).unwrap();
    let (again, _) = run(&mut moved);
    assert_eq!(again[0].cached_tokens, 1984);
    // Only what is there is imported: a partial import computes the rest.
    let mut partial = engine(args);
    let mut r = request(3, &prompt, 16, 8);
    r.imported_tokens = 600;
    partial.add_request(r).unwrap();
    let (tokens, steps) = run(&mut partial);
    assert_eq!(steps[0].shape.prefill_tokens, 1400);
    assert_eq!(
        tokens.iter().map(|t| t.token).collect::<Vec<_>>(),
        full.iter().map(|t| t.token).collect::<Vec<_>>()
    );
}

#[test]
fn banned_tokens_never_come_out_and_the_rest_of_the_stream_is_unchanged() {
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 64,
        ..EngineArgs::default()
    };
    let prompt: Vec<u32> = (0..8).collect();
    let expected = expected_stream(1, 8, 40);
    let banned = vec![expected[2], expected[17], expected[30]];
    let mut e = engine(args);
    let mut r = request(1, &prompt, 4, 40);
    r.rules.banned = banned.clone();
    e.add_request(r).unwrap();
    let (tokens, _) = run(&mut e);
    let got: Vec<u32> = tokens.iter().map(|t| t.token).collect();
    assert_eq!(got.len(), 40);
    for (i, (&want, &got)) in expected.iter().zip(&got).enumerate() {
        if banned.contains(&want) {
            assert!(
                !banned.contains(&got),
                "position {i}: banned token {want} produced"
            );
        } else {
            assert_eq!(want, got, "position {i}: an allowed token changed");
        }
    }
}

/// Every request's output tokens, by request, from one engine running `requests`.
fn outputs(args: EngineArgs, requests: Vec<MockRequest>) -> Vec<Vec<u32>> {
    let mut e = engine(args);
    let ids: Vec<RequestId> = requests.iter().map(|r| r.id).collect();
    for r in requests {
        e.add_request(r).unwrap();
    }
    let (tokens, _) = run(&mut e);
    ids.iter()
        .map(|&id| {
            tokens
                .iter()
                .filter(|t| t.request == id)
                .map(|t| t.token)
                .collect()
        })
        .collect()
}

/// Tokens that repeat one already in the same output.
fn repeats(output: &[u32]) -> usize {
    let mut distinct = output.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    output.len() - distinct.len()
}

#[test]
fn penalties_change_how_often_output_tokens_repeat() {
    let args = EngineArgs {
        block_size: 16,
        num_gpu_blocks: 4_096,
        ..EngineArgs::default()
    };
    let prompt: Vec<u32> = (0..32).collect();
    let with = |frequency: f32, presence: f32| {
        let requests = (0..12)
            .map(|id| {
                let mut r = request(id, &prompt, 16, 600);
                r.rules.frequency_penalty = frequency;
                r.rules.presence_penalty = presence;
                r
            })
            .collect();
        outputs(args, requests)
    };
    let total = |outs: &[Vec<u32>]| outs.iter().map(|o| repeats(o)).sum::<usize>();
    let plain = with(0.0, 0.0);
    // Without penalties the stream is the plain one.
    assert_eq!(plain[3], expected_stream(3, 32, 600));
    // 600 draws from 32,000 tokens repeat about 5.6 times.
    let base = total(&plain);
    assert!(
        (30..120).contains(&base),
        "{base} repeats without penalties"
    );
    // Positive penalties make a repeat e^-2 as likely.
    let discouraged = total(&with(2.0, 0.0));
    assert!(
        discouraged * 3 < base,
        "{discouraged} repeats, {base} without penalties"
    );
    let absent = total(&with(0.0, 2.0));
    assert!(
        absent * 3 < base,
        "{absent} repeats, {base} without penalties"
    );
    // A negative frequency penalty feeds on itself: a repeated token gets likelier each
    // time, until it is much of the output, as with a real model.
    let encouraged = with(-2.0, 0.0);
    assert!(
        total(&encouraged) > 5 * base,
        "{} repeats",
        total(&encouraged)
    );
    let degenerate = encouraged
        .iter()
        .filter(|output| {
            let most = output
                .iter()
                .map(|t| output.iter().filter(|u| *u == t).count())
                .max()
                .unwrap();
            most > 100
        })
        .count();
    assert!(
        degenerate >= 6,
        "only {degenerate} of 12 outputs degenerate"
    );
}

#[test]
fn a_resumed_request_with_penalties_continues_the_same_stream() {
    let args = EngineArgs {
        block_size: 4,
        num_gpu_blocks: 256,
        ..EngineArgs::default()
    };
    let prompt: Vec<u32> = (0..10).collect();
    let rules = TokenRules {
        frequency_penalty: -0.5,
        presence_penalty: 1.0,
        bias: vec![(17, 9.0)],
        ..TokenRules::default()
    };
    let mut r = request(5, &prompt, 4, 300);
    r.rules = rules.clone();
    let full = &outputs(args, vec![r])[0];
    assert!(repeats(full) > 20, "the rules should make repeats common");
    // Picked up after 120 tokens elsewhere: the engine counts those 120 for the penalties.
    let mut resumed_prompt = prompt.clone();
    resumed_prompt.extend(&full[..120]);
    let mut r = request(5, &resumed_prompt, 4, 180);
    r.generated = 120;
    r.rules = rules.clone();
    r.earlier_output = full[..120].to_vec();
    let rest = &outputs(args, vec![r])[0];
    assert_eq!(rest, &full[120..]);
    // Without the earlier output the penalties see another history and the stream differs.
    let mut r = request(5, &resumed_prompt, 4, 180);
    r.generated = 120;
    r.rules = rules;
    let forgetful = &outputs(args, vec![r])[0];
    assert_ne!(forgetful, &full[120..]);
}

#[test]
fn a_request_waiting_for_its_media_prefills_its_text_and_lets_ready_ones_pass() {
    let args = EngineArgs {
        block_size: 4,
        max_num_batched_tokens: 8,
        num_gpu_blocks: 64,
        ..EngineArgs::default()
    };
    let mut e = engine(args);
    // Request 1: 20 prompt tokens, media from position 6 still encoding. Request 2 comes
    // after it, ready.
    let prompt: Vec<u32> = (0..20).collect();
    let gated = MockRequest {
        media_gate: Some(6),
        ..request(1, &prompt, 4, 2)
    };
    e.add_request(gated).unwrap();
    e.add_request(request(2, &(100..110).collect::<Vec<u32>>(), 4, 2))
        .unwrap();
    assert!(e.waiting_on_media());
    let mut now = Duration::ZERO;
    let mut first_token = std::collections::HashMap::new();
    let mut prefilled = 0;
    for _ in 0..20 {
        let mut out = StepOutput::default();
        e.step(now, &mut out);
        e.validate().unwrap();
        prefilled += out.shape.prefill_tokens;
        now = out.finished_at();
        for t in &out.tokens {
            first_token.entry(t.request.0).or_insert(now);
        }
        if out.shape.prefill_tokens == 0 && out.shape.decode_seqs == 0 {
            break;
        }
    }
    // The ready request finished; the gated one computed its 6 text tokens and no more.
    assert!(first_token.contains_key(&2));
    assert!(!first_token.contains_key(&1));
    assert_eq!(prefilled, 6 + 10);
    assert!(e.has_work());
    // Its media arrives: it prefills the other 14 tokens and generates.
    assert!(e.media_ready(RequestId(1)));
    assert!(!e.waiting_on_media());
    let (tokens, steps) = run(&mut e);
    let prefill: u32 = steps.iter().map(|s| s.shape.prefill_tokens).sum();
    assert_eq!(prefill, 14);
    let stream: Vec<u32> = tokens.iter().map(|t| t.token).collect();
    assert_eq!(stream, expected_stream(1, 20, 2));
    assert!(!e.media_ready(RequestId(1)), "finished requests are gone");
}

#[test]
fn media_ready_late_resume_behind_the_requests_that_came_before_them() {
    // Request 1 computes its 4 text tokens, then waits for its media; requests 2 and 3
    // arrive meanwhile; its media are ready; request 4 arrives after that.
    let first_tokens = |defer: bool| {
        let args = EngineArgs {
            block_size: 4,
            max_num_batched_tokens: 16,
            num_gpu_blocks: 128,
            defer_ready_media: defer,
            ..EngineArgs::default()
        };
        let mut e = engine(args);
        e.add_request(MockRequest {
            media_gate: Some(4),
            ..request(1, &(0..40).collect::<Vec<u32>>(), 4, 2)
        })
        .unwrap();
        let mut out = StepOutput::default();
        e.step(Duration::ZERO, &mut out);
        assert_eq!(out.shape.prefill_tokens, 4);
        let mut now = out.finished_at();
        for id in [2u64, 3] {
            let prompt: Vec<u32> = (0..24).map(|t| t + 100 * id as u32).collect();
            e.add_request(request(id, &prompt, 4, 2)).unwrap();
        }
        assert!(e.media_ready(RequestId(1)));
        e.add_request(request(4, &(500..524).collect::<Vec<u32>>(), 4, 2))
            .unwrap();
        let mut first = std::collections::HashMap::new();
        for step in 0..100u32 {
            let mut out = StepOutput::default();
            e.step(now, &mut out);
            e.validate().unwrap();
            now = out.finished_at();
            for t in &out.tokens {
                first.entry(t.request.0).or_insert(step);
            }
            if !e.has_work() {
                break;
            }
        }
        // Request 1 is whole: the same stream as ever.
        assert_eq!(first.len(), 4);
        first
    };
    let deferred = first_tokens(true);
    // Behind the two that were waiting, ahead of the one that came after.
    assert!(
        deferred[&2] <= deferred[&1] && deferred[&3] <= deferred[&1],
        "{deferred:?}"
    );
    assert!(deferred[&1] <= deferred[&4], "{deferred:?}");
    // Not deferred: its 36 media positions go first and hold the others back.
    let at_once = first_tokens(false);
    assert!(at_once[&1] < at_once[&3], "{at_once:?}");
    assert!(at_once[&3] > deferred[&3], "{at_once:?} {deferred:?}");
}

#[test]
fn media_wait_for_staging_memory_in_order_and_leave_it_once_their_prompt_is_computed() {
    // Room for 10 media positions; three requests with 8 each, encoded on arrival.
    let args = EngineArgs {
        block_size: 4,
        max_num_batched_tokens: 16,
        num_gpu_blocks: 64,
        staging_tokens: 10,
        ..EngineArgs::default()
    };
    let mut e = engine(args);
    for id in 1..=3u64 {
        let prompt: Vec<u32> = (0..20).map(|t| t + 100 * id as u32).collect();
        e.add_request(MockRequest {
            media: Some((4, 8)),
            ..request(id, &prompt, 4, 2)
        })
        .unwrap();
    }
    assert_eq!(e.staged_tokens(), 8);
    assert_eq!(e.stats().staging_waits, 2);
    assert!(e.waiting_on_media(), "two wait at their media");
    let (tokens, _) = run(&mut e);
    // All three finish, one after another's prompt is computed; nothing stays staged.
    let finished: Vec<u64> = tokens
        .iter()
        .filter(|t| t.finish.is_some())
        .map(|t| t.request.0)
        .collect();
    assert_eq!(finished.len(), 3);
    assert_eq!(e.staged_tokens(), 0);
    assert!(!e.waiting_on_media());
    // Media larger than the whole staging memory go alone.
    e.add_request(MockRequest {
        media: Some((2, 30)),
        ..request(9, &(0..40).collect::<Vec<u32>>(), 4, 1)
    })
    .unwrap();
    assert_eq!(e.staged_tokens(), 30);
    run(&mut e);
    assert_eq!(e.staged_tokens(), 0);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Against a naive count: staged positions never exceed the budget (unless one
    /// request's alone), cancelled and finished requests give theirs back, and every
    /// request completes.
    #[test]
    fn staging_never_overflows_and_every_request_completes(
        limit in 1u64..40,
        requests in proptest::collection::vec((1u32..24, 0u32..3, proptest::bool::ANY), 1..12),
    ) {
        let args = EngineArgs {
            block_size: 4,
            max_num_batched_tokens: 16,
            num_gpu_blocks: 256,
            staging_tokens: limit,
            ..EngineArgs::default()
        };
        let mut e = engine(args);
        let mut media = std::collections::HashMap::new();
        for (i, &(tokens, gated, cancel)) in requests.iter().enumerate() {
            let id = i as u64 + 1;
            let prompt: Vec<u32> = (0..tokens + 8).map(|t| t + 1000 * id as u32).collect();
            e.add_request(MockRequest {
                media: Some((4, tokens)),
                media_gate: (gated == 0).then_some(4),
                ..request(id, &prompt, 4, 2)
            })
            .unwrap();
            media.insert(id, (tokens, gated == 0, cancel));
        }
        let mut now = Duration::ZERO;
        let mut finished = std::collections::HashSet::new();
        for step in 0..400 {
            // Media arrive for the gated ones after a few steps; some requests leave.
            if step == 3 {
                for (&id, &(_, gated, _)) in &media {
                    if gated {
                        proptest::prop_assert!(e.media_ready(RequestId(id)));
                    }
                }
            }
            if step == 5 {
                for (&id, &(_, _, cancel)) in &media {
                    if cancel && !finished.contains(&id) {
                        e.cancel(RequestId(id));
                        finished.insert(id);
                    }
                }
            }
            let staged = e.staged_tokens();
            let largest = media.values().map(|m| u64::from(m.0)).max().unwrap_or(0);
            proptest::prop_assert!(staged <= limit.max(largest), "{staged} staged over {limit}");
            let mut out = StepOutput::default();
            e.step(now, &mut out);
            e.validate().unwrap();
            now = out.finished_at();
            for t in out.tokens.iter().filter(|t| t.finish.is_some()) {
                finished.insert(t.request.0);
            }
            if !e.has_work() {
                break;
            }
        }
        proptest::prop_assert_eq!(finished.len(), media.len());
        proptest::prop_assert_eq!(e.staged_tokens(), 0);
    }
}

/// The request keyed 5 under a JSON constraint, resumed after `generated` of `earlier`'s
/// tokens (the guide having taken them), on a fresh engine: its tokens.
fn constrained_run(prompt: &[u32], earlier: &[u32], max_output_tokens: u32) -> Vec<TokenOutput> {
    let grammars = switchyard_grammar::Grammars::builtin().unwrap();
    let constraint = switchyard_core::protocol::Constraint::JsonSchema(
        r#"{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a","b"]}"#.into(),
    );
    let mut guide = grammars.guide(&constraint).unwrap();
    guide.take(earlier).unwrap();
    let mut whole = prompt.to_vec();
    whole.extend_from_slice(earlier);
    let mut e = engine(EngineArgs {
        block_size: 4,
        ..EngineArgs::default()
    });
    e.add_request(MockRequest {
        generated: earlier.len() as u32,
        stream_key: 5,
        guide: Some(Box::new(guide)),
        ..request(1, &whole, 4, max_output_tokens - earlier.len() as u32)
    })
    .unwrap();
    run(&mut e).0
}

#[test]
fn a_constrained_request_ends_with_its_constraint_and_resumes_on_another_engine_the_same() {
    let prompt: Vec<u32> = (1..=10).collect();
    let whole = constrained_run(&prompt, &[], 200);
    let last = whole.last().unwrap();
    assert_eq!(last.token, switchyard_core::builtin_vocab::EOS);
    assert_eq!(
        last.finish,
        Some(FinishReason::Stop),
        "the constraint's end ends it"
    );
    let vocabulary = switchyard_grammar::Vocabulary::builtin();
    let text: Vec<u8> = whole[..whole.len() - 1]
        .iter()
        .flat_map(|t| vocabulary.tokens[t.token as usize].clone())
        .collect();
    let value: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert!(value["a"].is_number() && value["b"].is_string(), "{value}");
    // Moved after a few tokens: the rest is what the first engine drew.
    let tokens: Vec<u32> = whole.iter().map(|t| t.token).collect();
    for cut in [1, 3, tokens.len() / 2] {
        let rest = constrained_run(&prompt, &tokens[..cut], 200);
        let rest: Vec<u32> = rest.iter().map(|t| t.token).collect();
        assert_eq!(rest, tokens[cut..], "resumed after {cut}");
    }
    // A budget that ends first: cut short, and said so.
    let short = constrained_run(&prompt, &[], 3);
    assert_eq!(short.len(), 3);
    assert_eq!(short.last().unwrap().finish, Some(FinishReason::Length));
}
