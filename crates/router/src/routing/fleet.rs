//! Workers joining, leaving and draining, as discovery and the shells report them.

use std::time::Duration;

use switchyard_core::{RequestId, SequenceHash, WorkerId, WorkerKey};

use super::health::HealthState;
use super::registry::{CacheView, JoinRefused, WorkerSpec};
use super::{RoutingCore, WorkerChanges, degradation};
use crate::policy::RoutingOverrides;
use crate::router::{RouteDecision, RouteRequest};

impl RoutingCore {
    /// Registers a worker and its ranks.
    pub fn add_worker(&mut self, spec: WorkerSpec) -> Result<(), JoinRefused> {
        let keys: Vec<WorkerKey> = spec.keys().collect();
        let view = self.config.router.cache_view.view_for(&spec);
        let id = spec.id;
        let serving = spec.role.serves_generation();
        let timing = spec.timing.clone();
        self.registry
            .add(spec, self.config.router.cache_view, self.now)?;
        if serving {
            self.degradation.worker_added(id, self.now);
        }
        if view == CacheView::Approximate {
            self.approx_workers += 1;
        }
        self.router.set_block_size(self.block_size());
        for key in keys {
            self.router.add_worker(key);
            if let Some(timing) = &timing {
                self.router.set_timing(key, timing.clone());
            }
        }
        Ok(())
    }

    /// The worker left discovery. With requests in flight it drains (no new requests, its
    /// load still counted) until they end; otherwise it is removed at once. Returns whether
    /// it is gone for good.
    pub fn worker_left(&mut self, id: WorkerId) -> bool {
        let Some(entry) = self.registry.get_mut(id) else {
            return true;
        };
        let busy = entry
            .spec
            .keys()
            .any(|key| self.router.load(key).requests > 0);
        if busy {
            entry.departed = true;
            // Its cache view is of no more use: nothing new goes there.
            if entry.view == CacheView::Approximate {
                for key in entry.spec.keys() {
                    self.approx.remove_worker(key);
                }
            }
            return false;
        }
        self.remove_worker(id);
        true
    }

    /// Unregisters a worker at once, dropping its requests from the load (they are lost, or
    /// moved elsewhere by the caller). Returns their ids.
    pub fn remove_worker(&mut self, id: WorkerId) -> Vec<RequestId> {
        let Some(entry) = self.registry.remove(id) else {
            return Vec::new();
        };
        if entry.spec.role.serves_generation() {
            self.degradation.worker_removed(
                id,
                degradation::capacity(&entry.spec),
                entry.health.state != HealthState::Healthy,
                entry.health.last_activity(),
                self.now,
            );
        }
        if entry.view == CacheView::Approximate {
            self.approx_workers -= 1;
        }
        let mut dropped = Vec::new();
        for key in entry.spec.keys() {
            dropped.extend(self.router.remove_worker(key));
            if entry.view == CacheView::Approximate {
                self.approx.remove_worker(key);
            }
        }
        dropped
    }

    /// Brings the registry in line with the workers discovery lists.
    pub fn sync_workers(&mut self, listed: impl IntoIterator<Item = WorkerSpec>) -> WorkerChanges {
        let listed: std::collections::BTreeMap<WorkerId, WorkerSpec> =
            listed.into_iter().map(|s| (s.id, s)).collect();
        let mut changes = WorkerChanges::default();
        let gone: Vec<WorkerId> = self
            .registry
            .iter()
            .filter(|e| {
                !e.departed
                    && listed
                        .get(&e.spec.id)
                        .is_none_or(|s| s.incarnation != e.spec.incarnation)
            })
            .map(|e| e.spec.id)
            .collect();
        for id in gone {
            let restarted = listed.contains_key(&id);
            if restarted {
                // A new incarnation: the old one's requests died with it.
                self.remove_worker(id);
            } else {
                self.worker_left(id);
            }
            changes.left.push(id);
        }
        for (id, spec) in listed {
            match self.registry.get(id) {
                Some(entry) if !entry.departed => continue,
                // It came back under the same incarnation while draining: serve it again.
                Some(entry) if entry.spec.incarnation == spec.incarnation => {
                    if let Some(entry) = self.registry.get_mut(id) {
                        entry.departed = false;
                    }
                    changes.joined.push(id);
                    continue;
                }
                Some(_) => {
                    self.remove_worker(id);
                }
                None => {}
            }
            match self.add_worker(spec) {
                Ok(()) => changes.joined.push(id),
                Err(refused) => changes.refused.push(refused),
            }
        }
        changes
    }

    /// Marks a worker draining (or not). Returns whether it is registered.
    pub fn set_draining(&mut self, id: WorkerId, draining: bool) -> bool {
        self.registry
            .get_mut(id)
            .map(|e| e.draining = draining)
            .is_some()
    }

    /// Whether KV events from `worker` belong in the caller's indexer: it is registered,
    /// still listed, and seen through its events.
    pub fn accepts_events(&self, worker: WorkerId) -> bool {
        self.registry
            .get(worker)
            .is_some_and(|e| e.view == CacheView::Events && !e.departed)
    }

    /// Prefill workers that may take requests.
    pub fn prefill_workers(&self) -> usize {
        self.registry
            .iter()
            .filter(|e| e.routable() && e.spec.role == switchyard_core::WorkerRole::Prefill)
            .count()
    }

    pub(super) fn remove_if_drained(&mut self, id: WorkerId) {
        let Some(entry) = self.registry.get(id) else {
            return;
        };
        if entry.departed
            && entry
                .spec
                .keys()
                .all(|key| self.router.load(key).requests == 0)
        {
            self.remove_worker(id);
        }
    }

    /// Records a request routed elsewhere (by another frontend) so its load counts here.
    /// Returns false when its worker is not registered here.
    pub fn record_external(
        &mut self,
        id: RequestId,
        worker: WorkerKey,
        seq_hashes: &[SequenceHash],
        prefill_tokens: u64,
        now: Duration,
    ) -> bool {
        let request = RouteRequest {
            id,
            isl_tokens: 0,
            seq_hashes,
            overrides: RoutingOverrides::default(),
        };
        let decision = RouteDecision {
            worker,
            policy: self.config.router.policy,
            overlap_blocks: 0,
            prefill_tokens,
        };
        self.router.record(&request, &decision, now).is_ok()
    }
}
