//! Worker failures as the frontend meets them: a worker found failed is taken out, and its
//! requests leave it as their lives decide (moved, or given up); a prefill it was
//! computing for a decode worker is a try that failed.

use std::time::Duration;

use switchyard_core::protocol::EngineError;
use switchyard_core::{RequestId, WorkerId};
use switchyard_mocker::MockEngine;
use switchyard_router::flow::{Event as LifeEvent, Leave, Step, TryFailure, stall};
use switchyard_router::routing::health::Failure;

use super::{Event, Fleet, Outcome, Slot, StepOutput, worker_key, worker_spec};
use crate::faults::FaultKind;

impl Fleet<'_> {
    /// The fault at `i` of the plan strikes its worker.
    pub(super) fn strike(&mut self, i: usize) {
        let fault = self.plan[i];
        let slot = (fault.worker - 1) as usize;
        if self.slots[slot] != Slot::Up {
            return;
        }
        self.failures.faults += 1;
        *self
            .failures
            .faults_by_kind
            .entry(fault.kind.name())
            .or_insert(0) += 1;
        // Whatever the engine was computing never comes out.
        self.step_end[slot] = None;
        self.slots[slot] = Slot::Failed {
            kind: fault.kind,
            since: self.now,
            detected: false,
            back_at: fault.down_for.map(|d| self.now + d),
        };
        if self.config.disagg.is_some() && !fault.kind.kv_survives() {
            self.transfers_lost(slot);
        }
        let noticed = match fault.kind {
            FaultKind::Crash => self.now + self.config.faults.crash_detection,
            FaultKind::Hang => self.first_stream_due(slot).0,
            FaultKind::Drain => self.now,
        };
        if noticed <= self.now {
            self.take_out(slot);
        } else {
            self.schedule(noticed, Event::Detected(slot as u32));
        }
    }

    /// When the first of the streams on the worker in `slot` is due to have a token by
    /// the frontend's timers, and since when it waits: one that had a token in its
    /// attempt waits the worker's stall timeout from its last token, one that had none
    /// waits for its first token from when it was sent (see
    /// `switchyard_router::flow::stall`). A hung worker is found when the first is due:
    /// its stream finds the worker idle, which opens its breaker at once, and the others
    /// leave with it.
    fn first_stream_due(&self, slot: usize) -> (Duration, Duration) {
        let key = worker_key(slot as u32);
        let stall = self.core.stall_timeout(key.worker_id);
        let first_token = stall::first_token_wait(
            self.core.health_config().first_token_timeout,
            self.core.queued_prefill_time(key.worker_id, self.now),
        );
        self.requests
            .iter()
            .zip(&self.lives)
            .filter(|(r, _)| r.worker == Some(key) && r.outcome == Outcome::Pending)
            .map(|(r, life)| {
                if life.attempt_tokens() > 0 {
                    (r.last_token + stall, r.last_token)
                } else {
                    (r.placed_at + first_token, r.placed_at)
                }
            })
            .min()
            .unwrap_or((self.now + stall, self.now))
    }

    /// A hung worker's first stream is due: as the frontend's stream does, it waits on
    /// while the worker's queued prefill is predicted to hold its tokens back (within the
    /// first-token timeout since its last token), else the worker is found hung.
    pub(super) fn stream_due(&mut self, slot: usize) {
        let worker = worker_key(slot as u32).worker_id;
        let (_, since) = self.first_stream_due(slot);
        let extra = stall::extra_wait(
            self.now.saturating_sub(since),
            self.core.queued_prefill_time(worker, self.now),
            self.core.health_config().first_token_timeout,
        );
        match extra {
            Some(extra) if !extra.is_zero() => {
                self.schedule(self.now + extra, Event::Detected(slot as u32))
            }
            _ => self.take_out(slot),
        }
    }

    /// A failed worker's detection delay is over: a hang's stream may wait on.
    pub(super) fn found(&mut self, slot: usize) {
        match self.slots[slot] {
            Slot::Failed {
                kind: FaultKind::Hang,
                detected: false,
                ..
            } => self.stream_due(slot),
            _ => self.take_out(slot),
        }
    }

    /// The frontend takes the failed worker in `slot` out of routing; its requests leave
    /// it.
    pub(super) fn take_out(&mut self, slot: usize) {
        let Slot::Failed {
            kind,
            since,
            detected: false,
            back_at,
        } = self.slots[slot]
        else {
            return;
        };
        self.slots[slot] = Slot::Failed {
            kind,
            since,
            detected: true,
            back_at,
        };
        let worker = worker_key(slot as u32).worker_id;
        let why = match kind {
            FaultKind::Crash => Leave::Failed(Failure::Disconnected),
            FaultKind::Hang => Leave::Failed(Failure::Hung),
            FaultKind::Drain => Leave::Cancelled,
        };
        for id in self.unregister(slot) {
            match self.prefill_ids.get(&id).copied() {
                Some(index) => self.prefill_lost(index, worker, kind),
                // Prefilling elsewhere for this decode worker: it finds out at the
                // handover, as the servers do.
                None if self.requests[id.0 as usize].remote_prefill.is_some() => {}
                None => self.move_request(id.0 as u32, worker, why, kind, since),
            }
        }
        if let Some(at) = back_at {
            self.schedule(at.max(self.now), Event::Recover(slot as u32));
        }
    }

    /// Workers that the failures counted against them took out (their breaker opened)
    /// before their fault was otherwise noticed: found now.
    pub(super) fn deal_with_outages(&mut self) {
        while let Some(worker) = self.outages.pop() {
            let slot = (worker.0 - 1) as usize;
            // Only a failed engine produces failures of its own in the simulator.
            if matches!(
                self.slots.get(slot),
                Some(Slot::Failed {
                    detected: false,
                    ..
                })
            ) {
                self.take_out(slot);
            }
        }
    }

    /// The prefill worker computing request `index`'s prompt failed (its stream breaks, or
    /// it was found unhealthy): a try that failed, not a move.
    fn prefill_lost(&mut self, index: u32, worker: WorkerId, kind: FaultKind) {
        let id = RequestId(u64::from(index));
        self.prefill_ids.remove(&id.prefill_stage());
        let state = &mut self.requests[index as usize];
        state.remote_prefill = None;
        if state.outcome != Outcome::Pending {
            return;
        }
        state.caught = true;
        self.failures.interrupted += 1;
        self.failures.restarted += 1;
        let failure = match kind {
            FaultKind::Crash => TryFailure::Refused(EngineError::Disconnected),
            FaultKind::Hang => TryFailure::FoundUnhealthy,
            FaultKind::Drain => TryFailure::Refused(EngineError::Stopping),
        };
        if self.try_failed(index, worker, failure) {
            self.place_again(index);
        }
    }

    /// Request `index` leaves `worker` (`why`), caught by a fault of `kind` struck at
    /// `since`: as its life decides, it goes on elsewhere, after the tokens streamed so far
    /// (its KV sent over when it is still readable and that is cheaper), or gives up.
    pub(super) fn move_request(
        &mut self,
        index: u32,
        worker: WorkerId,
        why: Leave,
        kind: FaultKind,
        since: Duration,
    ) {
        self.transfers.remove(&index);
        let id = RequestId(u64::from(index));
        if let Some((pslot, _)) = self.requests[index as usize].remote_prefill.take() {
            // Caught mid-prefill: the prefill worker lets it go too.
            self.engines[pslot].cancel(id);
            self.prefill_ids.remove(&id.prefill_stage());
        }
        let state = &mut self.requests[index as usize];
        state.pulling_from = None;
        if state.outcome != Outcome::Pending {
            return;
        }
        state.caught = true;
        self.failures.interrupted += 1;
        let left = LifeEvent::Left { worker, why };
        match self.with_life(index, |life, shell| life.step(left, shell)) {
            Step::GiveUp(give_up) => return self.give_up(index, &give_up),
            Step::Finish(reason) => return self.complete(index, reason, self.now),
            Step::Move => {}
            step => unreachable!("leaving a worker does not lead to {step:?}"),
        }
        self.requests[index as usize].moves += 1;
        let (prompt, left, generated) = self.resumed(index);
        if generated == 0 {
            // Nothing reached the client: sent again as it came.
            self.failures.restarted += 1;
            self.place(index, prompt, left, 0, 0);
            return;
        }
        self.failures.migrations += 1;
        self.requests[index as usize].interrupted_at = Some(since);
        // The last streamed token was never fed through the model: its KV is not there.
        let kv_tokens = if kind.kv_survives() && why != Leave::KvLost {
            prompt.total_tokens() as u32 - 1
        } else {
            0
        };
        self.place(index, prompt, left, generated, kv_tokens);
    }

    /// A moved request's KV has arrived at its new worker.
    pub(super) fn transfer_done(&mut self, index: u32, moves: u32) {
        let Some(&(expected, slot, _)) = self.transfers.get(&index) else {
            return;
        };
        if expected != moves {
            return;
        }
        let Some((_, _, mock)) = self.transfers.remove(&index) else {
            return;
        };
        self.requests[index as usize].pulling_from = None;
        if !matches!(self.slots[slot], Slot::Up | Slot::Draining) {
            // Hung: it sits there until the hang is found and it moves again.
            return;
        }
        self.requests[index as usize].placed_at = self.now;
        if let Err(rejected) = self.engines[slot].add_request(mock) {
            let worker = worker_key(slot as u32).worker_id;
            if self.try_failed(index, worker, TryFailure::Refused(rejected.engine_error())) {
                self.place_again(index);
            }
            return;
        }
        if self.step_end[slot].is_none() {
            self.start_step(slot, self.now);
        }
    }

    /// The worker in `slot` leaves the routing core and the index; returns the requests
    /// still bound to it, in order.
    pub(super) fn unregister(&mut self, slot: usize) -> Vec<RequestId> {
        let key = worker_key(slot as u32);
        let mut caught = self.core.remove_worker(key.worker_id);
        self.indexer.remove_worker(key);
        self.accepted[slot] = false;
        // Its KV events still on their way describe a cache that is gone.
        for events in &mut self.in_flight_events {
            events.retain(|e| e.worker() != key);
        }
        caught.sort_unstable();
        caught
    }

    /// The worker in `slot` is back: a fresh engine with an empty cache.
    pub(super) fn bring_back(&mut self, slot: usize) {
        let Slot::Failed {
            since,
            detected: true,
            ..
        } = self.slots[slot]
        else {
            return;
        };
        self.failures.worker_seconds_down += (self.now - since).as_secs_f64();
        let key = worker_key(slot as u32);
        let args = self.config.engine;
        let perf = self.config.perf_of(slot).clone();
        let Ok(engine) = MockEngine::new(key, args, perf, self.config.seed) else {
            unreachable!("the engine arguments were accepted at the start");
        };
        self.engines[slot] = engine;
        self.outputs[slot] = StepOutput::default();
        self.step_end[slot] = None;
        self.register(slot);
    }

    /// The worker in `slot` joins the routing core, up, and queued requests may go to it.
    pub(super) fn register(&mut self, slot: usize) {
        self.slots[slot] = Slot::Up;
        if self
            .core
            .add_worker(worker_spec(self.config, slot as u32, self.roles[slot]))
            .is_err()
        {
            unreachable!("every simulated worker has the same block size");
        }
        self.accepted[slot] = self.core.accepts_events(worker_key(slot as u32).worker_id);
        self.release_queued();
        self.workers_changed();
    }
}
