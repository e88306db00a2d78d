//! [`RequestLife`]: the counts and rules of one request's life (see the module above).

use std::time::Duration;

use switchyard_core::protocol::{EngineError, FinishReason};
use switchyard_core::{RequestId, Token, WorkerId};

use super::stall;
use super::{
    GiveUp, Leave, Leaving, MigrationConfig, NoWorker, Routing, Shell, TryFailure, failure_of,
};
use crate::routing::RoutingConfig;

/// One request's life. The shell calls it at each event; it decides what follows.
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
            attempt_tokens: 0,
        }
    }

    /// The request starts (admitted): the fleet may move this many more requests.
    pub fn start(&mut self, shell: &mut impl Shell) {
        shell.credit_migration();
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

    /// Workers not to route it to: those that failed it.
    pub fn exclusions(&self) -> &[WorkerId] {
        &self.failed
    }

    /// No worker could be chosen (with the exclusions, or, if `unexcluded`, with none) at
    /// `now`.
    pub fn no_worker(&mut self, unexcluded: bool, now: Duration) -> NoWorker {
        let under_way = !self.failed.is_empty() && self.unservable.is_none();
        if !under_way {
            return NoWorker::GiveUp(match &self.unservable {
                Some(message) => GiveUp::Unservable(message.clone()),
                None if self.failed.is_empty() => GiveUp::NoWorkers,
                None => GiveUp::NoOtherWorker,
            });
        }
        if !unexcluded {
            return NoWorker::RouteUnexcluded;
        }
        let since = *self.no_worker_since.get_or_insert(now);
        let until = since + self.queue_timeout;
        if now < until {
            NoWorker::Wait { until }
        } else {
            NoWorker::GiveUp(GiveUp::NoOtherWorker)
        }
    }

    /// Routes it: `route` is asked for a worker away from those that failed it (with none
    /// excluded, when its life says they may be tried again) and answers `None` when no
    /// worker can be chosen. When none can, the request waits for one or gives up, as its
    /// life decides ([`Self::no_worker`]) at `now`.
    pub fn route<T, E>(
        &mut self,
        now: Duration,
        mut route: impl FnMut(&[WorkerId]) -> Result<Option<T>, E>,
    ) -> Result<Routing<T>, E> {
        let mut unexcluded = false;
        loop {
            let exclude = if unexcluded {
                &[][..]
            } else {
                &self.failed[..]
            };
            if let Some(routed) = route(exclude)? {
                self.no_worker_since = None;
                return Ok(Routing::Routed(routed));
            }
            match self.no_worker(unexcluded, now) {
                NoWorker::RouteUnexcluded => unexcluded = true,
                NoWorker::Wait { until } => return Ok(Routing::Wait { until }),
                NoWorker::GiveUp(give_up) => return Ok(Routing::GiveUp(give_up)),
            }
        }
    }

    /// It is routed again before it was sent (its prompt changed behind it, or it waits
    /// for its media first): the router's records of the last routing are released, and
    /// no try is counted.
    pub fn reroute(&mut self, shell: &mut impl Shell) {
        shell.release(self.id);
    }

    /// A try on `worker` failed before the request was under way there: counted against
    /// the worker if it is at fault, the worker excluded, the router's records released.
    /// Returns how long to wait before the next try (none: try at once), or why it gives
    /// up.
    pub fn try_failed(
        &mut self,
        worker: WorkerId,
        failure: TryFailure,
        shell: &mut impl Shell,
    ) -> Result<Option<Duration>, GiveUp> {
        shell.release(self.id);
        let (error, counted) = match failure {
            TryFailure::Refused(EngineError::Invalid(message)) => {
                return Err(GiveUp::Invalid(message));
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
            return Err(match &self.unservable {
                Some(message) => GiveUp::Unservable(message.clone()),
                None => GiveUp::Exhausted(error.to_string()),
            });
        }
        // A request that streamed nothing yet backs off, longer at each failed try; one
        // under way (moved) goes on at once, and so does one that every worker so far
        // could not serve (it looks for one that can).
        let backoff = (self.generated == 0 && self.unservable.is_none())
            .then(|| self.config.backoff(self.failed_tries, shell.unit_random()));
        Ok(backoff)
    }

    /// Its worker took it (its stream is open): the round of tries ends. A prompt sent
    /// ahead of its media (`ahead_of_media`: its length, and where its media start) has
    /// the part from its media on held back until they are ready.
    pub fn sent(&mut self, ahead_of_media: Option<(u64, u32)>, shell: &mut impl Shell) {
        if let Some((prompt_tokens, from)) = ahead_of_media {
            shell.hold_prefill(self.id, prompt_tokens, u64::from(from));
        }
        self.under_way();
    }

    /// Its remote prefill handed over: the prefill worker no longer counts it, and it is
    /// under way on its decode worker.
    pub fn handed_over(&mut self, shell: &mut impl Shell) {
        shell.prefill_released(self.id);
        self.under_way();
    }

    /// The request is under way on its worker: the round of tries ends.
    pub(super) fn under_way(&mut self) {
        self.failed_tries = 0;
        self.exempt = 0;
        self.unservable = None;
        self.no_worker_since = None;
        self.attempt_tokens = 0;
    }

    /// Tokens arrived from its worker. Returns whether they are the attempt's first (its
    /// worker computed the prompt, as the shell was told).
    pub fn tokens(&mut self, tokens: &[Token], shell: &mut impl Shell) -> bool {
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

    /// The shell ends it for a reason of its own (its prompt cannot be rendered, its media
    /// failed): the router's records are released.
    pub fn abandoned(&mut self, shell: &mut impl Shell) {
        shell.release(self.id);
    }

    /// Whether the token a remote prefill computed (its attempt's first, not yet counted
    /// with [`Self::tokens`]) ends the request: a token it stops after, or the last it may
    /// have. Otherwise its decode worker goes on from it.
    pub fn ended_by_prefill_token(&self, token: Token) -> Option<FinishReason> {
        if self.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.tokens_left() <= 1 {
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// Its worker said it completed.
    pub fn finished(&mut self, worker: WorkerId, shell: &mut impl Shell) {
        shell.count_success(worker);
        shell.release(self.id);
    }

    /// It leaves `worker`: complete if its tokens all arrived, else moved to another (or
    /// not, past its own limit or the fleet's budget).
    pub fn left(&mut self, worker: WorkerId, why: Leave, shell: &mut impl Shell) -> Leaving {
        shell.release(self.id);
        if let Leave::Failed(failure) = why {
            shell.count_failure(worker, failure);
        }
        if let Some(reason) = self.ended_by_tokens() {
            return Leaving::Complete(reason);
        }
        if why != Leave::KvLost {
            self.failed.push(worker);
        }
        if self.moves >= self.config.max_migrations {
            return Leaving::GiveUp(GiveUp::MoveLimit {
                workers: self.moves + 1,
            });
        }
        if !shell.spend_migration() {
            return Leaving::GiveUp(GiveUp::MoveBudget);
        }
        self.moves += 1;
        self.under_way();
        Leaving::Move
    }

    /// Its stream on `worker` got no token for `waited` (the worker produced none on any
    /// stream for `worker_idle`): counted against the worker (stalled, or hung), then it
    /// leaves.
    pub fn stalled(
        &mut self,
        worker: WorkerId,
        waited: Duration,
        worker_idle: Duration,
        shell: &mut impl Shell,
    ) -> Leaving {
        let failure = stall::stall_failure(waited, worker_idle);
        self.left(worker, Leave::Failed(failure), shell)
    }

    /// Its stream's error: it leaves the worker, or gives up when no other would do
    /// better.
    pub fn stream_error(
        &mut self,
        worker: WorkerId,
        error: &EngineError,
        shell: &mut impl Shell,
    ) -> Leaving {
        match Leave::of_error(error) {
            Some(why) => self.left(worker, why, shell),
            None => {
                shell.release(self.id);
                Leaving::GiveUp(GiveUp::Refused(error.to_string()))
            }
        }
    }
}
