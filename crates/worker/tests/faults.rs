//! Injected faults, as a client of the worker sees them: a hang holds the stream and lets it
//! go on, corruption changes tokens, a refusal and a crash look like a dead worker, a slow
//! engine takes longer per step, and the admin endpoint is closed without its token.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::{EngineError, GenerateOutput, GenerateRequest, SamplingParams};
use switchyard_core::{RequestId, Token, WorkerId};
use switchyard_mocker::EngineArgs;
use switchyard_runtime::local::{
    LocalDiscovery, LocalEventPlane, LocalKvSnapshots, LocalRequestPlane,
};
use switchyard_runtime::{RequestPlane, ResponseStream};
use switchyard_worker::faults::{Fault, FaultSettings, FaultSpec};
use switchyard_worker::{EngineConfig, MockerConfig, Serving, Worker, WorkerConfig, WorkerPlanes};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

struct Setup {
    requests: LocalRequestPlane,
    worker: Worker,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

async fn setup(faults: FaultSettings) -> Setup {
    let planes = WorkerPlanes {
        discovery: Arc::new(LocalDiscovery::new()),
        events: Arc::new(LocalEventPlane::new()),
    };
    let requests = LocalRequestPlane::new();
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let config = WorkerConfig {
        model: "m".into(),
        role: Default::default(),
        engine: EngineConfig::Mocker(MockerConfig {
            args: EngineArgs {
                speedup_ratio: 1.0,
                ..EngineArgs::default()
            },
            ..MockerConfig::default()
        }),
        faults,
    };
    let worker = Worker::start(
        WorkerId(7),
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
    Setup {
        requests,
        worker,
        tracker,
        cancel,
    }
}

fn request(id: u64, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        sampling: SamplingParams {
            seed: Some(99),
            ..SamplingParams::default()
        },
        ..GenerateRequest::text(RequestId(id), (0..64).collect(), max_tokens)
    }
}

impl Setup {
    async fn stream(&self, id: u64, max_tokens: u32) -> Result<ResponseStream, EngineError> {
        self.requests
            .generate(&self.worker.instance, request(id, max_tokens))
            .await
    }

    /// The tokens of a whole request, and when its last item came.
    async fn tokens(&self, id: u64, max_tokens: u32) -> (Vec<Token>, Instant) {
        let mut stream = self.stream(id, max_tokens).await.unwrap();
        let mut tokens = Vec::new();
        while let Some(item) = stream.next().await {
            if let GenerateOutput::Tokens { token_ids, .. } = item.unwrap() {
                tokens.extend(token_ids);
            }
        }
        (tokens, Instant::now())
    }

    async fn stop(self) {
        drop(self.worker);
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

fn spec(fault: Fault, lasts: Option<Duration>) -> FaultSpec {
    FaultSpec {
        fault,
        at: Duration::ZERO,
        lasts,
    }
}

#[tokio::test(start_paused = true)]
async fn a_hang_holds_the_stream_and_lets_it_go_on_unchanged() {
    let s = setup(FaultSettings::default()).await;
    let (clean, _) = s.tokens(1, 20).await;

    let mut stream = s.stream(2, 20).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 5 {
        if let GenerateOutput::Tokens { token_ids, .. } = stream.next().await.unwrap().unwrap() {
            got.extend(token_ids);
        }
    }
    s.worker.faults().inject(
        spec(Fault::Hang, Some(Duration::from_secs(2))),
        &s.tracker,
        &s.cancel,
    );
    let frozen = Instant::now();
    // Nothing comes while it hangs.
    assert!(
        tokio::time::timeout(Duration::from_millis(1900), stream.next())
            .await
            .is_err()
    );
    while let Some(item) = stream.next().await {
        if let GenerateOutput::Tokens { token_ids, .. } = item.unwrap() {
            got.extend(token_ids);
        }
    }
    assert!(frozen.elapsed() >= Duration::from_secs(2));
    // The same request with the same seed: the same tokens, none lost while frozen.
    assert_eq!(got, clean);
    assert!(!s.worker.faults().active().hung);
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn corruption_changes_tokens_and_a_slow_engine_takes_longer() {
    let s = setup(FaultSettings::default()).await;
    let start = Instant::now();
    let (clean, done) = s.tokens(1, 30).await;
    let clean_time = done - start;

    s.worker
        .faults()
        .inject(spec(Fault::Corrupt, None), &s.tracker, &s.cancel);
    let (corrupt, _) = s.tokens(2, 30).await;
    assert_eq!(corrupt.len(), clean.len());
    assert!(corrupt.iter().zip(&clean).all(|(a, b)| a != b));
    s.worker.faults().clear();
    assert_eq!(s.tokens(3, 30).await.0, clean);

    s.worker.faults().inject(
        spec(Fault::Slow { factor: 4.0 }, None),
        &s.tracker,
        &s.cancel,
    );
    let start = Instant::now();
    let (slow, done) = s.tokens(4, 30).await;
    assert_eq!(slow, clean);
    let ratio = (done - start).as_secs_f64() / clean_time.as_secs_f64();
    // The second run finds the prompt cached, so a little less than 4×.
    assert!((3.0..4.5).contains(&ratio), "slow-down {ratio}");
    s.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_refusing_or_crashed_worker_looks_dead_and_a_schedule_plays_out() {
    let faults = FaultSettings {
        schedule: vec!["refuse@1s+1s".parse().unwrap(), "crash@5s".parse().unwrap()],
        ..FaultSettings::default()
    };
    let s = setup(faults).await;
    assert!(s.stream(1, 5).await.is_ok());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(
        s.stream(2, 5).await,
        Err(EngineError::Unreachable(_))
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The refusal lasted a second.
    let mut long = s.stream(3, 100_000).await.unwrap();
    assert!(long.next().await.unwrap().is_ok());
    // The crash at 5 s breaks the stream in flight, and nothing is served after.
    let mut last = None;
    while let Some(item) = long.next().await {
        last = Some(item);
    }
    assert_eq!(last, Some(Err(EngineError::Disconnected)));
    assert!(Instant::now().elapsed() < Duration::from_secs(1));
    assert!(s.worker.faults().active().crashed);
    assert!(matches!(
        s.stream(4, 5).await,
        Err(EngineError::Unreachable(_))
    ));
    s.stop().await;
}

#[tokio::test]
async fn the_admin_endpoint_wants_its_token_and_injects_on_command() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    let s = setup(FaultSettings::default()).await;
    let app = switchyard_worker::faults::admin_routes(
        s.worker.faults().clone(),
        "sesame".into(),
        s.tracker.clone(),
        s.cancel.clone(),
    );
    let call = |method: &str, token: Option<&str>, body: &str| {
        let mut request = Request::builder()
            .method(method)
            .uri(switchyard_worker::faults::FAULTS_PATH);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        app.clone()
            .oneshot(request.body(Body::from(body.to_string())).unwrap())
    };
    let status = |r: axum::response::Response| r.status();
    assert_eq!(
        status(call("POST", None, r#"{"fault":"hang"}"#).await.unwrap()),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status(
            call("POST", Some("sesamf"), r#"{"fault":"hang"}"#)
                .await
                .unwrap()
        ),
        StatusCode::UNAUTHORIZED
    );
    assert!(!s.worker.faults().active().hung);
    assert_eq!(
        status(
            call("POST", Some("sesame"), r#"{"fault":"melt"}"#)
                .await
                .unwrap()
        ),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status(
            call("POST", Some("sesame"), r#"{"fault":"hang"}"#)
                .await
                .unwrap()
        ),
        StatusCode::OK
    );
    assert!(s.worker.faults().active().hung);
    assert_eq!(
        status(call("DELETE", Some("sesame"), "").await.unwrap()),
        StatusCode::OK
    );
    assert!(!s.worker.faults().active().hung);
    s.stop().await;
}
