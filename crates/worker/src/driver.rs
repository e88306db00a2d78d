//! The step driver: runs an engine that works in steps (one batch per step) and delivers
//! what each step produced: tokens to each request's stream, KV events to the publisher,
//! the load to a watch channel.
//!
//! Two pacings, one loop:
//! - [`spawn_timed`]: the engine says how long each step takes (a simulated engine, whose
//!   time is an input); a tokio task sleeps until the step's end before delivering, so
//!   tokio's paused clock drives it in tests exactly like virtual time drives the
//!   simulator. Steps run back to back on the model's schedule: the next one starts when
//!   the last one ended, not when the task woke up (tokio's timer rounds up to the
//!   millisecond, and a busy runtime wakes tasks late), so the delay of a wake-up never
//!   accumulates into the engine's timing;
//! - [`spawn_threaded`]: the engine computes for real (a model on the CPU) and runs on its
//!   own OS thread, stepping back to back, so its work never blocks the async runtime.
//!
//! Requests arriving during a step join the next one. A request whose stream receiver is
//! gone (the client left) is cancelled in the engine, which frees its blocks. Commands and
//! events travel on bounded channels: a flood of submissions waits for room, and a slow
//! event publisher slows the engine down rather than losing events or growing memory.
//! Each request's token stream holds at most its `max_tokens` items.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use hdrhistogram::Histogram;
use switchyard_core::protocol::{EngineError, GenerateRequest, TokenOutput};
use switchyard_core::{KvEvent, LoadSnapshot, RequestId, SequenceHash};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Commands queued for the engine before submitters wait.
const COMMAND_CAPACITY: usize = 1024;
/// Step outputs' event batches queued for the publisher before the engine waits.
pub const EVENT_CAPACITY: usize = 256;

/// An engine that works in steps.
pub trait StepEngine: Send + 'static {
    /// Queues a request (validated and refused here if the engine cannot serve it).
    fn add(&mut self, request: GenerateRequest) -> Result<(), EngineError>;
    /// Drops a request. Returns whether it was there.
    fn cancel(&mut self, id: RequestId) -> bool;
    /// Whether a step would do anything.
    fn has_work(&self) -> bool;
    /// Runs one step starting at `now` (time since the driver started), appending the
    /// tokens it produced and its KV events. Returns how long the step takes in engine
    /// time: the timed driver waits that long; an engine that computes for real has
    /// already spent its time and returns zero.
    fn step(
        &mut self,
        now: Duration,
        tokens: &mut Vec<TokenOutput>,
        events: &mut Vec<KvEvent>,
    ) -> Duration;
    /// The engine's load now.
    fn load(&self) -> LoadSnapshot;
    /// How many of `blocks`, from the first, its KV cache holds (engines without a
    /// prefix cache hold none).
    fn held_prefix(&self, blocks: &[SequenceHash]) -> u32 {
        let _ = blocks;
        0
    }
    /// Request `id`'s media are encoded: its prefill may pass its first media position.
    /// Whether it was here, held at its media (engines that hold none answer false).
    fn media_ready(&mut self, id: RequestId) -> bool {
        let _ = id;
        false
    }
}

enum Command {
    Add {
        request: Box<GenerateRequest>,
        stream: mpsc::UnboundedSender<TokenOutput>,
        ack: oneshot::Sender<Result<(), EngineError>>,
    },
    Cancel(RequestId),
    /// How many of these blocks the cache holds.
    Held(Vec<SequenceHash>, oneshot::Sender<u32>),
    /// A request's media are encoded; whether it was held at them.
    MediaReady(RequestId, oneshot::Sender<bool>),
    /// Stops a threaded driver (which cannot wait on the cancellation token).
    Stop,
}

/// A handle to a running engine.
#[derive(Debug, Clone)]
pub struct DriverHandle {
    commands: mpsc::Sender<Command>,
    load: watch::Receiver<LoadSnapshot>,
}

/// A request's tokens, in order, the last one carrying its finish reason. Dropping it
/// cancels the request.
#[derive(Debug)]
pub struct TokenStream {
    id: RequestId,
    tokens: mpsc::UnboundedReceiver<TokenOutput>,
    commands: mpsc::Sender<Command>,
}

impl TokenStream {
    /// The next token; `None` once the request finished, or when the engine stopped
    /// before finishing it.
    pub async fn recv(&mut self) -> Option<TokenOutput> {
        self.tokens.recv().await
    }
}

impl Drop for TokenStream {
    fn drop(&mut self) {
        // Best effort: the driver also notices the closed stream after its next step.
        let _ = self.commands.try_send(Command::Cancel(self.id));
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Add { request, .. } => write!(f, "Add({})", request.id),
            Command::Cancel(id) => write!(f, "Cancel({id})"),
            Command::Held(blocks, _) => write!(f, "Held({} blocks)", blocks.len()),
            Command::MediaReady(id, _) => write!(f, "MediaReady({id})"),
            Command::Stop => write!(f, "Stop"),
        }
    }
}

impl DriverHandle {
    /// Submits a request; its tokens arrive on the returned stream.
    pub async fn submit(&self, request: GenerateRequest) -> Result<TokenStream, EngineError> {
        let id = request.id;
        let (stream, tokens) = mpsc::unbounded_channel();
        let (ack, accepted) = oneshot::channel();
        self.commands
            .send(Command::Add {
                request: Box::new(request),
                stream,
                ack,
            })
            .await
            .map_err(|_| EngineError::Stopping)?;
        accepted.await.map_err(|_| EngineError::Stopping)??;
        Ok(TokenStream {
            id,
            tokens,
            commands: self.commands.clone(),
        })
    }

    /// How many of `blocks`, from the first, the engine's cache holds now.
    pub async fn held_prefix(&self, blocks: Vec<SequenceHash>) -> Result<u32, EngineError> {
        let (reply, held) = oneshot::channel();
        self.commands
            .send(Command::Held(blocks, reply))
            .await
            .map_err(|_| EngineError::Stopping)?;
        held.await.map_err(|_| EngineError::Stopping)
    }

    /// Request `id`'s media are encoded (see [`StepEngine::media_ready`]).
    pub async fn media_ready(&self, id: RequestId) -> Result<bool, EngineError> {
        let (reply, held) = oneshot::channel();
        self.commands
            .send(Command::MediaReady(id, reply))
            .await
            .map_err(|_| EngineError::Stopping)?;
        held.await.map_err(|_| EngineError::Stopping)
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

/// What a driver reports when it stops.
#[derive(Debug, Clone)]
pub struct DriverReport {
    pub steps: u64,
    /// How late each step's end was observed, in microseconds (timed driver only; bounded
    /// memory however long the engine runs).
    pub lag_us: Histogram<u64>,
}

impl Default for DriverReport {
    fn default() -> Self {
        DriverReport {
            steps: 0,
            // Microseconds up to an hour, 3 significant digits.
            lag_us: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .unwrap_or_else(|_| unreachable!("constant, valid histogram bounds")),
        }
    }
}

/// The state both pacings share: the engine, the open streams, the step's outputs.
struct Core<E> {
    engine: E,
    /// In request order: when the engine stops, its streams end in the order their
    /// requests came (each frontend then meets them in that order, as the simulator does).
    streams: BTreeMap<RequestId, mpsc::UnboundedSender<TokenOutput>>,
    tokens: Vec<TokenOutput>,
    events: Vec<KvEvent>,
    report: DriverReport,
}

impl<E: StepEngine> Core<E> {
    fn new(engine: E) -> Self {
        Core {
            engine,
            streams: BTreeMap::new(),
            tokens: Vec::new(),
            events: Vec::new(),
            report: DriverReport::default(),
        }
    }

    /// Applies a command; false for `Stop`.
    fn command(&mut self, command: Command) -> bool {
        match command {
            Command::Add {
                request,
                stream,
                ack,
            } => {
                let id = request.id;
                let result = self.engine.add(*request);
                if result.is_ok() {
                    self.streams.insert(id, stream);
                }
                let _ = ack.send(result);
            }
            Command::Cancel(id) => {
                self.engine.cancel(id);
                self.streams.remove(&id);
            }
            Command::Held(blocks, reply) => {
                let _ = reply.send(self.engine.held_prefix(&blocks));
            }
            Command::MediaReady(id, reply) => {
                let _ = reply.send(self.engine.media_ready(id));
            }
            Command::Stop => return false,
        }
        true
    }

    fn step(&mut self, now: Duration) -> Duration {
        self.tokens.clear();
        self.events.clear();
        self.report.steps += 1;
        self.engine.step(now, &mut self.tokens, &mut self.events)
    }

    /// Sends the step's tokens; cancels requests whose clients left.
    fn deliver_tokens(&mut self) {
        for token in self.tokens.drain(..) {
            let finished = token.finish.is_some();
            let request = token.request;
            let gone = match self.streams.get(&request) {
                Some(stream) => stream.send(token).is_err(),
                None => false,
            };
            if finished || gone {
                self.streams.remove(&request);
            }
            if gone && !finished {
                self.engine.cancel(request);
            }
        }
        // Clients that left while their request waited or prefilled.
        let closed: Vec<RequestId> = self
            .streams
            .iter()
            .filter(|(_, s)| s.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in closed {
            self.streams.remove(&id);
            self.engine.cancel(id);
        }
    }
}

/// Spawns a timed driver: the engine's step durations are waited out on tokio's clock.
pub fn spawn_timed<E: StepEngine>(
    engine: E,
    events: Option<mpsc::Sender<Vec<KvEvent>>>,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> (DriverHandle, tokio::task::JoinHandle<DriverReport>) {
    let (commands, inbox) = mpsc::channel(COMMAND_CAPACITY);
    let (load_tx, load) = watch::channel(engine.load());
    let task = tracker.spawn(run_timed(Core::new(engine), inbox, events, load_tx, cancel));
    (DriverHandle { commands, load }, task)
}

async fn run_timed<E: StepEngine>(
    mut core: Core<E>,
    mut inbox: mpsc::Receiver<Command>,
    events: Option<mpsc::Sender<Vec<KvEvent>>>,
    load: watch::Sender<LoadSnapshot>,
    cancel: CancellationToken,
) -> DriverReport {
    let epoch = tokio::time::Instant::now();
    // When the next step starts on the model's schedule: where the last one ended, or when
    // work arrived at an idle engine.
    let mut next_start = epoch;
    // Commands that came during a step, for after it.
    let mut deferred: VecDeque<Command> = VecDeque::new();
    let mut inbox_open = true;
    loop {
        // Take everything queued; wait for a command only when there is nothing to do.
        loop {
            let command = if let Some(command) = deferred.pop_front() {
                command
            } else if core.engine.has_work() {
                match inbox.try_recv() {
                    Ok(command) => command,
                    Err(_) => break,
                }
            } else {
                let command = tokio::select! {
                    () = cancel.cancelled() => return core.report,
                    command = inbox.recv() => match command {
                        Some(command) => command,
                        None => return core.report,
                    },
                };
                next_start = next_start.max(tokio::time::Instant::now());
                command
            };
            if !core.command(command) {
                return core.report;
            }
            // Admissions and cancellations change the load even before the next step.
            load.send_replace(core.engine.load());
        }

        let started = next_start;
        let duration = core.step(started - epoch);
        let deadline = started + duration;
        next_start = deadline;
        if !duration.is_zero() {
            let step = tokio::time::sleep_until(deadline);
            tokio::pin!(step);
            loop {
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => return core.report,
                    () = &mut step => break,
                    command = inbox.recv(), if inbox_open => match command {
                        // What the cache holds is answered during a step: a decode worker
                        // pulling KV from this one reads it without waiting for this
                        // engine's step (the copy is one-sided, as over RDMA).
                        Some(Command::Held(blocks, reply)) => {
                            let _ = reply.send(core.engine.held_prefix(&blocks));
                        }
                        Some(other) => deferred.push_back(other),
                        None => inbox_open = false,
                    },
                }
            }
        }
        let lag = tokio::time::Instant::now().saturating_duration_since(deadline);
        core.report
            .lag_us
            .saturating_record(lag.as_micros().min(u128::from(u64::MAX)) as u64);
        core.deliver_tokens();
        if let Some(sink) = &events
            && !core.events.is_empty()
        {
            let batch = std::mem::take(&mut core.events);
            tokio::select! {
                () = cancel.cancelled() => return core.report,
                _ = sink.send(batch) => {}
            }
        }
        load.send_replace(core.engine.load());
        // Zero-length steps (a request preempted and requeued) go round again at once.
        if duration.is_zero() {
            tokio::task::yield_now().await;
        }
    }
}

/// Spawns a threaded driver: the engine steps back to back on its own OS thread. The
/// thread stops when `cancel` fires or every handle is dropped; the returned task resolves
/// to its report.
pub fn spawn_threaded<E: StepEngine>(
    engine: E,
    events: Option<mpsc::Sender<Vec<KvEvent>>>,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> std::io::Result<(DriverHandle, tokio::task::JoinHandle<DriverReport>)> {
    let (commands, inbox) = mpsc::channel(COMMAND_CAPACITY);
    let (load_tx, load) = watch::channel(engine.load());
    let (done_tx, done) = oneshot::channel();
    // The thread waits on the inbox when idle: cancellation reaches it as a command.
    let closer = {
        let commands = commands.clone();
        let cancel = cancel.clone();
        tracker.spawn(async move {
            cancel.cancelled().await;
            let _ = commands.send(Command::Stop).await;
        })
    };
    std::thread::Builder::new()
        .name("switchyard-engine".into())
        .spawn(move || {
            let report = run_threaded(Core::new(engine), inbox, events, load_tx, &cancel);
            let _ = done_tx.send(report);
        })?;
    let task = tracker.spawn(async move {
        let report = done.await.unwrap_or_default();
        closer.abort();
        report
    });
    Ok((DriverHandle { commands, load }, task))
}

fn run_threaded<E: StepEngine>(
    mut core: Core<E>,
    mut inbox: mpsc::Receiver<Command>,
    events: Option<mpsc::Sender<Vec<KvEvent>>>,
    load: watch::Sender<LoadSnapshot>,
    cancel: &CancellationToken,
) -> DriverReport {
    let epoch = std::time::Instant::now();
    loop {
        if cancel.is_cancelled() {
            return core.report;
        }
        loop {
            let command = if core.engine.has_work() {
                match inbox.try_recv() {
                    Ok(command) => command,
                    Err(_) => break,
                }
            } else {
                match inbox.blocking_recv() {
                    Some(command) => command,
                    None => return core.report,
                }
            };
            if !core.command(command) {
                return core.report;
            }
            load.send_replace(core.engine.load());
        }
        core.step(epoch.elapsed());
        core.deliver_tokens();
        if let Some(sink) = &events
            && !core.events.is_empty()
            && sink
                .blocking_send(std::mem::take(&mut core.events))
                .is_err()
        {
            return core.report;
        }
        load.send_replace(core.engine.load());
    }
}

/// A lag percentile from a report's histogram.
pub fn percentile_us(lags: &Histogram<u64>, p: f64) -> Duration {
    if lags.is_empty() {
        return Duration::ZERO;
    }
    Duration::from_micros(lags.value_at_quantile(p))
}
