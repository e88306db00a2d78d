//! Admission control: a bounded queue with priority tiers.
//!
//! While some worker has room, requests go straight through (unless requests of the same or
//! a higher tier are already waiting: no overtaking). When every worker is above its busy
//! threshold, the lowest tiers are shed first:
//!
//! - `best_effort`: answered 429 with `Retry-After` at once;
//! - `standard`: queued while the queue is under half full, else 429;
//! - `premium`: queued while the queue has room, else 503.
//!
//! Queued requests wait for capacity (a request ending, a worker joining), premium first,
//! for at most the queue timeout, after which they get a 503 with `Retry-After`.

use std::pin::pin;
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::openai::ApiError;
use crate::openai::request::Priority;
use crate::routing::RoutingService;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdmissionConfig {
    /// A worker is busy when in-flight requests hold this share of its KV blocks (or it
    /// runs as many requests as it can).
    pub busy_kv_threshold: f64,
    /// Most requests waiting at once.
    pub max_queue: usize,
    /// Longest a request waits in the queue.
    #[serde(with = "humantime_serde")]
    pub queue_timeout: Duration,
    /// Suggested wait, sent as `Retry-After`.
    #[serde(with = "humantime_serde")]
    pub retry_after: Duration,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            busy_kv_threshold: 0.95,
            max_queue: 1024,
            queue_timeout: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Default)]
pub struct Admission {
    config: AdmissionConfig,
    /// Waiting requests per tier (best_effort, standard, premium).
    queued: Mutex<[usize; 3]>,
}

/// Counts a waiting request while it waits.
struct Waiting<'a> {
    admission: &'a Admission,
    tier: usize,
    wake: &'a tokio::sync::Notify,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let lower_waiting = {
            let mut queued = self.admission.queued.lock();
            queued[self.tier] -= 1;
            queued[..self.tier].iter().sum::<usize>() > 0
        };
        // Lower tiers may have been waiting only for this one to go first.
        if lower_waiting {
            self.wake.notify_waiters();
        }
    }
}

fn tier(p: Priority) -> usize {
    match p {
        Priority::BestEffort => 0,
        Priority::Standard => 1,
        Priority::Premium => 2,
    }
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Self {
        Admission {
            config,
            queued: Mutex::new([0; 3]),
        }
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.queued.lock().iter().sum()
    }

    /// Waits until `priority` may proceed, or refuses it.
    pub async fn admit(
        &self,
        priority: Priority,
        routing: &RoutingService,
    ) -> Result<(), ApiError> {
        let t = tier(priority);
        let busy = || routing.all_busy(self.config.busy_kv_threshold);
        let waiting_at_or_above =
            |queued: &[usize; 3], from: usize| queued[from..].iter().sum::<usize>();
        {
            let mut queued = self.queued.lock();
            if waiting_at_or_above(&queued, t) == 0 && !busy() {
                return Ok(());
            }
            let total: usize = queued.iter().sum();
            let retry = self.config.retry_after;
            match priority {
                Priority::BestEffort => {
                    return Err(ApiError::overloaded(
                        "All workers are busy; best-effort requests are shed. Retry later.",
                        retry,
                    ));
                }
                Priority::Standard if total >= self.config.max_queue / 2 => {
                    return Err(ApiError::overloaded(
                        "All workers are busy and the queue is filling. Retry later.",
                        retry,
                    ));
                }
                Priority::Premium if total >= self.config.max_queue => {
                    return Err(ApiError::unavailable(
                        "All workers are busy and the queue is full. Retry later.",
                        retry,
                    ));
                }
                _ => queued[t] += 1,
            }
        }
        let _waiting = Waiting {
            admission: self,
            tier: t,
            wake: routing.capacity_notify(),
        };
        let wait = async {
            loop {
                let mut changed = pin!(routing.capacity_notify().notified());
                changed.as_mut().enable();
                let higher_waiting = waiting_at_or_above(&self.queued.lock(), t + 1) > 0;
                if !higher_waiting && !busy() {
                    return;
                }
                changed.await;
            }
        };
        tokio::time::timeout(self.config.queue_timeout, wait)
            .await
            .map_err(|_| {
                ApiError::unavailable(
                    "Timed out waiting for a free worker. Retry later.",
                    self.config.retry_after,
                )
            })
    }
}
