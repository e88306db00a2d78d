//! Requests with media: the encoder pool, joint routing (a worker's cache standing in for
//! encoding), and the gate a request sent ahead of its media waits at.

use switchyard_core::{MediaSpan, RequestId, WorkerId};
use switchyard_router::flow;
use switchyard_router::routing::encoders::MediaWork;
use switchyard_router::{RouteQuery, RoutingOverrides};

use super::{Event, Fleet, Outcome, Slot, micros, slot_of};

impl Fleet<'_> {
    /// Joint routing: the routing core predicts the first token on every worker, those
    /// holding the request's media starting at once and the others after the encoders
    /// (their predicted finish for its items, plus moving the embeddings); when the
    /// soonest is a holder, the request goes there without encoding (in a disaggregated
    /// fleet, prefilled there too: no other worker has its media).
    pub(super) fn worth_skipping(&mut self, index: u32) -> Option<WorkerId> {
        let request = &self.workload.requests[index as usize];
        let end = request.media.iter().map(MediaSpan::end).max()?;
        let needed = flow::media::held_blocks(
            end,
            request.prompt.total_tokens() as u64,
            self.workload.block_size,
        )?;
        let pool = self.encoders.as_ref()?;
        let now = self.now;
        let encoded = request
            .media
            .iter()
            .map(|span| {
                let work = MediaWork {
                    owner: u64::from(index),
                    modality: span.modality,
                    tokens: span.length,
                };
                (0..pool.len())
                    .map(|e| pool.ready_at(e, &work, now))
                    .min()
                    .unwrap_or(now)
            })
            .max()
            .unwrap_or(now)
            .saturating_sub(now);
        let media_tokens: u64 = request.media.iter().map(|s| u64::from(s.length)).sum();
        let encode = encoded + pool.cost().transfer_time(media_tokens);
        let overlaps = self.indexer.find_matches_blocks(&request.prompt);
        let query = RouteQuery {
            id: RequestId(u64::from(index)),
            blocks: &request.prompt,
            overrides: RoutingOverrides::default(),
            exclude: &[],
        };
        match self
            .core
            .joint_media_choice(&query, &overlaps, needed, encode, now)?
        {
            (worker, false) => Some(worker),
            (_, true) => None,
        }
    }

    /// Whether requests go to their LLM worker while their media is encoded (a remote
    /// prefill among them waits for the media: see [`flow::media::waits_for_media`]).
    pub(super) fn overlaps(&self) -> bool {
        self.config.encoders.as_ref().is_some_and(|e| e.overlap)
    }

    /// Where a request's prefill stops while its media is encoded: its first media position.
    pub(super) fn media_gate(&self, index: u32) -> Option<u32> {
        if self.requests[index as usize].encoding == 0 || !self.overlaps() {
            return None;
        }
        self.workload.requests[index as usize]
            .media
            .iter()
            .map(|span| span.offset)
            .min()
    }

    /// The encoder finished a batch: requests whose every item is encoded are routed.
    pub(super) fn encode_done(&mut self, encoder: usize) {
        let Some(pool) = &mut self.encoders else {
            return;
        };
        let (done, next) = pool.finish(encoder, self.now);
        if let Some(s) = next {
            self.schedule(s.ends, Event::EncodeDone(s.encoder as u32));
        }
        for item in done {
            let index = item.owner as u32;
            let state = &mut self.requests[index as usize];
            state.encoding = state.encoding.saturating_sub(1);
            if state.encoding == 0 && state.outcome == Outcome::Pending {
                self.encode_wait
                    .record(micros(self.now - state.encoding_since));
                let when_encoded =
                    std::mem::take(&mut self.requests[index as usize].route_when_encoded);
                if !self.overlaps() || when_encoded {
                    self.place_again(index);
                    continue;
                }
                // Its worker has it already (or it is on its way over): release its gate.
                let Some(worker) = self.requests[index as usize].worker else {
                    continue;
                };
                let slot = slot_of(worker);
                self.core.media_ready(RequestId(u64::from(index)), self.now);
                if self.engines[slot].media_ready(RequestId(u64::from(index)))
                    && self.step_end[slot].is_none()
                    && self.slots[slot] != Slot::Retired
                {
                    self.start_step(slot, self.now);
                }
            }
        }
    }
}
