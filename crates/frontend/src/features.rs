//! The frontend's encoded-feature store: which media items' features exist in the fleet,
//! so an item sent again (the next turn of a conversation) is not encoded again, within
//! the memory budgets of `frontend.multimodal.feature_store`. The bookkeeping is
//! [`switchyard_multimodal::store::FeatureStore`]; this wraps it for concurrent requests
//! and keeps its metrics current. A request holds its items from encoding until its
//! response ends ([`FeatureHold`]); then the policy drops or keeps them. Beside the
//! bookkeeping it keeps the embeddings real encoders computed, for as long as the store
//! keeps their item.
//!
//! The states after encoding follow the request: its items are STAGED when they go to its
//! LLM worker (with the request, or when it is told they are ready), within the staging
//! budget, which stands for the engines' memory for features they have not prefilled yet
//! (a request waits for room, bounded by `staging_wait`); MERGED and PREFILLED at its first
//! token, which the engine sends once it has computed the prompt, media included (engines
//! report no separate merge), giving the staging memory back. A request moved to another
//! worker stages them again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use switchyard_core::protocol::MediaInput;
use switchyard_multimodal::store::{
    AfterPrefill, FeatureState, FeatureStore, StoreError, StoreStats,
};
use tokio::sync::Notify;

use crate::metrics::{FeatureStateLabels, MemoryLabels, Metrics};

/// `frontend.multimodal.feature_store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeatureStoreConfig {
    /// CPU memory for encoded features, in MiB.
    pub cpu_mib: u64,
    /// The engines' staging memory for them, in MiB.
    pub staging_mib: u64,
    /// Once no request holds an item: `discard` it (the KV cache holds its effect), or
    /// `keep_cpu` for the next request that sends it.
    pub after_prefill: AfterPrefill,
    /// How long a request waits for staging memory before it is refused (503).
    #[serde(with = "humantime_serde")]
    pub staging_wait: Duration,
}

impl Default for FeatureStoreConfig {
    fn default() -> Self {
        FeatureStoreConfig {
            cpu_mib: 16 << 10,
            staging_mib: 4 << 10,
            after_prefill: AfterPrefill::Discard,
            staging_wait: Duration::from_secs(30),
        }
    }
}

#[derive(Debug)]
struct Inner {
    store: FeatureStore,
    /// The stats the metrics show.
    reported: StoreStats,
    /// The embeddings of items in the store, by item hash.
    payloads: HashMap<u64, MediaInput>,
}

/// The store, shared by the frontend's requests.
#[derive(Debug)]
pub struct SharedFeatureStore {
    inner: Mutex<Inner>,
    bytes: Family<FeatureStateLabels, Gauge>,
    evictions: Counter,
    waits: Family<MemoryLabels, Counter>,
    /// Woken whenever memory (CPU or staging) is given back.
    freed: Notify,
    staging_wait: Duration,
}

/// Why a request's items could not be staged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StagingRefused {
    /// No room came within `staging_wait`.
    Full(Duration),
}

impl SharedFeatureStore {
    pub fn new(config: &FeatureStoreConfig, metrics: &Metrics) -> Arc<Self> {
        let store = FeatureStore::new(
            config.cpu_mib << 20,
            config.staging_mib << 20,
            config.after_prefill,
        );
        Arc::new(SharedFeatureStore {
            inner: Mutex::new(Inner {
                store,
                reported: StoreStats::default(),
                payloads: HashMap::new(),
            }),
            bytes: metrics.feature_store_bytes.clone(),
            evictions: metrics.feature_store_evictions.clone(),
            waits: metrics.feature_store_waits.clone(),
            freed: Notify::new(),
            staging_wait: config.staging_wait,
        })
    }

    /// Runs `f` on the store, then brings the metrics up to date.
    pub fn with<R>(&self, f: impl FnOnce(&mut FeatureStore) -> R) -> R {
        self.with_payloads(|store, _| f(store))
    }

    /// Runs `f` on the store and the embeddings it keeps, then drops the embeddings of
    /// items no longer in it and brings the metrics up to date.
    pub fn with_payloads<R>(
        &self,
        f: impl FnOnce(&mut FeatureStore, &mut HashMap<u64, MediaInput>) -> R,
    ) -> R {
        let mut inner = self.inner.lock();
        let Inner {
            store,
            reported,
            payloads,
        } = &mut *inner;
        let before = (store.cpu_used(), store.staging_used(), store.stats().kept);
        let out = f(store, payloads);
        // Memory given back, or an item that may now be evicted to make room: whoever
        // waits for room looks again.
        if store.cpu_used() < before.0
            || store.staging_used() < before.1
            || store.stats().kept > before.2
        {
            self.freed.notify_waiters();
        }
        if !payloads.is_empty() {
            payloads.retain(|&hash, _| store.state(hash).is_some());
        }
        let stats = store.stats();
        self.evictions.inc_by(stats.evictions - reported.evictions);
        for (memory, now, before) in [
            ("cpu", stats.waits, reported.waits),
            ("staging", stats.staging_waits, reported.staging_waits),
        ] {
            self.waits
                .get_or_create(&MemoryLabels { memory })
                .inc_by(now - before);
        }
        *reported = stats;
        for state in FeatureState::ALL {
            self.bytes
                .get_or_create(&FeatureStateLabels {
                    state: state.name(),
                })
                .set(i64::try_from(store.bytes_in(state)).unwrap_or(i64::MAX));
        }
        out
    }

    /// The embeddings the store keeps for item `hash`.
    pub fn payload(&self, hash: u64) -> Option<MediaInput> {
        self.inner.lock().payloads.get(&hash).cloned()
    }

    /// How many items' embeddings it keeps.
    pub fn payloads(&self) -> usize {
        self.inner.lock().payloads.len()
    }

    /// Runs `f` on the store until it answers `Some` (the attempt made room, or needed
    /// none), waiting for memory to be given back between attempts, at most `bound` in
    /// all; `None` when the time ran out.
    pub async fn when_freed<R>(
        &self,
        bound: Duration,
        mut f: impl FnMut(&mut FeatureStore) -> Option<R>,
    ) -> Option<R> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            // Registered before looking, so memory freed in between is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(out) = self.with(&mut f) {
                return Some(out);
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return None;
            }
        }
    }
}

/// A request's hold on its media items' features: let go when dropped (when its response
/// has ended, or it failed).
#[derive(Debug)]
pub struct FeatureHold {
    store: Arc<SharedFeatureStore>,
    held: Vec<u64>,
    /// Held items this request staged whose positions its worker has not prefilled yet.
    staged: Vec<u64>,
}

impl FeatureHold {
    pub fn new(store: Arc<SharedFeatureStore>) -> Self {
        FeatureHold {
            store,
            held: Vec::new(),
            staged: Vec::new(),
        }
    }

    /// Records that the request holds `hash` (acquired from the store).
    pub fn push(&mut self, hash: u64) {
        self.held.push(hash);
    }

    /// Whether the request holds `hash`.
    pub fn holds(&self, hash: u64) -> bool {
        self.held.contains(&hash)
    }

    /// Forgets `hash` (its encoding failed: it left the store).
    pub fn forget(&mut self, hash: u64) {
        self.held.retain(|&h| h != hash);
        self.staged.retain(|&h| h != hash);
    }

    /// The held items among `hashes` (the media of the prompt about to go to a worker).
    pub fn held_among(&self, hashes: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut out: Vec<u64> = hashes
            .into_iter()
            .filter(|h| self.held.contains(h))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Records that the request staged `hashes` (see [`stage`]).
    pub fn staged(&mut self, hashes: &[u64]) {
        for &hash in hashes {
            if !self.staged.contains(&hash) {
                self.staged.push(hash);
            }
        }
    }

    /// The request's worker computed its prompt: its staged items are merged and
    /// prefilled, and their staging memory given back. Items another request has taken
    /// further already are left as they are.
    pub fn prefilled(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        let staged = std::mem::take(&mut self.staged);
        self.store.with(|store| {
            for hash in staged {
                let done = match store.state(hash) {
                    Some(FeatureState::Staged) => {
                        store.merged(hash).and_then(|()| store.prefilled(hash))
                    }
                    Some(FeatureState::Merged) => store.prefilled(hash),
                    _ => Ok(()),
                };
                if let Err(e) = done {
                    tracing::warn!(error = %e, "the feature store could not record a prefill");
                }
            }
        });
    }

    pub fn store(&self) -> &Arc<SharedFeatureStore> {
        &self.store
    }
}

/// Stages `hold`'s items among `hashes` for a worker: waits (at most the store's
/// `staging_wait`) until the staging budget has room for all of them at once. Items larger
/// than the whole budget, or not encoded (yet), are sent without staging.
pub async fn stage(
    hold: &parking_lot::Mutex<FeatureHold>,
    hashes: impl IntoIterator<Item = u64>,
) -> Result<(), StagingRefused> {
    let (store, wanted) = {
        let hold = hold.lock();
        (Arc::clone(&hold.store), hold.held_among(hashes))
    };
    if wanted.is_empty() {
        return Ok(());
    }
    let bound = store.staging_wait;
    let staged = store
        .when_freed(bound, |s| stage_together(s, &wanted))
        .await
        .ok_or(StagingRefused::Full(bound))?;
    hold.lock().staged(&staged);
    Ok(())
}

/// Stages every item of `wanted` that can be, or none while the budget lacks room for one
/// of them (so two requests never hold half of each other's room): `None` to wait.
fn stage_together(store: &mut FeatureStore, wanted: &[u64]) -> Option<Vec<u64>> {
    // The items this call staged: another request's staged item is that request's to
    // see prefilled.
    let mut staged = Vec::new();
    for &hash in wanted {
        let before = store.state(hash);
        match store.stage(hash) {
            Ok(true) if before != store.state(hash) => staged.push(hash),
            Ok(true) => {}
            Ok(false) => {
                for &done in &staged {
                    if let Err(e) = store.unstage(done) {
                        tracing::warn!(error = %e, "the feature store could not unstage an item");
                    }
                }
                return None;
            }
            Err(StoreError::TooLarge { .. } | StoreError::Illegal { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "the feature store could not stage an item"),
        }
    }
    Some(staged)
}

impl Drop for FeatureHold {
    fn drop(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let held = std::mem::take(&mut self.held);
        self.store.with(|store| {
            for hash in held {
                // Only items this request took are here: a failure is a bookkeeping bug,
                // logged rather than fatal.
                if let Err(e) = store.release(hash) {
                    tracing::warn!(error = %e, "the feature store could not release an item");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use switchyard_multimodal::store::Acquired;

    use super::*;

    /// A store with room for one item of 1 MiB, kept after its request lets it go.
    fn one_item_store() -> Arc<SharedFeatureStore> {
        let config = FeatureStoreConfig {
            cpu_mib: 1,
            staging_mib: 1,
            after_prefill: AfterPrefill::KeepCpu,
            staging_wait: Duration::from_secs(30),
        };
        SharedFeatureStore::new(&config, &Metrics::default())
    }

    #[tokio::test]
    async fn a_request_waiting_for_cpu_memory_wakes_when_an_item_becomes_evictable() {
        let store = one_item_store();
        let mib = 1 << 20;
        store.with(|s| {
            assert_eq!(s.acquire(1, mib), Ok(Acquired::Encode));
            s.encoded(1).unwrap();
        });
        // Item 1 is held: item 2 waits for room.
        let waiter = tokio::spawn({
            let store = Arc::clone(&store);
            async move {
                store
                    .when_freed(Duration::from_secs(5), |s| match s.acquire(2, mib) {
                        Ok(Acquired::Wait) => None,
                        other => Some(other),
                    })
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        // Let go and kept: no memory is given back, but item 1 may now be evicted.
        store.with(|s| s.release(1)).unwrap();
        assert_eq!(waiter.await.unwrap(), Some(Ok(Acquired::Encode)));
        store.with(|s| {
            assert_eq!(s.state(1), None);
            assert_eq!(s.stats().evictions, 1);
        });
    }
}
