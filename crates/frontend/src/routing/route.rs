//! Routing in the routing service: a request's worker chosen by the core (after hashing
//! its prompt and looking it up in the index, outside the core's lock), then its prefill,
//! media and end recorded, and shared with the other frontends.

use std::time::Duration;

use switchyard_core::protocol::Prompt;
use switchyard_core::{RequestId, WorkerId, blocks_for};
use switchyard_router::{LocalReason, RouteDecision, RouteError, RouteQuery, RoutingOverrides};
use switchyard_runtime::WorkerInstance;
use switchyard_runtime::discovery::Needs;

use super::RoutingService;

/// Where a request was sent.
#[derive(Debug, Clone)]
pub struct Routed {
    pub instance: WorkerInstance,
    pub decision: RouteDecision,
    /// The prefill worker computing the prompt first, when the request is disaggregated
    /// (tracked until [`RoutingService::prefill_finished`]).
    pub prefill: Option<(WorkerInstance, RouteDecision)>,
    /// Why a request for a decode worker was prefilled there, if it was.
    pub local: Option<LocalReason>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteFailure {
    #[error("no worker serves this model")]
    NoWorkers,
    #[error("{0}")]
    InvalidPrompt(String),
    #[error("{0}")]
    Internal(String),
}

impl RoutingService {
    /// Joint routing of a prompt with media (see `RoutingCore::joint_media_choice`): the
    /// worker predicted to give the first token soonest when it holds the media's KV
    /// already (so encoding it would be wasted: the request is to go there), given
    /// `encode` until the media could reach any other worker. None when that worker needs
    /// the media encoded, the prompt cannot be hashed or no worker serves.
    pub fn sooner_holder(&self, prompt: &Prompt, encode: Duration) -> Option<WorkerId> {
        let block_size = self.block_size();
        let blocks = blocks_for(prompt, block_size).ok()?;
        let overlaps = self.indexer.find_matches_blocks(&blocks);
        let now = self.now();
        let mut core = self.core.lock();
        if core.block_size() != block_size {
            return None;
        }
        core.sooner_holder(RequestId(0), &blocks, &prompt.media, &overlaps, encode, now)
    }

    /// The workers that cannot meet what a request `needs` (to leave out when routing it);
    /// none when there are workers and none of them can.
    pub fn unable(&self, needs: &Needs<'_>) -> Option<Vec<WorkerId>> {
        let instances = self.instances.read();
        let (able, unable): (Vec<_>, Vec<_>) = instances
            .values()
            .partition(|instance| instance.serves(needs));
        (!able.is_empty() || unable.is_empty())
            .then(|| unable.iter().map(|i| i.worker_id).collect())
    }

    /// Picks a worker for a prompt, other than those in `exclude` (workers that just failed
    /// it), and records the request as active on it.
    pub fn route(
        &self,
        id: RequestId,
        prompt: &Prompt,
        overrides: RoutingOverrides,
        exclude: &[WorkerId],
    ) -> Result<Routed, RouteFailure> {
        let result = self.route_inner(id, prompt, overrides, exclude);
        self.pump();
        result
    }

    fn route_inner(
        &self,
        id: RequestId,
        prompt: &Prompt,
        overrides: RoutingOverrides,
        exclude: &[WorkerId],
    ) -> Result<Routed, RouteFailure> {
        let mut block_size = self.block_size();
        loop {
            // Hashing and the index lookup run outside the core's lock.
            let blocks = blocks_for(prompt, block_size)
                .map_err(|e| RouteFailure::InvalidPrompt(e.to_string()))?;
            let overlaps = self.indexer.find_matches_blocks(&blocks);
            let now = self.now();
            let mut core = self.core.lock();
            if core.block_size() != block_size {
                // The fleet changed block size meanwhile: hash again.
                block_size = core.block_size();
                continue;
            }
            let query = RouteQuery {
                id,
                blocks: &blocks,
                overrides,
                exclude,
            };
            let (pair, local) = core
                .route_pair(&query, &overlaps, now)
                .map_err(|e| match e {
                    RouteError::NoWorkers => RouteFailure::NoWorkers,
                    RouteError::Active(e) => RouteFailure::Internal(e.to_string()),
                })?;
            let decision = pair.decode;
            // Under the core's lock: the other frontends see events in the order it took them.
            if let Some(replicas) = &self.replicas {
                replicas.routed(id, &decision, blocks.sequence_hashes());
                if let Some(prefill) = &pair.prefill {
                    replicas.routed(id.prefill_stage(), prefill, blocks.sequence_hashes());
                }
            }
            let instances = self.instances.read();
            let instance = instances.get(&decision.worker.worker_id).cloned();
            let prefill = pair
                .prefill
                .map(|p| (instances.get(&p.worker.worker_id).cloned(), p));
            drop(instances);
            return match (instance, prefill) {
                (Some(instance), None) => Ok(Routed {
                    instance,
                    decision,
                    prefill: None,
                    local,
                }),
                (Some(instance), Some((Some(prefill), p))) => Ok(Routed {
                    instance,
                    decision,
                    prefill: Some((prefill, p)),
                    local,
                }),
                _ => {
                    let decode = core.finish(id);
                    let prefill = core.prefill_finished(id);
                    if let Some(replicas) = &self.replicas {
                        if decode.is_some() {
                            replicas.finished(id);
                        }
                        if prefill.is_some() {
                            replicas.finished(id.prefill_stage());
                        }
                    }
                    Err(RouteFailure::NoWorkers)
                }
            };
        }
    }

    /// The request's first token arrived: its prompt is computed (less prefill queued on
    /// its worker may let a queued request go).
    /// The request went to its worker ahead of its media (see
    /// [`switchyard_router::RoutingCore::media_pending`]).
    pub fn media_pending(&self, id: RequestId, prompt_tokens: u64, media_from: u64) {
        self.core
            .lock()
            .media_pending(id, prompt_tokens, media_from);
    }

    /// The request's media are ready: the rest of its prompt joins its worker's queue.
    pub fn media_ready(&self, id: RequestId) {
        let now = self.now();
        self.core.lock().media_ready(id, now);
    }

    pub fn prefill_done(&self, id: RequestId) {
        let now = self.now();
        let queued = {
            let mut core = self.core.lock();
            if core.prefill_done(id, now)
                && let Some(replicas) = &self.replicas
            {
                replicas.prefill_done(id);
            }
            core.queued() > 0
        };
        if queued {
            self.pump();
        }
    }

    /// The request ended, however it ended.
    pub fn finish(&self, id: RequestId) {
        {
            let mut core = self.core.lock();
            if core.finish(id).is_some()
                && let Some(replicas) = &self.replicas
            {
                replicas.finished(id);
            }
            // A remote prefill still open (its request given up mid-prefill).
            if core.prefill_finished(id).is_some()
                && let Some(replicas) = &self.replicas
            {
                replicas.finished(id.prefill_stage());
            }
        }
        self.pump();
    }

    /// The request's remote prefill is over (its first token came back, or it failed):
    /// its prefill worker no longer counts it.
    pub fn prefill_finished(&self, id: RequestId) {
        {
            let mut core = self.core.lock();
            if core.prefill_finished(id).is_some()
                && let Some(replicas) = &self.replicas
            {
                replicas.finished(id.prefill_stage());
            }
        }
        self.pump();
    }

    /// A request started: the fleet-wide budget of moves grows.
    pub fn credit_migration(&self) {
        self.core.lock().credit_migration();
    }

    /// Takes one move from the fleet-wide budget, if one is left.
    pub fn spend_migration(&self) -> bool {
        self.core.lock().spend_migration()
    }

    /// Whether every worker is at or above its busy threshold.
    pub fn all_busy(&self) -> bool {
        self.core.lock().all_busy()
    }
}
