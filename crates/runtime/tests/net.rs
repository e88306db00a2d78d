//! The distributed planes against real servers: etcd for discovery, NATS for events, and
//! the HTTP/2 request plane between two runtimes.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use switchyard_core::protocol::{FinishReason, GenerateOutput, GenerateRequest};
use switchyard_core::{
    KvEvent, KvEventData, LoadSnapshot, LocalBlockHash, RequestId, SequenceHash, StorageTier,
    StoredBlock, WorkerId, WorkerKey,
};
use switchyard_runtime::net::etcd::EtcdDiscovery;
use switchyard_runtime::net::etcd::client::EtcdClient;
use switchyard_runtime::net::http::{HttpRequestPlane, routes};
use switchyard_runtime::net::nats::NatsEventPlane;
use switchyard_runtime::testing::{EtcdServer, NatsServer};
use switchyard_runtime::{
    Discovery, EngineError, EngineService, EventPlane, Instances, RequestPlane, ResponseStream,
    WorkerEvent, WorkerInstance,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

fn instance(id: u64, address: Option<String>) -> WorkerInstance {
    WorkerInstance {
        block_size: Some(16),
        capacity_blocks: Some(100),
        max_num_seqs: Some(8),
        address,
        ..WorkerInstance::new(WorkerId(id), "m")
    }
}

/// Waits until the watched instances satisfy `check`.
async fn until(
    watch: &mut watch::Receiver<Instances>,
    within: Duration,
    check: impl Fn(&Instances) -> bool,
) {
    let wait = async {
        loop {
            if check(&watch.borrow_and_update()) {
                return;
            }
            watch.changed().await.unwrap();
        }
    };
    tokio::time::timeout(within, wait)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "discovery did not converge within {within:?}: {:?}",
                watch.borrow().keys().collect::<Vec<_>>()
            )
        });
}

fn discovery(etcd: &EtcdServer, ttl: Duration) -> (EtcdDiscovery, CancellationToken) {
    let cancel = CancellationToken::new();
    let d = EtcdDiscovery::start(
        &etcd.url(),
        "test ns",
        ttl,
        TaskTracker::new(),
        cancel.clone(),
    );
    (d, cancel)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_registrations_come_and_go() {
    let etcd = EtcdServer::start();
    let (frontend, _f) = discovery(&etcd, Duration::from_secs(10));
    let (worker, _w) = discovery(&etcd, Duration::from_secs(10));
    let mut watch = frontend.watch();
    let lease = worker
        .register(instance(1, Some("127.0.0.1:1".into())))
        .await
        .unwrap();
    let lease2 = worker.register(instance(2, None)).await.unwrap();
    until(&mut watch, Duration::from_secs(5), |i| i.len() == 2).await;
    assert_eq!(
        watch.borrow()[&WorkerId(1)].address.as_deref(),
        Some("127.0.0.1:1"),
        "the instance travels whole"
    );
    // A graceful exit revokes the lease: gone at once, not after the TTL.
    let started = std::time::Instant::now();
    drop(lease);
    until(&mut watch, Duration::from_secs(3), |i| {
        !i.contains_key(&WorkerId(1))
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(watch.borrow().contains_key(&WorkerId(2)));

    // A late watcher lists what is there.
    let (late, _l) = discovery(&etcd, Duration::from_secs(10));
    let mut late_watch = late.watch();
    until(&mut late_watch, Duration::from_secs(5), |i| {
        i.len() == 1 && i.contains_key(&WorkerId(2))
    })
    .await;
    drop(lease2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrenewed_lease_expires_and_the_worker_leaves() {
    let etcd = EtcdServer::start();
    let (frontend, _f) = discovery(&etcd, Duration::from_secs(10));
    let mut watch = frontend.watch();
    // A worker that dies without a word: its key under a lease nobody renews.
    let endpoint = etcd.url().replace("etcd://", "");
    let client = EtcdClient::new(&endpoint).unwrap();
    let lease = client.grant(Duration::from_secs(2)).await.unwrap();
    let value = serde_json::to_vec(&instance(9, None)).unwrap();
    client
        .put(
            b"/switchyard/test_ns/instances/0000000000000009",
            &value,
            lease,
        )
        .await
        .unwrap();
    // Something that is not a worker record, under the same prefix: ignored, with a warning.
    client
        .put(
            b"/switchyard/test_ns/instances/garbage",
            b"{not json",
            lease,
        )
        .await
        .unwrap();
    until(&mut watch, Duration::from_secs(5), |i| {
        i.contains_key(&WorkerId(9))
    })
    .await;
    let started = std::time::Instant::now();
    until(&mut watch, Duration::from_secs(6), |i| i.is_empty()).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "removed by expiry, not at once: {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_survive_etcd_restarts_even_with_lost_data() {
    let mut etcd = EtcdServer::start();
    let (frontend, _f) = discovery(&etcd, Duration::from_secs(3));
    let (worker, _w) = discovery(&etcd, Duration::from_secs(3));
    let mut watch = frontend.watch();
    let _lease = worker.register(instance(5, None)).await.unwrap();
    until(&mut watch, Duration::from_secs(5), |i| {
        i.contains_key(&WorkerId(5))
    })
    .await;

    etcd.restart();
    let _lease2 = worker.register(instance(6, None)).await.unwrap();
    until(&mut watch, Duration::from_secs(15), |i| i.len() == 2).await;

    // etcd comes back empty: the keepers notice their leases are gone and register again,
    // and the watcher re-lists.
    etcd.restart_empty();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (fresh, _x) = discovery(&etcd, Duration::from_secs(3));
    let mut fresh_watch = fresh.watch();
    until(&mut fresh_watch, Duration::from_secs(15), |i| i.len() == 2).await;
    until(&mut watch, Duration::from_secs(15), |i| i.len() == 2).await;
}

fn stored(worker: u64, id: u64) -> KvEvent {
    KvEvent {
        worker_id: WorkerId(worker),
        dp_rank: 0,
        event_id: id,
        tier: StorageTier::Device,
        data: KvEventData::Stored {
            parent: None,
            blocks: vec![StoredBlock {
                seq_hash: SequenceHash(id),
                local_hash: LocalBlockHash(id),
            }],
        },
    }
}

async fn next(subscription: &mut switchyard_runtime::EventSubscription) -> WorkerEvent {
    tokio::time::timeout(Duration::from_secs(10), subscription.recv())
        .await
        .expect("an event within 10 s")
        .expect("the subscription is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_carries_events_per_model_and_reports_reconnections() {
    let mut nats = NatsServer::start();
    let tracker = TaskTracker::new();
    let cancel = CancellationToken::new();
    let worker = NatsEventPlane::connect(&nats.url(), "ns", tracker.clone(), cancel.clone())
        .await
        .unwrap();
    let frontend = NatsEventPlane::connect(&nats.url(), "ns", tracker.clone(), cancel.clone())
        .await
        .unwrap();
    let other_ns = NatsEventPlane::connect(&nats.url(), "other", tracker.clone(), cancel.clone())
        .await
        .unwrap();
    let mut events = frontend.subscribe("org/model:v1").await.unwrap();
    let mut other_model = frontend.subscribe("another").await.unwrap();
    let mut other_namespace = other_ns.subscribe("org/model:v1").await.unwrap();
    // Subscriptions reach the server before anything is published.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // A large batch is split, in order.
    let batch: Vec<KvEvent> = (1..=600).map(|id| stored(1, id)).collect();
    worker
        .publish("org/model:v1", WorkerEvent::Kv(batch.clone()))
        .await
        .unwrap();
    let load = WorkerEvent::Load {
        worker: WorkerKey::new(1, 0),
        load: LoadSnapshot::default(),
    };
    worker.publish("org/model:v1", load.clone()).await.unwrap();
    let mut received = Vec::new();
    while received.len() < batch.len() {
        match next(&mut events).await {
            WorkerEvent::Kv(events) => received.extend(events),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(received, batch);
    assert_eq!(next(&mut events).await, load);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(other_model.try_recv().is_err(), "subjects are per model");
    assert!(other_namespace.try_recv().is_err(), "and per namespace");

    // The server restarts: the subscription says so, and carries events again.
    nats.restart();
    assert_eq!(next(&mut events).await, WorkerEvent::EventsLost);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        // The publisher may reconnect after the subscriber: publish until one arrives.
        worker
            .publish("org/model:v1", WorkerEvent::Kv(vec![stored(1, 601)]))
            .await
            .unwrap();
        match tokio::time::timeout(Duration::from_millis(300), events.recv()).await {
            Ok(Some(WorkerEvent::Kv(got))) => {
                assert_eq!(got, vec![stored(1, 601)]);
                break;
            }
            Ok(Some(WorkerEvent::EventsLost)) | Err(_) => {}
            Ok(other) => panic!("unexpected {other:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no event after the restart"
        );
    }
    cancel.cancel();
}

/// Streams `max_tokens` tokens, one per `interval`; counts streams dropped before their end.
#[derive(Debug, Default)]
struct Ticker {
    interval: Duration,
    dropped: Arc<AtomicUsize>,
}

struct DropCounter(Arc<AtomicUsize>, bool);

impl Drop for DropCounter {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[async_trait]
impl EngineService for Ticker {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError> {
        match request.max_tokens {
            0 => return Err(EngineError::Invalid("max_tokens must be at least 1".into())),
            999 => return Err(EngineError::Overloaded("too many requests here".into())),
            // A frame far over the limit frontends accept.
            555 => {
                let huge = GenerateOutput::Text {
                    text: "x".repeat(switchyard_runtime::net::http::MAX_FRAME_BYTES + 1),
                    tokens: None,
                    cached_tokens: None,
                    logprobs: Vec::new(),
                };
                return Ok(futures::stream::iter([Ok(huge)]).boxed());
            }
            // Fails mid-stream, after one token.
            777 => {
                let items = [
                    Ok(GenerateOutput::Tokens {
                        token_ids: vec![1],
                        cached_tokens: Some(0),
                        logprobs: Vec::new(),
                    }),
                    Err(EngineError::Internal("the engine broke".into())),
                ];
                return Ok(futures::stream::iter(items).boxed());
            }
            _ => {}
        }
        let interval = self.interval;
        let counter = DropCounter(Arc::clone(&self.dropped), false);
        let n = request.max_tokens;
        let stream = futures::stream::unfold((0u32, counter), move |(i, mut counter)| async move {
            if i > n {
                return None;
            }
            tokio::time::sleep(interval).await;
            if i == n {
                counter.1 = true;
                let end = GenerateOutput::Finished {
                    reason: FinishReason::Length,
                    completion_tokens: n,
                    cached_tokens: None,
                };
                return Some((Ok(end), (i + 1, counter)));
            }
            let tokens = GenerateOutput::Tokens {
                token_ids: vec![i],
                cached_tokens: (i == 0).then_some(0),
                logprobs: Vec::new(),
            };
            Some((Ok(tokens), (i + 1, counter)))
        });
        Ok(stream.boxed())
    }
}

fn request(max_tokens: u32) -> GenerateRequest {
    GenerateRequest::text(RequestId(1), vec![1, 2, 3], max_tokens)
}

/// Serves `service` on its own runtime in a thread; dropping the guard kills that runtime
/// and every connection with it, like a crashed worker.
struct WorkerRuntime {
    address: String,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WorkerRuntime {
    fn start(service: Arc<dyn EngineService>) -> Self {
        let (address_tx, address_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            runtime.spawn(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                address_tx
                    .send(listener.local_addr().unwrap().to_string())
                    .unwrap();
                axum::serve(listener, routes(service)).await.unwrap();
            });
            let _ = stop_rx.recv();
            runtime.shutdown_background();
        });
        WorkerRuntime {
            address: address_rx.recv().unwrap(),
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    fn kill(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for WorkerRuntime {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_plane_streams_cancels_and_reports_lost_workers() {
    let dropped = Arc::new(AtomicUsize::new(0));
    let service = Arc::new(Ticker {
        interval: Duration::from_millis(5),
        dropped: Arc::clone(&dropped),
    });
    let mut worker = WorkerRuntime::start(service);
    let target = instance(1, Some(worker.address.clone()));
    let plane = HttpRequestPlane::new().unwrap();

    // A whole stream, tokens then Finished.
    let items: Vec<_> = plane
        .generate(&target, request(4))
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(items.len(), 5, "{items:?}");
    assert!(
        items[..4]
            .iter()
            .all(|i| matches!(i, Ok(GenerateOutput::Tokens { .. })))
    );
    assert!(matches!(
        items[4],
        Ok(GenerateOutput::Finished {
            completion_tokens: 4,
            ..
        })
    ));
    assert_eq!(dropped.load(Ordering::SeqCst), 0);

    // Many at once over the one connection.
    let streams = futures::future::join_all((0..32).map(|_| async {
        let stream = plane.generate(&target, request(3)).await.unwrap();
        stream.collect::<Vec<_>>().await.len()
    }))
    .await;
    assert!(streams.iter().all(|&n| n == 4), "{streams:?}");

    // Refusals and failures keep their type across the network.
    assert!(matches!(
        plane.generate(&target, request(0)).await,
        Err(EngineError::Invalid(m)) if m.contains("max_tokens")
    ));
    assert!(matches!(
        plane.generate(&target, request(999)).await,
        Err(EngineError::Overloaded(_))
    ));
    let failed: Vec<_> = plane
        .generate(&target, request(777))
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(
        failed.last(),
        Some(&Err(EngineError::Internal("the engine broke".into())))
    );
    // A frame over the limit ends the stream instead of being buffered.
    let huge: Vec<_> = plane
        .generate(&target, request(555))
        .await
        .unwrap()
        .collect()
        .await;
    assert!(
        matches!(huge.as_slice(), [Err(EngineError::Internal(m))] if m.contains("limit")),
        "{:?}",
        huge.iter().map(|r| r.as_ref().err()).collect::<Vec<_>>()
    );

    // Dropping the stream cancels the request on the worker.
    let mut stream = plane.generate(&target, request(1000)).await.unwrap();
    assert!(stream.next().await.unwrap().is_ok());
    drop(stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while dropped.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never saw the cancellation"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The worker dies mid-stream: the stream ends with Disconnected.
    let mut stream = plane.generate(&target, request(1000)).await.unwrap();
    assert!(stream.next().await.unwrap().is_ok());
    worker.kill();
    let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(10), stream.collect::<Vec<_>>())
        .await
        .expect("the stream ends once the worker is gone");
    assert_eq!(
        rest.last(),
        Some(&Err(EngineError::Disconnected)),
        "{:?}",
        rest.last()
    );

    // Nobody listens there now.
    assert!(matches!(
        plane.generate(&target, request(1)).await,
        Err(EngineError::Unreachable(_))
    ));
    assert!(matches!(
        plane.generate(&instance(2, None), request(1)).await,
        Err(EngineError::Unreachable(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_request_plane_secret_refuses_frontends_without_it() {
    use switchyard_runtime::net::secret;
    const SECRET: &str = "correct-horse-battery-staple";
    let service: Arc<dyn EngineService> = Arc::new(Ticker {
        interval: Duration::from_millis(1),
        dropped: Arc::new(AtomicUsize::new(0)),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let app = routes(service).layer(axum::middleware::from_fn_with_state(
        Arc::<str>::from(SECRET),
        secret::require,
    ));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let target = instance(1, Some(address));
    for presented in [None, Some("correct-horse-battery-stapler"), Some("wrong")] {
        let plane = HttpRequestPlane::with_secret(presented).unwrap();
        match plane.generate(&target, request(2)).await {
            Err(EngineError::Unreachable(message)) => {
                assert!(message.contains("request-plane secret"), "{message}");
            }
            Err(other) => panic!("{presented:?} was refused oddly: {other:?}"),
            Ok(_) => panic!("{presented:?} was not refused"),
        }
    }
    let plane = HttpRequestPlane::with_secret(Some(SECRET)).unwrap();
    let items: Vec<_> = plane
        .generate(&target, request(2))
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(items.len(), 3, "{items:?}");
    // The secret never shows in the client's debug output.
    assert!(!format!("{plane:?}").contains(SECRET));
    server.abort();
}
