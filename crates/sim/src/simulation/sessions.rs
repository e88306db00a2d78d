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

use switchyard_core::trace::session::After;

use crate::workload::PreparedRequest;

/// Arrivals of a workload with sessions.
#[derive(Debug)]
pub(super) struct Sessions {
    /// Requests sent at their own arrival, by arrival (file order among equals).
    roots: Vec<u32>,
    next_root: usize,
    /// Released requests, by when they are sent (then by index).
    released: BinaryHeap<Reverse<(Duration, u32)>>,
    /// The requests each request releases (taken when it ends).
    children: Vec<Vec<u32>>,
    /// Per request, the requests it still waits for.
    waiting: Vec<u32>,
    /// Per request, the latest end of those it waited for so far.
    latest: Vec<Duration>,
    /// Requests not yet released.
    unreleased: usize,
    /// The shortest wait of any released request.
    min_wait: Duration,
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
        let mut children = vec![Vec::new(); requests.len()];
        let mut waiting = vec![0; requests.len()];
        let mut min_wait = Duration::MAX;
        for (index, request) in requests.iter().enumerate() {
            if let Some(after) = after(request) {
                // A parent outside the workload (cut off) never ends: not waited for.
                for &parent in &after.parents {
                    if let Some(siblings) = children.get_mut(parent as usize) {
                        siblings.push(index as u32);
                        waiting[index] += 1;
                    }
                }
                min_wait = min_wait.min(after.wait());
            }
        }
        let mut sessions = Sessions {
            unreleased: requests.len() - roots.len(),
            roots,
            next_root: 0,
            released: BinaryHeap::new(),
            children,
            waiting,
            latest: vec![Duration::ZERO; requests.len()],
            min_wait,
        };
        // Waiting for nothing left: released from the start, after its wait.
        for (index, request) in requests.iter().enumerate() {
            if let Some(after) = after(request)
                && sessions.waiting[index] == 0
            {
                sessions
                    .released
                    .push(Reverse((after.wait(), index as u32)));
                sessions.unreleased -= 1;
            }
        }
        Some(sessions)
    }

    /// The next arrival: (when, which request).
    pub(super) fn peek(&self, requests: &[PreparedRequest]) -> Option<(Duration, u32)> {
        let root = self
            .roots
            .get(self.next_root)
            .map(|&i| (requests[i as usize].arrival, i));
        let released = self.released.peek().map(|Reverse(next)| *next);
        match (root, released) {
            (Some(r), Some(d)) => Some(if r.0 <= d.0 { r } else { d }),
            (r, d) => r.or(d),
        }
    }

    /// Takes the arrival [`Self::peek`] gave.
    pub(super) fn pop(&mut self, requests: &[PreparedRequest]) {
        let root = self
            .roots
            .get(self.next_root)
            .map(|&i| requests[i as usize].arrival);
        let released = self.released.peek().map(|Reverse((at, _))| *at);
        match (root, released) {
            (Some(r), Some(d)) if r <= d => self.next_root += 1,
            (Some(_), None) => self.next_root += 1,
            _ => {
                self.released.pop();
            }
        }
    }

    /// Request `index` ended at `at`: those waiting only for it and others already ended
    /// are released, each after its own wait. Only the first end counts.
    pub(super) fn ended(&mut self, index: u32, at: Duration, requests: &[PreparedRequest]) {
        for child in std::mem::take(&mut self.children[index as usize]) {
            let c = child as usize;
            self.latest[c] = self.latest[c].max(at);
            self.waiting[c] -= 1;
            if self.waiting[c] == 0 {
                let wait = requests[c]
                    .turn
                    .as_ref()
                    .and_then(|t| t.after.as_ref())
                    .map_or(Duration::ZERO, |a| a.wait());
                self.released.push(Reverse((self.latest[c] + wait, child)));
                self.unreleased -= 1;
            }
        }
    }

    /// How far the engines may run alone from `now`: no request can be released before
    /// this; none once every request has been released.
    pub(super) fn horizon(&self, now: Duration) -> Option<Duration> {
        (self.unreleased > 0).then(|| now.saturating_add(self.min_wait))
    }
}
