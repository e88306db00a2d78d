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
mod tests;
