//! Disaggregated serving on the worker side: a prefill worker computes a prompt and hands
//! out its KV; a decode worker pulls what it lacks (timed by the link) and generates the
//! same tokens an aggregated worker would; a lost source fails the decode as `KvLost`.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::{
    EngineError, GenerateOutput, GenerateRequest, KvHandle, Phase, Resume,
};
use switchyard_core::{RequestId, Token, WorkerId, WorkerRole};
use switchyard_mocker::EngineArgs;
use switchyard_runtime::local::{
    LocalDiscovery, LocalEventPlane, LocalKvSnapshots, LocalRequestPlane,
};
use switchyard_runtime::{RequestPlane, ResponseStream};
use switchyard_worker::config::KvTransferConfig;
use switchyard_worker::{
    EchoConfig, EngineConfig, MockerConfig, Serving, Worker, WorkerConfig, WorkerError,
    WorkerPlanes,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const SPEEDUP: f64 = 10.0;

struct Fleet {
    planes: WorkerPlanes,
    requests: LocalRequestPlane,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Fleet {
    fn new() -> Self {
        Fleet {
            planes: WorkerPlanes {
                discovery: Arc::new(LocalDiscovery::new()),
                events: Arc::new(LocalEventPlane::new()),
            },
            requests: LocalRequestPlane::new(),
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
        }
    }

    async fn start(
        &self,
        id: u64,
        role: WorkerRole,
        engine: EngineConfig,
    ) -> Result<Worker, WorkerError> {
        let config = WorkerConfig {
            model: "m".into(),
            role,
            engine,
            faults: Default::default(),
        };
        Worker::start(
            WorkerId(id),
            &config,
            &self.planes,
            Serving::Local {
                requests: self.requests.clone(),
                snapshots: LocalKvSnapshots::new(),
            },
            &self.tracker,
            self.cancel.clone(),
        )
        .await
    }
}

/// A mocker whose KV link is slow (0.01 GB/s): a transfer's time shows.
fn mocker() -> EngineConfig {
    EngineConfig::Mocker(MockerConfig {
        args: EngineArgs {
            speedup_ratio: SPEEDUP,
            ..EngineArgs::default()
        },
        seed: 11,
        kv_transfer: KvTransferConfig {
            bandwidth_gbps: 0.01,
            ..KvTransferConfig::default()
        },
        ..MockerConfig::default()
    })
}

fn request(id: u64, prompt: &[Token], max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        sampling: switchyard_core::protocol::SamplingParams {
            seed: Some(99),
            ..Default::default()
        },
        ..GenerateRequest::text(RequestId(id), prompt.to_vec(), max_tokens)
    }
}

async fn tokens(stream: ResponseStream) -> Vec<Token> {
    stream
        .filter_map(|item| async move {
            match item.unwrap() {
                GenerateOutput::Tokens { token_ids, .. } => Some(token_ids),
                _ => None,
            }
        })
        .concat()
        .await
}

async fn prefill(
    requests: &LocalRequestPlane,
    worker: &Worker,
    id: u64,
    prompt: &[Token],
) -> (Token, KvHandle) {
    let mut r = request(id, prompt, 1);
    r.phase = Phase::PrefillOnly;
    let items: Vec<_> = requests
        .generate(&worker.instance, r)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(items.len(), 1, "{items:?}");
    match items.into_iter().next().unwrap().unwrap() {
        GenerateOutput::PrefillDone {
            first_token, kv, ..
        } => (first_token, kv),
        other => panic!("not a prefill answer: {other:?}"),
    }
}

fn decode(
    id: u64,
    prompt: &[Token],
    first: Token,
    kv: KvHandle,
    max_tokens: u32,
) -> GenerateRequest {
    let mut full = prompt.to_vec();
    full.push(first);
    GenerateRequest {
        resume: Some(Resume { generated: 1 }),
        phase: Phase::Decode { kv },
        ..request(id, &full, max_tokens - 1)
    }
}

#[tokio::test(start_paused = true)]
async fn prefill_then_decode_gives_the_aggregated_tokens_after_a_timed_transfer() {
    let fleet = Fleet::new();
    let p = fleet.start(1, WorkerRole::Prefill, mocker()).await.unwrap();
    let d = fleet.start(2, WorkerRole::Decode, mocker()).await.unwrap();
    let a = fleet
        .start(3, WorkerRole::Aggregated, mocker())
        .await
        .unwrap();
    let roles: Vec<WorkerRole> = {
        let listed = fleet.planes.discovery.watch().borrow().clone();
        (1..=3).map(|id| listed[&WorkerId(id)].role).collect()
    };
    assert_eq!(
        roles,
        [
            WorkerRole::Prefill,
            WorkerRole::Decode,
            WorkerRole::Aggregated
        ]
    );

    let prompt: Vec<Token> = (1000..1300).collect();
    let whole = tokens(
        fleet
            .requests
            .generate(&a.instance, request(7, &prompt, 12))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(whole.len(), 12);

    let (first, kv) = prefill(&fleet.requests, &p, 7, &prompt).await;
    assert_eq!(first, whole[0], "the prefill worker's first token");
    assert_eq!(kv.source.worker_id, WorkerId(1));
    assert_eq!((kv.tokens, kv.blocks.len()), (300, 300 / 16));

    // The decode worker holds nothing of it: the whole prompt's KV crosses the link.
    let transfer = KvTransferConfig {
        bandwidth_gbps: 0.01,
        ..KvTransferConfig::default()
    }
    .time(300)
    .div_f64(SPEEDUP);
    let started = Instant::now();
    let rest = tokens(
        fleet
            .requests
            .generate(&d.instance, decode(8, &prompt, first, kv.clone(), 12))
            .await
            .unwrap(),
    )
    .await;
    let cold = started.elapsed();
    assert_eq!(rest, whole[1..], "the same tokens as aggregated serving");
    assert!(cold >= transfer, "{cold:?} < {transfer:?}");

    // Now it holds the blocks: a second request from the same prefix pulls nothing.
    let started = Instant::now();
    let again = tokens(
        fleet
            .requests
            .generate(&d.instance, decode(9, &prompt, first, kv, 12))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(again.len(), 11);
    assert!(started.elapsed() < transfer, "{:?}", started.elapsed());

    // A source that is gone: the decode fails as KvLost (prefill again), not as a fault
    // of the decode worker.
    let other: Vec<Token> = (5000..5200).collect();
    let (first, kv) = prefill(&fleet.requests, &p, 10, &other).await;
    drop(p);
    let err = fleet
        .requests
        .generate(&d.instance, decode(10, &other, first, kv, 5))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, EngineError::KvLost(_)), "{err:?}");
    assert!(err.retry_elsewhere() && !err.is_worker_fault());
    fleet.cancel.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_source_lost_during_the_transfer_loses_the_copy() {
    let fleet = Fleet::new();
    let p = fleet.start(1, WorkerRole::Prefill, mocker()).await.unwrap();
    let d = fleet.start(2, WorkerRole::Decode, mocker()).await.unwrap();
    let prompt: Vec<Token> = (0..400).collect();
    let (first, kv) = prefill(&fleet.requests, &p, 1, &prompt).await;
    let requests = fleet.requests.clone();
    let instance = d.instance.clone();
    let pending = tokio::spawn(async move {
        requests
            .generate(&instance, decode(2, &prompt, first, kv, 8))
            .await
            .err()
    });
    // Mid-transfer (it takes ~0.5 s of model time at this speedup).
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(p);
    let err = pending.await.unwrap().unwrap();
    assert!(matches!(err, EngineError::KvLost(_)), "{err:?}");
    fleet.cancel.cancel();
}

#[tokio::test]
async fn an_engine_without_kv_handover_cannot_take_a_disaggregated_role() {
    let fleet = Fleet::new();
    let err = fleet
        .start(
            1,
            WorkerRole::Prefill,
            EngineConfig::Echo(EchoConfig::default()),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("cannot serve as a prefill worker"),
        "{err}"
    );
    let err = fleet
        .start(2, WorkerRole::Encoder, mocker())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("encoder"), "{err}");
    fleet.cancel.cancel();
}
