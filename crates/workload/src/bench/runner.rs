//! Dispatching a run's requests under its load shape, within its bounds.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::BenchError;
use super::client::Client;
use super::config::{BenchConfig, LoadShape, RequestSource};
use super::plan::Plan;
use super::progress::Progress;
use super::prompt::PromptBuilder;
use super::record::RequestRecord;
use super::report::BenchReport;
use super::sessions::dispatch_sessions;
use switchyard_core::trace::session::has_sessions;

/// Everything a dispatching task needs.
#[derive(Clone)]
pub(super) struct Dispatch {
    pub client: Arc<Client>,
    pub records: mpsc::UnboundedSender<RequestRecord>,
    pub start: Instant,
    /// No request is sent at or after this instant.
    pub deadline: Option<Instant>,
    /// Cancelled on shutdown: stop sending and cancel what is in flight.
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
}

impl Dispatch {
    pub fn past_deadline(&self, at: Instant) -> bool {
        self.deadline.is_some_and(|deadline| at >= deadline)
    }
}

/// Runs a benchmark until its plan is exhausted, its duration is up (requests in flight
/// then finish, each within its timeout), or `shutdown` is cancelled (requests in flight
/// are cancelled). Requests that fail are recorded, never fatal.
pub async fn run(
    config: BenchConfig,
    shutdown: CancellationToken,
) -> Result<BenchReport, BenchError> {
    config.validate()?;
    let client = Arc::new(Client::new(&config)?);
    let plan = Plan::new(&config);
    let mut progress = Progress::new(config.show_progress, config.request_limit());
    let (sender, mut receiver) = mpsc::unbounded_channel();
    let start = Instant::now();
    let dispatch = Dispatch {
        client,
        records: sender,
        start,
        deadline: config.duration.map(|d| start + d),
        cancel: shutdown.child_token(),
        tracker: TaskTracker::new(),
    };
    match (config.shape, &config.source) {
        (
            LoadShape::Replay { speedup },
            RequestSource::Trace {
                records,
                block_size,
            },
        ) if has_sessions(records) => {
            let sessions = dispatch_sessions(
                records.clone(),
                speedup,
                PromptBuilder::new(*block_size, config.seed),
                config.request_limit(),
                dispatch.clone(),
            );
            dispatch.tracker.spawn(sessions);
        }
        (LoadShape::Replay { .. } | LoadShape::Poisson { .. }, _) => {
            let open_loop = dispatch.clone();
            dispatch.tracker.spawn(open_loop_dispatch(plan, open_loop));
        }
        (LoadShape::Concurrency { clients }, _) => {
            let plan = Arc::new(Mutex::new(plan));
            for _ in 0..clients {
                dispatch
                    .tracker
                    .spawn(closed_loop_client(Arc::clone(&plan), dispatch.clone()));
            }
        }
    }
    let tracker = dispatch.tracker.clone();
    tracker.close();
    // The channel closes once every task, each holding a sender, has ended.
    drop(dispatch);
    let mut records = Vec::new();
    while let Some(record) = receiver.recv().await {
        progress.record(&record);
        records.push(record);
    }
    tracker.wait().await;
    progress.finish();
    records.sort_by_key(|r| r.index);
    Ok(BenchReport::new(&config, records))
}

/// Sends each request at its scheduled time without waiting for earlier ones (open loop).
async fn open_loop_dispatch(mut plan: Plan, dispatch: Dispatch) {
    // Build each prompt before sleeping so the send is on time.
    while let Some(request) = plan.next_request() {
        let at = dispatch.start + request.scheduled.unwrap_or_default();
        if dispatch.past_deadline(at) {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep_until(at) => {}
            () = dispatch.cancel.cancelled() => break,
        }
        let task = dispatch.clone();
        dispatch.tracker.spawn(async move {
            let record = task.client.send(request, task.start, &task.cancel).await;
            // The receiver outlives every task; a send error means the run was dropped.
            let _ = task.records.send(record);
        });
    }
}

/// One closed-loop client: sends the next request as soon as its previous one ends.
async fn closed_loop_client(plan: Arc<Mutex<Plan>>, dispatch: Dispatch) {
    loop {
        if dispatch.cancel.is_cancelled() || dispatch.past_deadline(Instant::now()) {
            break;
        }
        let next = match plan.lock() {
            Ok(mut plan) => plan.next_request(),
            Err(_) => None,
        };
        let Some(request) = next else {
            break;
        };
        let record = dispatch
            .client
            .send(request, dispatch.start, &dispatch.cancel)
            .await;
        if dispatch.records.send(record).is_err() {
            break;
        }
    }
}
