//! What a session trace's sessions went through: how long they took, their first tokens by
//! turn, and where their time went (the fleet, tools, the client's own pauses).

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::report::{Distribution, LatencyRecorder};
use crate::simulation::micros;

/// Turns past this index are reported together with it.
pub const TURNS_REPORTED: usize = 8;

/// One request of a session, as it went.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TurnOutcome {
    pub session: u32,
    pub turn: u32,
    /// When it was sent.
    pub sent: Duration,
    pub first_token: Option<Duration>,
    /// When it ended (completed, refused or failed); none if it never did.
    pub ended: Option<Duration>,
    /// The client's pause before it, and the tool's run (none for a session's first turn).
    pub delay: Duration,
    pub tool_wait: Duration,
}

/// The sessions of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SessionReport {
    pub sessions: u64,
    pub turns_mean: f64,
    pub turns_max: u32,
    /// From a session's first request sent to its last one's end.
    pub duration_ms: Distribution,
    /// Time to first token by turn (0 is a session's first); the last entry gathers turn
    /// [`TURNS_REPORTED`] − 1 and every later one.
    pub ttft_ms_by_turn: Vec<Distribution>,
    /// Requests behind each entry of `ttft_ms_by_turn`.
    pub requests_by_turn: Vec<u64>,
    /// Seconds, summed over every request, from its sending to its end: waiting on the
    /// fleet.
    pub fleet_seconds: f64,
    /// Seconds, summed over every request, that tools ran before it was sent.
    pub tool_seconds: f64,
    /// Seconds, summed over every request, of the client's own pause before it was sent.
    pub client_seconds: f64,
}

impl SessionReport {
    pub fn build(turns: impl IntoIterator<Item = TurnOutcome>) -> Self {
        let mut spans: HashMap<u32, (Duration, Duration, u32)> = HashMap::new();
        let mut by_turn: Vec<LatencyRecorder> = Vec::new();
        let mut counts: Vec<u64> = Vec::new();
        let mut report = SessionReport::default();
        for t in turns {
            let end = t.ended.unwrap_or(t.sent);
            let span = spans.entry(t.session).or_insert((t.sent, end, 0));
            span.0 = span.0.min(t.sent);
            span.1 = span.1.max(end);
            span.2 += 1;
            let slot = (t.turn as usize).min(TURNS_REPORTED - 1);
            if by_turn.len() <= slot {
                by_turn.resize_with(slot + 1, LatencyRecorder::default);
                counts.resize(slot + 1, 0);
            }
            counts[slot] += 1;
            if let Some(first) = t.first_token {
                by_turn[slot].record(micros(first.saturating_sub(t.sent)));
            }
            report.fleet_seconds += end.saturating_sub(t.sent).as_secs_f64();
            report.tool_seconds += t.tool_wait.as_secs_f64();
            report.client_seconds += t.delay.as_secs_f64();
        }
        let mut duration = LatencyRecorder::default();
        for &(start, end, turns) in spans.values() {
            duration.record(micros(end.saturating_sub(start)));
            report.turns_max = report.turns_max.max(turns);
        }
        report.sessions = spans.len() as u64;
        report.turns_mean = if spans.is_empty() {
            0.0
        } else {
            counts.iter().sum::<u64>() as f64 / spans.len() as f64
        };
        report.duration_ms = duration.distribution();
        report.ttft_ms_by_turn = by_turn.iter().map(LatencyRecorder::distribution).collect();
        report.requests_by_turn = counts;
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn sessions_add_up_their_turns() {
        let turn = |session, turn, sent, first: Option<u64>, ended: Option<u64>, delay, tool| {
            TurnOutcome {
                session,
                turn,
                sent: ms(sent),
                first_token: first.map(ms),
                ended: ended.map(ms),
                delay: ms(delay),
                tool_wait: ms(tool),
            }
        };
        let report = SessionReport::build([
            turn(0, 0, 0, Some(100), Some(1000), 0, 0),
            turn(1, 0, 50, Some(80), Some(500), 0, 0),
            turn(0, 1, 1500, Some(1700), Some(2000), 100, 400),
            // Refused: no first token, ends when sent.
            turn(1, 1, 800, None, Some(800), 300, 0),
            turn(0, 9, 2100, Some(2130), Some(2200), 100, 0),
        ]);
        assert_eq!(report.sessions, 2);
        assert_eq!(report.turns_max, 3);
        assert!((report.turns_mean - 2.5).abs() < 1e-9);
        assert_eq!(report.requests_by_turn, [2, 2, 0, 0, 0, 0, 0, 1]);
        assert!((report.ttft_ms_by_turn[0].mean - 65.0).abs() < 0.1);
        assert!((report.ttft_ms_by_turn[1].p50 - 200.0).abs() < 0.5);
        assert!((report.ttft_ms_by_turn[7].p50 - 30.0).abs() < 0.1);
        assert!((report.fleet_seconds - (1.0 + 0.45 + 0.5 + 0.0 + 0.1)).abs() < 1e-9);
        assert!((report.tool_seconds - 0.4).abs() < 1e-9);
        assert!((report.client_seconds - 0.5).abs() < 1e-9);
        // Sessions last 2.2 s and 0.75 s.
        assert!((report.duration_ms.p99 - 2200.0).abs() < 5.0);
        assert!((report.duration_ms.p50 - 750.0).abs() < 1.0);
    }
}
