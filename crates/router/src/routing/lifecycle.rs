//! What a routed request does to its worker's load until it ends, and the fleet-wide
//! budget of moves between workers.

use std::time::Duration;

use switchyard_core::{RequestId, WorkerId, WorkerKey};

use super::RoutingCore;
use crate::active::WorkerLoad;

impl RoutingCore {
    /// The remote prefill of `id` is over (its first token came back, or it failed): the
    /// prefill worker no longer counts it. Returns the worker it was on.
    pub fn prefill_finished(&mut self, id: RequestId) -> Option<WorkerKey> {
        let worker = self.router.free(id.prefill_stage())?;
        self.remove_if_drained(worker.worker_id);
        Some(worker)
    }

    /// The request went to its worker ahead of its media, whose engine computes the prompt
    /// from its first media position (`prompt_tokens - media_from` tokens) only once they
    /// are ready, behind the requests that arrive meanwhile: that part leaves the worker's
    /// queue until [`Self::media_ready`], so requests routed meanwhile do not count it.
    pub fn media_pending(&mut self, id: RequestId, prompt_tokens: u64, media_from: u64) -> bool {
        self.router
            .hold_prefill(id, prompt_tokens.saturating_sub(media_from))
    }

    /// The request's media are ready at `now`: the rest of its prompt joins the back of its
    /// worker's queue.
    pub fn media_ready(&mut self, id: RequestId, now: Duration) -> bool {
        self.tick(now);
        self.router.release_prefill(id, now)
    }

    /// The request's first token arrived at `now`: its prompt is computed.
    pub fn prefill_done(&mut self, id: RequestId, now: Duration) -> bool {
        self.tick(now);
        self.router.mark_prefill_completed(id, now)
    }

    /// The request ended, however it ended. Returns the worker it was on. A departed
    /// worker whose last request this was is removed.
    pub fn finish(&mut self, id: RequestId) -> Option<WorkerKey> {
        self.admission.withdraw(id, self.now);
        let worker = self.router.free(id)?;
        self.remove_if_drained(worker.worker_id);
        Some(worker)
    }

    /// Frees requests active longer than the TTL (their handlers vanished).
    pub fn expire(&mut self, now: Duration) -> Vec<RequestId> {
        let expired = self.router.expire(now);
        let departed: Vec<WorkerId> = self
            .registry
            .iter()
            .filter(|e| e.departed)
            .map(|e| e.spec.id)
            .collect();
        for id in departed {
            self.remove_if_drained(id);
        }
        expired
    }

    pub fn load(&self, key: WorkerKey) -> WorkerLoad {
        self.router.load(key)
    }

    /// Every registered rank's load, by key.
    pub fn loads(&self) -> Vec<(WorkerKey, WorkerLoad)> {
        self.router
            .workers()
            .iter()
            .map(|&k| (k, self.router.load(k)))
            .collect()
    }

    pub fn active_requests(&self) -> usize {
        self.router.active().active_requests()
    }

    pub fn active_request_ids(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.router.active().request_ids()
    }
}

impl RoutingCore {
    /// A request started: the fleet-wide budget of moves grows (see
    /// [`crate::flow::MigrationBudget::credit`]).
    pub fn credit_migration(&mut self) {
        let in_flight = self.active_requests();
        self.migrations.credit(&self.config.migration, in_flight);
    }

    /// Takes one move from the fleet-wide budget, if one is left.
    pub fn spend_migration(&mut self) -> bool {
        self.migrations.spend()
    }

    /// Moves left in the fleet-wide budget.
    pub fn migrations_left(&self) -> f64 {
        self.migrations.left()
    }
}
