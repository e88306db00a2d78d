//! Graceful degradation under lost capacity.
//!
//! The capacity model compares what the healthy workers can take (suspicious ones at their
//! weight) with what the fleet had: the serving workers registered, plus those lost while
//! unhealthy (crashed, hung, corrupt) in the last `lost_memory` (a worker that leaves
//! cleanly, drained or scaled down, takes its capacity with it). Time to first token
//! against the SLO target adds to the level. The levels:
//!
//! - 0: normal;
//! - 1: smaller batches (workers count as busy at 80 % of their limits, so requests queue
//!   at the frontend rather than crowding engines);
//! - 2: best-effort requests are shed;
//! - 3: latency targets relaxed: best-effort shed, standard refused once a quarter of the
//!   queue is taken, premium waits twice as long in the queue;
//! - 4: new requests are refused (503) while what is in flight drains.
//!
//! Levels 3 and 4 wait for `escalation_hold` (level 2 meanwhile): failing over is a dip,
//! not a collapse.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::{Priority, WorkerId};

use super::admission::Rejection;
use super::registry::WorkerSpec;
use crate::InvalidConfig;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DegradationConfig {
    pub enabled: bool,
    /// The time-to-first-token target: above it the level rises by one, above twice it by
    /// two.
    #[serde(with = "humantime_serde")]
    pub ttft_target: Duration,
    /// Weight of a new time to first token in its moving average.
    pub ttft_alpha: f64,
    /// How long capacity lost to failures counts as missing.
    #[serde(with = "humantime_serde")]
    pub lost_memory: Duration,
    /// A worker that joined this long before a failing one left is taken as its
    /// replacement (a restarted worker often registers before its predecessor's lease
    /// runs out).
    #[serde(with = "humantime_serde")]
    pub replacement_window: Duration,
    /// Levels 3 and 4 (which refuse standard requests) take effect only once what calls
    /// for them has lasted this long: a failover's dip (a worker lost, its replacement not
    /// yet registered, survivors briefly suspicious) does not turn traffic away.
    #[serde(with = "humantime_serde")]
    pub escalation_hold: Duration,
}

impl Default for DegradationConfig {
    fn default() -> Self {
        DegradationConfig {
            enabled: true,
            ttft_target: Duration::from_secs(5),
            ttft_alpha: 0.05,
            lost_memory: Duration::from_secs(300),
            replacement_window: Duration::from_secs(30),
            escalation_hold: Duration::from_secs(2),
        }
    }
}

impl DegradationConfig {
    /// Checks the ranges serde cannot.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        if !(self.ttft_alpha > 0.0 && self.ttft_alpha <= 1.0) {
            return Err(InvalidConfig::new(
                "degradation.ttft_alpha",
                format!("must be in (0, 1], got {}", self.ttft_alpha),
            ));
        }
        if self.ttft_target.is_zero() {
            return Err(InvalidConfig::new(
                "degradation.ttft_target",
                "must be longer than zero",
            ));
        }
        Ok(())
    }
}

/// A worker's capacity in the model: one per data-parallel rank.
pub fn capacity(spec: &WorkerSpec) -> f64 {
    f64::from(spec.dp_size.max(1))
}

/// Level from the share of the fleet's capacity that is healthy.
fn level_of(fraction: f64) -> u8 {
    if fraction >= 0.9 {
        0
    } else if fraction >= 0.7 {
        1
    } else if fraction >= 0.5 {
        2
    } else if fraction >= 0.25 {
        3
    } else {
        4
    }
}

/// What admission refuses at `level` (beyond what a busy fleet refuses anyway).
pub fn refuse(level: u8, priority: Priority, queued: usize, max_queue: usize) -> Option<Rejection> {
    match (level, priority) {
        (0 | 1, _) => None,
        (2 | 3, Priority::BestEffort) => Some(Rejection::Shed),
        (3, Priority::Standard) if queued >= max_queue / 4 => Some(Rejection::QueueFilling),
        (2 | 3, _) => None,
        _ => Some(Rejection::Degraded),
    }
}

/// What a level was computed from, for operators: logged when the level changes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DegradationState {
    pub level: u8,
    /// Capacity of the healthy workers (suspicious ones at their weight).
    pub healthy: f64,
    /// Capacity of the serving workers registered.
    pub registered: f64,
    /// Capacity lost to failures in the last `lost_memory` and not replaced.
    pub lost: f64,
    /// Moving average of time to first token, in seconds.
    pub ttft_seconds: Option<f64>,
}

#[derive(Debug)]
pub struct Degradation {
    config: DegradationConfig,
    /// The last computation (its level is the level now), and whether its level differs
    /// from the one reported before.
    state: DegradationState,
    changed: bool,
    /// Since when the computed level has been 3 or more.
    severe_since: Option<Duration>,
    /// Capacity of workers removed while unhealthy, and since when.
    lost: BTreeMap<WorkerId, (f64, Duration)>,
    /// When workers joined that replaced no lost capacity, for a departure to claim.
    unclaimed_joins: std::collections::VecDeque<Duration>,
    ttft: Option<f64>,
}

impl Degradation {
    pub fn new(config: DegradationConfig) -> Self {
        Degradation {
            config,
            state: DegradationState {
                level: 0,
                healthy: 0.0,
                registered: 0.0,
                lost: 0.0,
                ttft_seconds: None,
            },
            changed: false,
            severe_since: None,
            lost: BTreeMap::new(),
            unclaimed_joins: std::collections::VecDeque::new(),
            ttft: None,
        }
    }

    /// A serving worker left the registry; if it was failing (unhealthy or suspicious) its
    /// capacity counts as lost, unless a worker joined for it: within the replacement
    /// window, and after `last_good`, the last time the failing worker was seen working
    /// (so the fleet's own start is not taken for replacements).
    pub fn worker_removed(
        &mut self,
        worker: WorkerId,
        capacity: f64,
        failing: bool,
        last_good: Duration,
        now: Duration,
    ) {
        if !failing {
            return;
        }
        self.forget_old_joins(now);
        match self.unclaimed_joins.iter().position(|&at| at >= last_good) {
            Some(i) => {
                self.unclaimed_joins.remove(i);
            }
            None => {
                self.lost.insert(worker, (capacity, now));
            }
        }
    }

    /// A worker joined. It replaces lost capacity: its own if it comes back under its id,
    /// else the longest lost; with none lost, a failing worker leaving within the
    /// replacement window may claim it.
    pub fn worker_added(&mut self, worker: WorkerId, now: Duration) {
        if self.lost.remove(&worker).is_some() {
            return;
        }
        let oldest = self
            .lost
            .iter()
            .min_by_key(|(_, (_, since))| *since)
            .map(|(id, _)| *id);
        match oldest {
            Some(oldest) => {
                self.lost.remove(&oldest);
            }
            None => {
                self.forget_old_joins(now);
                self.unclaimed_joins.push_back(now);
            }
        }
    }

    fn forget_old_joins(&mut self, now: Duration) {
        let window = self.config.replacement_window;
        while self
            .unclaimed_joins
            .front()
            .is_some_and(|&at| at + window < now)
        {
            self.unclaimed_joins.pop_front();
        }
    }

    pub fn observe_ttft(&mut self, ttft: Duration) {
        let seconds = ttft.as_secs_f64();
        self.ttft = Some(match self.ttft {
            None => seconds,
            Some(avg) => avg + self.config.ttft_alpha * (seconds - avg),
        });
    }

    /// The level now, given the healthy and the registered capacity.
    pub fn level(&mut self, healthy: f64, registered: f64, now: Duration) -> u8 {
        let memory = self.config.lost_memory;
        self.lost.retain(|_, (_, since)| now < *since + memory);
        if !self.config.enabled {
            self.state.level = 0;
            return 0;
        }
        let lost: f64 = self.lost.values().map(|(c, _)| c).fold(0.0, |a, c| a + c);
        let nominal = registered + lost;
        let mut level = if nominal > 0.0 {
            level_of(healthy / nominal)
        } else {
            0
        };
        let target = self.config.ttft_target.as_secs_f64();
        if let Some(ttft) = self.ttft
            && target > 0.0
            && ttft > target
        {
            level = (level.max(1) + u8::from(ttft > 2.0 * target)).min(4);
        }
        if level >= 3 {
            let since = *self.severe_since.get_or_insert(now);
            if now.saturating_sub(since) < self.config.escalation_hold {
                level = 2;
            }
        } else {
            self.severe_since = None;
        }
        self.changed |= level != self.state.level;
        self.state = DegradationState {
            level,
            healthy,
            registered,
            lost,
            ttft_seconds: self.ttft,
        };
        level
    }

    /// The last computation, if its level changed since this was last asked.
    pub fn take_change(&mut self) -> Option<DegradationState> {
        std::mem::take(&mut self.changed).then_some(self.state)
    }

    /// The level last computed.
    pub fn current(&self) -> u8 {
        self.state.level
    }

    /// Share of a worker's limits at which it counts as busy.
    pub fn batch_scale(&self) -> f64 {
        if self.state.level >= 1 { 0.8 } else { 1.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// Levels at once, without the escalation hold.
    fn immediate() -> DegradationConfig {
        DegradationConfig {
            escalation_hold: Duration::ZERO,
            ..DegradationConfig::default()
        }
    }

    #[test]
    fn levels_follow_the_healthy_share_and_lost_capacity_is_remembered_a_while() {
        let mut d = Degradation::new(immediate());
        assert_eq!(d.level(4.0, 4.0, S), 0);
        assert_eq!(d.level(3.0, 4.0, S), 1);
        assert_eq!(d.level(2.0, 4.0, S), 2);
        // Three of four crash and are removed: one healthy of four.
        for w in 1..=3 {
            d.worker_removed(WorkerId(w), 1.0, true, S, S);
        }
        assert_eq!(d.level(1.0, 1.0, 2 * S), 3);
        // A worker that leaves cleanly takes its capacity with it.
        d.worker_removed(WorkerId(9), 1.0, false, S, 2 * S);
        assert_eq!(d.level(1.0, 1.0, 3 * S), 3);
        d.worker_added(WorkerId(1), 3 * S);
        assert_eq!(d.level(2.0, 2.0, 4 * S), 2);
        // A replacement under a new id takes the place of another lost worker.
        d.worker_added(WorkerId(20), 4 * S);
        assert_eq!(d.level(3.0, 3.0, 4 * S), 1);
        // Five minutes later the loss is forgotten: the smaller fleet is the fleet.
        assert_eq!(d.level(1.0, 1.0, 302 * S), 0);
        assert_eq!(d.level(0.0, 1.0, 303 * S), 4);
    }

    #[test]
    fn a_replacement_started_before_the_failed_worker_left_covers_it() {
        let mut d = Degradation::new(immediate());
        // The fleet starts: four joins at 0 s. Worker 1, seen working at 1 s, crashes and
        // leaves: the fleet's own start is no replacement for it.
        for w in 1..=4 {
            d.worker_added(WorkerId(w), Duration::ZERO);
        }
        d.worker_removed(WorkerId(1), 1.0, true, S, S);
        assert_eq!(d.level(3.0, 3.0, S), 1);
        d.worker_added(WorkerId(5), S);
        assert_eq!(d.level(4.0, 4.0, S), 0);
        // Twenty crashes, each replaced, the replacement registering before or after the
        // crashed worker leaves: nothing accumulates.
        for w in 6..26u64 {
            let t = S * w as u32;
            if w % 2 == 0 {
                d.worker_added(WorkerId(w), t);
                d.worker_removed(WorkerId(w - 4), 1.0, true, t - S / 2, t);
            } else {
                d.worker_removed(WorkerId(w - 4), 1.0, true, t - S / 2, t);
                d.worker_added(WorkerId(w), t);
            }
            assert_eq!(d.level(4.0, 4.0, t), 0, "{w}");
        }
        // A worker that joined long before is growth, not a replacement.
        d.worker_added(WorkerId(40), 25 * S);
        assert_eq!(d.level(5.0, 5.0, 60 * S), 0);
        d.worker_removed(WorkerId(30), 1.0, true, 59 * S, 60 * S);
        assert_eq!(d.level(4.0, 4.0, 60 * S), 1);
    }

    #[test]
    fn refusing_levels_wait_for_the_hold_and_a_recovery_restarts_it() {
        let mut d = Degradation::new(DegradationConfig::default());
        let ms = Duration::from_millis;
        // Half a healthy worker of four: level 4 is called for, level 2 until it has
        // lasted 2 s.
        assert_eq!(d.level(0.5, 4.0, S), 2);
        assert_eq!(d.level(0.5, 4.0, S + ms(1999)), 2);
        assert_eq!(d.level(0.5, 4.0, 3 * S), 4);
        assert_eq!(d.take_change().map(|s| s.level), Some(4));
        assert_eq!(d.take_change(), None);
        // Recovered for a moment: the hold starts over.
        assert_eq!(d.level(4.0, 4.0, 4 * S), 0);
        assert_eq!(d.level(1.5, 4.0, 5 * S), 2);
        assert_eq!(d.level(1.5, 4.0, 6 * S), 2);
        assert_eq!(d.level(1.5, 4.0, 7 * S), 3);
        let state = d.take_change().unwrap();
        assert_eq!(
            (state.healthy, state.registered, state.lost),
            (1.5, 4.0, 0.0)
        );
    }

    #[test]
    fn slow_first_tokens_raise_the_level() {
        let mut d = Degradation::new(DegradationConfig {
            ttft_alpha: 1.0,
            ..immediate()
        });
        d.observe_ttft(Duration::from_secs(6));
        assert_eq!(d.level(4.0, 4.0, S), 1);
        assert_eq!(d.batch_scale(), 0.8);
        d.observe_ttft(Duration::from_secs(11));
        assert_eq!(d.level(4.0, 4.0, S), 2);
        d.observe_ttft(Duration::from_secs(1));
        assert_eq!(d.level(4.0, 4.0, S), 0);
    }

    #[test]
    fn what_each_level_refuses() {
        use Priority::*;
        let cases = [
            (1, BestEffort, 0, None),
            (2, BestEffort, 0, Some(Rejection::Shed)),
            (2, Standard, 900, None),
            (3, Standard, 255, None),
            (3, Standard, 256, Some(Rejection::QueueFilling)),
            (3, Premium, 1000, None),
            (4, Premium, 0, Some(Rejection::Degraded)),
        ];
        for (level, priority, queued, expected) in cases {
            assert_eq!(
                refuse(level, priority, queued, 1024),
                expected,
                "{level} {priority:?}"
            );
        }
    }
}
