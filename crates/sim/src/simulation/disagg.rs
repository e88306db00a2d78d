//! Disaggregated requests: a prompt computed on a prefill worker, its KV pulled by the
//! decode worker, which generates the rest.

use switchyard_core::protocol::{EngineError, FinishReason};
use switchyard_core::{RequestId, Token, WorkerId, WorkerKey};
use switchyard_mocker::MockRequest;
use switchyard_router::flow::{Event as LifeEvent, Leave, Step, TryFailure};

use super::{Event, Fleet, Slot, micros, slot_of};
use crate::faults::FaultKind;

impl Fleet<'_> {
    /// Hands a request's prompt to its prefill worker (for one token), the routing core
    /// having recorded both workers. A crashed worker of the pair refuses it, as does an
    /// engine that cannot take it: returned, for the request's life to decide.
    pub(super) fn start_remote_prefill(
        &mut self,
        index: u32,
        mock: &MockRequest,
        decode: WorkerKey,
        prefill: WorkerKey,
    ) -> Result<(), (WorkerId, TryFailure)> {
        let id = RequestId(u64::from(index));
        for worker in [prefill, decode] {
            if let Slot::Failed {
                kind: FaultKind::Crash,
                ..
            } = self.slots[slot_of(worker)]
            {
                let refused =
                    TryFailure::Refused(EngineError::Unreachable("the worker crashed".into()));
                return Err((worker.worker_id, refused));
            }
        }
        let (pslot, dslot) = (slot_of(prefill), slot_of(decode));
        if !matches!(self.slots[pslot], Slot::Failed { .. }) {
            let prompt = MockRequest {
                max_output_tokens: 1,
                ..mock.clone()
            };
            if let Err(rejected) = self.engines[pslot].add_request(prompt) {
                return Err((
                    prefill.worker_id,
                    TryFailure::Refused(rejected.engine_error()),
                ));
            }
            if self.step_end[pslot].is_none() {
                self.start_step(pslot, self.now);
            }
        }
        // (Hung, it takes the prompt and does nothing, until the hang is found.)
        let state = &mut self.requests[index as usize];
        state.worker = Some(decode);
        state.remote_prefill = Some((pslot, dslot));
        state.placed_at = self.now;
        self.per_worker_requests[dslot] += 1;
        self.prefill_ids.insert(id.prefill_stage(), index);
        self.disagg.remote_prefills += 1;
        Ok(())
    }

    /// A remote prefill produced the request's next token (its first, or the first after
    /// a move): the request is under way on its decode worker, which (unless that token
    /// ends it) pulls the KV blocks it lacks and then generates the rest. Returns how that
    /// token ends the request, if it does, and whether the decode worker is gone (the
    /// request then leaves it, once the token is counted).
    pub(super) fn remote_prefill_done(
        &mut self,
        index: u32,
        token: Token,
        pslot: usize,
        dslot: usize,
    ) -> (Option<FinishReason>, bool) {
        let id = RequestId(u64::from(index));
        let handed_over = LifeEvent::HandedOver { token };
        let step = self.with_life(index, |life, shell| life.step(handed_over, shell));
        self.prefill_ids.remove(&id.prefill_stage());
        self.requests[index as usize].remote_prefill = None;
        match step {
            Step::Stream => {}
            Step::Finish(reason) => return (Some(reason), false),
            step => unreachable!("a handover does not lead to {step:?}"),
        }
        if !matches!(self.slots[dslot], Slot::Up | Slot::Draining) {
            return (None, true);
        }
        let Some(disagg) = self.config.disagg else {
            return (None, false);
        };
        let (mut prompt, left, generated) = self.resumed(index);
        let prompt_tokens = prompt.total_tokens() as u32;
        let block_size = self.config.engine.block_size;
        let held = self.engines[dslot]
            .block_manager()
            .cached_prefix(prompt.sequence_hashes()) as u32
            * block_size;
        let held = held.min(prompt_tokens);
        let bytes = u64::from(prompt_tokens - held) * disagg.kv_bytes_per_token;
        // In the engines' time, as a worker times its pull (model time over the speedup).
        let transfer = self.engine_time(disagg.link.transfer_time(bytes));
        self.disagg.transferred_bytes += bytes;
        self.disagg.reused_tokens += u64::from(held);
        self.transfer_time.record(micros(transfer));
        prompt.extend(&[token]);
        let mut mock = self.mock_for(index, prompt, left.saturating_sub(1).max(1), generated + 1);
        mock.imported_tokens = prompt_tokens;
        mock.media_gate = None;
        // Its media are in the KV it pulls.
        mock.media = None;
        let state = &mut self.requests[index as usize];
        state.pulling_from = Some(pslot);
        let moves = state.moves;
        self.transfers.insert(index, (moves, dslot, mock));
        self.schedule(self.now + transfer, Event::TransferDone(index, moves));
        (None, false)
    }

    /// The prefill worker in `slot` failed: the decode workers pulling KV from it find it
    /// gone, and those requests are prefilled again.
    pub(super) fn transfers_lost(&mut self, slot: usize) {
        let mut caught: Vec<u32> = self
            .transfers
            .keys()
            .copied()
            .filter(|&i| self.requests[i as usize].pulling_from == Some(slot))
            .collect();
        caught.sort_unstable();
        for index in caught {
            self.disagg.lost_transfers += 1;
            self.requests[index as usize].pulling_from = None;
            let Some(worker) = self.requests[index as usize].worker else {
                continue;
            };
            self.move_request(
                index,
                worker.worker_id,
                Leave::KvLost,
                FaultKind::Crash,
                self.now,
            );
        }
    }
}
