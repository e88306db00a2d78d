//! The routing core's side of admission: when the fleet is busy, and each request put
//! through the queue ([`super::AdmissionQueue`]) with the fleet's state.

use std::time::Duration;

use switchyard_core::{Priority, RequestId};

use super::{Admission, AdmissionQueue, Fleet};
use crate::routing::RoutingCore;
use crate::routing::degradation;
use crate::routing::registry::WorkerEntry;

impl RoutingCore {
    /// Whether every worker that may take requests is at or above its busy threshold: KV
    /// blocks of in-flight requests at the threshold share of its capacity, or as many
    /// requests as it runs at once, or (with a wait target) prefill queued for longer than
    /// its share of the target. Workers that announce none of these are never busy.
    pub fn all_busy(&self) -> bool {
        // Degraded fleets run smaller batches (see `degradation`).
        let scale = self.degradation.batch_scale();
        let admission = &self.config.admission;
        let threshold = admission.busy_kv_threshold * scale;
        let queue_limit = admission
            .wait_target
            .map(|target| target.mul_f64(admission.busy_prefill_share));
        self.registry.iter().filter(|e| e.serving()).all(|e| {
            e.spec.keys().all(|key| {
                let load = self.router.load(key);
                let kv = e
                    .spec
                    .capacity_blocks
                    .is_some_and(|c| load.active_blocks as f64 >= threshold * c as f64);
                let seqs = e
                    .spec
                    .max_num_seqs
                    .is_some_and(|m| f64::from(load.requests) >= (f64::from(m) * scale).ceil());
                // Last: the timing model's prediction is the dearest of the three.
                kv || seqs
                    || queue_limit
                        .is_some_and(|limit| self.router.queued_prefill_time(key, self.now) > limit)
            })
        })
    }

    /// Offers a new request for admission. With no worker registered it is refused at
    /// once; while every registered worker is out of rotation (unhealthy: its breaker may
    /// half-open, or a replacement join) it queues like a request meeting a busy fleet,
    /// without being refused for a predicted wait.
    pub fn admit(&mut self, id: RequestId, priority: Priority, now: Duration) -> Admission {
        self.tick(now);
        let any = self.registry.iter().any(WorkerEntry::may_serve);
        let level = if any { self.degradation_level(now) } else { 0 };
        if let Some(rejection) = degradation::refuse(
            level,
            priority,
            self.admission.len(),
            self.config.admission.max_queue,
        ) {
            return Admission::Rejected(rejection);
        }
        self.admission.offer(id, priority, self.fleet(), now)
    }

    /// What the fleet can do for a request now (see [`Fleet`]).
    pub(super) fn fleet(&self) -> Fleet {
        if self.any_serving() {
            if self.all_busy() {
                Fleet::Busy
            } else {
                Fleet::Free
            }
        } else if self.registry.iter().any(WorkerEntry::may_serve) {
            Fleet::Down
        } else {
            Fleet::Empty
        }
    }

    pub(super) fn any_serving(&self) -> bool {
        self.registry.iter().any(WorkerEntry::serving)
    }

    /// How long a request of `priority` offered now would wait in the admission queue
    /// (see [`AdmissionQueue::predicted_wait`]): the `Retry-After` of a
    /// [`Rejection::WaitTooLong`].
    pub fn predicted_wait(&self, priority: Priority, now: Duration) -> Option<Duration> {
        self.admission.predicted_wait(priority, now)
    }

    /// How long a request of `priority` may wait in the admission queue now (premium waits
    /// longer when the fleet is degraded: latency targets are relaxed rather than it being
    /// refused).
    pub fn queue_timeout(&self, priority: Priority) -> Duration {
        let base = self.config.admission.queue_timeout;
        if priority == Priority::Premium && self.degradation.current() >= 3 {
            base * 2
        } else {
            base
        }
    }

    /// The next queued request that may go now, if any (one at a time: call again once it
    /// has been routed).
    pub fn next_admitted(&mut self, now: Duration) -> Option<RequestId> {
        self.tick(now);
        if self.admission.is_empty() {
            return None;
        }
        let busy = self.all_busy();
        self.admission.next(busy, now)
    }

    /// Queued requests that can no longer start within the wait target: refuse them
    /// ([`Rejection::WaitTooLong`]); see [`AdmissionQueue::overdue`].
    /// None while no worker is in rotation: the queue moves again when one is back, at a
    /// rate nothing measured yet.
    pub fn overdue(&mut self, now: Duration) -> Vec<(RequestId, Duration)> {
        if !self.any_serving() {
            return Vec::new();
        }
        self.admission.overdue(now)
    }

    /// A queued request gives up (timed out, or its client left).
    pub fn withdraw(&mut self, id: RequestId, now: Duration) -> bool {
        self.tick(now);
        self.admission.withdraw(id, now)
    }

    /// Requests waiting for admission.
    pub fn queued(&self) -> usize {
        self.admission.len()
    }

    pub fn admission(&self) -> &AdmissionQueue {
        &self.admission
    }
}
