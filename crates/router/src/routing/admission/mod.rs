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
//!
//! On top of the queue-length rules, a request that would queue is refused at once (429,
//! with its predicted wait as `Retry-After`) when its predicted wait exceeds `wait_target`
//! (twice that for premium, and never past `queue_timeout`; only `queue_share` of that is
//! queued, so that what is queued still starts in time when the rate dips): the requests
//! waiting ahead of
//! it at its tier or above, over the rate at which the queue has been releasing requests
//! lately (the fleet's measured service rate under saturation). What is admitted is then
//! served in time, and what would not be is told so at once instead of after waiting.
//! Requests wait inside the engines too (an engine takes many more requests than it
//! computes at once): with a wait target, a worker whose queued prefill alone would hold a
//! new request past `busy_prefill_share` of the target counts as busy, so the queue forms
//! here, where it is predicted, rather than in the engines.

mod in_core;

use std::collections::VecDeque;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::{Priority, RequestId};

use crate::settings::InvalidConfig;

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
    /// Refuse a request that would queue longer than this (premium: twice this), by the
    /// queue ahead of it and the measured release rate; none: only the queue length counts.
    /// `"off"` in a configuration file turns it off.
    #[serde(with = "crate::settings::duration_or_off")]
    pub wait_target: Option<Duration>,
    /// With a wait target, a worker is also busy once the prefill queued on it (by its
    /// timing model) would hold a new request's first token longer than this share of the
    /// target: the wait inside the engines counts, not only the queue here.
    pub busy_prefill_share: f64,
    /// With a wait target, a request is queued only while its predicted wait is within
    /// this share of its limit: the prediction errs (the release rate swings), and a
    /// request queued near the limit is the one refused after waiting when it does.
    pub queue_share: f64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            busy_kv_threshold: SERVER_BUSY_KV_THRESHOLD,
            max_queue: 1024,
            queue_timeout: Duration::from_secs(30),
            retry_after: Duration::from_secs(1),
            wait_target: Some(DEFAULT_WAIT_TARGET),
            busy_prefill_share: 0.5,
            queue_share: 0.8,
        }
    }
}

impl AdmissionConfig {
    /// Admission that shapes nothing until the fleet is full: requests go to the engines
    /// until their caches are nearly full (95 %), with no wait target, so a queue forms
    /// here only when every worker is full (the way engines' own benchmarks replay a
    /// trace). In a configuration file: `busy_kv_threshold = 0.95`, `wait_target = "off"`.
    pub fn queue_only() -> Self {
        AdmissionConfig {
            busy_kv_threshold: 0.95,
            wait_target: None,
            ..AdmissionConfig::default()
        }
    }

    /// Checks the ranges serde cannot.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if !(self.busy_kv_threshold > 0.0 && self.busy_kv_threshold <= 1.0) {
            return Err(InvalidConfig::new(
                "admission.busy_kv_threshold",
                format!("must be in (0, 1], got {}", self.busy_kv_threshold),
            ));
        }
        if !(self.busy_prefill_share.is_finite() && self.busy_prefill_share > 0.0) {
            return Err(InvalidConfig::new(
                "admission.busy_prefill_share",
                format!("must be a number above 0, got {}", self.busy_prefill_share),
            ));
        }
        if !(self.queue_share > 0.0 && self.queue_share <= 1.0) {
            return Err(InvalidConfig::new(
                "admission.queue_share",
                format!("must be in (0, 1], got {}", self.queue_share),
            ));
        }
        if self.max_queue == 0 {
            return Err(InvalidConfig::new(
                "admission.max_queue",
                "must be at least 1",
            ));
        }
        if self.queue_timeout.is_zero() {
            return Err(InvalidConfig::new(
                "admission.queue_timeout",
                "must be longer than zero",
            ));
        }
        if self.wait_target.is_some_and(|t| t.is_zero()) {
            return Err(InvalidConfig::new(
                "admission.wait_target",
                "must be longer than zero, or \"off\"",
            ));
        }
        Ok(())
    }
}

/// The servers' default `wait_target`.
pub const DEFAULT_WAIT_TARGET: Duration = Duration::from_secs(5);

/// The servers' default `busy_kv_threshold`. The blocks counted are those of the in-flight
/// requests' prompts and outputs so far; their outputs grow into the rest, so a fleet
/// admitted up to 95 % preempts (and computes prompts again) under overload: replayed at
/// 1–3× past capacity in the simulator, 0.8 cut preemptions from hundreds to tens and
/// served more requests (docs/benchmarks.md, "Admission by predicted wait"). The routing
/// core's own default stays 0.95, as the simulator's replays have always run.
pub const SERVER_BUSY_KV_THRESHOLD: f64 = 0.8;

/// What happens to a request offered for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It may be routed now.
    Admitted,
    /// It waits; [`AdmissionQueue::next`] releases it.
    Queued,
    Rejected(Rejection),
}

/// What the fleet can do for a request offered for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fleet {
    /// No worker can take requests at all.
    Empty,
    /// Workers are registered but none is in rotation now (each may come back, or a
    /// replacement join): requests queue, and none is refused for a predicted wait (the
    /// rate the queue released at before tells nothing about when it moves again).
    Down,
    /// Every worker in rotation is busy.
    Busy,
    /// Some worker has room.
    Free,
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
    /// Its predicted wait in the queue is beyond the target.
    WaitTooLong,
}

impl Rejection {
    /// The HTTP status it is answered with: 429 asks the client to slow down, 503 says the
    /// service cannot take it.
    pub fn status(self) -> u16 {
        match self {
            Rejection::Shed | Rejection::QueueFilling | Rejection::WaitTooLong => 429,
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
            Rejection::WaitTooLong => {
                "All workers are busy and this request would wait too long to be served in time. Retry after the suggested delay."
            }
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
            Rejection::WaitTooLong => "wait_too_long",
        }
    }
}

/// The queue of requests waiting for capacity.
#[derive(Debug, Default)]
pub struct AdmissionQueue {
    config: AdmissionConfig,
    /// Waiting requests per tier, lowest tier first, oldest first, with when they queued.
    tiers: [VecDeque<(RequestId, Duration)>; 3],
    /// Released from the queue and not yet routed: the next waits for it.
    pending: Option<RequestId>,
    /// When the releases of the last [`RATE_HORIZON`] happened: the measured release rate.
    releases: VecDeque<Duration>,
    /// Since when requests have been waiting without a break (none while nothing waits).
    waiting_since: Option<Duration>,
    /// Earlier spans during which requests waited, oldest first: the rate counts the
    /// releases over the time there was something to release, not over the quiet time
    /// between saturated moments (which would read a fleet that saturates now and then as
    /// slow, and refuse requests it serves in a blink).
    waited: VecDeque<(Duration, Duration)>,
}

/// The release rate counts the releases of this long a window (bursts, as when several
/// requests finish at once, average out over it).
const RATE_HORIZON: Duration = Duration::from_secs(30);
/// Fewer releases in the window than this measure nothing.
const RATE_MIN_SAMPLES: usize = 4;
/// Release times kept at most (a rate above this many per horizon reads as this).
const RATE_MAX_SAMPLES: usize = 4096;

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

    /// Requests released per second while requests waited, over the last
    /// [`RATE_HORIZON`] up to `now`: a queue that stopped moving reads as slow; none before
    /// enough releases.
    pub fn release_rate(&self, now: Duration) -> Option<f64> {
        let count = self
            .releases
            .iter()
            .filter(|&&t| now.saturating_sub(t) <= RATE_HORIZON)
            .count();
        if count < RATE_MIN_SAMPLES {
            return None;
        }
        let span = self.waiting_time(now).as_secs_f64().max(1e-3);
        Some(count as f64 / span)
    }

    /// How long requests were waiting within the last [`RATE_HORIZON`] up to `now`.
    fn waiting_time(&self, now: Duration) -> Duration {
        let from = now.saturating_sub(RATE_HORIZON);
        let closed: Duration = self
            .waited
            .iter()
            .map(|&(start, end)| end.saturating_sub(start.max(from)))
            .sum();
        let open = self
            .waiting_since
            .map_or(Duration::ZERO, |start| now.saturating_sub(start.max(from)));
        closed + open
    }

    /// Opens or closes the current waiting span after the queue changed at `now`.
    fn track_waiting(&mut self, now: Duration) {
        match (self.waiting_since, self.is_empty()) {
            (None, false) => self.waiting_since = Some(now),
            (Some(start), true) => {
                self.waiting_since = None;
                self.waited.push_back((start, now));
                while self
                    .waited
                    .front()
                    .is_some_and(|&(_, end)| now.saturating_sub(end) > RATE_HORIZON)
                    || self.waited.len() > RATE_MAX_SAMPLES
                {
                    self.waited.pop_front();
                }
            }
            _ => {}
        }
    }

    /// How long a request of `priority` offered now would wait: those waiting at its tier
    /// and above, plus itself, at the measured release rate.
    pub fn predicted_wait(&self, priority: Priority, now: Duration) -> Option<Duration> {
        let rate = self.release_rate(now)?;
        let ahead: usize = self.tiers[priority.rank()..]
            .iter()
            .map(VecDeque::len)
            .sum();
        let pending = usize::from(self.pending.is_some());
        Some(Duration::from_secs_f64((ahead + pending + 1) as f64 / rate))
    }

    /// Takes out the waiting requests that can no longer start within their tier's wait
    /// limit (counted from when they queued), by their place in the release order and the
    /// measured rate: refuse them now (429) rather than let them wait out the timeout. The
    /// queue forms before any rate is measured (a burst on an idle fleet), so this is what
    /// keeps the first requests of an overload from waiting far past the target.
    /// Each comes with its predicted wait from now (a `Retry-After`).
    pub fn overdue(&mut self, now: Duration) -> Vec<(RequestId, Duration)> {
        let Some(rate) = self.release_rate(now) else {
            return Vec::new();
        };
        let mut ahead = usize::from(self.pending.is_some());
        let mut out = Vec::new();
        for rank in (0..self.tiers.len()).rev() {
            let Some(limit) = self.wait_limit(Priority::ALL[rank]) else {
                ahead += self.tiers[rank].len();
                continue;
            };
            let mut kept = VecDeque::with_capacity(self.tiers[rank].len());
            for (id, queued) in self.tiers[rank].drain(..) {
                let start = Duration::from_secs_f64((ahead + 1) as f64 / rate);
                if now.saturating_sub(queued) + start > limit {
                    out.push((id, start));
                } else {
                    kept.push_back((id, queued));
                    ahead += 1;
                }
            }
            self.tiers[rank] = kept;
        }
        self.track_waiting(now);
        out
    }

    /// The longest predicted wait a request of `priority` is queued for.
    fn wait_limit(&self, priority: Priority) -> Option<Duration> {
        let target = self.config.wait_target?;
        let limit = if priority == Priority::Premium {
            target * 2
        } else {
            target
        };
        Some(limit.min(self.config.queue_timeout))
    }

    /// Decides on a new request, given what the fleet can do now.
    pub fn offer(
        &mut self,
        id: RequestId,
        priority: Priority,
        fleet: Fleet,
        now: Duration,
    ) -> Admission {
        if fleet == Fleet::Empty {
            return Admission::Rejected(Rejection::NoWorkers);
        }
        let tier = priority.rank();
        let waiting_at_or_above: usize = self.tiers[tier..].iter().map(VecDeque::len).sum();
        if waiting_at_or_above == 0 && fleet == Fleet::Free {
            return Admission::Admitted;
        }
        let total = self.len();
        let rejection = match priority {
            Priority::BestEffort => Some(Rejection::Shed),
            Priority::Standard if total >= self.config.max_queue / 2 => {
                Some(Rejection::QueueFilling)
            }
            Priority::Premium if total >= self.config.max_queue => Some(Rejection::QueueFull),
            _ if fleet == Fleet::Down => None,
            _ => match (
                self.predicted_wait(priority, now),
                self.wait_limit(priority),
            ) {
                (Some(wait), Some(limit)) if wait > limit.mul_f64(self.config.queue_share) => {
                    Some(Rejection::WaitTooLong)
                }
                _ => None,
            },
        };
        match rejection {
            Some(rejection) => Admission::Rejected(rejection),
            None => {
                self.tiers[tier].push_back((id, now));
                self.track_waiting(now);
                Admission::Queued
            }
        }
    }

    /// Releases the next waiting request, highest tier first, if capacity allows and no
    /// request released earlier is still on its way to being routed.
    pub fn next(&mut self, busy: bool, now: Duration) -> Option<RequestId> {
        if self.pending.is_some() || busy {
            return None;
        }
        let (id, _) = self.tiers.iter_mut().rev().find_map(VecDeque::pop_front)?;
        self.pending = Some(id);
        self.track_waiting(now);
        while self
            .releases
            .front()
            .is_some_and(|&t| now.saturating_sub(t) > RATE_HORIZON)
            || self.releases.len() >= RATE_MAX_SAMPLES
        {
            self.releases.pop_front();
        }
        self.releases.push_back(now);
        Some(id)
    }

    /// The request was routed (or failed to be): the next may be released.
    pub fn settled(&mut self, id: RequestId) {
        if self.pending == Some(id) {
            self.pending = None;
        }
    }

    /// The request gave up waiting at `now` (timed out, or its client left). Returns
    /// whether it was still waiting or released but not routed.
    pub fn withdraw(&mut self, id: RequestId, now: Duration) -> bool {
        if self.pending == Some(id) {
            self.pending = None;
            return true;
        }
        let found = self.tiers.iter_mut().any(|tier| {
            tier.iter()
                .position(|&(r, _)| r == id)
                .and_then(|i| tier.remove(i))
                .is_some()
        });
        self.track_waiting(now);
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Duration = Duration::ZERO;

    fn queue(max_queue: usize) -> AdmissionQueue {
        AdmissionQueue::new(AdmissionConfig {
            max_queue,
            wait_target: None,
            ..AdmissionConfig::default()
        })
    }

    #[test]
    fn idle_fleets_admit_and_busy_ones_shed_lowest_tiers_first() {
        let mut q = queue(4);
        assert_eq!(
            q.offer(RequestId(1), Priority::BestEffort, Fleet::Free, T0),
            Admission::Admitted
        );
        assert_eq!(
            q.offer(RequestId(2), Priority::Premium, Fleet::Empty, T0),
            Admission::Rejected(Rejection::NoWorkers)
        );
        assert_eq!(
            q.offer(RequestId(3), Priority::BestEffort, Fleet::Busy, T0),
            Admission::Rejected(Rejection::Shed)
        );
        assert_eq!(
            q.offer(RequestId(4), Priority::Standard, Fleet::Busy, T0),
            Admission::Queued
        );
        assert_eq!(
            q.offer(RequestId(5), Priority::Standard, Fleet::Busy, T0),
            Admission::Queued
        );
        // Half full: standard is refused, premium still queues until full.
        assert_eq!(
            q.offer(RequestId(6), Priority::Standard, Fleet::Busy, T0),
            Admission::Rejected(Rejection::QueueFilling)
        );
        assert_eq!(
            q.offer(RequestId(7), Priority::Premium, Fleet::Busy, T0),
            Admission::Queued
        );
        assert_eq!(
            q.offer(RequestId(8), Priority::Premium, Fleet::Busy, T0),
            Admission::Queued
        );
        assert_eq!(
            q.offer(RequestId(9), Priority::Premium, Fleet::Busy, T0),
            Admission::Rejected(Rejection::QueueFull)
        );
        assert_eq!(q.by_tier(), [0, 2, 2]);
        assert_eq!(Rejection::QueueFull.status(), 503);
        assert_eq!(Rejection::Shed.status(), 429);
    }

    #[test]
    fn no_overtaking_and_release_one_at_a_time_highest_tier_first() {
        let mut q = queue(16);
        q.offer(RequestId(1), Priority::Standard, Fleet::Busy, T0);
        q.offer(RequestId(2), Priority::Premium, Fleet::Busy, T0);
        // Capacity is back, but a standard request waits: another standard one queues
        // behind it, while a premium one would have to wait behind the premium one.
        assert_eq!(
            q.offer(RequestId(3), Priority::Standard, Fleet::Free, T0),
            Admission::Queued
        );
        assert_eq!(q.next(true, T0), None, "still busy");
        assert_eq!(q.next(false, T0), Some(RequestId(2)));
        assert_eq!(
            q.next(false, T0),
            None,
            "the released one has not been routed yet"
        );
        q.settled(RequestId(2));
        assert_eq!(q.next(false, T0), Some(RequestId(1)));
        assert!(q.withdraw(RequestId(1), T0), "released but gave up");
        assert!(q.withdraw(RequestId(3), T0));
        assert!(!q.withdraw(RequestId(3), T0));
        assert_eq!(q.next(false, T0), None);
        assert!(q.is_empty());
    }

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn a_request_predicted_to_wait_past_the_target_is_refused_at_once() {
        let mut q = AdmissionQueue::new(AdmissionConfig {
            max_queue: 1000,
            wait_target: Some(Duration::from_secs(1)),
            ..AdmissionConfig::default()
        });
        // No measured rate yet: only the queue length counts.
        for id in 0..30 {
            assert_eq!(
                q.offer(RequestId(id), Priority::Standard, Fleet::Busy, at(0)),
                Admission::Queued
            );
        }
        assert_eq!(q.predicted_wait(Priority::Standard, at(0)), None);
        // The queue releases one request every 100 ms: 10 per second.
        for i in 0..10u64 {
            let id = q.next(false, at(100 * i)).unwrap();
            q.settled(id);
        }
        let rate = q.release_rate(at(1000)).unwrap();
        assert!((rate - 10.0).abs() < 0.01, "{rate}");
        // 20 standard requests ahead: 2.1 s predicted, past the 1 s target.
        assert_eq!(
            q.offer(RequestId(100), Priority::Standard, Fleet::Busy, at(1000)),
            Admission::Rejected(Rejection::WaitTooLong)
        );
        let wait = q.predicted_wait(Priority::Standard, at(1000)).unwrap();
        assert!((wait.as_secs_f64() - 2.1).abs() < 0.01, "{wait:?}");
        // Premium sees only the premium queue ahead of it (empty) and has twice the target.
        assert_eq!(
            q.offer(RequestId(101), Priority::Premium, Fleet::Busy, at(1000)),
            Admission::Queued
        );
        // Once the standard queue is short enough, standard requests queue again.
        while q.by_tier()[1] > 5 {
            let id = q.next(false, at(1000)).unwrap();
            q.settled(id);
        }
        assert_eq!(
            q.offer(RequestId(102), Priority::Standard, Fleet::Busy, at(1000)),
            Admission::Queued
        );
        // A queue that stopped moving reads as slower and slower.
        let later = q.release_rate(at(20_000)).unwrap();
        assert!(later < 2.0, "{later}");
        // Releases older than the horizon are forgotten.
        assert_eq!(q.release_rate(at(100_000)), None);
        assert_eq!(Rejection::WaitTooLong.status(), 429);
    }

    #[test]
    fn only_a_share_of_the_target_is_queued() {
        let config = AdmissionConfig {
            max_queue: 1000,
            wait_target: Some(Duration::from_secs(1)),
            ..AdmissionConfig::default()
        };
        assert_eq!(config.queue_share, 0.8);
        let mut q = AdmissionQueue::new(config);
        for id in 0..10 {
            q.offer(RequestId(id), Priority::Standard, Fleet::Busy, at(0));
        }
        for i in 0..10u64 {
            let id = q.next(false, at(100 * i)).unwrap();
            q.settled(id);
        }
        // Ten released in the 0.9 s requests waited, 11.1 a second: the eighth in line is
        // predicted at 0.72 s and queued; the ninth at 0.81 s, within the target but not
        // its share, is refused.
        let offer = |q: &mut AdmissionQueue, id| {
            q.offer(RequestId(id), Priority::Standard, Fleet::Busy, at(1000))
        };
        for id in 10..18 {
            assert_eq!(offer(&mut q, id), Admission::Queued, "request {id}");
        }
        assert_eq!(
            offer(&mut q, 18),
            Admission::Rejected(Rejection::WaitTooLong)
        );
        let mut whole = AdmissionQueue::new(AdmissionConfig {
            queue_share: 1.0,
            ..config
        });
        for id in 0..10 {
            whole.offer(RequestId(id), Priority::Standard, Fleet::Busy, at(0));
        }
        for i in 0..10u64 {
            let id = whole.next(false, at(100 * i)).unwrap();
            whole.settled(id);
        }
        // The whole target: the eleventh (0.99 s) is queued, the twelfth (1.08 s) is not.
        for id in 10..21 {
            assert_eq!(offer(&mut whole, id), Admission::Queued, "request {id}");
        }
        assert_eq!(
            offer(&mut whole, 21),
            Admission::Rejected(Rejection::WaitTooLong)
        );
        assert!(
            AdmissionConfig {
                queue_share: 0.0,
                ..config
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn the_rate_counts_only_the_time_requests_waited() {
        let mut q = AdmissionQueue::new(AdmissionConfig {
            max_queue: 1000,
            wait_target: Some(Duration::from_secs(1)),
            ..AdmissionConfig::default()
        });
        // Four short saturated moments 5 s apart: each time two requests wait 100 ms and
        // leave together. Counted over the whole 15 s that is a release every 2 s; counted
        // over the 400 ms anything waited, 20 per second.
        for burst in 0..4u64 {
            let start = burst * 5000;
            for id in 0..2 {
                let id = RequestId(burst * 2 + id);
                assert_eq!(
                    q.offer(id, Priority::Standard, Fleet::Busy, at(start)),
                    Admission::Queued
                );
            }
            for _ in 0..2 {
                let id = q.next(false, at(start + 100)).unwrap();
                q.settled(id);
            }
        }
        let rate = q.release_rate(at(16_000)).unwrap();
        assert!((rate - 20.0).abs() < 0.01, "{rate}");
        // So a queue of ten ahead is half a second away, within the target.
        for id in 100..110 {
            q.offer(RequestId(id), Priority::Standard, Fleet::Busy, at(16_000));
        }
        assert_eq!(
            q.offer(RequestId(110), Priority::Standard, Fleet::Busy, at(16_000)),
            Admission::Queued
        );
        // Spans that ended more than the horizon ago are forgotten with their releases.
        while let Some(id) = q.next(false, at(16_000)) {
            q.settled(id);
        }
        assert!(q.is_empty());
        assert_eq!(q.waiting_time(at(16_000 + 30_000 + 100)), Duration::ZERO);
    }

    #[test]
    fn a_fleet_that_is_down_queues_without_predicting_a_wait() {
        let mut q = AdmissionQueue::new(AdmissionConfig {
            max_queue: 1000,
            wait_target: Some(Duration::from_secs(1)),
            ..AdmissionConfig::default()
        });
        for id in 0..20 {
            q.offer(RequestId(id), Priority::Standard, Fleet::Busy, at(0));
        }
        for i in 0..4u64 {
            let id = q.next(false, at(100 * i)).unwrap();
            q.settled(id);
        }
        // 16 ahead at 10 per second: refused while the fleet is busy...
        assert_eq!(
            q.offer(RequestId(100), Priority::Standard, Fleet::Busy, at(400)),
            Admission::Rejected(Rejection::WaitTooLong)
        );
        // ...but while no worker is in rotation that rate says nothing: it queues.
        assert_eq!(
            q.offer(RequestId(101), Priority::Standard, Fleet::Down, at(400)),
            Admission::Queued
        );
        // Queue-length limits still hold.
        assert_eq!(
            q.offer(RequestId(102), Priority::BestEffort, Fleet::Down, at(400)),
            Admission::Rejected(Rejection::Shed)
        );
    }
}
