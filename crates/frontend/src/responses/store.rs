//! Stored responses: what `previous_response_id` continues and `GET /v1/responses/{id}`
//! returns. Bounded in entries and bytes, each kept for a TTL, oldest evicted first; held
//! in this frontend's memory only.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openai_protocol::responses::ResponsesResponse;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::convert::Known;

/// `frontend.responses`: how many stored responses are kept, and how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResponsesConfig {
    /// Stored responses at most; the oldest go first.
    pub max_stored: usize,
    /// Bytes of stored responses at most (their conversations, texts and token ids).
    pub max_stored_bytes: usize,
    /// How long a stored response can be continued or read.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        ResponsesConfig {
            max_stored: 10_000,
            max_stored_bytes: 512 << 20,
            ttl: Duration::from_secs(3600),
        }
    }
}

/// One stored response.
#[derive(Debug)]
pub struct Stored {
    /// As `GET /v1/responses/{id}` returns it.
    pub response: ResponsesResponse,
    /// The conversation's messages, this response's answer included, without
    /// `instructions` (see [`super::lower::Lowered::history`]).
    pub history: Vec<Value>,
    /// Its prompt and answer as tokens, for the next turn (none: a prompt with media).
    pub known: Option<Arc<Known>>,
}

impl Stored {
    /// What it holds in memory, roughly.
    fn bytes(&self) -> usize {
        // JSON values take a few times their text in memory.
        let history: usize = 3 * self
            .history
            .iter()
            .map(|m| m.to_string().len())
            .sum::<usize>();
        let response = serde_json::to_string(&self.response).map_or(0, |r| 2 * r.len());
        let known = self.known.as_ref().map_or(0, |k| {
            k.prompt.len() + k.answer.len() + 4 * (k.prompt_ids.len() + k.answer_ids.len())
        });
        history + response + known + 512
    }
}

#[derive(Debug)]
struct Entry {
    stored: Arc<Stored>,
    at: Instant,
    bytes: usize,
    /// Its place in the order stored (an id stored again gets a new one).
    seq: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Ids in the order stored, with their place and time (an id deleted or stored again
    /// lingers here until popped).
    order: VecDeque<(String, u64, Instant)>,
    bytes: usize,
    next: u64,
}

/// The bounded store.
#[derive(Debug)]
pub struct ResponseStore {
    config: ResponsesConfig,
    inner: Mutex<Inner>,
}

impl ResponseStore {
    pub fn new(config: ResponsesConfig) -> Self {
        ResponseStore {
            config,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn config(&self) -> ResponsesConfig {
        self.config
    }

    /// Keeps `stored` under its id, evicting the oldest while over a bound (a response
    /// larger than the byte bound alone is not kept).
    pub fn insert(&self, stored: Stored, now: Instant) {
        let bytes = stored.bytes();
        if bytes > self.config.max_stored_bytes || self.config.max_stored == 0 {
            return;
        }
        let id = stored.response.id.clone();
        let mut inner = self.inner.lock();
        inner.remove(&id);
        let seq = inner.next;
        inner.next += 1;
        inner.order.push_back((id.clone(), seq, now));
        inner.bytes += bytes;
        inner.entries.insert(
            id,
            Entry {
                stored: Arc::new(stored),
                at: now,
                bytes,
                seq,
            },
        );
        let ttl = self.config.ttl;
        while inner.entries.len() > self.config.max_stored
            || inner.bytes > self.config.max_stored_bytes
            || inner
                .order
                .front()
                .is_some_and(|(_, _, at)| now.duration_since(*at) >= ttl)
        {
            let Some((id, seq, _)) = inner.order.pop_front() else {
                break;
            };
            if inner.entries.get(&id).is_some_and(|e| e.seq == seq) {
                inner.remove(&id);
            }
        }
    }

    /// The stored response `id`, unless it expired.
    pub fn get(&self, id: &str, now: Instant) -> Option<Arc<Stored>> {
        let mut inner = self.inner.lock();
        let entry = inner.entries.get(id)?;
        if now.duration_since(entry.at) >= self.config.ttl {
            inner.remove(id);
            return None;
        }
        Some(Arc::clone(&entry.stored))
    }

    /// Forgets `id`; whether it was there.
    pub fn delete(&self, id: &str) -> bool {
        self.inner.lock().remove(id)
    }

    /// Stored responses and their bytes.
    pub fn len_and_bytes(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        (inner.entries.len(), inner.bytes)
    }
}

impl Inner {
    fn remove(&mut self, id: &str) -> bool {
        let Some(entry) = self.entries.remove(id) else {
            return false;
        };
        self.bytes -= entry.bytes;
        // Ids deleted or stored again linger in the order; past twice the live ones it is
        // rebuilt (amortized constant time), so it never outgrows the entries.
        if self.order.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.order
                .retain(|(id, seq, _)| entries.get(id).is_some_and(|e| e.seq == *seq));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8, usize),
        Get(u8),
        Delete(u8),
        Wait(u64),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                (0..6u8, 0..400usize).prop_map(|(id, size)| Op::Insert(id, size)),
                (0..6u8).prop_map(Op::Get),
                (0..6u8).prop_map(Op::Delete),
                (0..40u64).prop_map(Op::Wait),
            ],
            0..60,
        )
    }

    proptest! {
        /// The store finds what a list in insertion order, trimmed from its front while over
        /// a bound or expired, holds.
        #[test]
        fn agrees_with_a_list_trimmed_from_the_front(ops in ops(), max_stored in 1..5usize, max_bytes in 600..2_000usize) {
            let config = ResponsesConfig { max_stored, max_stored_bytes: max_bytes, ttl: Duration::from_millis(100) };
            let store = ResponseStore::new(config);
            let start = Instant::now();
            let mut now = start;
            // (id, stored at, bytes), oldest first.
            let mut model: Vec<(String, Instant, usize)> = Vec::new();
            for op in ops {
                match op {
                    Op::Insert(id, size) => {
                        let id = format!("r{id}");
                        let entry = stored(&id, size);
                        let bytes = entry.bytes();
                        store.insert(entry, now);
                        if bytes <= max_bytes {
                            model.retain(|(i, ..)| *i != id);
                            model.push((id, now, bytes));
                            while model.len() > max_stored
                                || model.iter().map(|e| e.2).sum::<usize>() > max_bytes
                                || model.first().is_some_and(|e| now.duration_since(e.1) >= config.ttl)
                            {
                                model.remove(0);
                            }
                        }
                    }
                    Op::Get(id) => {
                        let id = format!("r{id}");
                        let live = model.iter().any(|(i, at, _)| *i == id && now.duration_since(*at) < config.ttl);
                        prop_assert_eq!(store.get(&id, now).is_some(), live, "get {}", id);
                        model.retain(|(i, at, _)| *i != id || now.duration_since(*at) < config.ttl);
                    }
                    Op::Delete(id) => {
                        let id = format!("r{id}");
                        let there = model.iter().any(|(i, ..)| *i == id);
                        prop_assert_eq!(store.delete(&id), there, "delete {}", id);
                        model.retain(|(i, ..)| *i != id);
                    }
                    Op::Wait(ms) => now += Duration::from_millis(ms),
                }
                let (len, bytes) = store.len_and_bytes();
                prop_assert!(len <= max_stored && bytes <= max_bytes);
            }
        }
    }

    fn stored(id: &str, history_bytes: usize) -> Stored {
        Stored {
            response: ResponsesResponse::builder(id, "m").build(),
            history: vec![Value::String("x".repeat(history_bytes))],
            known: None,
        }
    }

    #[test]
    fn keeps_at_most_max_stored_oldest_evicted_first() {
        let store = ResponseStore::new(ResponsesConfig {
            max_stored: 2,
            ..ResponsesConfig::default()
        });
        let now = Instant::now();
        for id in ["a", "b", "c"] {
            store.insert(stored(id, 10), now);
        }
        assert!(store.get("a", now).is_none());
        assert!(store.get("b", now).is_some());
        assert!(store.get("c", now).is_some());
        assert_eq!(store.len_and_bytes().0, 2);
    }

    #[test]
    fn expires_after_the_ttl() {
        let store = ResponseStore::new(ResponsesConfig {
            ttl: Duration::from_secs(10),
            ..ResponsesConfig::default()
        });
        let now = Instant::now();
        store.insert(stored("a", 10), now);
        assert!(store.get("a", now + Duration::from_secs(9)).is_some());
        assert!(store.get("a", now + Duration::from_secs(10)).is_none());
        assert_eq!(store.len_and_bytes(), (0, 0));
    }

    #[test]
    fn the_byte_bound_evicts_and_a_too_large_response_is_not_kept() {
        let one = stored("a", 1000).bytes();
        let store = ResponseStore::new(ResponsesConfig {
            max_stored_bytes: 2 * one + one / 2,
            ..ResponsesConfig::default()
        });
        let now = Instant::now();
        for id in ["a", "b", "c"] {
            store.insert(stored(id, 1000), now);
        }
        assert!(store.get("a", now).is_none());
        assert!(store.get("c", now).is_some());
        assert_eq!(store.len_and_bytes(), (2, 2 * one));
        store.insert(stored("huge", 3 * one), now);
        assert!(store.get("huge", now).is_none());
        assert!(store.get("b", now).is_some());
    }

    #[test]
    fn ids_deleted_or_stored_again_do_not_pile_up() {
        let store = ResponseStore::new(ResponsesConfig::default());
        let now = Instant::now();
        for i in 0..1000 {
            store.insert(stored(&format!("gone{i}"), 1), now);
            store.delete(&format!("gone{i}"));
            store.insert(stored("again", 1), now);
        }
        assert_eq!(store.len_and_bytes().0, 1);
        assert!(store.inner.lock().order.len() <= 66);
        assert!(store.get("again", now).is_some());
    }

    #[test]
    fn a_deleted_or_replaced_id_keeps_the_counts_right() {
        let store = ResponseStore::new(ResponsesConfig {
            max_stored: 2,
            ..ResponsesConfig::default()
        });
        let now = Instant::now();
        store.insert(stored("a", 10), now);
        assert!(store.delete("a"));
        assert!(!store.delete("a"));
        assert_eq!(store.len_and_bytes(), (0, 0));
        store.insert(stored("b", 10), now);
        store.insert(stored("b", 20), now + Duration::from_millis(1));
        store.insert(stored("c", 10), now + Duration::from_millis(2));
        // The first "b" left in the order queue must not evict the second.
        store.insert(stored("d", 10), now + Duration::from_millis(3));
        assert!(store.get("b", now).is_none());
        assert!(store.get("c", now).is_some());
        assert!(store.get("d", now).is_some());
        assert_eq!(store.len_and_bytes().0, 2);
    }
}
