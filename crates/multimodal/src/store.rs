//! The encoded-feature store's bookkeeping: which media items' embeddings exist, in what
//! state, for how many requests, and how much memory they hold, within a CPU budget and a
//! staging budget (the engine's side). A pure state machine: callers (encoders, the
//! engine, the frontend) report what happened; the store answers what may happen next and
//! never holds more than its budgets.
//!
//! An item's life: `Encoding` (its CPU bytes reserved) → `EncodedCpu` → `Staged` (staging
//! bytes too) → `Merged` (into the sequence being prefilled) → `Prefilled` (staging bytes
//! given back) → discarded when its last request lets go, or, with
//! [`AfterPrefill::KeepCpu`], kept in CPU memory for the next request that sends the same
//! item, as `EncodedCpu` with no references, the first to be evicted when memory is needed
//! (oldest first). While any request holds an item, its CPU copy stays (a re-prefill after
//! a migration needs it). Transitions out of order are errors, never panics.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Where an item's embeddings are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureState {
    Encoding,
    EncodedCpu,
    Staged,
    Merged,
    Prefilled,
}

impl FeatureState {
    pub const ALL: [FeatureState; 5] = [
        FeatureState::Encoding,
        FeatureState::EncodedCpu,
        FeatureState::Staged,
        FeatureState::Merged,
        FeatureState::Prefilled,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FeatureState::Encoding => "encoding",
            FeatureState::EncodedCpu => "encoded_cpu",
            FeatureState::Staged => "staged",
            FeatureState::Merged => "merged",
            FeatureState::Prefilled => "prefilled",
        }
    }
}

/// What happens to an item's embeddings once no request holds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterPrefill {
    /// Dropped: the KV cache holds their effect, and prefix caching finds it.
    #[default]
    Discard,
    /// Kept in CPU memory (evictable) so the same item sent again skips the encoder.
    KeepCpu,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    #[error("an item of {bytes} bytes is larger than the whole {budget}-byte {which} budget")]
    TooLarge {
        bytes: u64,
        budget: u64,
        which: &'static str,
    },
    #[error("media item {hash:016x} is not in the store")]
    Unknown { hash: u64 },
    #[error("media item {hash:016x} cannot go from {from} to {to}")]
    Illegal {
        hash: u64,
        from: &'static str,
        to: &'static str,
    },
    #[error("media item {hash:016x} was released more often than it was taken")]
    NotHeld { hash: u64 },
}

/// The answer to [`FeatureStore::acquire`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The item is there (or being encoded for another request), now held for this one too.
    Hit(FeatureState),
    /// The item is new: its CPU bytes are reserved; encode it, then report
    /// [`FeatureStore::encoded`] or [`FeatureStore::failed`].
    Encode,
    /// No room in CPU memory even after evicting every unheld item: wait for requests to
    /// finish and ask again (nothing was reserved).
    Wait,
}

/// Counts over the store's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Times a request had to wait for CPU memory to encode.
    pub waits: u64,
    /// Times a request had to wait for staging memory.
    pub staging_waits: u64,
    /// Times an item was let go by its last request and kept in CPU memory: from then on
    /// it may be evicted, so a request waiting for CPU memory may now find room.
    pub kept: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    state: FeatureState,
    bytes: u64,
    refs: u32,
    /// For eviction: when it was last let go.
    released_at: u64,
}

/// The store's bookkeeping (see the module documentation).
#[derive(Debug, Clone)]
pub struct FeatureStore {
    cpu_budget: u64,
    staging_budget: u64,
    policy: AfterPrefill,
    entries: HashMap<u64, Entry>,
    cpu_used: u64,
    staging_used: u64,
    stats: StoreStats,
}

impl FeatureStore {
    pub fn new(cpu_budget: u64, staging_budget: u64, policy: AfterPrefill) -> Self {
        FeatureStore {
            cpu_budget,
            staging_budget,
            policy,
            entries: HashMap::new(),
            cpu_used: 0,
            staging_used: 0,
            stats: StoreStats::default(),
        }
    }

    /// Takes the item `hash` of `bytes` for a request: a hit, a reservation to encode it, or
    /// a wait. Every `Hit` and `Encode` is matched by one [`FeatureStore::release`].
    pub fn acquire(&mut self, hash: u64, bytes: u64) -> Result<Acquired, StoreError> {
        if let Some(entry) = self.entries.get_mut(&hash) {
            entry.refs += 1;
            self.stats.hits += 1;
            return Ok(Acquired::Hit(entry.state));
        }
        if bytes > self.cpu_budget {
            return Err(StoreError::TooLarge {
                bytes,
                budget: self.cpu_budget,
                which: "CPU",
            });
        }
        if !self.make_room(bytes) {
            self.stats.waits += 1;
            return Ok(Acquired::Wait);
        }
        self.stats.misses += 1;
        self.cpu_used += bytes;
        self.entries.insert(
            hash,
            Entry {
                state: FeatureState::Encoding,
                bytes,
                refs: 1,
                released_at: 0,
            },
        );
        Ok(Acquired::Encode)
    }

    /// Evicts unheld encoded items, oldest first, until `bytes` fit; false (and nothing
    /// evicted) when they cannot.
    fn make_room(&mut self, bytes: u64) -> bool {
        let free = self.cpu_budget - self.cpu_used;
        if bytes <= free {
            return true;
        }
        let mut evictable: Vec<(u64, u64, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.refs == 0 && e.state == FeatureState::EncodedCpu)
            .map(|(&h, e)| (e.released_at, h, e.bytes))
            .collect();
        if free + evictable.iter().map(|&(_, _, b)| b).sum::<u64>() < bytes {
            return false;
        }
        evictable.sort_unstable();
        let mut freed = free;
        for (_, hash, size) in evictable {
            if freed >= bytes {
                break;
            }
            self.entries.remove(&hash);
            self.cpu_used -= size;
            freed += size;
            self.stats.evictions += 1;
        }
        true
    }

    fn entry(&mut self, hash: u64) -> Result<&mut Entry, StoreError> {
        self.entries
            .get_mut(&hash)
            .ok_or(StoreError::Unknown { hash })
    }

    fn advance(
        &mut self,
        hash: u64,
        from: FeatureState,
        to: FeatureState,
    ) -> Result<u64, StoreError> {
        let entry = self.entry(hash)?;
        if entry.state != from {
            return Err(StoreError::Illegal {
                hash,
                from: entry.state.name(),
                to: to.name(),
            });
        }
        entry.state = to;
        Ok(entry.bytes)
    }

    /// The encoder finished the item.
    pub fn encoded(&mut self, hash: u64) -> Result<(), StoreError> {
        self.advance(hash, FeatureState::Encoding, FeatureState::EncodedCpu)?;
        // Nobody waits for it any more: the policy decides at once.
        self.settle(hash);
        Ok(())
    }

    /// The encoder failed on the item: its memory is given back and it leaves the store;
    /// the requests holding it fail or fall back (they need not release it).
    pub fn failed(&mut self, hash: u64) -> Result<(), StoreError> {
        let entry = self.entry(hash)?;
        if entry.state != FeatureState::Encoding {
            return Err(StoreError::Illegal {
                hash,
                from: entry.state.name(),
                to: "failed",
            });
        }
        let bytes = entry.bytes;
        self.entries.remove(&hash);
        self.cpu_used -= bytes;
        Ok(())
    }

    /// Copies the item to the engine's staging memory: `Ok(false)` when staging memory is
    /// full (wait, then ask again). Already staged (for another request): `Ok(true)`.
    pub fn stage(&mut self, hash: u64) -> Result<bool, StoreError> {
        let staging_budget = self.staging_budget;
        let free = staging_budget - self.staging_used;
        let entry = self.entry(hash)?;
        match entry.state {
            FeatureState::Staged | FeatureState::Merged => return Ok(true),
            FeatureState::EncodedCpu | FeatureState::Prefilled => {}
            other => {
                return Err(StoreError::Illegal {
                    hash,
                    from: other.name(),
                    to: FeatureState::Staged.name(),
                });
            }
        }
        let bytes = entry.bytes;
        if bytes > staging_budget {
            return Err(StoreError::TooLarge {
                bytes,
                budget: staging_budget,
                which: "staging",
            });
        }
        if bytes > free {
            self.stats.staging_waits += 1;
            return Ok(false);
        }
        entry.state = FeatureState::Staged;
        self.staging_used += bytes;
        Ok(true)
    }

    /// Takes back a staging that did not go ahead: the item is in CPU memory only again.
    pub fn unstage(&mut self, hash: u64) -> Result<(), StoreError> {
        let bytes = self.advance(hash, FeatureState::Staged, FeatureState::EncodedCpu)?;
        self.staging_used -= bytes;
        Ok(())
    }

    /// The engine merged the staged item into the sequence it prefills.
    pub fn merged(&mut self, hash: u64) -> Result<(), StoreError> {
        self.advance(hash, FeatureState::Staged, FeatureState::Merged)
            .map(|_| ())
    }

    /// The engine prefilled the item's positions: its staging memory is given back.
    pub fn prefilled(&mut self, hash: u64) -> Result<(), StoreError> {
        let bytes = self.advance(hash, FeatureState::Merged, FeatureState::Prefilled)?;
        self.staging_used -= bytes;
        Ok(())
    }

    /// A request lets go of the item (finished, failed or gone).
    pub fn release(&mut self, hash: u64) -> Result<(), StoreError> {
        let entry = self.entry(hash)?;
        if entry.refs == 0 {
            return Err(StoreError::NotHeld { hash });
        }
        entry.refs -= 1;
        self.settle(hash);
        Ok(())
    }

    /// An unheld item: out of staging, then dropped or kept as the policy says. Items
    /// still encoding wait for [`FeatureStore::encoded`].
    fn settle(&mut self, hash: u64) {
        let Some(entry) = self.entries.get_mut(&hash) else {
            return;
        };
        if entry.refs > 0 || entry.state == FeatureState::Encoding {
            return;
        }
        if matches!(entry.state, FeatureState::Staged | FeatureState::Merged) {
            self.staging_used -= entry.bytes;
        }
        match self.policy {
            AfterPrefill::Discard => {
                let bytes = entry.bytes;
                self.entries.remove(&hash);
                self.cpu_used -= bytes;
            }
            AfterPrefill::KeepCpu => {
                // The count of items kept is also the clock eviction goes by.
                self.stats.kept += 1;
                entry.state = FeatureState::EncodedCpu;
                entry.released_at = self.stats.kept;
            }
        }
    }

    /// The item's state, if it is in the store.
    pub fn state(&self, hash: u64) -> Option<FeatureState> {
        self.entries.get(&hash).map(|e| e.state)
    }

    /// CPU bytes held by items in `state` (every item holds its CPU copy while in the store).
    pub fn bytes_in(&self, state: FeatureState) -> u64 {
        self.entries
            .values()
            .filter(|e| e.state == state)
            .map(|e| e.bytes)
            .sum()
    }

    pub fn cpu_used(&self) -> u64 {
        self.cpu_used
    }

    pub fn staging_used(&self) -> u64 {
        self.staging_used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn stats(&self) -> StoreStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn an_item_goes_through_its_life_and_leaves_no_memory_behind() {
        let mut store = FeatureStore::new(1_000, 500, AfterPrefill::Discard);
        assert_eq!(store.acquire(7, 300), Ok(Acquired::Encode));
        assert_eq!(
            store.acquire(7, 300),
            Ok(Acquired::Hit(FeatureState::Encoding))
        );
        assert_eq!(store.cpu_used(), 300);
        store.encoded(7).unwrap();
        assert_eq!(store.stage(7), Ok(true));
        assert_eq!(store.staging_used(), 300);
        store.merged(7).unwrap();
        store.prefilled(7).unwrap();
        assert_eq!(store.staging_used(), 0);
        assert_eq!(store.bytes_in(FeatureState::Prefilled), 300);
        store.release(7).unwrap();
        assert_eq!(store.state(7), Some(FeatureState::Prefilled));
        store.release(7).unwrap();
        assert!(store.is_empty());
        assert_eq!((store.cpu_used(), store.staging_used()), (0, 0));
        assert_eq!(store.release(7), Err(StoreError::Unknown { hash: 7 }));
    }

    #[test]
    fn out_of_order_reports_are_errors_that_change_nothing() {
        let mut store = FeatureStore::new(1_000, 500, AfterPrefill::Discard);
        store.acquire(1, 100).unwrap();
        assert!(matches!(
            store.merged(1),
            Err(StoreError::Illegal {
                from: "encoding",
                to: "merged",
                ..
            })
        ));
        assert!(matches!(store.stage(1), Err(StoreError::Illegal { .. })));
        assert!(matches!(
            store.prefilled(1),
            Err(StoreError::Illegal { .. })
        ));
        store.encoded(1).unwrap();
        assert!(matches!(store.encoded(1), Err(StoreError::Illegal { .. })));
        assert!(matches!(store.failed(1), Err(StoreError::Illegal { .. })));
        assert_eq!(store.state(1), Some(FeatureState::EncodedCpu));
        assert_eq!(store.encoded(9), Err(StoreError::Unknown { hash: 9 }));
        assert!(matches!(
            store.acquire(2, 5_000),
            Err(StoreError::TooLarge { which: "CPU", .. })
        ));
    }

    #[test]
    fn kept_items_serve_the_next_request_and_are_evicted_oldest_first_when_room_is_needed() {
        let mut store = FeatureStore::new(1_000, 1_000, AfterPrefill::KeepCpu);
        for hash in [1, 2, 3] {
            assert_eq!(store.acquire(hash, 300), Ok(Acquired::Encode));
            store.encoded(hash).unwrap();
            store.release(hash).unwrap();
        }
        // A second turn sending item 1 again: a hit, no encoding.
        assert_eq!(
            store.acquire(1, 300),
            Ok(Acquired::Hit(FeatureState::EncodedCpu))
        );
        store.release(1).unwrap();
        // Every let-go item was kept (evictable from then on).
        assert_eq!(store.stats().kept, 4);
        // 400 more bytes: the oldest unheld (2, then 3) go; 1 was let go last.
        assert_eq!(store.acquire(4, 400), Ok(Acquired::Encode));
        assert_eq!(store.state(2), None);
        assert_eq!(store.state(3), Some(FeatureState::EncodedCpu));
        assert_eq!(store.stats().evictions, 1);
        // Held or encoding items are never evicted: with nothing evictable, wait.
        store.acquire(3, 300).unwrap();
        store.acquire(1, 300).unwrap();
        assert_eq!(store.acquire(5, 200), Ok(Acquired::Wait));
        assert_eq!(store.stats().waits, 1);
        assert!(store.cpu_used() <= 1_000);
    }

    #[test]
    fn staging_waits_when_full_and_a_failed_encoding_frees_its_reservation() {
        let mut store = FeatureStore::new(1_000, 400, AfterPrefill::Discard);
        for hash in [1, 2] {
            store.acquire(hash, 300).unwrap();
            store.encoded(hash).unwrap();
        }
        assert_eq!(store.stage(1), Ok(true));
        assert_eq!(store.stage(2), Ok(false));
        assert_eq!((store.stats().waits, store.stats().staging_waits), (0, 1));
        store.merged(1).unwrap();
        store.prefilled(1).unwrap();
        assert_eq!(store.stage(2), Ok(true));
        store.acquire(3, 300).unwrap();
        store.failed(3).unwrap();
        assert_eq!(store.state(3), None);
        assert_eq!(store.cpu_used(), 600);
        // A request that goes before its item is prefilled gives its staging back.
        store.release(2).unwrap();
        assert_eq!(store.staging_used(), 0);
        store.release(1).unwrap();
        assert!(store.is_empty());
    }

    /// One step of a request's life against the store.
    #[derive(Debug, Clone)]
    enum Op {
        Acquire(u64, u64),
        Encoded(u64),
        Failed(u64),
        Stage(u64),
        Unstage(u64),
        Merged(u64),
        Prefilled(u64),
        Release(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let hash = 0u64..6;
        prop_oneof![
            (hash.clone(), 1u64..400).prop_map(|(h, b)| Op::Acquire(h, b)),
            hash.clone().prop_map(Op::Encoded),
            hash.clone().prop_map(Op::Failed),
            hash.clone().prop_map(Op::Stage),
            hash.clone().prop_map(Op::Unstage),
            hash.clone().prop_map(Op::Merged),
            hash.clone().prop_map(Op::Prefilled),
            hash.prop_map(Op::Release),
        ]
    }

    /// The naive model: a list of (hash, state, bytes, refs, released order), every rule
    /// spelled out with no bookkeeping shortcuts.
    #[derive(Debug, Default)]
    struct Naive {
        items: Vec<(u64, FeatureState, u64, u32, u64)>,
        clock: u64,
    }

    impl Naive {
        fn cpu(&self) -> u64 {
            self.items.iter().map(|i| i.2).sum()
        }
        fn staging(&self) -> u64 {
            self.items
                .iter()
                .filter(|i| matches!(i.1, FeatureState::Staged | FeatureState::Merged))
                .map(|i| i.2)
                .sum()
        }
        fn find(&self, hash: u64) -> Option<usize> {
            self.items.iter().position(|i| i.0 == hash)
        }
        fn settle(&mut self, at: usize, policy: AfterPrefill) {
            let item = self.items[at];
            if item.3 > 0 || item.1 == FeatureState::Encoding {
                return;
            }
            match policy {
                AfterPrefill::Discard => {
                    self.items.remove(at);
                }
                AfterPrefill::KeepCpu => {
                    self.clock += 1;
                    self.items[at].1 = FeatureState::EncodedCpu;
                    self.items[at].4 = self.clock;
                }
            }
        }
    }

    proptest! {
        #[test]
        fn the_store_agrees_with_a_naive_model_and_never_exceeds_its_budgets(
            ops in proptest::collection::vec(op(), 1..120),
            keep in any::<bool>(),
        ) {
            let (cpu_budget, staging_budget) = (1_000u64, 500u64);
            let policy = if keep { AfterPrefill::KeepCpu } else { AfterPrefill::Discard };
            let mut store = FeatureStore::new(cpu_budget, staging_budget, policy);
            let mut naive = Naive::default();
            for op in ops {
                match op {
                    Op::Acquire(h, b) => {
                        let got = store.acquire(h, b).unwrap();
                        let want = if let Some(at) = naive.find(h) {
                            naive.items[at].3 += 1;
                            Acquired::Hit(naive.items[at].1)
                        } else {
                            let mut evictable: Vec<(u64, u64)> = naive
                                .items
                                .iter()
                                .filter(|i| i.3 == 0 && i.1 == FeatureState::EncodedCpu)
                                .map(|i| (i.4, i.0))
                                .collect();
                            evictable.sort_unstable();
                            let reclaimable: u64 = evictable
                                .iter()
                                .map(|&(_, h)| naive.items[naive.find(h).unwrap()].2)
                                .sum();
                            if cpu_budget - naive.cpu() + reclaimable < b {
                                Acquired::Wait
                            } else {
                                for (_, old) in evictable {
                                    if cpu_budget - naive.cpu() >= b {
                                        break;
                                    }
                                    let at = naive.find(old).unwrap();
                                    naive.items.remove(at);
                                }
                                naive.items.push((h, FeatureState::Encoding, b, 1, 0));
                                Acquired::Encode
                            }
                        };
                        prop_assert_eq!(got, want);
                    }
                    Op::Encoded(h) => {
                        let ok = match naive.find(h) {
                            Some(at) if naive.items[at].1 == FeatureState::Encoding => {
                                naive.items[at].1 = FeatureState::EncodedCpu;
                                naive.settle(at, policy);
                                true
                            }
                            _ => false,
                        };
                        prop_assert_eq!(store.encoded(h).is_ok(), ok);
                    }
                    Op::Failed(h) => {
                        let ok = match naive.find(h) {
                            Some(at) if naive.items[at].1 == FeatureState::Encoding => {
                                naive.items.remove(at);
                                true
                            }
                            _ => false,
                        };
                        prop_assert_eq!(store.failed(h).is_ok(), ok);
                    }
                    Op::Stage(h) => {
                        let want = match naive.find(h) {
                            None => None,
                            Some(at) => match naive.items[at].1 {
                                FeatureState::Staged | FeatureState::Merged => Some(true),
                                FeatureState::EncodedCpu | FeatureState::Prefilled => {
                                    let fits = naive.staging() + naive.items[at].2 <= staging_budget;
                                    if fits {
                                        naive.items[at].1 = FeatureState::Staged;
                                    }
                                    Some(fits)
                                }
                                FeatureState::Encoding => None,
                            },
                        };
                        prop_assert_eq!(store.stage(h).ok(), want);
                    }
                    Op::Unstage(h) => {
                        let ok = match naive.find(h) {
                            Some(at) if naive.items[at].1 == FeatureState::Staged => {
                                naive.items[at].1 = FeatureState::EncodedCpu;
                                true
                            }
                            _ => false,
                        };
                        prop_assert_eq!(store.unstage(h).is_ok(), ok);
                    }
                    Op::Merged(h) => {
                        let ok = match naive.find(h) {
                            Some(at) if naive.items[at].1 == FeatureState::Staged => {
                                naive.items[at].1 = FeatureState::Merged;
                                true
                            }
                            _ => false,
                        };
                        prop_assert_eq!(store.merged(h).is_ok(), ok);
                    }
                    Op::Prefilled(h) => {
                        let ok = match naive.find(h) {
                            Some(at) if naive.items[at].1 == FeatureState::Merged => {
                                naive.items[at].1 = FeatureState::Prefilled;
                                true
                            }
                            _ => false,
                        };
                        prop_assert_eq!(store.prefilled(h).is_ok(), ok);
                    }
                    Op::Release(h) => {
                        let ok = match naive.find(h) {
                            Some(at) if naive.items[at].3 > 0 => {
                                naive.items[at].3 -= 1;
                                naive.settle(at, policy);
                                true
                            }
                            _ => false,
                        };
                        prop_assert_eq!(store.release(h).is_ok(), ok);
                    }
                }
                prop_assert_eq!(store.cpu_used(), naive.cpu());
                prop_assert_eq!(store.staging_used(), naive.staging());
                prop_assert!(store.cpu_used() <= cpu_budget);
                prop_assert!(store.staging_used() <= staging_budget);
                prop_assert_eq!(store.len(), naive.items.len());
                for state in FeatureState::ALL {
                    let want: u64 = naive.items.iter().filter(|i| i.1 == state).map(|i| i.2).sum();
                    prop_assert_eq!(store.bytes_in(state), want);
                }
            }
        }
    }
}
