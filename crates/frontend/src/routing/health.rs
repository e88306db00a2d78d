//! Worker health as the routing service sees it: failures and successes reported by
//! requests, token gaps, stalls, canaries, and the fleet's degradation level. A worker
//! that becomes unhealthy has its streams told, so they move elsewhere.

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::{WorkerId, WorkerRole};
use switchyard_router::routing::degradation::DegradationState;
use switchyard_router::routing::health::{Failure, HealthChange};
use switchyard_router::{HealthState, RoutingCore};
use switchyard_runtime::WorkerInstance;
use tokio::sync::watch;

use super::RoutingService;

impl RoutingService {
    /// A receiver that changes whenever `worker` becomes unhealthy.
    pub fn outages(&self, worker: WorkerId) -> watch::Receiver<u64> {
        self.outages
            .lock()
            .entry(worker)
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Where streams on `worker` mark its progress.
    pub fn progress(&self, worker: WorkerId) -> Progress {
        self.progress
            .lock()
            .entry(worker)
            .or_insert_with(|| Progress::new(self.started))
            .clone()
    }

    /// A failure of `worker`'s own making. If it became unhealthy, its streams are told.
    pub fn report_failure(&self, worker: WorkerId, failure: Failure) {
        let now = self.now();
        let (change, kept_in) = {
            let mut core = self.core.lock();
            let kept_in = |core: &RoutingCore| core.worker(worker).map(|e| e.health.kept_in);
            let before = kept_in(&core);
            let change = core.observe_failure(worker, failure, now);
            (change, kept_in(&core) != before)
        };
        if kept_in {
            tracing::warn!(%worker, failure = failure.name(), "worker kept in rotation: as many workers as health.max_unhealthy_fraction allows are out already");
        }
        self.health_changed(worker, change, Some(failure));
    }

    /// A request that completed on `worker`.
    pub fn report_success(&self, worker: WorkerId) {
        let now = self.now();
        let change = self.core.lock().observe_success(worker, now);
        self.health_changed(worker, change, None);
    }

    /// A gap between two tokens streamed from `worker`.
    pub fn report_gap(&self, worker: WorkerId, gap: Duration) {
        let now = self.now();
        self.core.lock().observe_gap(worker, gap, now);
    }

    /// A request's time to first token (for degradation against the SLO).
    pub fn report_ttft(&self, ttft: Duration) {
        self.core.lock().observe_ttft(ttft);
    }

    pub(crate) fn health_changed(
        &self,
        worker: WorkerId,
        change: Option<HealthChange>,
        failure: Option<Failure>,
    ) {
        let Some(change) = change else { return };
        match change.to {
            HealthState::Unhealthy => {
                tracing::warn!(%worker, failure = failure.map(Failure::name), "worker unhealthy: moving its requests elsewhere");
                if let Some(outage) = self.outages.lock().get(&worker) {
                    outage.send_modify(|n| *n += 1);
                }
            }
            HealthState::Suspicious => {
                tracing::info!(%worker, failure = failure.map(Failure::name), "worker suspicious")
            }
            HealthState::Healthy => tracing::info!(%worker, "worker healthy again"),
        }
        // A worker coming back may free capacity for queued requests.
        self.fleet_changed.notify_waiters();
        self.pump();
    }

    /// How much longer `worker` is predicted to be busy with the prefill routed to it.
    pub fn queued_prefill_time(&self, worker: WorkerId) -> Duration {
        let now = self.now();
        self.core.lock().queued_prefill_time(worker, now)
    }

    /// How long a stream on `worker` may go without a token.
    pub fn stall_timeout(&self, worker: WorkerId) -> Duration {
        self.core.lock().stall_timeout(worker)
    }

    /// How long a request may wait for its first token.
    pub fn first_token_timeout(&self) -> Duration {
        self.core.lock().health_config().first_token_timeout
    }

    /// Workers due a canary now (marked as being checked).
    pub fn due_canaries(&self) -> Vec<WorkerInstance> {
        let now = self.now();
        let due = self.core.lock().due_canaries(now);
        let instances = self.instances.read();
        // Encoder workers generate no tokens to check.
        due.iter()
            .filter_map(|w| instances.get(w).cloned())
            .filter(|i| i.role != WorkerRole::Encoder)
            .collect()
    }

    /// A canary's answer, or its failure. Returns the failure it counted against the
    /// worker, if any (a wrong answer is found here).
    pub fn canary_finished(
        &self,
        worker: WorkerId,
        answer: Result<switchyard_router::routing::health::CanaryAnswer, Failure>,
    ) -> Option<Failure> {
        let now = self.now();
        let (change, failure) = {
            let mut core = self.core.lock();
            let change = core.canary_finished(worker, answer, now);
            let failure = core
                .registry()
                .get(worker)
                .filter(|e| e.health.consecutive_failures > 0)
                .and_then(|e| e.health.last_failure);
            (change, failure)
        };
        self.health_changed(worker, change, failure);
        failure
    }

    /// A canary that came back with nothing to judge.
    pub fn canary_skipped(&self, worker: WorkerId) {
        self.core.lock().canary_skipped(worker);
    }

    /// The degradation level now.
    pub fn degradation_level(&self) -> u8 {
        let now = self.now();
        let mut core = self.core.lock();
        let level = core.degradation_level(now);
        if let Some(state) = core.take_degradation_change() {
            log_degradation(&state);
        }
        level
    }
}

/// When a worker last produced a token (on any stream), shared by its streams: one atomic
/// store per token.
#[derive(Debug, Clone)]
pub struct Progress {
    started: tokio::time::Instant,
    /// Microseconds since `started`.
    last: Arc<std::sync::atomic::AtomicU64>,
}

impl Progress {
    fn new(started: tokio::time::Instant) -> Self {
        let now = started.elapsed().as_micros() as u64;
        Progress {
            started,
            last: Arc::new(std::sync::atomic::AtomicU64::new(now)),
        }
    }

    /// The worker produced a token at `now`.
    pub fn mark(&self, now: tokio::time::Instant) {
        let micros = (now - self.started).as_micros() as u64;
        self.last
            .fetch_max(micros, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long since the worker last produced a token.
    pub fn idle(&self) -> Duration {
        let last = Duration::from_micros(self.last.load(std::sync::atomic::Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }
}

/// A change of degradation level, with what it was computed from.
pub(super) fn log_degradation(state: &DegradationState) {
    let DegradationState {
        level,
        healthy,
        registered,
        lost,
        ttft_seconds,
    } = *state;
    if level > 0 {
        tracing::warn!(
            level,
            healthy,
            registered,
            lost,
            ttft_seconds,
            "degradation level changed"
        );
    } else {
        tracing::info!(
            healthy,
            registered,
            lost,
            ttft_seconds,
            "degradation cleared"
        );
    }
}
