//! [`RequestLife`]: the counts and rules of one request's life (see the module above).

use std::time::Duration;

use switchyard_core::protocol::{EngineError, FinishReason};
use switchyard_core::{RequestId, Token, WorkerId};

use super::{GiveUp, Leave, MigrationConfig, Shell, Step, TryFailure, failure_of};
use crate::routing::RoutingConfig;

/// One request's life. The shell tells it each event ([`Self::step`]); it decides what
/// follows.
#[derive(Debug, Clone)]
pub struct RequestLife {
    id: RequestId,
    config: MigrationConfig,
    /// How long a request under way waits for a worker when none can take it.
    queue_timeout: Duration,
    max_tokens: u32,
    stop_token_ids: Vec<Token>,
    /// Output tokens delivered so far, and the last of them.
    generated: u32,
    last_token: Option<Token>,
    /// Workers that failed it: not tried again.
    failed: Vec<WorkerId>,
    /// Moves to another worker after it was first under way.
    moves: u32,
    /// The current round of tries (from the start, or the latest move, until it is under
    /// way): tries that failed, those not counted, and while every worker said it cannot
    /// serve the request, what the last one said.
    failed_tries: u32,
    exempt: u32,
    unservable: Option<String>,
    /// Since when no worker could take it, while it waits for one.
    no_worker_since: Option<Duration>,
    /// While none could be chosen away from the workers that failed it: those are tried
    /// again.
    unexcluded: bool,
    /// Tokens from the current attempt.
    attempt_tokens: u32,
}

impl RequestLife {
    /// A request for at most `max_tokens`, which ends early on `stop_token_ids`.
    pub fn new(
        id: RequestId,
        config: &RoutingConfig,
        max_tokens: u32,
        stop_token_ids: Vec<Token>,
    ) -> Self {
        RequestLife {
            id,
            config: config.migration,
            queue_timeout: config.admission.queue_timeout,
            max_tokens,
            stop_token_ids,
            generated: 0,
            last_token: None,
            failed: Vec::new(),
            moves: 0,
            failed_tries: 0,
            exempt: 0,
            unservable: None,
            no_worker_since: None,
            unexcluded: false,
            attempt_tokens: 0,
        }
    }

    pub fn id(&self) -> RequestId {
        self.id
    }

    /// Output tokens delivered so far.
    pub fn generated(&self) -> u32 {
        self.generated
    }

    /// Tokens it may still generate.
    pub fn tokens_left(&self) -> u32 {
        self.max_tokens.saturating_sub(self.generated)
    }

    /// Moves so far.
    pub fn moves(&self) -> u32 {
        self.moves
    }

    /// Tokens delivered by the current attempt.
    pub fn attempt_tokens(&self) -> u32 {
        self.attempt_tokens
    }

    /// Workers not to route it to: those that failed it (none, while its life says they
    /// may be tried again).
    pub fn exclusions(&self) -> &[WorkerId] {
        if self.unexcluded { &[] } else { &self.failed }
    }

    /// No worker could be chosen, away from [`Self::exclusions`], at `now`. A request not
    /// yet under way gives up; one under way is routed again with none excluded (one that
    /// failed it may be healthy again), then waits for a worker as long as a queued request
    /// would.
    pub(super) fn no_worker(&mut self, now: Duration) -> Step {
        let under_way = !self.failed.is_empty() && self.unservable.is_none();
        if !under_way {
            return Step::GiveUp(match &self.unservable {
                Some(message) => GiveUp::Unservable(message.clone()),
                None if self.failed.is_empty() => GiveUp::NoWorkers,
                None => GiveUp::NoOtherWorker,
            });
        }
        self.unexcluded = !self.unexcluded;
        if self.unexcluded {
            return Step::Route;
        }
        let since = *self.no_worker_since.get_or_insert(now);
        let until = since + self.queue_timeout;
        if now < until {
            Step::Wait { until }
        } else {
            Step::GiveUp(GiveUp::NoOtherWorker)
        }
    }

    /// A worker was chosen: the next time none can be, the wait starts afresh.
    pub(super) fn routed(&mut self) {
        self.no_worker_since = None;
        self.unexcluded = false;
    }

    /// A try on `worker` failed before the request was under way there: counted against
    /// the worker if it is at fault, the worker excluded, the router's records released.
    /// It is routed again at once, after a backoff, or gives up.
    pub(super) fn try_failed(
        &mut self,
        worker: WorkerId,
        failure: TryFailure,
        shell: &mut impl Shell,
    ) -> Step {
        shell.release(self.id);
        let (error, counted) = match failure {
            TryFailure::Refused(EngineError::Invalid(message)) => {
                return Step::GiveUp(GiveUp::Invalid(message));
            }
            TryFailure::Refused(error) => {
                let counted = failure_of(&error);
                (error, counted)
            }
            TryFailure::TimedOut(after) => (
                EngineError::Unreachable(format!("no answer within {after:?}")),
                Some(crate::routing::health::Failure::Timeout),
            ),
            TryFailure::FoundUnhealthy => {
                self.exempt += 1;
                (
                    EngineError::Unreachable("the worker was found unhealthy".into()),
                    None,
                )
            }
        };
        if let Some(failure) = counted {
            shell.count_failure(worker, failure);
        }
        self.failed_tries += 1;
        self.unservable = match &error {
            EngineError::Unsupported(message)
                if self.failed_tries == 1 || self.unservable.is_some() =>
            {
                Some(message.clone())
            }
            _ => None,
        };
        self.failed.push(worker);
        if self.failed_tries.saturating_sub(self.exempt) >= self.config.max_dispatch_attempts {
            return Step::GiveUp(match &self.unservable {
                Some(message) => GiveUp::Unservable(message.clone()),
                None => GiveUp::Exhausted(error.to_string()),
            });
        }
        // A request that streamed nothing yet backs off, longer at each failed try; one
        // under way (moved) goes on at once, and so does one that every worker so far
        // could not serve (it looks for one that can).
        if self.generated == 0 && self.unservable.is_none() {
            Step::BackOff(self.config.backoff(self.failed_tries, shell.unit_random()))
        } else {
            Step::Route
        }
    }

    /// The request is under way on its worker: the round of tries ends.
    pub(super) fn under_way(&mut self) {
        self.failed_tries = 0;
        self.exempt = 0;
        self.unservable = None;
        self.no_worker_since = None;
        self.unexcluded = false;
        self.attempt_tokens = 0;
    }

    /// Tokens arrived from its worker. Returns whether they are the attempt's first (its
    /// worker computed the prompt, as the shell was told).
    pub(super) fn tokens(&mut self, tokens: &[Token], shell: &mut impl Shell) -> bool {
        let first = self.attempt_tokens == 0;
        if first {
            shell.prefill_done(self.id);
        }
        let count = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        self.attempt_tokens = self.attempt_tokens.saturating_add(count);
        self.generated = self.generated.saturating_add(count);
        if let Some(&last) = tokens.last() {
            self.last_token = Some(last);
        }
        first
    }

    /// How the request ended if its tokens say it did: its last token is one it stops
    /// after, or it has all it may have.
    pub fn ended_by_tokens(&self) -> Option<FinishReason> {
        let last = self.last_token?;
        if self.stop_token_ids.contains(&last) {
            Some(FinishReason::Stop)
        } else if self.generated >= self.max_tokens {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// Whether the token a remote prefill computed (its attempt's first, not yet counted
    /// as [`super::Event::Tokens`]) ends the request: a token it stops after, or the last
    /// it may have. Otherwise its decode worker goes on from it.
    pub(super) fn ended_by_prefill_token(&self, token: Token) -> Option<FinishReason> {
        if self.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.tokens_left() <= 1 {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// It leaves `worker`: complete if its tokens all arrived, else moved to another (or
    /// not, past its own limit or the fleet's budget).
    pub(super) fn left(&mut self, worker: WorkerId, why: Leave, shell: &mut impl Shell) -> Step {
        shell.release(self.id);
        if let Leave::Failed(failure) = why {
            shell.count_failure(worker, failure);
        }
        if let Some(reason) = self.ended_by_tokens() {
            return Step::Finish(reason);
        }
        if why != Leave::KvLost {
            self.failed.push(worker);
        }
        if self.moves >= self.config.max_migrations {
            return Step::GiveUp(GiveUp::MoveLimit {
                workers: self.moves + 1,
            });
        }
        if !shell.spend_migration() {
            return Step::GiveUp(GiveUp::MoveBudget);
        }
        self.moves += 1;
        self.under_way();
        Step::Move
    }
}
