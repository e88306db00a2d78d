//! The step driver, timed on tokio's paused clock and threaded.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::protocol::{
    EngineError, FinishReason, GenerateOutput, GenerateRequest, Phase, Resume, TokenOutput,
};
use switchyard_core::{RequestId, WorkerKey};
use switchyard_mocker::perf::StepShape;
use switchyard_mocker::tokens::token_at;
use switchyard_mocker::{EngineArgs, MockEngine, PerfModel};
use switchyard_worker::driver;
use switchyard_worker::mocker::{Mocker, SteppedMocker};
use switchyard_worker::{Engine, MockerConfig};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const SEED: u64 = 3;

fn request(id: u64, tokens: u32, max_tokens: u32) -> GenerateRequest {
    let prompt: Vec<u32> = (0..tokens).map(|t| t + id as u32 * 1000).collect();
    GenerateRequest::text(RequestId(id), prompt, max_tokens)
}

fn mocker(args: EngineArgs) -> Box<Mocker> {
    let config = MockerConfig {
        args,
        seed: SEED,
        ..MockerConfig::default()
    };
    Box::new(Mocker::new(WorkerKey::new(1, 0), &config).unwrap())
}

async fn drain(stream: &mut driver::TokenStream) -> Vec<TokenOutput> {
    let mut out = Vec::new();
    while let Some(t) = stream.recv().await {
        out.push(t);
    }
    out
}

#[tokio::test(start_paused = true)]
async fn tokens_arrive_on_the_model_clock_and_events_flow() {
    let args = EngineArgs {
        speedup_ratio: 2.0,
        ..EngineArgs::default()
    };
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let engine = mocker(args);
    assert_eq!(engine.capabilities().block_size, Some(16));
    let running = engine.start(&tracker, cancel.clone()).await.unwrap();
    let mut events = running.events.unwrap();

    let start = Instant::now();
    let mut items = running.service.generate(request(1, 64, 3)).await.unwrap();
    use futures::StreamExt;
    let first = items.next().await.unwrap().unwrap();
    let ttft = start.elapsed();
    // One prefill step of 64 tokens at speedup 2.
    let model = PerfModel::Polynomial;
    let expected = Duration::from_secs_f64(model.prefill_ms(64) / 1e3 / 2.0);
    assert!(
        ttft.abs_diff(expected) < Duration::from_millis(2),
        "{ttft:?} vs {expected:?}"
    );
    assert!(matches!(
        first,
        switchyard_core::protocol::GenerateOutput::Tokens {
            cached_tokens: Some(0),
            ..
        }
    ));
    let rest: Vec<_> = items.collect().await;
    assert_eq!(rest.len(), 3, "two more tokens, then Finished");
    assert_eq!(
        rest[2],
        Ok(switchyard_core::protocol::GenerateOutput::Finished {
            reason: FinishReason::Length,
            completion_tokens: 3,
            cached_tokens: None,
        })
    );
    // Decode steps take the decode time (5 blocks of 16384 in use).
    let decode = model.decode_ms(&StepShape {
        decode_seqs: 1,
        active_blocks: 5,
        capacity_blocks: 16_384,
        ..StepShape::default()
    });
    let total = start.elapsed();
    let expected_total = expected + Duration::from_secs_f64(2.0 * decode / 1e3 / 2.0);
    assert!(
        total.abs_diff(expected_total) < Duration::from_millis(3),
        "{total:?} vs {expected_total:?}"
    );
    let stored = events.recv().await.unwrap();
    assert!(!stored.is_empty());
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_stream_cancels_the_request_and_refusals_are_typed() {
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let running = mocker(EngineArgs::default())
        .start(&tracker, cancel.clone())
        .await
        .unwrap();
    let load = running.load.unwrap();
    let mut items = running
        .service
        .generate(request(1, 100, 10_000))
        .await
        .unwrap();
    use futures::StreamExt;
    items.next().await.unwrap().unwrap();
    items.next().await.unwrap().unwrap();
    assert!(load.borrow().active_blocks > 0);
    drop(items);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let now = *load.borrow();
    assert_eq!((now.running, now.active_blocks), (0, 0));

    // A request this engine can never hold: another worker might.
    let err = running
        .service
        .generate(request(2, 16, 1_000_000))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, EngineError::Unsupported(_)), "{err:?}");
    assert!(err.retry_elsewhere());
    // An empty prompt is invalid anywhere.
    let err = running
        .service
        .generate(request(3, 0, 4))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, EngineError::Invalid(_)), "{err:?}");
    assert!(!err.retry_elsewhere());
    // A decode request whose transferred KV covers the whole prompt has nothing to
    // compute from.
    let mut decode = request(4, 16, 4);
    decode.phase = Phase::Decode {
        kv: switchyard_core::protocol::KvHandle {
            source: WorkerKey::new(9, 0),
            request: RequestId(4),
            blocks: Vec::new(),
            tokens: 16,
            address: None,
        },
    };
    let err = running.service.generate(decode).await.err().unwrap();
    assert!(matches!(err, EngineError::Invalid(_)), "{err:?}");

    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    let err = running.service.generate(request(5, 16, 1)).await.err();
    assert_eq!(
        err,
        Some(EngineError::Stopping),
        "a stopped engine refuses work"
    );
}

#[tokio::test(start_paused = true)]
async fn a_resumed_request_continues_where_the_first_worker_stopped() {
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let first = mocker(EngineArgs::default())
        .start(&tracker, cancel.clone())
        .await
        .unwrap();
    let second = mocker(EngineArgs::default())
        .start(&tracker, cancel.clone())
        .await
        .unwrap();
    use futures::StreamExt;
    let tokens = |items: Vec<Result<switchyard_core::protocol::GenerateOutput, EngineError>>| {
        items
            .into_iter()
            .filter_map(|i| match i.unwrap() {
                switchyard_core::protocol::GenerateOutput::Tokens { token_ids, .. } => {
                    Some(token_ids)
                }
                _ => None,
            })
            .flatten()
            .collect::<Vec<u32>>()
    };
    let full = tokens(
        first
            .service
            .generate(request(7, 40, 10))
            .await
            .unwrap()
            .collect()
            .await,
    );
    assert_eq!(full.len(), 10);
    assert_eq!(
        full[0],
        token_at(SEED, 7, 40),
        "keyed by request and position"
    );
    let mut resumed = request(7, 40, 6);
    resumed.prompt.token_ids.extend(&full[..4]);
    resumed.resume = Some(Resume { generated: 4 });
    let rest = tokens(
        second
            .service
            .generate(resumed)
            .await
            .unwrap()
            .collect()
            .await,
    );
    assert_eq!(rest, full[4..]);
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_threaded_driver_serves_and_stops() {
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let engine = MockEngine::new(
        WorkerKey::new(1, 0),
        EngineArgs::default(),
        PerfModel::Polynomial,
        SEED,
    )
    .unwrap();
    let (handle, task) =
        driver::spawn_threaded(SteppedMocker::new(engine), None, &tracker, cancel.clone()).unwrap();
    let mut streams = Vec::new();
    for id in 0..8 {
        streams.push(handle.submit(request(id, 50, 20)).await.unwrap());
    }
    for (id, stream) in streams.iter_mut().enumerate() {
        let tokens = drain(stream).await;
        assert_eq!(tokens.len(), 20);
        assert_eq!(tokens[19].finish, Some(FinishReason::Length));
        let expected: Vec<u32> = (0..20).map(|i| token_at(SEED, id as u64, 50 + i)).collect();
        assert_eq!(tokens.iter().map(|t| t.token).collect::<Vec<_>>(), expected);
    }
    // A dropped stream frees its request.
    let mut long = handle.submit(request(100, 50, 100_000)).await.unwrap();
    long.recv().await.unwrap();
    drop(long);
    let mut load = handle.watch_load();
    tokio::time::timeout(Duration::from_secs(5), async {
        while load.borrow_and_update().running > 0 {
            load.changed().await.unwrap();
        }
    })
    .await
    .expect("the cancelled request leaves the engine");
    cancel.cancel();
    let report = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the engine thread stops on cancellation")
        .unwrap();
    assert!(report.steps > 20);
    tracker.close();
    tracker.wait().await;
    assert_eq!(
        handle.submit(request(200, 10, 1)).await.err(),
        Some(EngineError::Stopping)
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_sent_ahead_of_its_media_waits_at_them_until_told_they_are_ready() {
    use futures::StreamExt;
    use switchyard_core::{MediaSpan, Modality};
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let running = mocker(EngineArgs::default())
        .start(&tracker, cancel.clone())
        .await
        .unwrap();
    let mut events = running.events.unwrap();
    // 256 tokens of text, then an image's 64 placeholder positions.
    let mut ahead = request(1, 320, 2);
    ahead.prompt.media = vec![MediaSpan {
        modality: Modality::Image,
        media_hash: 7,
        offset: 256,
        length: 64,
    }];
    ahead.media_pending = true;
    let mut items = running.service.generate(ahead).await.unwrap();
    // Not ready: nothing comes, however long it waits...
    let waited = tokio::time::timeout(Duration::from_secs(30), items.next()).await;
    assert!(waited.is_err(), "{waited:?}");
    // ...but the text before the media was computed (and stored: 16 blocks of 16).
    let mut stored = 0;
    while let Ok(batch) = events.try_recv() {
        stored += batch.iter().map(|e| e.block_count()).sum::<usize>();
    }
    assert_eq!(stored, 16);
    // Other requests are served meanwhile: the engine is not stuck behind it.
    let mut other = running.service.generate(request(2, 32, 2)).await.unwrap();
    assert!(matches!(
        other.next().await,
        Some(Ok(GenerateOutput::Tokens { .. }))
    ));
    // Ready: it goes on, and only a request held there counts as held.
    assert!(running.service.media_ready(RequestId(1)).await.unwrap());
    assert!(!running.service.media_ready(RequestId(9)).await.unwrap());
    let first = tokio::time::timeout(Duration::from_secs(5), items.next()).await;
    assert!(
        matches!(first, Ok(Some(Ok(GenerateOutput::Tokens { .. })))),
        "{first:?}"
    );
    cancel.cancel();
}
