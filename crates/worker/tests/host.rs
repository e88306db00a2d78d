//! A mocker worker on in-process planes.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::{FinishReason, GenerateOutput, GenerateRequest};
use switchyard_core::{RequestId, WorkerId};
use switchyard_mocker::EngineArgs;
use switchyard_runtime::local::{
    LocalDiscovery, LocalEventPlane, LocalKvSnapshots, LocalRequestPlane,
};
use switchyard_runtime::{
    Discovery, DiscoveryError, Lease, RequestPlane, WorkerEvent, WorkerInstance,
};
use switchyard_worker::{
    EchoConfig, EngineConfig, MockerConfig, Serving, Worker, WorkerConfig, WorkerError,
    WorkerPlanes,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[tokio::test(start_paused = true)]
async fn a_worker_registers_serves_and_publishes() {
    let planes = WorkerPlanes {
        discovery: Arc::new(LocalDiscovery::new()),
        events: Arc::new(LocalEventPlane::new()),
    };
    let requests = LocalRequestPlane::new();
    let mut events = planes.events.subscribe("m").await.unwrap();
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let config = WorkerConfig {
        model: "m".into(),
        role: Default::default(),
        engine: EngineConfig::Mocker(MockerConfig {
            args: EngineArgs {
                speedup_ratio: 10.0,
                ..EngineArgs::default()
            },
            ..MockerConfig::default()
        }),
        faults: Default::default(),
    };
    let worker = Worker::start(
        WorkerId(42),
        &config,
        &planes,
        Serving::Local {
            requests: requests.clone(),
            snapshots: LocalKvSnapshots::new(),
        },
        &tracker,
        cancel.clone(),
    )
    .await
    .unwrap();
    let instances = planes.discovery.watch().borrow().clone();
    assert_eq!(instances[&WorkerId(42)].block_size, Some(16));
    assert_eq!(instances[&WorkerId(42)].capacity_blocks, Some(16_384));
    assert!(instances[&WorkerId(42)].kv_events);
    // Its timing, for routers that predict latency.
    assert_eq!(
        instances[&WorkerId(42)].perf,
        Some(switchyard_core::perf::PerfModel::Polynomial)
    );
    assert_eq!(instances[&WorkerId(42)].max_batched_tokens, Some(8192));

    let request = GenerateRequest::text(RequestId(1), (0..100).collect(), 5);
    let items: Vec<_> = requests
        .generate(&worker.instance, request)
        .await
        .unwrap()
        .map(|i| i.unwrap())
        .collect()
        .await;
    assert_eq!(items.len(), 6);
    assert!(matches!(
        items[0],
        GenerateOutput::Tokens {
            cached_tokens: Some(0),
            ..
        }
    ));
    assert_eq!(
        items[5],
        GenerateOutput::Finished {
            reason: FinishReason::Length,
            completion_tokens: 5,
            cached_tokens: None,
        }
    );

    // KV events (the 6 full prompt blocks) and load reports arrive on the event plane.
    let mut stored = 0;
    let mut saw_load = false;
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(500), events.recv()).await
    {
        match event {
            WorkerEvent::Kv(batch) => {
                stored += batch.iter().map(|e| e.block_count()).sum::<usize>()
            }
            WorkerEvent::Load { worker, .. } => {
                assert_eq!(worker.worker_id, WorkerId(42));
                saw_load = true;
            }
            WorkerEvent::EventsLost => panic!("nothing is lost on an idle local plane"),
        }
    }
    assert_eq!(stored, 6);
    assert!(saw_load);
    // The worker's own record of its cache, for frontends that resynchronise.
    let index = worker.kv_state.lock().index();
    assert_eq!(index.streams.len(), 1);
    assert_eq!(index.streams[0].blocks.len(), 6);

    drop(worker);
    assert!(planes.discovery.watch().borrow().is_empty());
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}

/// An echo worker of model "m" (answers with its prompt: easy to tell apart).
fn echo_config() -> WorkerConfig {
    WorkerConfig {
        model: "m".into(),
        role: Default::default(),
        engine: EngineConfig::Echo(EchoConfig::default()),
        faults: Default::default(),
    }
}

/// Whether a start was refused because `id` is registered already.
fn refused_as_duplicate(started: &Result<Worker, WorkerError>, id: u64) -> bool {
    matches!(
        started,
        Err(WorkerError::Discovery(DiscoveryError::Duplicate(WorkerId(i)))) if *i == id
    )
}

#[tokio::test]
async fn a_duplicate_id_is_refused_without_disturbing_the_registered_worker() {
    let planes = WorkerPlanes {
        discovery: Arc::new(LocalDiscovery::new()),
        events: Arc::new(LocalEventPlane::new()),
    };
    let requests = LocalRequestPlane::new();
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let echo = echo_config();
    let mocker = WorkerConfig {
        model: "m".into(),
        role: Default::default(),
        engine: EngineConfig::Mocker(MockerConfig::default()),
        faults: Default::default(),
    };
    let first = Worker::start(
        WorkerId(1),
        &echo,
        &planes,
        Serving::Local {
            requests: requests.clone(),
            snapshots: LocalKvSnapshots::new(),
        },
        &tracker,
        cancel.clone(),
    )
    .await
    .unwrap();
    let second = Worker::start(
        WorkerId(1),
        &mocker,
        &planes,
        Serving::Local {
            requests: requests.clone(),
            snapshots: LocalKvSnapshots::new(),
        },
        &tracker,
        cancel.clone(),
    )
    .await;
    assert!(refused_as_duplicate(&second, 1), "{second:?}");
    // The echo worker still answers its requests (the mocker's would be other tokens).
    assert!(
        !first.instance.kv_events,
        "the echo engine publishes no events"
    );
    assert_eq!(first.instance.capacity_blocks, None);
    let request = GenerateRequest::text(RequestId(1), vec![5, 6, 7], 3);
    let tokens: Vec<u32> = requests
        .generate(&first.instance, request)
        .await
        .unwrap()
        .filter_map(|o| async move {
            match o {
                Ok(GenerateOutput::Tokens { token_ids, .. }) => Some(token_ids),
                _ => None,
            }
        })
        .concat()
        .await;
    assert_eq!(tokens, vec![5, 6, 7]);
    // The refused worker's engine stopped with it: only the first worker's tasks remain.
    drop(first);
    tracker.close();
    tokio::time::timeout(Duration::from_secs(5), tracker.wait())
        .await
        .expect("every task stops once the workers are gone, without the global token");
}

/// A discovery that, like a frontend reacting at once, sends a request to every worker the
/// moment it is listed, and records how each went.
#[derive(Debug)]
struct EagerFrontend {
    inner: LocalDiscovery,
    requests: LocalRequestPlane,
    outcomes: parking_lot::Mutex<Vec<Result<(), String>>>,
}

#[async_trait::async_trait]
impl Discovery for EagerFrontend {
    async fn register(&self, instance: WorkerInstance) -> Result<Box<dyn Lease>, DiscoveryError> {
        let lease = self.inner.register(instance.clone()).await?;
        let request = GenerateRequest::text(RequestId(9), vec![1, 2, 3], 2);
        let outcome = match self.requests.generate(&instance, request).await {
            Ok(stream) => {
                let items: Vec<_> = stream.collect().await;
                match items.last() {
                    Some(Ok(GenerateOutput::Finished { .. })) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        self.outcomes.lock().push(outcome);
        Ok(lease)
    }

    fn watch(&self) -> tokio::sync::watch::Receiver<switchyard_runtime::Instances> {
        self.inner.watch()
    }
}

#[tokio::test]
async fn a_listed_worker_is_served_and_a_refused_one_leaves_nothing_behind() {
    let requests = LocalRequestPlane::new();
    let eager = Arc::new(EagerFrontend {
        inner: LocalDiscovery::new(),
        requests: requests.clone(),
        outcomes: Default::default(),
    });
    let planes = WorkerPlanes {
        discovery: eager.clone(),
        events: Arc::new(LocalEventPlane::new()),
    };
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let echo = echo_config();
    let serving = || Serving::Local {
        requests: requests.clone(),
        snapshots: LocalKvSnapshots::new(),
    };
    let worker = Worker::start(
        WorkerId(1),
        &echo,
        &planes,
        serving(),
        &tracker,
        cancel.clone(),
    )
    .await
    .unwrap();
    // Reachable the moment it was listed: what a frontend's first canary needs.
    assert_eq!(*eager.outcomes.lock(), vec![Ok(())]);
    // Id 2 is listed already (another process holds it): the worker is refused, and its
    // service does not stay behind on the plane.
    let _other = eager
        .inner
        .register(WorkerInstance::new(WorkerId(2), "m"))
        .await
        .unwrap();
    let refused = Worker::start(
        WorkerId(2),
        &echo,
        &planes,
        serving(),
        &tracker,
        cancel.clone(),
    )
    .await;
    assert!(refused_as_duplicate(&refused, 2), "{refused:?}");
    let instance = WorkerInstance::new(WorkerId(2), "m");
    let request = GenerateRequest::text(RequestId(10), vec![1], 1);
    assert!(matches!(
        requests.generate(&instance, request).await,
        Err(switchyard_runtime::EngineError::Unreachable(_))
    ));
    drop(worker);
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
}
