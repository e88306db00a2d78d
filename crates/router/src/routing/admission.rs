//! Admission: a bounded queue with priority tiers, as a state machine.
//!
//! While some worker has room, requests go straight through (unless requests of the same or
//! a higher tier are already waiting: no overtaking). When every worker is above its busy
//! threshold, the lowest tiers are shed first:
//!
//! - `best_effort`: refused with 429 at once;
//! - `standard`: queued while the queue is under half full, else 429;
//! - `premium`: queued while the queue has room, else 503.
//!
//! Queued requests leave the queue one at a time, highest tier first, whenever capacity
//! allows: the next one is released only once the previous one has been routed (or gave
//! up), so each sees the load of those before it. How long a request may wait is the
//! caller's business (it withdraws the request when its time is up): the servers and the
//! simulator both count the same `queue_timeout` from the moment a request is queued.

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::{Priority, RequestId};

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

/// What happens to a request offered for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It may be routed now.
    Admitted,
    /// It waits; [`AdmissionQueue::next`] releases it.
    Queued,
    Rejected(Rejection),
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// No worker can take requests at all.
    NoWorkers,
    /// Every worker is busy and best-effort requests are shed.
    Shed,
    /// Every worker is busy and the queue is too full for this tier.
    QueueFilling,
    /// Every worker is busy and the queue is full.
    QueueFull,
    /// It waited the whole queue timeout.
    TimedOut,
    /// The fleet lost most of its capacity: new requests are refused while it drains.
    Degraded,
}

impl Rejection {
    /// The HTTP status it is answered with: 429 asks the client to slow down, 503 says the
    /// service cannot take it.
    pub fn status(self) -> u16 {
        match self {
            Rejection::Shed | Rejection::QueueFilling => 429,
            Rejection::NoWorkers
            | Rejection::QueueFull
            | Rejection::TimedOut
            | Rejection::Degraded => 503,
        }
    }

    pub fn message(self) -> &'static str {
        match self {
            Rejection::NoWorkers => "No worker serves this model right now.",
            Rejection::Shed => "All workers are busy; best-effort requests are shed. Retry later.",
            Rejection::QueueFilling => {
                "All workers are busy and the queue is filling. Retry later."
            }
            Rejection::QueueFull => "All workers are busy and the queue is full. Retry later.",
            Rejection::TimedOut => "Timed out waiting for a free worker. Retry later.",
            Rejection::Degraded => {
                "Most of the fleet's capacity is lost; new requests are refused while it recovers. Retry later."
            }
        }
    }

    /// A short name, for metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Rejection::NoWorkers => "no_workers",
            Rejection::Shed => "shed",
            Rejection::QueueFilling => "queue_filling",
            Rejection::QueueFull => "queue_full",
            Rejection::TimedOut => "timed_out",
            Rejection::Degraded => "degraded",
        }
    }
}

/// The queue of requests waiting for capacity.
#[derive(Debug, Default)]
pub struct AdmissionQueue {
    config: AdmissionConfig,
    /// Waiting requests per tier, lowest tier first, oldest first.
    tiers: [VecDeque<RequestId>; 3],
    /// Released from the queue and not yet routed: the next waits for it.
    pending: Option<RequestId>,
}

impl AdmissionQueue {
    pub fn new(config: AdmissionConfig) -> Self {
        AdmissionQueue {
            config,
            ..AdmissionQueue::default()
        }
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.tiers.iter().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests waiting, per tier (lowest first).
    pub fn by_tier(&self) -> [usize; 3] {
        [
            self.tiers[0].len(),
            self.tiers[1].len(),
            self.tiers[2].len(),
        ]
    }

    /// Decides on a new request, given whether every worker is busy and whether any can
    /// take requests at all.
    pub fn offer(
        &mut self,
        id: RequestId,
        priority: Priority,
        busy: bool,
        any_worker: bool,
    ) -> Admission {
        if !any_worker {
            return Admission::Rejected(Rejection::NoWorkers);
        }
        let tier = priority.rank();
        let waiting_at_or_above: usize = self.tiers[tier..].iter().map(VecDeque::len).sum();
        if waiting_at_or_above == 0 && !busy {
            return Admission::Admitted;
        }
        let total = self.len();
        let rejection = match priority {
            Priority::BestEffort => Some(Rejection::Shed),
            Priority::Standard if total >= self.config.max_queue / 2 => {
                Some(Rejection::QueueFilling)
            }
            Priority::Premium if total >= self.config.max_queue => Some(Rejection::QueueFull),
            _ => None,
        };
        match rejection {
            Some(rejection) => Admission::Rejected(rejection),
            None => {
                self.tiers[tier].push_back(id);
                Admission::Queued
            }
        }
    }

    /// Releases the next waiting request, highest tier first, if capacity allows and no
    /// request released earlier is still on its way to being routed.
    pub fn next(&mut self, busy: bool) -> Option<RequestId> {
        if self.pending.is_some() || busy {
            return None;
        }
        let id = self.tiers.iter_mut().rev().find_map(VecDeque::pop_front)?;
        self.pending = Some(id);
        Some(id)
    }

    /// The request was routed (or failed to be): the next may be released.
    pub fn settled(&mut self, id: RequestId) {
        if self.pending == Some(id) {
            self.pending = None;
        }
    }

    /// The request gave up waiting (timed out, or its client left). Returns whether it was
    /// still waiting or released but not routed.
    pub fn withdraw(&mut self, id: RequestId) -> bool {
        if self.pending == Some(id) {
            self.pending = None;
            return true;
        }
        for tier in &mut self.tiers {
            if let Some(i) = tier.iter().position(|&r| r == id) {
                tier.remove(i);
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(max_queue: usize) -> AdmissionQueue {
        AdmissionQueue::new(AdmissionConfig {
            max_queue,
            ..AdmissionConfig::default()
        })
    }

    #[test]
    fn idle_fleets_admit_and_busy_ones_shed_lowest_tiers_first() {
        let mut q = queue(4);
        assert_eq!(
            q.offer(RequestId(1), Priority::BestEffort, false, true),
            Admission::Admitted
        );
        assert_eq!(
            q.offer(RequestId(2), Priority::Premium, false, false),
            Admission::Rejected(Rejection::NoWorkers)
        );
        assert_eq!(
            q.offer(RequestId(3), Priority::BestEffort, true, true),
            Admission::Rejected(Rejection::Shed)
        );
        assert_eq!(
            q.offer(RequestId(4), Priority::Standard, true, true),
            Admission::Queued
        );
        assert_eq!(
            q.offer(RequestId(5), Priority::Standard, true, true),
            Admission::Queued
        );
        // Half full: standard is refused, premium still queues until full.
        assert_eq!(
            q.offer(RequestId(6), Priority::Standard, true, true),
            Admission::Rejected(Rejection::QueueFilling)
        );
        assert_eq!(
            q.offer(RequestId(7), Priority::Premium, true, true),
            Admission::Queued
        );
        assert_eq!(
            q.offer(RequestId(8), Priority::Premium, true, true),
            Admission::Queued
        );
        assert_eq!(
            q.offer(RequestId(9), Priority::Premium, true, true),
            Admission::Rejected(Rejection::QueueFull)
        );
        assert_eq!(q.by_tier(), [0, 2, 2]);
        assert_eq!(Rejection::QueueFull.status(), 503);
        assert_eq!(Rejection::Shed.status(), 429);
    }

    #[test]
    fn no_overtaking_and_release_one_at_a_time_highest_tier_first() {
        let mut q = queue(16);
        q.offer(RequestId(1), Priority::Standard, true, true);
        q.offer(RequestId(2), Priority::Premium, true, true);
        // Capacity is back, but a standard request waits: another standard one queues
        // behind it, while a premium one would have to wait behind the premium one.
        assert_eq!(
            q.offer(RequestId(3), Priority::Standard, false, true),
            Admission::Queued
        );
        assert_eq!(q.next(true), None, "still busy");
        assert_eq!(q.next(false), Some(RequestId(2)));
        assert_eq!(
            q.next(false),
            None,
            "the released one has not been routed yet"
        );
        q.settled(RequestId(2));
        assert_eq!(q.next(false), Some(RequestId(1)));
        assert!(q.withdraw(RequestId(1)), "released but gave up");
        assert!(q.withdraw(RequestId(3)));
        assert!(!q.withdraw(RequestId(3)));
        assert_eq!(q.next(false), None);
        assert!(q.is_empty());
    }
}
