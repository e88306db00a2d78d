//! The real-time driver: one tokio task per engine, stepping it against the clock.
//!
//! The task steps the engine, sleeps for the step's duration (already divided by the speedup
//! ratio), then delivers what the step produced: tokens to each request's stream, KV events
//! to the event sink, the load snapshot to a watch channel. With no work it waits for a
//! request. A request whose stream receiver is gone (the client left) is cancelled in the
//! engine, which frees its blocks.
//!
//! The task is spawned on the caller's [`TaskTracker`] and stops when the caller's
//! [`CancellationToken`] fires, so shutdown waits for it.

use std::time::Duration;

use hdrhistogram::Histogram;
use rustc_hash::FxHashMap;
use switchyard_core::{KvEvent, LoadSnapshot, RequestId};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::{MockEngine, MockRequest, Rejected, StepOutput, TokenOutput};

enum Command {
    Add {
        request: MockRequest,
        stream: mpsc::UnboundedSender<TokenOutput>,
        ack: tokio::sync::oneshot::Sender<Result<(), Rejected>>,
    },
    Cancel(RequestId),
}

/// The engine task has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the engine has stopped")]
pub struct EngineStopped;

/// A handle to a running engine task.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    commands: mpsc::UnboundedSender<Command>,
    load: watch::Receiver<LoadSnapshot>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Add { request, .. } => write!(f, "Add({})", request.id),
            Command::Cancel(id) => write!(f, "Cancel({id})"),
        }
    }
}

/// What the task reports when it stops.
#[derive(Debug, Clone)]
pub struct DriverReport {
    pub steps: u64,
    /// How late each step's end was observed, in microseconds (bounded memory however
    /// long the engine runs).
    pub lag_us: Histogram<u64>,
}

impl Default for DriverReport {
    fn default() -> Self {
        DriverReport {
            steps: 0,
            // Microseconds up to an hour, 3 significant digits.
            lag_us: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("constant, valid histogram bounds"),
        }
    }
}

impl EngineHandle {
    /// Submits a request; its tokens arrive on the returned stream, the last one marked
    /// `finished`. Dropping the stream cancels the request.
    pub async fn submit(
        &self,
        request: MockRequest,
    ) -> Result<mpsc::UnboundedReceiver<TokenOutput>, SubmitError> {
        let (stream, tokens) = mpsc::unbounded_channel();
        let (ack, accepted) = tokio::sync::oneshot::channel();
        self.commands
            .send(Command::Add {
                request,
                stream,
                ack,
            })
            .map_err(|_| SubmitError::Stopped(EngineStopped))?;
        match accepted.await {
            Ok(Ok(())) => Ok(tokens),
            Ok(Err(rejected)) => Err(SubmitError::Rejected(rejected)),
            Err(_) => Err(SubmitError::Stopped(EngineStopped)),
        }
    }

    /// Cancels a request (also done by dropping its stream).
    pub fn cancel(&self, id: RequestId) {
        let _ = self.commands.send(Command::Cancel(id));
    }

    /// The load after the engine's last step.
    pub fn load(&self) -> LoadSnapshot {
        *self.load.borrow()
    }

    /// A receiver notified after every step.
    pub fn watch_load(&self) -> watch::Receiver<LoadSnapshot> {
        self.load.clone()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Rejected(#[from] Rejected),
    #[error(transparent)]
    Stopped(#[from] EngineStopped),
}

/// Spawns the engine's task. KV events go to `events` when given.
pub fn spawn(
    engine: MockEngine,
    events: Option<mpsc::UnboundedSender<Vec<KvEvent>>>,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> (EngineHandle, JoinHandle<DriverReport>) {
    let (commands, inbox) = mpsc::unbounded_channel();
    let (load_tx, load) = watch::channel(engine.load());
    let task = tracker.spawn(run(engine, inbox, events, load_tx, cancel));
    (EngineHandle { commands, load }, task)
}

async fn run(
    mut engine: MockEngine,
    mut inbox: mpsc::UnboundedReceiver<Command>,
    events: Option<mpsc::UnboundedSender<Vec<KvEvent>>>,
    load: watch::Sender<LoadSnapshot>,
    cancel: CancellationToken,
) -> DriverReport {
    let epoch = Instant::now();
    let mut streams: FxHashMap<RequestId, mpsc::UnboundedSender<TokenOutput>> =
        FxHashMap::default();
    let mut out = StepOutput::default();
    let mut report = DriverReport::default();
    loop {
        // Take everything queued; wait for a command only when there is nothing to do.
        loop {
            let command = if engine.has_work() {
                match inbox.try_recv() {
                    Ok(command) => command,
                    Err(_) => break,
                }
            } else {
                tokio::select! {
                    () = cancel.cancelled() => return report,
                    command = inbox.recv() => match command {
                        Some(command) => command,
                        None => return report,
                    },
                }
            };
            match command {
                Command::Add {
                    request,
                    stream,
                    ack,
                } => {
                    let id = request.id;
                    let result = engine.add_request(request);
                    if result.is_ok() {
                        streams.insert(id, stream);
                    }
                    let _ = ack.send(result);
                }
                Command::Cancel(id) => {
                    engine.cancel(id);
                    streams.remove(&id);
                }
            }
        }

        let started = Instant::now();
        engine.step(started - epoch, &mut out);
        let deadline = started + out.duration;
        if !out.duration.is_zero() {
            tokio::select! {
                () = cancel.cancelled() => return report,
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
        let lag = Instant::now().saturating_duration_since(deadline);
        report.steps += 1;
        report
            .lag_us
            .saturating_record(lag.as_micros().min(u128::from(u64::MAX)) as u64);

        for token in out.tokens.drain(..) {
            let gone = match streams.get(&token.request) {
                Some(stream) => stream.send(token).is_err(),
                None => false,
            };
            if token.finished || gone {
                streams.remove(&token.request);
            }
            if gone && !token.finished {
                engine.cancel(token.request);
            }
        }
        // Clients that left while their request waited or prefilled.
        let closed: Vec<RequestId> = streams
            .iter()
            .filter(|(_, s)| s.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in closed {
            streams.remove(&id);
            engine.cancel(id);
        }
        if let Some(sink) = &events
            && !out.events.is_empty()
        {
            let _ = sink.send(std::mem::take(&mut out.events));
        }
        load.send_replace(engine.load());
        // Zero-length steps (a request preempted and requeued) go round again at once.
        if out.duration.is_zero() {
            tokio::task::yield_now().await;
        }
    }
}

/// A lag percentile from a report's histogram.
pub fn percentile_us(lags: &Histogram<u64>, p: f64) -> Duration {
    if lags.is_empty() {
        return Duration::ZERO;
    }
    Duration::from_micros(lags.value_at_quantile(p))
}
