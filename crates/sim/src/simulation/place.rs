//! A request's placement: from admission to its engine, through the routing core, each
//! try's outcome told to its life ([`RequestLife`]), which decides what follows (another
//! worker, a backoff, a wait for one, giving up).

use std::time::Duration;

use rand::Rng;
use rand::rngs::SmallRng;
use switchyard_core::protocol::EngineError;
use switchyard_core::{MediaSpan, RequestId, Token, TokenBlocks, WorkerId, WorkerKey};
use switchyard_mocker::MockRequest;
use switchyard_mocker::tokens::{TokenRules, token_at};
use switchyard_router::flow::{Event as LifeEvent, GiveUp, Shell, Step, TryFailure};
use switchyard_router::routing::health::{Failure, HealthChange};
use switchyard_router::{
    HealthState, LocalReason, PairDecision, RequestLife, RouteDecision, RouteQuery, RoutingCore,
    RoutingOverrides,
};

use super::media::Media;
use super::{Event, Fleet, Outcome, Slot, slot_of};
use crate::faults::FaultKind;

/// The fleet as a request's life sees it: the routing core's records and health, the
/// migration budget, the backoffs' jitter; workers its failures take out are noted.
pub(super) struct SimShell<'a> {
    pub(super) core: &'a mut RoutingCore,
    pub(super) rng: &'a mut SmallRng,
    pub(super) outages: &'a mut Vec<WorkerId>,
    pub(super) now: Duration,
}

impl Shell for SimShell<'_> {
    fn release(&mut self, id: RequestId) {
        self.core.finish(id);
        self.core.prefill_finished(id);
    }

    fn prefill_released(&mut self, id: RequestId) {
        self.core.prefill_finished(id);
    }

    fn hold_prefill(&mut self, id: RequestId, prompt_tokens: u64, media_from: u64) {
        self.core.media_pending(id, prompt_tokens, media_from);
    }

    fn prefill_done(&mut self, id: RequestId) {
        self.core.prefill_done(id, self.now);
    }

    fn count_failure(&mut self, worker: WorkerId, failure: Failure) {
        if let Some(HealthChange {
            to: HealthState::Unhealthy,
            ..
        }) = self.core.observe_failure(worker, failure, self.now)
        {
            self.outages.push(worker);
        }
    }

    fn count_success(&mut self, worker: WorkerId) {
        self.core.observe_success(worker, self.now);
    }

    fn credit_migration(&mut self) {
        self.core.credit_migration();
    }

    fn spend_migration(&mut self) -> bool {
        self.core.spend_migration()
    }

    fn unit_random(&mut self) -> f64 {
        self.rng.random::<f64>()
    }
}

impl Fleet<'_> {
    /// Runs `f` on request `index`'s life, with the fleet as its shell, now.
    pub(super) fn with_life<R>(
        &mut self,
        index: u32,
        f: impl FnOnce(&mut RequestLife, &mut SimShell<'_>) -> R,
    ) -> R {
        self.with_life_at(index, self.now, f)
    }

    /// [`Self::with_life`] at `now` (an engine advanced on its own is ahead of the
    /// fleet's clock).
    pub(super) fn with_life_at<R>(
        &mut self,
        index: u32,
        now: Duration,
        f: impl FnOnce(&mut RequestLife, &mut SimShell<'_>) -> R,
    ) -> R {
        let mut shell = SimShell {
            core: &mut self.core,
            rng: &mut self.rng,
            outages: &mut self.outages,
            now,
        };
        f(&mut self.lives[index as usize], &mut shell)
    }

    /// Starts an admitted request: to the encoders first if it has media (unless, with
    /// joint routing, a worker holding its media already is predicted to be sooner), and
    /// to its worker (at once, with overlap; once encoded, without).
    pub(super) fn dispatch(&mut self, index: u32) {
        self.with_life(index, |life, shell| life.step(LifeEvent::Admitted, shell));
        let request = &self.workload.requests[index as usize];
        if !request.media.is_empty() {
            self.media.requests += 1;
            self.media.items += request.media.len() as u64;
        }
        if request.media.is_empty() {
            return self.place_again(index);
        }
        match self.meet_encoders(index) {
            Media::Ready => {}
            Media::Held(holder) => {
                self.media.skipped += 1;
                self.requests[index as usize].holder = Some(holder);
            }
            Media::Encoding if !self.overlaps() => return,
            Media::Encoding => {}
        }
        self.place_again(index);
    }

    /// The request's prompt as its next worker must see it (the original, then the tokens
    /// streamed so far), its tokens left, and how many were streamed.
    pub(super) fn resumed(&self, index: u32) -> (TokenBlocks, u32, u32) {
        let request = &self.workload.requests[index as usize];
        let generated = self.requests[index as usize].output_tokens;
        let mut prompt = request.prompt.clone();
        if generated > 0 {
            let prompt_tokens = prompt.total_tokens() as u32;
            let seed = self.config.seed;
            let streamed: Vec<Token> = (0..generated)
                .map(|i| token_at(seed, u64::from(index), prompt_tokens + i))
                .collect();
            prompt.extend(&streamed);
        }
        (prompt, request.output_tokens - generated, generated)
    }

    /// Places the request from where it stands (as it came, or after what it streamed).
    pub(super) fn place_again(&mut self, index: u32) {
        let (prompt, left, generated) = self.resumed(index);
        self.place(index, prompt, left, generated, 0);
    }

    /// What its engine is handed.
    pub(super) fn mock_for(
        &self,
        index: u32,
        prompt: TokenBlocks,
        max_output_tokens: u32,
        generated: u32,
    ) -> MockRequest {
        let id = RequestId(u64::from(index));
        MockRequest {
            id,
            prompt,
            max_output_tokens,
            generated,
            stream_key: id.0,
            stop_token_ids: self.config.eos_token_ids.clone(),
            rules: TokenRules::default(),
            earlier_output: Vec::new(),
            imported_tokens: 0,
            media_gate: self.media_gate(index),
            media: MediaSpan::extent(&self.workload.requests[index as usize].media),
            // Traces carry no constraints and ask for no log probabilities.
            guide: None,
            logprobs: None,
            prompt_logprobs: None,
        }
    }

    /// Routes a request (new, or moved with `generated` tokens streamed and `kv_tokens`
    /// tokens of KV readable on the worker it leaves) and hands it to an engine, trying
    /// others as its life decides when one cannot take it.
    pub(super) fn place(
        &mut self,
        index: u32,
        prompt: TokenBlocks,
        max_output_tokens: u32,
        generated: u32,
        kv_tokens: u32,
    ) {
        let mut mock = self.mock_for(index, prompt, max_output_tokens, generated);
        loop {
            let Some((PairDecision { decode, prefill }, local)) = self.route_for(index, &mock)
            else {
                return;
            };
            if let Some(local) = local {
                self.disagg.count_local(local);
            }
            let failed = match prefill {
                Some(prefill) => self
                    .start_remote_prefill(index, &mock, decode.worker, prefill.worker)
                    .err(),
                None => self.try_on(index, &decode, mock, kv_tokens),
            };
            let Some((worker, failure)) = failed else {
                return;
            };
            if !self.try_failed(index, worker, failure) {
                return;
            }
            let (prompt, left, generated) = self.resumed(index);
            mock = self.mock_for(index, prompt, left, generated);
        }
    }

    /// Routes the request as its life decides: a worker (or a pair) and why a request for
    /// a decode worker is prefilled there, if it is; none when it waits (for a worker, or
    /// for its media) or gave up.
    fn route_for(
        &mut self,
        index: u32,
        mock: &MockRequest,
    ) -> Option<(PairDecision, Option<LocalReason>)> {
        let holder = self.requests[index as usize].holder;
        let overrides = RoutingOverrides {
            worker: holder,
            held_media: holder.is_some(),
            media_pending: mock.media_gate.is_some(),
            max_tokens: Some(mock.max_output_tokens),
            ..RoutingOverrides::default()
        };
        let overlaps = self.indexer.find_matches_blocks(&mock.prompt);
        loop {
            let query = RouteQuery {
                id: mock.id,
                blocks: &mock.prompt,
                overrides,
                exclude: self.lives[index as usize].exclusions(),
            };
            let routed = self.core.route_pair(&query, &overlaps, self.now).ok();
            let event = match &routed {
                Some((pair, _)) => LifeEvent::Routed {
                    pair: pair.prefill.is_some(),
                    media_pending: mock.media_gate.is_some(),
                },
                None => LifeEvent::NoWorker { now: self.now },
            };
            match self.with_life(index, |life, shell| life.step(event, shell)) {
                Step::Route => {}
                Step::Send => return routed,
                // A prefill worker hands over a finished prompt: routed again once its
                // media are encoded.
                Step::AwaitMedia => {
                    self.requests[index as usize].route_when_encoded = true;
                    return None;
                }
                Step::Wait { until } => {
                    self.wait_for_worker(index, until);
                    return None;
                }
                Step::GiveUp(give_up) => {
                    self.give_up(index, &give_up);
                    return None;
                }
                step => unreachable!("routing a request does not lead to {step:?}"),
            }
        }
    }

    /// Hands the request to the engine it was routed to (its KV sent over instead of
    /// computed again, when that is cheaper); the try's failure when the engine cannot
    /// take it.
    fn try_on(
        &mut self,
        index: u32,
        decision: &RouteDecision,
        mut mock: MockRequest,
        kv_tokens: u32,
    ) -> Option<(WorkerId, TryFailure)> {
        let worker = decision.worker;
        let slot = slot_of(worker);
        match self.slots[slot] {
            // A crashed worker refuses the connection.
            Slot::Failed {
                kind: FaultKind::Crash,
                ..
            } => {
                let refused =
                    TryFailure::Refused(EngineError::Unreachable("the worker crashed".into()));
                return Some((worker.worker_id, refused));
            }
            // A hung worker takes it and does nothing: it moves when the hang is found.
            Slot::Failed { .. } => {
                self.bind(index, worker);
                return None;
            }
            // Neither is registered with the core, which cannot route to them.
            Slot::Starting | Slot::Retired => {
                unreachable!("routed to a worker the core does not know")
            }
            Slot::Up | Slot::Draining => {}
        }
        if kv_tokens > 0
            && let Some(transfer) = self.cheaper_transfer(slot, decision, kv_tokens)
        {
            mock.imported_tokens = kv_tokens;
            let moves = self.requests[index as usize].moves;
            self.bind(index, worker);
            self.transfers.insert(index, (moves, slot, mock));
            self.schedule(self.now + transfer, Event::TransferDone(index, moves));
            return None;
        }
        if mock.generated > 0 {
            self.failures.by_reprefill += 1;
            self.failures.recomputed_tokens += decision.prefill_tokens;
        }
        let ahead_of_media = mock
            .media_gate
            .map(|gate| (mock.prompt.total_tokens() as u64, gate));
        if let Err(rejected) = self.engines[slot].add_request(mock) {
            return Some((
                worker.worker_id,
                TryFailure::Refused(rejected.engine_error()),
            ));
        }
        self.requests[index as usize].placed_at = self.now;
        self.requests[index as usize].worker = Some(worker);
        self.per_worker_requests[slot] += 1;
        let sent = LifeEvent::Sent { ahead_of_media };
        self.with_life(index, |life, shell| life.step(sent, shell));
        if self.step_end[slot].is_none() {
            self.start_step(slot, self.now);
        }
        None
    }

    /// The request is bound to `worker`, under way there without an engine step of its
    /// own yet (its engine hangs, or its KV is on its way).
    fn bind(&mut self, index: u32, worker: WorkerKey) {
        self.requests[index as usize].worker = Some(worker);
        self.per_worker_requests[slot_of(worker)] += 1;
        let sent = LifeEvent::Sent {
            ahead_of_media: None,
        };
        self.with_life(index, |life, shell| life.step(sent, shell));
    }

    /// How long sending `kv_tokens` of a moved request's KV to the engine in `slot` takes,
    /// when that is sooner than computing it again there; counted as a transfer.
    fn cheaper_transfer(
        &mut self,
        slot: usize,
        decision: &RouteDecision,
        kv_tokens: u32,
    ) -> Option<Duration> {
        let link = self.config.faults.link?;
        let bytes = u64::from(kv_tokens) * self.config.faults.kv_bytes_per_token;
        let transfer = self.engine_time(link.transfer_time(bytes));
        let recompute = self.engine_time(Duration::from_secs_f64(
            self.config
                .perf_of(slot)
                .prefill_ms(decision.prefill_tokens.min(u64::from(u32::MAX)) as u32)
                / 1e3,
        ));
        if transfer >= recompute {
            return None;
        }
        self.failures.by_transfer += 1;
        self.failures.transferred_bytes += bytes;
        Some(transfer)
    }

    /// A try of request `index` on `worker` failed: its life decides. Returns whether to
    /// try again at once (else it waits out a backoff, or gave up).
    pub(super) fn try_failed(&mut self, index: u32, worker: WorkerId, failure: TryFailure) -> bool {
        let failed = LifeEvent::TryFailed { worker, failure };
        match self.with_life(index, |life, shell| life.step(failed, shell)) {
            Step::Route => true,
            Step::BackOff(backoff) => {
                self.schedule(self.now + backoff, Event::Retry(index));
                false
            }
            Step::GiveUp(give_up) => {
                self.give_up(index, &give_up);
                false
            }
            step => unreachable!("a failed try does not lead to {step:?}"),
        }
    }

    /// Model time as the engines run it (over their speedup ratio).
    pub(super) fn engine_time(&self, model: Duration) -> Duration {
        let speedup = self.config.engine.speedup_ratio;
        Duration::try_from_secs_f64(model.as_secs_f64() / speedup).unwrap_or(Duration::MAX)
    }

    /// A backoff is over.
    pub(super) fn retry(&mut self, index: u32) {
        if self.requests[index as usize].outcome == Outcome::Pending {
            self.place_again(index);
        }
    }

    /// No worker can take the request now: it waits for one to join or recover.
    fn wait_for_worker(&mut self, index: u32, until: Duration) {
        let state = &mut self.requests[index as usize];
        if !state.waiting_for_worker {
            state.waiting_for_worker = true;
            self.waiting.push(index);
            self.schedule(until, Event::WaitOver(index));
        }
    }

    /// Requests waiting for a worker look again (one joined or came back).
    pub(super) fn workers_changed(&mut self) {
        for index in std::mem::take(&mut self.waiting) {
            self.requests[index as usize].waiting_for_worker = false;
            if self.requests[index as usize].outcome == Outcome::Pending {
                self.place_again(index);
            }
        }
    }

    /// A request waited for a worker as long as it may: one last look.
    pub(super) fn wait_over(&mut self, index: u32) {
        if !self.requests[index as usize].waiting_for_worker {
            return;
        }
        self.requests[index as usize].waiting_for_worker = false;
        self.waiting.retain(|&i| i != index);
        if self.requests[index as usize].outcome == Outcome::Pending {
            self.place_again(index);
        }
    }

    /// Its life gave up.
    pub(super) fn give_up(&mut self, index: u32, give_up: &GiveUp) {
        self.media_released(index);
        self.ended(index, self.now);
        let state = &mut self.requests[index as usize];
        state.outcome = Outcome::Failed(give_up.name());
        if state.caught {
            self.failures.failed += 1;
        }
        self.report.failed += 1;
        *self
            .report
            .failed_by_reason
            .entry(give_up.name())
            .or_insert(0) += 1;
    }
}
