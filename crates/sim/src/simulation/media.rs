//! Requests with media: the encoder pool, joint routing (a worker's cache standing in for
//! encoding), and the gate a request sent ahead of its media waits at.

use std::collections::HashMap;

use switchyard_core::{MediaSpan, RequestId, WorkerId};
use switchyard_multimodal::store::{Acquired, FeatureState, FeatureStore};
use switchyard_router::routing::encoders::{
    EncoderCost, EncoderLedger, EncoderPolicy, EncoderPool, MediaWork, Started, job_estimate_ms,
};

use super::{Event, Fleet, Outcome, Slot, micros, slot_of};

impl Fleet<'_> {
    /// Joint routing: the routing core predicts the first token on every worker, those
    /// holding the request's media starting at once and the others only after `encode`
    /// (the frontend's estimate: see [`MediaLife::estimate`]); when the soonest is a
    /// holder, the request goes there without encoding (in a disaggregated fleet,
    /// prefilled there too: no other worker has its media).
    pub(super) fn worth_skipping(
        &mut self,
        index: u32,
        encode: std::time::Duration,
    ) -> Option<WorkerId> {
        let request = &self.workload.requests[index as usize];
        let overlaps = self.indexer.find_matches_blocks(&request.prompt);
        self.core.sooner_holder(
            RequestId(u64::from(index)),
            &request.prompt,
            &request.media,
            &overlaps,
            encode,
            self.now,
        )
    }

    /// A request with media meets the encoders, as the frontend's encode stage has it: the
    /// items the feature store holds are not encoded again, those another request is
    /// encoding are waited for, the rest are one job for the encoder its policy picks,
    /// unless joint routing finds a worker holding them sooner. Returns the worker it is
    /// pinned to (joint routing) or whether it waits for media.
    pub(super) fn meet_encoders(&mut self, index: u32) -> Media {
        let Some(life) = &mut self.media_life else {
            return Media::Ready;
        };
        let request = &self.workload.requests[index as usize];
        let (to_encode, awaited, cached) = life.hold(index, &request.media);
        self.media.cached += cached;
        if to_encode.is_empty() && awaited == 0 {
            return Media::Ready;
        }
        let joint = self.config.encoders.as_ref().is_some_and(|e| e.joint);
        if !to_encode.is_empty() {
            let (encoder, estimate_ms) = life.pick(&to_encode);
            if joint {
                let tokens: u64 = to_encode.iter().map(|w| u64::from(w.tokens)).sum();
                let ready_ms = life.ledger.outstanding_ms(encoder) + estimate_ms;
                let encode = std::time::Duration::from_secs_f64(ready_ms / 1e3)
                    + life.cost.transfer_time(tokens);
                if let Some(holder) = self.worth_skipping(index, encode) {
                    if let Some(life) = &mut self.media_life {
                        life.give_back_reserved(index);
                    }
                    return Media::Held(holder);
                }
            }
            let Some(life) = &mut self.media_life else {
                return Media::Ready;
            };
            let started = life.send(index, encoder, estimate_ms, &to_encode, self.now);
            for s in started {
                self.schedule(s.ends, Event::EncodeDone(s.encoder as u32));
            }
        }
        let state = &mut self.requests[index as usize];
        state.encoding = to_encode.len() as u32 + awaited;
        state.encoding_since = self.now;
        Media::Encoding
    }

    /// Whether requests go to their LLM worker while their media is encoded (a remote
    /// prefill among them waits for the media: see
    /// [`switchyard_router::flow::media::waits_for_media`]).
    pub(super) fn overlaps(&self) -> bool {
        self.config.encoders.as_ref().is_some_and(|e| e.overlap)
    }

    /// Where a request's prefill stops while its media is encoded: its first media position.
    pub(super) fn media_gate(&self, index: u32) -> Option<u32> {
        if self.requests[index as usize].encoding == 0 || !self.overlaps() {
            return None;
        }
        switchyard_router::flow::media::gate(&self.workload.requests[index as usize].media)
    }

    /// The encoder finished a batch: a job whose every item is encoded is answered, and
    /// the requests whose media are then all encoded go on.
    pub(super) fn encode_done(&mut self, encoder: usize) {
        let Some(life) = &mut self.media_life else {
            return;
        };
        let (done, next) = life.pool.finish(encoder, self.now);
        let mut ready = Vec::new();
        for item in done {
            ready.extend(life.item_encoded(item.owner as u32));
        }
        if let Some(s) = next {
            self.schedule(s.ends, Event::EncodeDone(s.encoder as u32));
        }
        for index in ready {
            self.media_encoded(index);
        }
    }

    /// Request `index` has one more of its items encoded (its own, or one it waited for).
    fn media_encoded(&mut self, index: u32) {
        let state = &mut self.requests[index as usize];
        state.encoding = state.encoding.saturating_sub(1);
        if state.encoding > 0 || state.outcome != Outcome::Pending {
            return;
        }
        self.encode_wait
            .record(micros(self.now - state.encoding_since));
        let when_encoded = std::mem::take(&mut self.requests[index as usize].route_when_encoded);
        if !self.overlaps() || when_encoded {
            self.place_again(index);
            return;
        }
        // Its worker has it already (or it is on its way over): release its gate.
        let Some(worker) = self.requests[index as usize].worker else {
            return;
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

    /// Request `index` is done with (complete, refused or given up): it lets its media go.
    pub(super) fn media_released(&mut self, index: u32) {
        if let Some(life) = &mut self.media_life {
            life.release(index);
        }
    }
}

/// Where a request's media stand once it met the encoders.
pub(super) enum Media {
    /// Nothing to encode (none, or all held already).
    Ready,
    /// Not encoded: this worker holds their KV.
    Held(WorkerId),
    /// Being encoded (or waited for).
    Encoding,
}

/// The encoders and what the frontend keeps of them: the feature store of encoded items
/// (the same store the frontend runs), its ledger of the encoders' work, the jobs out.
#[derive(Debug)]
pub(super) struct MediaLife {
    pub(super) pool: EncoderPool,
    pub(super) cost: EncoderCost,
    policy: EncoderPolicy,
    pub(super) ledger: EncoderLedger<usize>,
    store: FeatureStore,
    /// Each request's items in the store, and those of them it reserved to encode.
    holds: HashMap<u32, (Vec<u64>, Vec<u64>)>,
    /// Each request's job on an encoder: (encoder, estimated ms, items left).
    jobs: HashMap<u32, (usize, f64, u32)>,
    /// Requests waiting for an item another request is encoding, by item.
    waiters: HashMap<u64, Vec<u32>>,
}

impl MediaLife {
    pub(super) fn new(sim: &crate::EncoderSim) -> Self {
        MediaLife {
            pool: EncoderPool::new(sim.count, sim.cost.clone(), sim.policy),
            cost: sim.cost.clone(),
            policy: sim.policy,
            ledger: EncoderLedger::default(),
            store: FeatureStore::new(sim.store_bytes, u64::MAX, sim.after_prefill),
            holds: HashMap::new(),
            jobs: HashMap::new(),
            waiters: HashMap::new(),
        }
    }

    /// Takes request `index`'s items in the store: returns those to encode, how many it
    /// waits for (another request is encoding them) and how many the store holds. An item larger than the store,
    /// or one it has no room for, is encoded without being kept (the frontend would wait
    /// for room: not modelled).
    fn hold(&mut self, index: u32, media: &[MediaSpan]) -> (Vec<MediaWork>, u32, u64) {
        let mut to_encode: Vec<MediaWork> = Vec::new();
        let mut awaited = 0;
        let mut cached = 0;
        let (held, reserved) = self.holds.entry(index).or_default();
        for span in media {
            if held.contains(&span.media_hash) {
                continue;
            }
            let work = MediaWork {
                owner: u64::from(index),
                modality: span.modality,
                tokens: span.length,
            };
            let bytes = u64::from(span.length).saturating_mul(self.cost.embedding_bytes_per_token);
            match self.store.acquire(span.media_hash, bytes) {
                Ok(Acquired::Hit(FeatureState::Encoding)) => {
                    held.push(span.media_hash);
                    self.waiters.entry(span.media_hash).or_default().push(index);
                    awaited += 1;
                    cached += 1;
                }
                Ok(Acquired::Hit(_)) => {
                    held.push(span.media_hash);
                    cached += 1;
                }
                Ok(Acquired::Encode) => {
                    held.push(span.media_hash);
                    reserved.push(span.media_hash);
                    to_encode.push(work);
                }
                Ok(Acquired::Wait) | Err(_) => to_encode.push(work),
            }
        }
        (to_encode, awaited, cached)
    }

    /// The encoder the frontend would send `items` to (its policy's first), and the job's
    /// estimated time.
    fn pick(&mut self, items: &[MediaWork]) -> (usize, f64) {
        let mut encoders: Vec<usize> = (0..self.pool.len()).collect();
        self.ledger.order(self.policy, &mut encoders);
        let estimate = job_estimate_ms(&self.cost, items.iter().copied());
        (encoders.first().copied().unwrap_or(0), estimate)
    }

    /// Joint routing chose a worker holding the media: the items reserved leave the store
    /// (nothing encodes them).
    fn give_back_reserved(&mut self, index: u32) {
        if let Some((held, reserved)) = self.holds.get_mut(&index) {
            for hash in reserved.drain(..) {
                held.retain(|&h| h != hash);
                let _ = self.store.failed(hash);
            }
        }
    }

    /// Sends request `index`'s job of `items` to `encoder`; returns the batches that start.
    fn send(
        &mut self,
        index: u32,
        encoder: usize,
        estimate_ms: f64,
        items: &[MediaWork],
        now: std::time::Duration,
    ) -> Vec<Started> {
        self.ledger.charge(encoder, estimate_ms);
        self.jobs
            .insert(index, (encoder, estimate_ms, items.len() as u32));
        items
            .iter()
            .filter_map(|&work| self.pool.submit_to(encoder, work, now))
            .collect()
    }

    /// An item of request `index`'s job is encoded. Returns the requests that have one more
    /// of their items encoded: its own (each item), and, once its whole job is answered,
    /// those waiting for the items it reserved (as the frontend tells them then).
    fn item_encoded(&mut self, index: u32) -> Vec<u32> {
        let mut encoded = vec![index];
        let Some(job) = self.jobs.get_mut(&index) else {
            return encoded;
        };
        job.2 = job.2.saturating_sub(1);
        if job.2 > 0 {
            return encoded;
        }
        let (encoder, ms, _) = *job;
        self.jobs.remove(&index);
        self.ledger.discharge(encoder, ms);
        let reserved = self
            .holds
            .get_mut(&index)
            .map(|(_, reserved)| std::mem::take(reserved))
            .unwrap_or_default();
        for hash in reserved {
            let _ = self.store.encoded(hash);
            encoded.extend(self.waiters.remove(&hash).unwrap_or_default());
        }
        encoded
    }

    /// Request `index` lets go of its items.
    fn release(&mut self, index: u32) {
        let Some((held, _)) = self.holds.remove(&index) else {
            return;
        };
        for hash in held {
            let _ = self.store.release(hash);
        }
    }

    pub(super) fn pool(&self) -> &EncoderPool {
        &self.pool
    }
}
