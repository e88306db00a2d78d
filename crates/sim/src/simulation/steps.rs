//! Engine steps: each one's tokens delivered to their requests' lives, its KV events set
//! off for the indexer, the next step started.

use std::cmp::Reverse;
use std::time::Duration;

use switchyard_core::KvEvent;
use switchyard_core::protocol::FinishReason;
use switchyard_router::flow::{Event as LifeEvent, Leave, Step};
use switchyard_router::routing::health::Failure;

use super::{Fleet, Outcome, Slot, media_class, micros, slot_of, worker_key};
use crate::faults::FaultKind;

impl Fleet<'_> {
    pub(super) fn start_step(&mut self, slot: usize, now: Duration) {
        self.engines[slot].step(now, &mut self.outputs[slot]);
        self.per_worker_prefill[slot] += u64::from(self.outputs[slot].shape.prefill_tokens);
        self.step_end[slot] = Some(self.outputs[slot].finished_at());
    }

    /// The step of engine `slot` ending at `now`: its tokens are delivered, its KV events
    /// set off, and its next step started if it has work.
    pub(super) fn step_done(&mut self, slot: usize, now: Duration) {
        self.last_event = self.last_event.max(now);
        let mut out = std::mem::take(&mut self.outputs[slot]);
        let mut freed = false;
        // A first token lowers the worker's queued prefill, which may make it not busy.
        let mut prefilled = false;
        for token in &out.tokens {
            let index = token.request.0 as usize;
            // A token of a placement since given up (the request was cancelled here and
            // moved, or is done): not the request's any more.
            let current = &self.requests[index];
            if current.outcome != Outcome::Pending || out.started_at < current.placed_at {
                continue;
            }
            let remote = self.requests[index]
                .remote_prefill
                .filter(|&(pslot, _)| pslot == slot);
            let mut finish = token.finish;
            let mut decode_lost = None;
            if let Some((pslot, dslot)) = remote {
                // A remote prefill's token: it ends the request only on a stop token or
                // when it is the last one it may have.
                let lost;
                (finish, lost) = self.remote_prefill_done(index as u32, token.token, pslot, dslot);
                if lost {
                    decode_lost = Some(worker_key(dslot as u32).worker_id);
                }
            }
            let tokens = LifeEvent::Tokens(std::slice::from_ref(&token.token));
            let first_of_attempt = self.with_life_at(index as u32, now, |life, shell| {
                life.step(tokens, shell) == Step::Prefilled
            });
            let state = &mut self.requests[index];
            if let Some(since) = state.interrupted_at.take() {
                self.stall.record(micros(now - since));
            }
            if state.first_token.is_none() {
                let arrival = state.arrived;
                if let Some(scaling) = &mut self.scaling {
                    scaling.traffic.cached_tokens += u64::from(token.cached_tokens);
                    scaling.traffic.ttft_ms_sum += (now - arrival).as_secs_f64() * 1e3;
                    scaling.traffic.ttft_count += 1;
                }
                self.ttft.record(micros(now - arrival));
                if self.has_media {
                    self.ttft_by_class
                        .entry(media_class(&self.workload.requests[index].media))
                        .or_default()
                        .record(micros(now - arrival));
                }
                self.core.observe_ttft(now - arrival);
                state.first_token = Some(now);
                state.cached_tokens = token.cached_tokens;
                self.report.prompt_tokens +=
                    self.workload.requests[index].prompt.total_tokens() as u64;
                self.report.cached_tokens += u64::from(token.cached_tokens);
            } else {
                if let Some(scaling) = &mut self.scaling {
                    scaling.traffic.itl_ms_sum += (now - state.last_token).as_secs_f64() * 1e3;
                    scaling.traffic.itl_count += 1;
                }
                self.itl.record(micros(now - state.last_token));
            }
            prefilled |= first_of_attempt;
            state.last_token = now;
            state.output_tokens += 1;
            self.report.output_tokens += 1;
            if let Some(reason) = finish {
                if let Some(worker) = state.worker {
                    let finished = LifeEvent::Finished {
                        worker: worker.worker_id,
                    };
                    self.with_life_at(index as u32, now, |life, shell| life.step(finished, shell));
                }
                self.complete(index as u32, reason, now);
                freed = true;
            } else if let Some(worker) = decode_lost {
                let why = Leave::Failed(Failure::Unreachable);
                self.move_request(index as u32, worker, why, FaultKind::Crash, now);
            }
        }
        if !out.events.is_empty() {
            if self.config.event_delay.is_zero() {
                self.apply_events(&mut out.events);
            } else {
                let slot = match self.free_slots.pop() {
                    Some(free) => free,
                    None => {
                        self.in_flight_events.push(Vec::new());
                        self.in_flight_events.len() - 1
                    }
                };
                std::mem::swap(&mut self.in_flight_events[slot], &mut out.events);
                let at = now + self.config.event_delay;
                self.deliveries.push(Reverse((at, self.next_seq, slot)));
                self.next_seq += 1;
            }
        }
        // A step that did nothing (every request held back by its media) would be followed
        // by another at the same instant: the engine idles until its media or a request
        // comes.
        let idle = out.shape.prefill_tokens == 0
            && out.shape.decode_seqs == 0
            && self.engines[slot].waiting_on_media();
        self.outputs[slot] = out;
        if self.engines[slot].has_work() && !idle {
            self.start_step(slot, now);
        } else {
            self.step_end[slot] = None;
            // A draining worker leaves once nothing is bound to it (requests prefilling
            // elsewhere for it, or with their KV on its way, still are).
            let bound = self.core.load(worker_key(slot as u32)).requests > 0;
            if self.slots[slot] == Slot::Draining && !bound {
                self.retire(slot);
            }
        }
        if freed || (prefilled && self.core.queued() > 0) {
            self.release_queued();
        }
    }

    /// Request `index` completed at `now` (`reason`): its latencies are recorded.
    pub(super) fn complete(&mut self, index: u32, reason: FinishReason, now: Duration) {
        self.media_released(index);
        let index = index as usize;
        let arrival = self.requests[index].arrived;
        let state = &mut self.requests[index];
        self.e2e.record(micros(now - arrival));
        if let Some(first) = state.first_token.filter(|_| state.output_tokens > 1) {
            self.tpot
                .record(micros((now - first) / (state.output_tokens - 1)));
        }
        if state.caught {
            self.moved_e2e.record(micros(now - arrival));
            self.failures.completed_after_move += 1;
        } else if !self.plan.is_empty() {
            self.untouched_e2e.record(micros(now - arrival));
        }
        state.finished = Some(now);
        state.outcome = Outcome::Completed(reason);
        if let Some(scaling) = &mut self.scaling {
            scaling.traffic.output_tokens += u64::from(state.output_tokens);
            scaling.traffic.finished += 1;
        }
        self.report.completed += 1;
        if reason == FinishReason::Stop {
            self.report.stopped_early += 1;
        }
        self.ended(index as u32, now);
    }

    /// Applies KV events from workers the core sees through events.
    pub(super) fn apply_events(&mut self, events: &mut Vec<KvEvent>) {
        for event in events.drain(..) {
            if self
                .accepted
                .get(slot_of(event.worker()))
                .copied()
                .unwrap_or(false)
            {
                self.indexer.apply(&event);
            }
        }
    }
}
