//! Closed loop: requests released by other requests' completions (a session trace).
//!
//! A session's later turn, or an agent's subagent, is sent a wait after the last request it
//! waits for ends (completed, refused or failed). Its time is known only then, so arrivals
//! are a queue that grows as the run goes: requests sent at their own time, in time order,
//! and those released so far.
//!
//! The engines' lazy advance (see the parent module) runs each engine alone up to the next
//! arrival. A completion during it releases a request no earlier than the smallest wait of
//! any request still to be released, so the advance is bounded by that horizon: a released
//! request is never routed against engines already run past its arrival.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use switchyard_core::trace::session::{After, Releases};

use crate::workload::PreparedRequest;

/// Arrivals of a workload with sessions.
#[derive(Debug)]
pub(super) struct Sessions {
    /// Requests sent at their own arrival, by arrival (file order among equals).
    roots: Vec<u32>,
    next_root: usize,
    /// Released requests, by when they are sent (then by index).
    released: BinaryHeap<Reverse<(Duration, u32)>>,
    releases: Releases<Duration>,
}

impl Sessions {
    /// None when every request is sent at its own arrival (open loop).
    pub(super) fn new(requests: &[PreparedRequest]) -> Option<Self> {
        fn after(r: &PreparedRequest) -> Option<&After> {
            r.turn.as_ref().and_then(|t| t.after.as_ref())
        }
        if !requests.iter().any(|r| after(r).is_some()) {
            return None;
        }
        let mut roots: Vec<u32> = (0..requests.len() as u32)
            .filter(|&i| after(&requests[i as usize]).is_none())
            .collect();
        roots.sort_by_key(|&i| requests[i as usize].arrival);
        // The waits were divided by the speedup when the workload was prepared.
        let (releases, orphans) = Releases::new(requests.iter().map(after), 1.0, Duration::ZERO);
        Some(Sessions {
            roots,
            next_root: 0,
            released: orphans.into_iter().map(Reverse).collect(),
            releases,
        })
    }

    /// The next arrival: (when, which request, whether it is a root).
    fn next(&self, requests: &[PreparedRequest]) -> Option<(Duration, u32, bool)> {
        let root = self
            .roots
            .get(self.next_root)
            .map(|&i| (requests[i as usize].arrival, i, true));
        let released = self
            .released
            .peek()
            .map(|Reverse((at, i))| (*at, *i, false));
        match (root, released) {
            (Some(r), Some(d)) => Some(if r.0 <= d.0 { r } else { d }),
            (r, d) => r.or(d),
        }
    }

    /// The next arrival: (when, which request).
    pub(super) fn peek(&self, requests: &[PreparedRequest]) -> Option<(Duration, u32)> {
        self.next(requests).map(|(at, index, _)| (at, index))
    }

    /// Takes the arrival [`Self::peek`] gave.
    pub(super) fn pop(&mut self, requests: &[PreparedRequest]) {
        match self.next(requests) {
            Some((_, _, true)) => self.next_root += 1,
            Some((_, _, false)) => {
                self.released.pop();
            }
            None => {}
        }
    }

    /// Request `index` ended at `at`: those waiting only for it and others already ended
    /// are released, each after its own wait. Only the first end counts.
    pub(super) fn ended(&mut self, index: u32, at: Duration) {
        let released = &mut self.released;
        self.releases.ended(index, at, |when, child| {
            released.push(Reverse((when, child)))
        });
    }

    /// How far the engines may run alone from `now`: no request can be released before
    /// this; none once every request has been released.
    pub(super) fn horizon(&self, now: Duration) -> Option<Duration> {
        (self.releases.unreleased() > 0).then(|| now.saturating_add(self.releases.min_wait()))
    }
}
