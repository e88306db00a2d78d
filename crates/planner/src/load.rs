//! Load-based rules: one vote per role and interval, from KV-cache usage (decode and
//! aggregated workers) and the queue of waiting requests (prefill and aggregated workers,
//! and decode workers unless `decode_queue` is off).

use serde::Serialize;

use crate::config::LoadConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Vote {
    Up,
    Hold,
    Down,
}

/// A vote with the reason it was cast.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub vote: Vote,
    pub reason: String,
}

fn verdict(vote: Vote, reason: String) -> Verdict {
    Verdict { vote, reason }
}

/// Whether the `workers − 1` left after a removal would carry `load · N / (N − 1)` above
/// the up threshold (and so be scaled up again at once).
fn would_oscillate(load: f64, workers: u32, up: f64) -> bool {
    workers <= 1 || load * f64::from(workers) / f64::from(workers - 1) > up
}

/// The KV-usage vote for `workers` workers at mean usage `usage`, `in_grace` while a
/// recently added worker protects the role from removal.
pub fn kv_vote(config: &LoadConfig, usage: f64, workers: u32, in_grace: bool) -> Verdict {
    let (up, down) = (config.kv_usage_up, config.kv_usage_down);
    if usage > up {
        verdict(Vote::Up, format!("KV usage {usage:.2} > {up}"))
    } else if usage < down {
        if workers <= 1 {
            verdict(
                Vote::Hold,
                format!("KV usage {usage:.2} < {down}, at one worker"),
            )
        } else if in_grace {
            verdict(
                Vote::Hold,
                format!("KV usage {usage:.2} < {down}, but a worker was added recently (grace)"),
            )
        } else if would_oscillate(usage, workers, up) {
            verdict(
                Vote::Hold,
                format!(
                    "KV usage {usage:.2} < {down}, but {} workers would run at {:.2} > {up}",
                    workers.saturating_sub(1),
                    usage * f64::from(workers) / f64::from(workers.saturating_sub(1).max(1))
                ),
            )
        } else {
            verdict(Vote::Down, format!("KV usage {usage:.2} < {down}"))
        }
    } else {
        verdict(
            Vote::Hold,
            format!("KV usage {usage:.2} within [{down}, {up}]"),
        )
    }
}

/// Least-squares slope of equally spaced values (per interval).
fn slope(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    if values.len() < 2 {
        return 0.0;
    }
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = values.iter().sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (i, y) in values.iter().enumerate() {
        let dx = i as f64 - mean_x;
        num += dx * (y - mean_y);
        den += dx * dx;
    }
    num / den
}

/// The queue vote: `history` holds the waiting requests per worker of recent intervals,
/// oldest first, the current one last; `name` says which queue, for the reasons.
pub fn queue_vote(config: &LoadConfig, name: &str, history: &[f64], workers: u32) -> Verdict {
    let (up, down) = (config.prefill_queue_up, config.prefill_queue_down);
    let Some(&queue) = history.last() else {
        return verdict(Vote::Hold, format!("no {name} measured"));
    };
    if queue > up {
        let ahead = f64::from(config.prefill_trend_intervals);
        let predicted = queue + slope(history) * ahead;
        if history.len() >= 2 && predicted < up {
            verdict(
                Vote::Hold,
                format!(
                    "{name} {queue:.2} > {up}, but its trend reaches {predicted:.2} within {ahead} intervals"
                ),
            )
        } else {
            verdict(Vote::Up, format!("{name} {queue:.2} > {up}"))
        }
    } else if queue < down {
        if workers <= 1 {
            verdict(
                Vote::Hold,
                format!("{name} {queue:.2} < {down}, at one worker"),
            )
        } else if would_oscillate(queue, workers, up) {
            verdict(
                Vote::Hold,
                format!("{name} {queue:.2} < {down}, but fewer workers would queue above {up}"),
            )
        } else {
            verdict(Vote::Down, format!("{name} {queue:.2} < {down}"))
        }
    } else {
        verdict(
            Vote::Hold,
            format!("{name} {queue:.2} within [{down}, {up}]"),
        )
    }
}

/// Two signals on one role (aggregated workers prefill and decode; decode workers fill
/// their cache and queue): either adds one; removing one takes both.
pub fn combine(kv: Verdict, queue: Verdict) -> Verdict {
    match (kv.vote, queue.vote) {
        (Vote::Up, _) => kv,
        (_, Vote::Up) => queue,
        (Vote::Down, Vote::Down) => {
            verdict(Vote::Down, format!("{} and {}", kv.reason, queue.reason))
        }
        (Vote::Hold, _) => kv,
        (_, Vote::Hold) => queue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LoadConfig {
        LoadConfig::default()
    }

    #[test]
    fn kv_thresholds_and_the_oscillation_guard() {
        let c = config();
        assert_eq!(kv_vote(&c, 0.95, 4, false).vote, Vote::Up);
        assert_eq!(kv_vote(&c, 0.7, 4, false).vote, Vote::Hold);
        assert_eq!(kv_vote(&c, 0.3, 4, false).vote, Vote::Down);
        // 0.45 · 2 / 1 = 0.9: not above the threshold, allowed.
        assert_eq!(kv_vote(&c, 0.45, 2, false).vote, Vote::Down);
        // 0.48 · 2 / 1 = 0.96 > 0.9: refused.
        let v = kv_vote(&c, 0.48, 2, false);
        assert_eq!(v.vote, Vote::Hold);
        assert!(
            v.reason.contains("1 workers would run at 0.96"),
            "{}",
            v.reason
        );
        // The last worker is never voted away.
        assert_eq!(kv_vote(&c, 0.0, 1, false).vote, Vote::Hold);
        // Grace holds a removal, never an addition.
        assert_eq!(kv_vote(&c, 0.1, 4, true).vote, Vote::Hold);
        assert_eq!(kv_vote(&c, 0.99, 4, true).vote, Vote::Up);
    }

    #[test]
    fn a_falling_queue_trend_holds_off_a_prefill_worker() {
        let c = config();
        // Steady above the threshold: add one.
        assert_eq!(
            queue_vote(&c, "prefill queue", &[0.9, 0.9, 0.9], 2).vote,
            Vote::Up
        );
        // Rising: add one.
        assert_eq!(
            queue_vote(&c, "prefill queue", &[0.2, 0.5, 0.8], 2).vote,
            Vote::Up
        );
        // Above, but falling 0.3 per interval: below 0.5 within 3 intervals.
        let v = queue_vote(&c, "prefill queue", &[1.4, 1.1, 0.8], 2);
        assert_eq!(v.vote, Vote::Hold);
        assert!(v.reason.contains("trend"), "{}", v.reason);
        // Falling too slowly to get there: add one.
        assert_eq!(
            queue_vote(&c, "prefill queue", &[1.2, 1.1, 1.0], 2).vote,
            Vote::Up
        );
        // A first interval has no trend.
        assert_eq!(queue_vote(&c, "prefill queue", &[0.8], 2).vote, Vote::Up);
        assert_eq!(queue_vote(&c, "prefill queue", &[0.1], 3).vote, Vote::Down);
        assert_eq!(queue_vote(&c, "prefill queue", &[0.0], 1).vote, Vote::Hold);
        // 0.19 · 3 / 2 = 0.285: fine; 0.19 at 2 → 0.38, fine; guard needs load near up.
        assert_eq!(queue_vote(&c, "prefill queue", &[0.19], 2).vote, Vote::Down);
        assert_eq!(queue_vote(&c, "prefill queue", &[], 2).vote, Vote::Hold);
    }

    #[test]
    fn aggregated_needs_both_to_shrink_and_either_to_grow() {
        let c = config();
        let down = || kv_vote(&c, 0.1, 4, false);
        let hold = || kv_vote(&c, 0.7, 4, false);
        let up = || kv_vote(&c, 0.95, 4, false);
        let q_down = || queue_vote(&c, "prefill queue", &[0.0], 4);
        let q_up = || queue_vote(&c, "prefill queue", &[2.0], 4);
        assert_eq!(combine(down(), q_down()).vote, Vote::Down);
        assert_eq!(combine(down(), q_up()).vote, Vote::Up);
        assert_eq!(combine(up(), q_down()).vote, Vote::Up);
        assert_eq!(combine(hold(), q_down()).vote, Vote::Hold);
        assert_eq!(
            combine(down(), queue_vote(&c, "prefill queue", &[0.3], 4)).vote,
            Vote::Hold
        );
    }
}
