//! Event-id bookkeeping per (worker, dp rank) stream.

use rustc_hash::FxHashMap;
use switchyard_core::WorkerKey;

use super::EventGap;

/// How an event's id relates to its stream's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamCheck {
    InOrder,
    /// Ids between the last seen and this one never arrived.
    Gap(EventGap),
    /// At or below the last seen id: a duplicate or a late delivery.
    Stale {
        last_event_id: u64,
    },
}

/// The last event id seen on each stream. The first event of a stream is always in order.
#[derive(Debug, Clone, Default)]
pub struct EventStreams {
    last: FxHashMap<WorkerKey, u64>,
}

impl EventStreams {
    /// Checks an event id and, unless stale, records it as the stream's last.
    pub fn observe(&mut self, worker: WorkerKey, event_id: u64) -> StreamCheck {
        let check = match self.last.get(&worker) {
            Some(&last) if event_id <= last => {
                return StreamCheck::Stale {
                    last_event_id: last,
                };
            }
            Some(&last) if event_id > last + 1 => StreamCheck::Gap(EventGap {
                worker,
                expected: last + 1,
                received: event_id,
            }),
            _ => StreamCheck::InOrder,
        };
        self.last.insert(worker, event_id);
        check
    }

    pub fn last(&self, worker: WorkerKey) -> Option<u64> {
        self.last.get(&worker).copied()
    }

    /// Sets (or clears) a stream's last id, as after restoring a snapshot.
    pub fn set(&mut self, worker: WorkerKey, last: Option<u64>) {
        match last {
            Some(id) => self.last.insert(worker, id),
            None => self.last.remove(&worker),
        };
    }

    pub fn forget(&mut self, worker: WorkerKey) {
        self.last.remove(&worker);
    }
}
