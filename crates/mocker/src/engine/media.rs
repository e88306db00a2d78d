//! Media on their way in: requests held at their media gate until the encoder is done,
//! the staging memory their encoded features wait in, and requests whose media became
//! ready scheduled behind the earlier arrivals.

use switchyard_core::RequestId;

use super::MockEngine;
use crate::sequence::Sequence;

impl MockEngine {
    /// Media positions staged now.
    pub fn staged_tokens(&self) -> u64 {
        self.staged_tokens
    }

    fn sequence_mut(&mut self, id: RequestId) -> Option<&mut Sequence> {
        self.running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|s| s.id == id)
    }

    /// Stages request `id`'s encoded media if the staging memory has room (or holds
    /// nothing: media larger than all of it go alone), opening its gate. Whether it did.
    fn try_stage(&mut self, id: RequestId) -> bool {
        let (limit, staged) = (self.args.staging_tokens, self.staged_tokens);
        let Some(seq) = self.sequence_mut(id) else {
            return true;
        };
        let tokens = u64::from(seq.media.map_or(0, |(_, t)| t));
        if limit != 0 && staged != 0 && staged + tokens > limit {
            return false;
        }
        seq.staged = true;
        let held = seq.gate.take().is_some();
        self.staged_tokens += tokens;
        if held && self.args.defer_ready_media {
            self.defer(id);
        }
        true
    }

    /// Schedules request `id` (running or waiting) behind the requests that arrived
    /// before now and were not themselves sent ahead of their media.
    fn defer(&mut self, id: RequestId) {
        let arrivals = self.arrivals;
        if let Some(seq) = self.sequence_mut(id)
            && seq.behind.is_none()
        {
            seq.behind = Some(arrivals);
            self.deferred += 1;
        }
    }

    /// Ends the deferral of requests that no earlier arrival is still ahead of (every
    /// request that arrived before their media were ready has computed its prompt, or as
    /// much of it as it can before its own media).
    pub(super) fn refresh_deferred(&mut self) {
        if self.deferred == 0 {
            return;
        }
        // Only requests that came with their media ready hold a deferred one back (those
        // sent ahead of theirs keep their arrival order among themselves).
        let earliest_prefilling = self
            .running
            .iter()
            .filter(|s| s.prefilling())
            .chain(self.waiting.iter())
            .filter(|s| !s.sent_ahead)
            .map(|s| s.arrival)
            .min()
            .unwrap_or(u64::MAX);
        for seq in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            if seq.behind.is_some_and(|m| earliest_prefilling >= m) {
                seq.behind = None;
                self.deferred -= 1;
            }
        }
    }

    /// Stages request `id`'s encoded media, or queues it behind those waiting (its prefill
    /// stopped at its media) until there is room.
    pub(super) fn stage_or_queue(&mut self, id: RequestId) {
        if self.staging_queue.is_empty() && self.try_stage(id) {
            return;
        }
        if let Some(seq) = self.sequence_mut(id) {
            seq.gate = seq.media.map(|(first, _)| first);
        }
        self.staging_queue.push_back(id);
        self.stats.staging_waits += 1;
    }

    /// `tokens` media positions staged for request `id` leave the staging memory (its
    /// prompt is computed, or it left: then it leaves the queue too); those waiting are
    /// staged in order while there is room.
    pub(super) fn unstage(&mut self, id: RequestId, tokens: u64) {
        self.staged_tokens = self.staged_tokens.saturating_sub(tokens);
        self.staging_queue.retain(|&q| q != id);
        while let Some(&next) = self.staging_queue.front() {
            if !self.try_stage(next) {
                break;
            }
            self.staging_queue.pop_front();
        }
    }

    /// Media positions of `seq` staged now.
    pub(super) fn staged_of(seq: &Sequence) -> u64 {
        if seq.staged {
            u64::from(seq.media.map_or(0, |(_, t)| t))
        } else {
            0
        }
    }

    /// Whether a request here is held at its media gate.
    pub fn waiting_on_media(&self) -> bool {
        self.running
            .iter()
            .chain(self.waiting.iter())
            .any(|s| s.gate.is_some())
    }

    /// The request's media is encoded: its prefill may pass its first media position.
    /// Returns whether the request is here.
    pub fn media_ready(&mut self, id: RequestId) -> bool {
        let Some(seq) = self.sequence_mut(id) else {
            return false;
        };
        if seq.media.is_none() {
            let held = seq.gate.take().is_some();
            if held && self.args.defer_ready_media {
                self.defer(id);
            }
        } else if !std::mem::replace(&mut seq.encoded, true) {
            self.stage_or_queue(id);
        }
        true
    }
}
