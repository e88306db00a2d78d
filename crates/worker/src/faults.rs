//! Fault injection, for tests, the chaos runs and demos: a worker told to fail fails the
//! way real ones do, at a set time or on command.
//!
//! - `crash`: the worker dies. A worker process exits at once (no draining, its lease left
//!   to expire, like `kill -9`); an in-process worker stops its engine, breaks its streams
//!   and refuses requests as unreachable, while staying registered.
//! - `hang`: no output while it lasts (streams freeze; new requests are not answered), then
//!   everything held goes out, like a process stopped with SIGSTOP and continued.
//! - `slow:K`: the engine's steps take K times longer (engines on the step driver).
//! - `corrupt`: wrong tokens, silently (each token id off by one).
//! - `drift:D`: the right tokens, but every log probability reported D lower (D > 0), as
//!   from logits perturbed without changing their order: corruption only log probabilities
//!   show.
//! - `refuse`: new requests are refused as if the port were closed.
//! - `truncate`: every stream ends right after its last token, without the record that
//!   says it finished, as when a worker dies between the two (the answer is whole).
//!
//! A fault is written `KIND[:ARG][@AT][+FOR]`: `crash@30s` (30 s after the worker started),
//! `hang@10s+5s` (for five seconds), `slow:4+20s` (now, for twenty seconds), `corrupt`.
//! Without `+FOR` a fault lasts until cleared.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use parking_lot::Mutex;
use switchyard_core::protocol::{EngineError, GenerateOutput, GenerateRequest, TokenLogprobs};
use switchyard_runtime::{EngineService, ResponseStream};
use thiserror::Error;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    Crash,
    Hang,
    Slow { factor: f64 },
    Corrupt,
    Refuse,
    Truncate,
    Drift { by: f64 },
}

impl Fault {
    fn flag(self) -> u8 {
        match self {
            Fault::Crash => CRASHED,
            Fault::Hang => HUNG,
            Fault::Slow { .. } => SLOW,
            Fault::Corrupt => CORRUPT,
            Fault::Refuse => REFUSING,
            Fault::Truncate => TRUNCATING,
            Fault::Drift { .. } => DRIFTING,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Crash => f.write_str("crash"),
            Fault::Hang => f.write_str("hang"),
            Fault::Slow { factor } => write!(f, "slow:{factor}"),
            Fault::Corrupt => f.write_str("corrupt"),
            Fault::Refuse => f.write_str("refuse"),
            Fault::Truncate => f.write_str("truncate"),
            Fault::Drift { by } => write!(f, "drift:{by}"),
        }
    }
}

/// A fault, when it starts (after the worker started) and how long it lasts. Written (and
/// serialized) as `KIND[:ARG][@AT][+FOR]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultSpec {
    pub fault: Fault,
    pub at: Duration,
    pub lasts: Option<Duration>,
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.fault)?;
        if !self.at.is_zero() {
            write!(f, "@{}", humantime::format_duration(self.at))?;
        }
        if let Some(lasts) = self.lasts {
            write!(f, "+{}", humantime::format_duration(lasts))?;
        }
        Ok(())
    }
}

impl serde::Serialize for FaultSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for FaultSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A worker's fault settings.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultSettings {
    /// Faults to inject, at their times after the worker started.
    pub schedule: Vec<FaultSpec>,
    /// Enables the admin endpoint that injects faults on command (over the network only),
    /// for requests bearing this token. Never set it in production.
    pub admin_token: Option<String>,
    /// A crash exits the process (a worker process) rather than stopping only the worker
    /// (workers sharing a process). Set by the host, not configured.
    #[serde(skip)]
    pub crash_exits: bool,
}

#[derive(Debug, Error, PartialEq)]
#[error(
    "invalid fault `{spec}`: {reason} (expected KIND[:ARG][@AT][+FOR] with KIND one of crash, hang, slow:FACTOR, corrupt, drift:D, refuse, truncate; e.g. hang@10s+5s)"
)]
pub struct InvalidFault {
    spec: String,
    reason: String,
}

impl FromStr for FaultSpec {
    type Err = InvalidFault;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let invalid = |reason: String| InvalidFault {
            spec: spec.to_string(),
            reason,
        };
        let duration = |text: &str, what: &str| {
            humantime::parse_duration(text)
                .map_err(|e| invalid(format!("{what} `{text}` is not a duration: {e}")))
        };
        let (rest, lasts) = match spec.split_once('+') {
            Some((rest, lasts)) => (rest, Some(duration(lasts, "the length")?)),
            None => (spec, None),
        };
        let (kind, at) = match rest.split_once('@') {
            Some((kind, at)) => (kind, duration(at, "the start")?),
            None => (rest, Duration::ZERO),
        };
        let (name, arg) = match kind.split_once(':') {
            Some((name, arg)) => (name, Some(arg)),
            None => (kind, None),
        };
        let fault = match (name.trim(), arg) {
            ("crash", None) => Fault::Crash,
            ("hang", None) => Fault::Hang,
            ("corrupt", None) => Fault::Corrupt,
            ("refuse", None) => Fault::Refuse,
            ("truncate", None) => Fault::Truncate,
            ("slow", Some(factor)) => match factor.parse::<f64>() {
                Ok(factor) if factor >= 1.0 && factor.is_finite() => Fault::Slow { factor },
                _ => {
                    return Err(invalid(format!(
                        "the slow-down `{factor}` must be a number of at least 1"
                    )));
                }
            },
            ("slow", None) => return Err(invalid("slow needs a factor, as in slow:4".into())),
            ("drift", Some(by)) => match by.parse::<f64>() {
                Ok(by) if by > 0.0 && by.is_finite() => Fault::Drift { by },
                _ => {
                    return Err(invalid(format!(
                        "the drift `{by}` must be a positive number of nats"
                    )));
                }
            },
            ("drift", None) => {
                return Err(invalid("drift needs an amount, as in drift:0.5".into()));
            }
            (other, Some(_))
                if ["crash", "hang", "corrupt", "refuse", "truncate"].contains(&other) =>
            {
                return Err(invalid(format!("{other} takes no argument")));
            }
            (other, _) => return Err(invalid(format!("unknown fault `{other}`"))),
        };
        if fault == Fault::Crash && lasts.is_some() {
            return Err(invalid("a crash lasts: it takes no +FOR".into()));
        }
        Ok(FaultSpec { fault, at, lasts })
    }
}

const CRASHED: u8 = 1;
const HUNG: u8 = 2;
const SLOW: u8 = 4;
const CORRUPT: u8 = 8;
const REFUSING: u8 = 16;
const TRUNCATING: u8 = 32;
const DRIFTING: u8 = 64;

/// How a crash plays out.
#[derive(Debug, Clone)]
pub enum CrashMode {
    /// The process exits at once (a worker process).
    Exit,
    /// The worker's engine and tasks stop (this token is cancelled) and its service answers
    /// as a dead worker would (an in-process worker: the process must live on).
    Stop(CancellationToken),
}

/// A worker's faults: what is active now, shared by its service, its engine (the pace of
/// its steps) and whoever injects them.
#[derive(Debug, Clone)]
pub struct Faults {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    flags: AtomicU8,
    /// The engine's pace: a factor on its step times (f64 bits).
    pace: Pace,
    /// How much lower log probabilities are reported under `drift` (f64 bits).
    drift: AtomicU64,
    /// Woken when a fault ends (hung streams go on) or the worker crashes.
    changed: Notify,
    crash: Mutex<CrashMode>,
    /// Each injection's generation: a timed fault ends only if nothing replaced it.
    generation: Mutex<[u64; 7]>,
}

/// A factor on an engine's step times, shared with whoever slows it down.
#[derive(Debug, Clone)]
pub struct Pace(Arc<AtomicU64>);

impl Default for Pace {
    fn default() -> Self {
        Pace(Arc::new(AtomicU64::new(1.0f64.to_bits())))
    }
}

impl Pace {
    pub fn factor(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    fn set(&self, factor: f64) {
        self.0.store(factor.to_bits(), Ordering::Relaxed);
    }
}

/// What is active, for listings.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ActiveFaults {
    pub crashed: bool,
    pub hung: bool,
    pub slow_factor: f64,
    pub corrupt: bool,
    pub refusing: bool,
    pub truncating: bool,
    /// How much lower log probabilities are reported (0: not drifting).
    pub drift: f64,
}

fn slot(fault: Fault) -> usize {
    fault.flag().trailing_zeros() as usize
}

impl Faults {
    /// No fault active; a crash plays out as `crash`. `pace` is the engine's, when it can
    /// be slowed down.
    pub fn new(crash: CrashMode, pace: Pace) -> Self {
        Faults {
            inner: Arc::new(Inner {
                flags: AtomicU8::new(0),
                pace,
                drift: AtomicU64::new(0f64.to_bits()),
                changed: Notify::new(),
                crash: Mutex::new(crash),
                generation: Mutex::new([0; 7]),
            }),
        }
    }

    /// How a crash plays out from now on.
    pub fn set_crash_mode(&self, crash: CrashMode) {
        *self.inner.crash.lock() = crash;
    }

    fn flags(&self) -> u8 {
        self.inner.flags.load(Ordering::Acquire)
    }

    pub fn active(&self) -> ActiveFaults {
        let flags = self.flags();
        ActiveFaults {
            crashed: flags & CRASHED != 0,
            hung: flags & HUNG != 0,
            slow_factor: self.inner.pace.factor(),
            corrupt: flags & CORRUPT != 0,
            refusing: flags & REFUSING != 0,
            truncating: flags & TRUNCATING != 0,
            drift: if flags & DRIFTING != 0 {
                self.drift()
            } else {
                0.0
            },
        }
    }

    /// Starts a fault now; returns its generation (see [`Faults::end_if`]).
    pub fn start(&self, fault: Fault) -> u64 {
        tracing::warn!(%fault, "injecting a fault");
        let generation = {
            let mut generations = self.inner.generation.lock();
            generations[slot(fault)] += 1;
            generations[slot(fault)]
        };
        if let Fault::Slow { factor } = fault {
            self.inner.pace.set(factor);
        }
        if let Fault::Drift { by } = fault {
            self.inner.drift.store(by.to_bits(), Ordering::Relaxed);
        }
        self.inner.flags.fetch_or(fault.flag(), Ordering::AcqRel);
        if fault == Fault::Crash {
            match &*self.inner.crash.lock() {
                CrashMode::Exit => {
                    tracing::error!("crashing (injected fault)");
                    std::process::exit(137);
                }
                CrashMode::Stop(stop) => stop.cancel(),
            }
            self.inner.changed.notify_waiters();
        }
        generation
    }

    /// Ends a fault (a crash cannot end).
    pub fn end(&self, fault: Fault) {
        if fault == Fault::Crash {
            return;
        }
        tracing::info!(%fault, "fault cleared");
        if let Fault::Slow { .. } = fault {
            self.inner.pace.set(1.0);
        }
        self.inner.flags.fetch_and(!fault.flag(), Ordering::AcqRel);
        self.inner.changed.notify_waiters();
    }

    /// Ends a fault if it was not injected again since `generation`.
    fn end_if(&self, fault: Fault, generation: u64) {
        if self.inner.generation.lock()[slot(fault)] == generation {
            self.end(fault);
        }
    }

    /// Ends every fault but a crash.
    pub fn clear(&self) {
        for fault in [
            Fault::Hang,
            Fault::Slow { factor: 1.0 },
            Fault::Corrupt,
            Fault::Refuse,
            Fault::Truncate,
            Fault::Drift { by: 0.0 },
        ] {
            self.end(fault);
        }
    }

    /// Starts `spec` now, and ends it after its length (if it has one).
    pub fn inject(&self, spec: FaultSpec, tracker: &TaskTracker, cancel: &CancellationToken) {
        let generation = self.start(spec.fault);
        if let Some(lasts) = spec.lasts {
            let faults = self.clone();
            let cancel = cancel.clone();
            tracker.spawn(async move {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tokio::time::sleep(lasts) => faults.end_if(spec.fault, generation),
                }
            });
        }
    }

    /// Plays a schedule: each fault at its time after now.
    pub fn schedule(&self, specs: &[FaultSpec], tracker: &TaskTracker, cancel: &CancellationToken) {
        let started = tokio::time::Instant::now();
        for &spec in specs {
            let faults = self.clone();
            let cancel = cancel.clone();
            let tasks = tracker.clone();
            tracker.spawn(async move {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = tokio::time::sleep_until(started + spec.at) => {
                        faults.inject(FaultSpec { at: Duration::ZERO, ..spec }, &tasks, &cancel);
                    }
                }
            });
        }
    }

    fn drift(&self) -> f64 {
        f64::from_bits(self.inner.drift.load(Ordering::Relaxed))
    }

    /// Waits while the worker hangs; false if it crashed meanwhile.
    async fn through_hang(&self) -> bool {
        loop {
            let changed = self.inner.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Registered before the check: a change right after it is not missed.
            changed.as_mut().enable();
            let flags = self.flags();
            if flags & CRASHED != 0 {
                return false;
            }
            if flags & HUNG == 0 {
                return true;
            }
            changed.await;
        }
    }
}

/// An engine service showing its worker's faults.
#[derive(Debug)]
pub struct FaultyService {
    inner: Arc<dyn EngineService>,
    faults: Faults,
}

impl FaultyService {
    pub fn new(inner: Arc<dyn EngineService>, faults: Faults) -> Self {
        FaultyService { inner, faults }
    }
}

/// One token off: another valid token id, deterministically wrong.
fn corrupt(output: &mut GenerateOutput) {
    if let GenerateOutput::Tokens { token_ids, .. } = output {
        for t in token_ids {
            *t = if *t > 0 { *t - 1 } else { *t + 1 };
        }
    }
}

/// Every log probability reported `by` lower.
fn drift(output: &mut GenerateOutput, by: f64) {
    let shift = |l: &mut TokenLogprobs| {
        l.logprob -= by as f32;
        for (_, logprob) in &mut l.top {
            *logprob -= by as f32;
        }
    };
    match output {
        GenerateOutput::Tokens { logprobs, .. } => logprobs.iter_mut().for_each(shift),
        GenerateOutput::PrefillDone {
            logprobs: Some(l), ..
        } => shift(l),
        _ => {}
    }
}

#[async_trait]
impl EngineService for FaultyService {
    async fn held_blocks(
        &self,
        blocks: &[switchyard_core::SequenceHash],
    ) -> Result<u32, EngineError> {
        if self.faults.flags() & (CRASHED | REFUSING | HUNG) != 0 {
            return Err(EngineError::Unreachable(
                "connection refused (injected fault)".into(),
            ));
        }
        self.inner.held_blocks(blocks).await
    }

    async fn media_ready(&self, id: switchyard_core::RequestId) -> Result<bool, EngineError> {
        if self.faults.flags() & (CRASHED | REFUSING | HUNG) != 0 {
            return Err(EngineError::Unreachable(
                "connection refused (injected fault)".into(),
            ));
        }
        self.inner.media_ready(id).await
    }

    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, EngineError> {
        let faults = &self.faults;
        if faults.flags() & (CRASHED | REFUSING) != 0 {
            return Err(EngineError::Unreachable(
                "connection refused (injected fault)".into(),
            ));
        }
        if faults.flags() & HUNG != 0 && !faults.through_hang().await {
            return Err(EngineError::Unreachable(
                "the worker crashed (injected fault)".into(),
            ));
        }
        let stream = self.inner.generate(request).await?;
        let faults = faults.clone();
        // Per item: one atomic load when no fault is active.
        let stream = futures::stream::unfold(Some(stream), move |state| {
            let faults = faults.clone();
            async move {
                let mut stream = state?;
                let item = stream.next().await;
                let flags = faults.flags();
                if flags & CRASHED != 0 {
                    return Some((Err(EngineError::Disconnected), None));
                }
                let mut item = item?;
                if flags & HUNG != 0 && !faults.through_hang().await {
                    return Some((Err(EngineError::Disconnected), None));
                }
                if faults.flags() & CORRUPT != 0
                    && let Ok(output) = &mut item
                {
                    corrupt(output);
                }
                if faults.flags() & DRIFTING != 0
                    && let Ok(output) = &mut item
                {
                    drift(output, faults.drift());
                }
                if faults.flags() & TRUNCATING != 0
                    && matches!(item, Ok(GenerateOutput::Finished { .. }))
                {
                    return None;
                }
                Some((item, Some(stream)))
            }
        });
        Ok(stream.boxed())
    }
}

/// Where the admin endpoint listens on the worker's request-plane server.
pub const FAULTS_PATH: &str = "/v1/internal/faults";

#[derive(Clone)]
struct Admin {
    faults: Faults,
    token: Arc<str>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Inject {
    /// A fault as `KIND[:ARG][@AT][+FOR]` (AT counts from now).
    fault: String,
}

/// The admin endpoint: `GET` lists the active faults, `POST {"fault": "hang+5s"}` injects
/// one, `DELETE` clears all but a crash. Every request must bear `Authorization: Bearer
/// <token>`.
pub fn admin_routes(
    faults: Faults,
    token: String,
    tracker: TaskTracker,
    cancel: CancellationToken,
) -> axum::Router {
    use axum::routing::get;
    let admin = Admin {
        faults,
        token: token.into(),
        tracker,
        cancel,
    };
    axum::Router::new()
        .route(FAULTS_PATH, get(list).post(inject).delete(clear_all))
        .with_state(admin)
}

type Answer = (axum::http::StatusCode, axum::Json<serde_json::Value>);

fn authorized(admin: &Admin, headers: &axum::http::HeaderMap) -> Result<(), Answer> {
    let presented = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compared in full whatever differs first, so timing says nothing of the token.
    let matches = presented.is_some_and(|p| {
        p.len() == admin.token.len()
            && p.bytes()
                .zip(admin.token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    });
    if matches {
        Ok(())
    } else {
        Err((
            axum::http::StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({"error": "a valid fault admin token is required"})),
        ))
    }
}

fn listing(admin: &Admin) -> Answer {
    (
        axum::http::StatusCode::OK,
        axum::Json(serde_json::json!(admin.faults.active())),
    )
}

async fn list(
    axum::extract::State(admin): axum::extract::State<Admin>,
    headers: axum::http::HeaderMap,
) -> Answer {
    authorized(&admin, &headers).map_or_else(|e| e, |()| listing(&admin))
}

async fn inject(
    axum::extract::State(admin): axum::extract::State<Admin>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Answer {
    if let Err(e) = authorized(&admin, &headers) {
        return e;
    }
    let bad = |message: String| {
        (
            axum::http::StatusCode::BAD_REQUEST,
            axum::Json(serde_json::json!({"error": message})),
        )
    };
    let request: Inject = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return bad(format!(
                "expected {{\"fault\": \"KIND[:ARG][@AT][+FOR]\"}}: {e}"
            ));
        }
    };
    let spec: FaultSpec = match request.fault.parse() {
        Ok(spec) => spec,
        Err(e) => return bad(e.to_string()),
    };
    if spec.at.is_zero() {
        admin.faults.inject(spec, &admin.tracker, &admin.cancel);
    } else {
        admin
            .faults
            .schedule(&[spec], &admin.tracker, &admin.cancel);
    }
    listing(&admin)
}

async fn clear_all(
    axum::extract::State(admin): axum::extract::State<Admin>,
    headers: axum::http::HeaderMap,
) -> Answer {
    if let Err(e) = authorized(&admin, &headers) {
        return e;
    }
    admin.faults.clear();
    listing(&admin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        let s = |t: &str| t.parse::<FaultSpec>();
        assert_eq!(
            s("hang@10s+5s").unwrap(),
            FaultSpec {
                fault: Fault::Hang,
                at: Duration::from_secs(10),
                lasts: Some(Duration::from_secs(5)),
            }
        );
        assert_eq!(
            s("slow:2.5+1m").unwrap(),
            FaultSpec {
                fault: Fault::Slow { factor: 2.5 },
                at: Duration::ZERO,
                lasts: Some(Duration::from_secs(60)),
            }
        );
        assert_eq!(s("crash@1s").unwrap().fault, Fault::Crash);
        assert_eq!(s("corrupt").unwrap().lasts, None);
        for text in [
            "hang@10s+5s",
            "slow:2.5+1m",
            "crash@1s",
            "refuse",
            "truncate@2s",
            "drift:0.5+10s",
        ] {
            assert_eq!(s(text).unwrap().to_string(), text);
        }
        for (bad, why) in [
            ("explode", "unknown fault"),
            ("slow", "needs a factor"),
            ("slow:0.5", "at least 1"),
            ("hang:3", "takes no argument"),
            ("hang@soon", "not a duration"),
            ("crash+5s", "takes no +FOR"),
            ("drift", "needs an amount"),
            ("drift:-1", "positive number"),
        ] {
            let e = s(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
