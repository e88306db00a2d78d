//! Active sequences: what each worker is busy with right now.
//!
//! The router knows when requests start and end, so it tracks active load itself rather
//! than waiting for engines to report it. Per worker it keeps the blocks held by in-flight
//! requests (reference-counted, so requests sharing a prefix count it once) and the prefill
//! tokens not yet computed.
//!
//! Every request holds a whole chain of blocks from the first, so each worker's active
//! block set is a union of chains, kept as a compressed trie ([`chains`]): adding, freeing
//! and asking how much of a new request a worker already holds cost a walk along the
//! request's chain, not a hash-table operation per block.

mod chains;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap;
use serde::Serialize;
use switchyard_core::{RequestId, SequenceHash, WorkerKey};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ActiveError {
    #[error("request {0} is already active")]
    DuplicateRequest(RequestId),
    #[error("worker {0} is not registered")]
    UnknownWorker(WorkerKey),
}

/// A worker's current load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WorkerLoad {
    /// Distinct blocks held by in-flight requests.
    pub active_blocks: u64,
    /// Prefill tokens routed to the worker and not yet computed.
    pub prefill_tokens: u64,
    /// In-flight requests.
    pub requests: u32,
    /// Since when the worker has been computing the head of its prefill queue: when the
    /// queue last became non-empty or a queued prefill last completed.
    pub prefill_since: Duration,
    /// Prefill tokens of requests sent ahead of their media that wait for them (not in
    /// `prefill_tokens`): the engine computes them behind the requests arriving meanwhile,
    /// but not behind other requests sent ahead of their media.
    pub held_prefill_tokens: u64,
}

#[derive(Debug, Default)]
struct WorkerSlots {
    chains: chains::ChainSet,
    prefill_tokens: u64,
    held_tokens: u64,
    requests: u32,
    prefill_since: Duration,
}

#[derive(Debug)]
struct ActiveRequest {
    worker: WorkerKey,
    blocks: Arc<[SequenceHash]>,
    /// Outstanding prefill tokens; zero once prefill completed.
    prefill_tokens: u64,
    /// Of those, the tokens waiting for the request's media (see
    /// [`ActiveSequences::hold_prefill`]): not in the worker's queue yet.
    held_tokens: u64,
    added_at: Duration,
}

/// Tracks in-flight requests per worker.
#[derive(Debug)]
pub struct ActiveSequences {
    workers: FxHashMap<WorkerKey, WorkerSlots>,
    requests: FxHashMap<RequestId, ActiveRequest>,
    /// Requests by arrival, for expiry. May hold ids already freed.
    arrivals: VecDeque<(Duration, RequestId)>,
    /// Requests older than this are presumed lost and freed.
    request_ttl: Duration,
}

impl ActiveSequences {
    pub fn new(request_ttl: Duration) -> Self {
        ActiveSequences {
            workers: FxHashMap::default(),
            requests: FxHashMap::default(),
            arrivals: VecDeque::new(),
            request_ttl,
        }
    }

    pub fn add_worker(&mut self, worker: WorkerKey) {
        self.workers.entry(worker).or_default();
    }

    /// Unregisters a worker, dropping its requests; returns their ids.
    pub fn remove_worker(&mut self, worker: WorkerKey) -> Vec<RequestId> {
        if self.workers.remove(&worker).is_none() {
            return Vec::new();
        }
        let dropped: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, r)| r.worker == worker)
            .map(|(&id, _)| id)
            .collect();
        for id in &dropped {
            self.requests.remove(id);
        }
        dropped
    }

    pub fn has_worker(&self, worker: WorkerKey) -> bool {
        self.workers.contains_key(&worker)
    }

    pub fn workers(&self) -> impl Iterator<Item = WorkerKey> + '_ {
        self.workers.keys().copied()
    }

    /// Starts tracking a request on `worker` holding `blocks` (its sequence hashes from the
    /// first block) with `prefill_tokens` still to compute.
    pub fn add_request(
        &mut self,
        id: RequestId,
        worker: WorkerKey,
        blocks: &[SequenceHash],
        prefill_tokens: u64,
        now: Duration,
    ) -> Result<(), ActiveError> {
        if self.requests.contains_key(&id) {
            return Err(ActiveError::DuplicateRequest(id));
        }
        let slots = self
            .workers
            .get_mut(&worker)
            .ok_or(ActiveError::UnknownWorker(worker))?;
        let blocks: Arc<[SequenceHash]> = Arc::from(blocks);
        slots.chains.add(&blocks);
        if slots.prefill_tokens == 0 {
            slots.prefill_since = now;
        }
        slots.prefill_tokens += prefill_tokens;
        slots.requests += 1;
        self.requests.insert(
            id,
            ActiveRequest {
                worker,
                blocks,
                prefill_tokens,
                held_tokens: 0,
                added_at: now,
            },
        );
        self.arrivals.push_back((now, id));
        Ok(())
    }

    /// The request's prefill is done at `now`: its prompt tokens no longer weigh as prefill
    /// load, and the worker goes on to the next queued prefill.
    pub fn mark_prefill_completed(&mut self, id: RequestId, now: Duration) -> bool {
        let Some(request) = self.requests.get_mut(&id) else {
            return false;
        };
        let held = std::mem::take(&mut request.held_tokens);
        let tokens = std::mem::take(&mut request.prefill_tokens) - held;
        if let Some(slots) = self.workers.get_mut(&request.worker) {
            slots.prefill_tokens -= tokens;
            slots.held_tokens -= held;
            if tokens > 0 {
                slots.prefill_since = now;
            }
        }
        true
    }

    /// The last `tokens` of the request's prefill wait for its media (it was sent ahead of
    /// them): they leave its worker's queue until [`Self::release_prefill`] (counted apart,
    /// as [`WorkerLoad::held_prefill_tokens`]), since the engine computes them behind the
    /// requests that arrive meanwhile. Returns whether the request is here.
    pub fn hold_prefill(&mut self, id: RequestId, tokens: u64) -> bool {
        let Some(request) = self.requests.get_mut(&id) else {
            return false;
        };
        let more = tokens.min(request.prefill_tokens - request.held_tokens);
        request.held_tokens += more;
        if let Some(slots) = self.workers.get_mut(&request.worker) {
            slots.prefill_tokens -= more;
            slots.held_tokens += more;
        }
        true
    }

    /// The request's media are ready at `now`: its held prefill joins the back of its
    /// worker's queue.
    pub fn release_prefill(&mut self, id: RequestId, now: Duration) -> bool {
        let Some(request) = self.requests.get_mut(&id) else {
            return false;
        };
        let tokens = std::mem::take(&mut request.held_tokens);
        if let Some(slots) = self.workers.get_mut(&request.worker)
            && tokens > 0
        {
            if slots.prefill_tokens == 0 {
                slots.prefill_since = now;
            }
            slots.prefill_tokens += tokens;
            slots.held_tokens -= tokens;
        }
        true
    }

    /// The request ended (finished, failed or cancelled). Returns its worker.
    pub fn free(&mut self, id: RequestId) -> Option<WorkerKey> {
        let request = self.requests.remove(&id)?;
        if let Some(slots) = self.workers.get_mut(&request.worker) {
            slots.chains.remove(&request.blocks);
            slots.prefill_tokens -= request.prefill_tokens - request.held_tokens;
            slots.held_tokens -= request.held_tokens;
            slots.requests -= 1;
        }
        Some(request.worker)
    }

    /// Frees requests added at least `request_ttl` ago; returns their ids.
    pub fn expire(&mut self, now: Duration) -> Vec<RequestId> {
        let mut expired = Vec::new();
        while let Some(&(added_at, id)) = self.arrivals.front() {
            if added_at + self.request_ttl > now {
                break;
            }
            self.arrivals.pop_front();
            if self
                .requests
                .get(&id)
                .is_some_and(|r| r.added_at == added_at)
            {
                self.free(id);
                expired.push(id);
            }
        }
        // Keep the queue from growing without bound when requests free normally.
        if self.arrivals.len() > 2 * self.requests.len() + 1024 {
            let live = &self.requests;
            self.arrivals
                .retain(|(at, id)| live.get(id).is_some_and(|r| r.added_at == *at));
        }
        expired
    }

    pub fn load(&self, worker: WorkerKey) -> WorkerLoad {
        self.workers
            .get(&worker)
            .map_or_else(WorkerLoad::default, |slots| WorkerLoad {
                active_blocks: slots.chains.distinct(),
                prefill_tokens: slots.prefill_tokens,
                requests: slots.requests,
                prefill_since: if slots.prefill_tokens > 0 {
                    slots.prefill_since
                } else {
                    Duration::ZERO
                },
                held_prefill_tokens: slots.held_tokens,
            })
    }

    /// How many of `blocks` (a chain from the first block) `worker` does not hold actively.
    pub fn new_blocks(&self, worker: WorkerKey, blocks: &[SequenceHash]) -> u64 {
        let Some(slots) = self.workers.get(&worker) else {
            return blocks.len() as u64;
        };
        (blocks.len() - slots.chains.held_prefix(blocks)) as u64
    }

    /// Reference count of a block on a worker (0 if not active). Scans the worker's
    /// chains: for inspection and tests.
    pub fn refcount(&self, worker: WorkerKey, block: SequenceHash) -> u32 {
        self.workers
            .get(&worker)
            .map_or(0, |s| s.chains.refcount(block))
    }

    /// Every request tracked.
    pub fn request_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.requests.keys().copied()
    }

    pub fn active_requests(&self) -> usize {
        self.requests.len()
    }

    /// The worker a request is active on.
    pub fn worker_of(&self, id: RequestId) -> Option<WorkerKey> {
        self.requests.get(&id).map(|r| r.worker)
    }
}
