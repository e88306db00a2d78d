//! [`RequestLife::step`]: one request's life as one function, events in and steps out.
//!
//! The shell driving a request (the frontend's pipeline in real time, the simulator in
//! virtual time) tells its life what happened ([`Event`]) and does what it is told next
//! ([`Step`]); it does the I/O and keeps the time, and decides nothing about the request.

use std::time::Duration;

use switchyard_core::protocol::{EngineError, FinishReason};
use switchyard_core::{Token, WorkerId};

use super::{GiveUp, Leave, RequestLife, Shell, TryFailure};

/// What happened to a request, as the shell driving it saw it.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// It was admitted.
    Admitted,
    /// A worker (or a prefill and decode pair, `pair`) was chosen for it, away from
    /// [`RequestLife::exclusions`]; `media_pending` while its media are being encoded.
    Routed { pair: bool, media_pending: bool },
    /// No worker could be chosen for it, away from [`RequestLife::exclusions`], at `now`.
    NoWorker { now: Duration },
    /// Its prompt changed behind it (its media encoded smaller, or dropped) after it was
    /// routed, or after it was sent: the router's records of it no longer hold.
    PromptChanged,
    /// A try on `worker` failed before the request was under way there.
    TryFailed {
        worker: WorkerId,
        failure: TryFailure,
    },
    /// Its worker took it (its stream is open). A prompt sent ahead of its media
    /// (`ahead_of_media`: its length, and where its media start) has the part from its
    /// media on held back until they are ready.
    Sent { ahead_of_media: Option<(u64, u32)> },
    /// Its remote prefill handed over, with the token it computed.
    HandedOver { token: Token },
    /// Tokens arrived from its worker.
    Tokens(&'a [Token]),
    /// Its worker said it completed.
    Finished { worker: WorkerId },
    /// It leaves `worker`, for `why`.
    Left { worker: WorkerId, why: Leave },
    /// Its stream on `worker` got no token for `waited`, and the worker produced none on
    /// any stream for `worker_idle`.
    Stalled {
        worker: WorkerId,
        waited: Duration,
        worker_idle: Duration,
    },
    /// Its stream on `worker` ended with this error.
    StreamError {
        worker: WorkerId,
        error: &'a EngineError,
    },
    /// The shell ends it for a reason of its own (its client is gone, its prompt cannot be
    /// rendered, its media failed).
    Abandoned,
}

/// What the shell does next for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Route it, away from [`RequestLife::exclusions`].
    Route,
    /// Send it to the worker (or the pair) it was routed to.
    Send,
    /// Wait for its media to be encoded, then route it again (a prefill worker hands
    /// over a finished prompt).
    AwaitMedia,
    /// Route it again after this backoff.
    BackOff(Duration),
    /// No worker can take it now: wait for the fleet to change (a worker joins or
    /// recovers), at the latest until this instant, then route it again.
    Wait { until: Duration },
    /// It is under way on its worker: stream its tokens.
    Stream,
    /// Its worker computed its prompt (the attempt's first token came): stream on.
    Prefilled,
    /// Route it to another worker, resumed after the tokens delivered.
    Move,
    /// It ends with this reason, as if its worker had said so.
    Finish(FinishReason),
    /// It is over (completed, or ended by the shell): nothing more to do.
    Done,
    /// It ends without completing.
    GiveUp(GiveUp),
}

impl RequestLife {
    /// What follows `event`: the one function both shells drive a request's life by.
    pub fn step(&mut self, event: Event<'_>, shell: &mut impl Shell) -> Step {
        match event {
            Event::Admitted => {
                shell.credit_migration();
                Step::Route
            }
            Event::Routed {
                pair,
                media_pending,
            } => {
                self.routed();
                if super::media::waits_for_media(pair, media_pending) {
                    shell.release(self.id());
                    Step::AwaitMedia
                } else {
                    Step::Send
                }
            }
            Event::NoWorker { now } => self.no_worker(now),
            Event::PromptChanged => {
                shell.release(self.id());
                Step::Route
            }
            Event::TryFailed { worker, failure } => self.try_failed(worker, failure, shell),
            Event::Sent { ahead_of_media } => {
                if let Some((prompt_tokens, from)) = ahead_of_media {
                    shell.hold_prefill(self.id(), prompt_tokens, u64::from(from));
                }
                self.under_way();
                Step::Stream
            }
            Event::HandedOver { token } => {
                shell.prefill_released(self.id());
                self.under_way();
                match self.ended_by_prefill_token(token) {
                    Some(reason) => Step::Finish(reason),
                    None => Step::Stream,
                }
            }
            Event::Tokens(tokens) => {
                if self.tokens(tokens, shell) {
                    Step::Prefilled
                } else {
                    Step::Stream
                }
            }
            Event::Finished { worker } => {
                shell.count_success(worker);
                shell.release(self.id());
                Step::Done
            }
            Event::Left { worker, why } => self.left(worker, why, shell),
            Event::Stalled {
                worker,
                waited,
                worker_idle,
            } => {
                let failure = super::stall::stall_failure(waited, worker_idle);
                self.left(worker, Leave::Failed(failure), shell)
            }
            Event::StreamError { worker, error } => match Leave::of_error(error) {
                Some(why) => self.left(worker, why, shell),
                None => {
                    shell.release(self.id());
                    Step::GiveUp(GiveUp::Refused(error.to_string()))
                }
            },
            Event::Abandoned => {
                shell.release(self.id());
                Step::Done
            }
        }
    }
}
