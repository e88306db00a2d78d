//! One request's life, decided once for the servers and the simulator.
//!
//! A request is admitted (or queued, or refused: [`crate::RoutingCore::admit`]), then
//! lives as a [`RequestLife`] until it completes or gives up:
//!
//! 1. **Routed** away from the workers that failed it ([`RequestLife::exclusions`]). When
//!    none is left, a request that already failed somewhere tries those again; one that is
//!    under way waits for a worker to join or recover, as long as a queued request would
//!    ([`Event::NoWorker`]).
//! 2. **Tried**: sent (its prompt first to a prefill worker, when disaggregated). A try that
//!    fails is counted against the worker when the worker is at fault, excludes it, and
//!    is retried after a backoff while nothing was generated; after
//!    `max_dispatch_attempts` failed tries the request gives up. A worker found unhealthy
//!    by others while the request was on its way is excluded but the try does not count
//!    ([`Event::TryFailed`]).
//! 3. **Under way**: its tokens stream; the first of each attempt means the worker computed
//!    its prompt. A stream that gets no token in time is stalled, or its worker hangs
//!    ([`stall`]).
//! 4. **Moved** when its worker fails: it resumes on another with the tokens delivered so
//!    far, within `max_migrations` and the fleet-wide budget; one whose tokens all arrived
//!    is complete instead ([`Event::Left`]).
//! 5. **Done**: complete, counted as a success of its worker, or given up ([`GiveUp`]).
//!
//! The life makes the decisions and keeps the counts, in one function
//! ([`RequestLife::step`]: an [`Event`] in, the [`Step`] that follows out); the shell
//! driving it (the frontend's pipeline, the simulator) does the I/O and keeps the time, and
//! is told what to record through [`Shell`].
//!
//! - [`config`]: the migration settings and the fleet-wide budget.
//! - [`stall`]: deadlines and whose fault a silent stream is.
//! - [`media`]: when a worker's cache stands in for encoding a request's media.

pub mod config;
mod life;
pub mod media;
pub mod stall;
mod step;

use std::time::Duration;

use switchyard_core::RequestId;
use switchyard_core::WorkerId;
use switchyard_core::protocol::EngineError;

pub use config::{MigrationBudget, MigrationConfig};
pub use life::RequestLife;
pub use step::{Event, Step};

use crate::routing::health::Failure;

/// What a request's life needs from the shell driving it: the routing core's records, the
/// workers' health and the fleet-wide migration budget (in the frontend, with what it
/// tells other frontends and its metrics).
pub trait Shell {
    /// The request no longer holds its router records (its worker's, and its remote
    /// prefill's if any).
    fn release(&mut self, id: RequestId);
    /// Its remote prefill is over: the prefill worker no longer counts it.
    fn prefill_released(&mut self, id: RequestId);
    /// It went to its worker ahead of its media: of its `prompt_tokens`, those from
    /// `media_from` on wait for them, outside the worker's queued prefill.
    fn hold_prefill(&mut self, id: RequestId, prompt_tokens: u64, media_from: u64);
    /// Its worker computed its prompt (the attempt's first token came).
    fn prefill_done(&mut self, id: RequestId);
    /// A failure of the worker's own making.
    fn count_failure(&mut self, worker: WorkerId, failure: Failure);
    /// A request completed on the worker.
    fn count_success(&mut self, worker: WorkerId);
    /// A request started: the fleet-wide migration budget grows.
    fn credit_migration(&mut self);
    /// Takes one move from the fleet-wide budget, if one is left.
    fn spend_migration(&mut self) -> bool;
    /// A uniform draw in [0, 1), for the backoff's jitter.
    fn unit_random(&mut self) -> f64;
}

/// A try that did not put the request under way on its worker.
#[derive(Debug, Clone, PartialEq)]
pub enum TryFailure {
    /// The worker (or the prefill worker) answered with this error.
    Refused(EngineError),
    /// Nothing answered within this long.
    TimedOut(Duration),
    /// The worker was found unhealthy by others while the request was on its way.
    FoundUnhealthy,
}

/// Why a request leaves the worker its stream was on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leave {
    /// A failure of the worker's, to count against it.
    Failed(Failure),
    /// The worker was found unhealthy (already counted by whoever found it).
    Outage,
    /// The worker gave the request up (it is stopping, or going away).
    Cancelled,
    /// The KV it was to decode from is gone: prefilled again, on any worker (this one
    /// included: it is not at fault).
    KvLost,
}

impl Leave {
    /// How a stream's error is met: leave the worker (and why), or `None` when no other
    /// worker would do better (the request is refused).
    pub fn of_error(error: &EngineError) -> Option<Leave> {
        if !error.retry_elsewhere() {
            return None;
        }
        Some(match error {
            EngineError::KvLost(_) => Leave::KvLost,
            error => failure_of(error).map_or(Leave::Cancelled, Leave::Failed),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Leave::Failed(f) => f.name(),
            Leave::Outage => "outage",
            Leave::Cancelled => "cancelled",
            Leave::KvLost => "kv_lost",
        }
    }
}

/// How an error from a worker counts against it, if at all: back-pressure and invalid
/// requests never do.
pub fn failure_of(error: &EngineError) -> Option<Failure> {
    match error {
        EngineError::Unreachable(_) => Some(Failure::Unreachable),
        EngineError::Disconnected => Some(Failure::Disconnected),
        EngineError::Internal(_) => Some(Failure::ServerError),
        EngineError::Stopping
        | EngineError::Overloaded(_)
        | EngineError::Unsupported(_)
        | EngineError::KvLost(_)
        | EngineError::OutOfMemory(_)
        | EngineError::Invalid(_) => None,
    }
}

/// Why a request's life ended without completing.
#[derive(Debug, Clone, PartialEq)]
pub enum GiveUp {
    /// No worker serves the model.
    NoWorkers,
    /// It failed somewhere, and no other worker can take it now (none came back in time).
    NoOtherWorker,
    /// Every worker tried said it cannot serve this request (the last one's words).
    Unservable(String),
    /// Its tries ran out; the last one's error.
    Exhausted(String),
    /// An engine found the request invalid.
    Invalid(String),
    /// Its worker refused to go on, and no other would do better.
    Refused(String),
    /// It failed on this many workers and may not move again.
    MoveLimit { workers: u32 },
    /// The fleet-wide migration budget is spent.
    MoveBudget,
}

impl GiveUp {
    /// A short name, for metrics and reports.
    pub fn name(&self) -> &'static str {
        match self {
            GiveUp::NoWorkers => "no_workers",
            GiveUp::NoOtherWorker => "no_other_worker",
            GiveUp::Unservable(_) => "unservable",
            GiveUp::Exhausted(_) => "exhausted",
            GiveUp::Invalid(_) => "invalid",
            GiveUp::Refused(_) => "refused",
            GiveUp::MoveLimit { .. } => "move_limit",
            GiveUp::MoveBudget => "move_budget",
        }
    }
}

#[cfg(test)]
mod tests;
