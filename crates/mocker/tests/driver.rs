//! The real-time driver, on tokio's paused clock.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use switchyard_core::{HashSeed, RequestId, TokenBlocks, WorkerKey};
use switchyard_mocker::driver::{self, SubmitError};
use switchyard_mocker::perf::StepShape;
use switchyard_mocker::{EngineArgs, MockEngine, MockRequest, PerfModel, Rejected};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn request(id: u64, tokens: u32, max_output_tokens: u32) -> MockRequest {
    let prompt: Vec<u32> = (0..tokens).map(|t| t + id as u32 * 1000).collect();
    MockRequest {
        id: RequestId(id),
        prompt: TokenBlocks::new(&prompt, 16, HashSeed::default()).unwrap(),
        max_output_tokens,
    }
}

#[tokio::test(start_paused = true)]
async fn tokens_arrive_on_the_model_clock_and_events_flow() {
    let args = EngineArgs {
        speedup_ratio: 2.0,
        ..EngineArgs::default()
    };
    let engine = MockEngine::new(WorkerKey::new(1, 0), args, PerfModel::Polynomial, 3).unwrap();
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (handle, _task) = driver::spawn(engine, Some(events_tx), &tracker, cancel.clone());

    let start = Instant::now();
    let mut stream = handle.submit(request(1, 64, 3)).await.unwrap();
    let first = stream.recv().await.unwrap();
    let ttft = start.elapsed();
    // One prefill step of 64 tokens at speedup 2.
    let model = PerfModel::Polynomial;
    let expected = Duration::from_secs_f64(model.prefill_ms(64) / 1e3 / 2.0);
    assert!(
        ttft.abs_diff(expected) < Duration::from_millis(2),
        "{ttft:?} vs {expected:?}"
    );
    assert_eq!(first.index, 0);
    let second = stream.recv().await.unwrap();
    let third = stream.recv().await.unwrap();
    assert!(third.finished && !second.finished);
    assert!(
        stream.recv().await.is_none(),
        "the stream closes after the last token"
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
async fn a_dropped_stream_cancels_the_request_and_frees_its_blocks() {
    let engine = MockEngine::new(
        WorkerKey::new(1, 0),
        EngineArgs::default(),
        PerfModel::Polynomial,
        3,
    )
    .unwrap();
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let (handle, task) = driver::spawn(engine, None, &tracker, cancel.clone());
    let mut stream = handle.submit(request(1, 100, 10_000)).await.unwrap();
    stream.recv().await.unwrap();
    stream.recv().await.unwrap();
    assert!(handle.load().active_blocks > 0);
    drop(stream);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let load = handle.load();
    assert_eq!((load.running, load.active_blocks), (0, 0));

    // A request the engine can never hold is refused, not queued forever.
    let err = handle.submit(request(2, 16, 1_000_000)).await.unwrap_err();
    assert!(matches!(
        err,
        SubmitError::Rejected(Rejected::TooLarge { .. })
    ));

    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    let report = task.await.unwrap();
    assert!(report.steps >= 3);
    assert!(
        handle.submit(request(3, 16, 1)).await.is_err(),
        "a stopped engine refuses work"
    );
}
