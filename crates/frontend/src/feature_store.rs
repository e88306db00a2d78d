//! The frontend's encoded-feature store: which media items' features exist in the fleet,
//! so an item sent again (the next turn of a conversation) is not encoded again, within
//! the memory budgets of `frontend.multimodal.feature_store`. The bookkeeping is
//! [`switchyard_multimodal::store::FeatureStore`]; this wraps it for concurrent requests
//! and keeps its metrics current. A request holds its items from encoding until its
//! response ends ([`FeatureHold`]); then the policy drops or keeps them. Beside the
//! bookkeeping it keeps the embeddings real encoders computed, for as long as the store
//! keeps their item.
//!
//! A request that finds an item another request has started encoding does not encode it
//! again: it holds it too and waits for that encoding ([`Taken::Pending`]); if that
//! encoding fails, the item leaves the store, every request waiting on it is told (and
//! encodes it itself). Each stay of an item in the store is its own generation, so a hold
//! on an item that left is never taken for a hold on the item that came back; a request's
//! reservations not settled when it goes away (a client that hung up) fail
//! ([`Reservations`]), so nobody waits on them.
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
    Acquired, AfterPrefill, FeatureState, FeatureStore, StoreError, StoreStats,
};
use tokio::sync::{Notify, watch};

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
    /// Items being encoded (see [`Encoding`]).
    encoding: HashMap<u64, Encoding>,
    /// Each item's generation: an item that left the store and came back is another.
    generations: HashMap<u64, u64>,
    next_generation: u64,
}

/// An item being encoded: the channel its waiting requests watch (`None` while encoding,
/// then `Some(true)` once encoded or `Some(false)` once it left the store), and whether its
/// encoding has started (a request still waiting for room to reserve its other items has
/// not started: another request waiting on it could wait on that request).
#[derive(Debug)]
struct Encoding {
    done: watch::Sender<Option<bool>>,
    started: bool,
}

/// How a request took one of its media items (see [`SharedFeatureStore::take`]).
#[derive(Debug)]
pub enum Taken {
    /// The store has the item (in any state after encoding).
    Hit,
    /// The item is new: reserved for this request to encode.
    Encode,
    /// Another request is encoding the item: held for this one too; the channel says when
    /// that encoding ends (see [`Pending::wait`]).
    Pending(Pending),
    /// Another request has reserved the item but not started encoding it: held for this
    /// one too; encode it too (the result is not stored).
    EncodeToo,
}

/// An item another request is encoding.
#[derive(Debug)]
pub struct Pending {
    pub hash: u64,
    done: watch::Receiver<Option<bool>>,
}

impl Pending {
    /// Waits for the other request's encoding: true when it encoded the item, false when
    /// it failed (the item left the store, and this request's hold on it with it).
    pub async fn wait(mut self) -> bool {
        matches!(
            self.done.wait_for(Option::is_some).await.as_deref(),
            Ok(Some(true))
        )
    }
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
                encoding: HashMap::new(),
                generations: HashMap::new(),
                next_generation: 0,
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
        self.locked(|inner| f(&mut inner.store, &mut inner.payloads))
    }

    /// Runs `f` on the store's state, then [`SharedFeatureStore::after`].
    fn locked<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let before = before_of(&inner.store);
        let out = f(inner);
        self.after(inner, before);
        out
    }

    /// Takes item `hash` of `bytes` for a request, as [`FeatureStore::acquire`] does, and
    /// for an item another request is encoding, the channel to wait on; with the item's
    /// generation (for [`FeatureHold::push`]). Waits while the store has no room, at most
    /// `bound`; `None` when the time ran out.
    pub async fn take(
        &self,
        hash: u64,
        bytes: u64,
        bound: Duration,
    ) -> Option<Result<(Taken, u64), StoreError>> {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            // Registered before looking, so memory freed in between is not missed.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let taken = self.locked(|inner| {
                let taken = match inner.store.acquire(hash, bytes) {
                    Ok(Acquired::Wait) => None,
                    Ok(Acquired::Encode) => {
                        inner.encoding.insert(
                            hash,
                            Encoding {
                                done: watch::Sender::new(None),
                                started: false,
                            },
                        );
                        Some(Ok(Taken::Encode))
                    }
                    Ok(Acquired::Hit(FeatureState::Encoding)) => {
                        Some(Ok(match inner.encoding.get(&hash) {
                            Some(e) if e.started => Taken::Pending(Pending {
                                hash,
                                done: e.done.subscribe(),
                            }),
                            _ => Taken::EncodeToo,
                        }))
                    }
                    Ok(Acquired::Hit(_)) => Some(Ok(Taken::Hit)),
                    Err(e) => Some(Err(e)),
                };
                // An item new to the store (or back in it) starts a generation.
                taken.map(|t| {
                    t.map(|t| {
                        let next = &mut inner.next_generation;
                        let generation = *inner.generations.entry(hash).or_insert_with(|| {
                            *next += 1;
                            *next
                        });
                        (t, generation)
                    })
                })
            });
            if taken.is_some() {
                return taken;
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return None;
            }
        }
    }

    /// After a change to the store: wakes whoever waits for room or for an encoding, drops
    /// the embeddings of items that left, and brings the metrics up to date.
    fn after(&self, inner: &mut Inner, before: (u64, u64, u64)) {
        let Inner {
            store,
            reported,
            payloads,
            encoding,
            generations,
            next_generation: _,
        } = inner;
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
        if !encoding.is_empty() {
            encoding.retain(|&hash, e| match store.state(hash) {
                Some(FeatureState::Encoding) => true,
                state => {
                    e.done.send_replace(Some(state.is_some()));
                    false
                }
            });
        }
        if !generations.is_empty() {
            generations.retain(|&hash, _| store.state(hash).is_some());
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
    }

    /// The request reserving `hashes` starts encoding them: from now on other requests
    /// wait for it rather than encode them too.
    pub fn start(&self, hashes: impl IntoIterator<Item = u64>) {
        let mut inner = self.inner.lock();
        for hash in hashes {
            if let Some(e) = inner.encoding.get_mut(&hash) {
                e.started = true;
            }
        }
    }

    /// Lets go of `held` (item, generation): items that left the store meanwhile (their
    /// encoding failed) are not released, whatever came back under their hash.
    fn release_held(&self, held: Vec<(u64, u64)>) {
        self.locked(|inner| {
            for (hash, generation) in held {
                if inner.generations.get(&hash) != Some(&generation) {
                    continue;
                }
                // Only items this request took are here: a failure is a bookkeeping bug,
                // logged rather than fatal.
                if let Err(e) = inner.store.release(hash) {
                    tracing::warn!(error = %e, "the feature store could not release an item");
                }
            }
        });
    }

    /// Fails `reserved` (item, generation) still being encoded: they leave the store and
    /// the requests waiting for them are told.
    fn fail_unsettled(&self, reserved: Vec<(u64, u64)>) {
        self.locked(|inner| {
            for (hash, generation) in reserved {
                if inner.generations.get(&hash) == Some(&generation)
                    && inner.store.state(hash) == Some(FeatureState::Encoding)
                    && let Err(e) = inner.store.failed(hash)
                {
                    tracing::warn!(error = %e, "the feature store could not fail an item");
                }
            }
        });
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

/// What [`SharedFeatureStore::after`] compares with: CPU and staging memory in use, and
/// the items kept.
fn before_of(store: &FeatureStore) -> (u64, u64, u64) {
    (store.cpu_used(), store.staging_used(), store.stats().kept)
}

/// A request's hold on its media items' features: let go when dropped (when its response
/// has ended, or it failed).
#[derive(Debug)]
pub struct FeatureHold {
    store: Arc<SharedFeatureStore>,
    /// Held items, with their generations.
    held: Vec<(u64, u64)>,
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

    /// Records that the request holds `hash` of `generation` (taken from the store).
    pub fn push(&mut self, hash: u64, generation: u64) {
        self.held.push((hash, generation));
    }

    /// Whether the request holds `hash`.
    pub fn holds(&self, hash: u64) -> bool {
        self.held.iter().any(|&(h, _)| h == hash)
    }

    /// Forgets `hash` (its encoding failed: it left the store).
    pub fn forget(&mut self, hash: u64) {
        self.held.retain(|&(h, _)| h != hash);
        self.staged.retain(|&h| h != hash);
    }

    /// The held items among `hashes` (the media of the prompt about to go to a worker),
    /// still in the store in the generation held (an item that left and came back is
    /// another request's to stage).
    pub fn held_among(&self, hashes: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let inner = self.store.inner.lock();
        let current = |&(h, g): &(u64, u64)| inner.generations.get(&h) == Some(&g);
        let mut out: Vec<u64> = hashes
            .into_iter()
            .filter(|&h| self.held.iter().any(|held| held.0 == h && current(held)))
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
        self.store.release_held(held);
    }
}

/// The items a request reserved to encode (with their generations): recorded encoded or
/// failed by [`Reservations::take_all`]'s caller; those still reserved when it is dropped
/// (the request went away first) fail.
#[derive(Debug)]
pub struct Reservations {
    store: Arc<SharedFeatureStore>,
    items: Vec<(u64, u64)>,
}

impl Reservations {
    pub fn new(store: Arc<SharedFeatureStore>) -> Self {
        Reservations {
            store,
            items: Vec::new(),
        }
    }

    pub fn push(&mut self, hash: u64, generation: u64) {
        self.items.push((hash, generation));
    }

    pub fn hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.items.iter().map(|&(h, _)| h)
    }

    /// The reserved items' hashes, now the caller's to settle.
    pub fn take_all(mut self) -> Vec<u64> {
        std::mem::take(&mut self.items)
            .into_iter()
            .map(|(h, _)| h)
            .collect()
    }
}

impl Drop for Reservations {
    fn drop(&mut self) {
        if !self.items.is_empty() {
            self.store.fail_unsettled(std::mem::take(&mut self.items));
        }
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
    async fn a_request_finding_its_item_being_encoded_waits_for_that_encoding() {
        let store = one_item_store();
        let kib = 1 << 10;
        let bound = Duration::from_secs(1);
        let take = |hash| {
            let store = Arc::clone(&store);
            async move { store.take(hash, kib, bound).await.unwrap().unwrap() }
        };
        // The first request reserves item 1; until it starts encoding, a second request
        // encodes it too (the first may be waiting for room for its other items).
        let (taken, first) = take(1).await;
        assert!(matches!(taken, Taken::Encode));
        assert!(matches!(take(1).await.0, Taken::EncodeToo));
        store.start([1]);
        let (Taken::Pending(pending), generation) = take(1).await else {
            panic!("the third request should wait for the first's encoding");
        };
        assert_eq!(generation, first, "the same stay in the store");
        let waiter = tokio::spawn(pending.wait());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "told before the encoding ended");
        store.with(|s| s.encoded(1)).unwrap();
        assert!(waiter.await.unwrap(), "the encoding succeeded");
        assert!(matches!(take(1).await.0, Taken::Hit));
        store.release_held(vec![(1, first); 4]);
        store.with(|s| assert_eq!(s.state(1), Some(FeatureState::EncodedCpu)));

        // A failed encoding: the waiter is told, and the item (with every hold on it) is
        // gone; the next request to send it encodes it afresh, in a new generation, and is
        // not told of the old failure.
        let (_, old) = take(2).await;
        store.start([2]);
        let (Taken::Pending(pending), _) = take(2).await else {
            panic!("the second request should wait for the first's encoding");
        };
        store.with(|s| s.failed(2)).unwrap();
        assert!(!pending.wait().await, "the encoding failed");
        let (taken, new) = take(2).await;
        assert!(matches!(taken, Taken::Encode));
        assert_ne!(new, old, "another stay in the store");
        store.start([2]);
        let (Taken::Pending(again), _) = take(2).await else {
            panic!("waits for the new encoding");
        };
        let waiter = tokio::spawn(again.wait());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "told of the old encoding's failure");
        // The old holds let go: nothing of the new stay is released.
        store.release_held(vec![(2, old); 2]);
        store.with(|s| s.encoded(2)).unwrap();
        assert!(waiter.await.unwrap());
        store.release_held(vec![(2, new)]);
        store.with(|s| {
            assert_eq!(
                s.state(2),
                Some(FeatureState::EncodedCpu),
                "still held once"
            );
            s.release(2).unwrap();
        });
        assert!(
            store.inner.lock().encoding.is_empty(),
            "no channel left behind"
        );

        // A hold on the old stay of item 2 is not a hold on the new one: nothing of it
        // is staged.
        let mut stale = FeatureHold::new(Arc::clone(&store));
        stale.push(2, old);
        assert_eq!(stale.held_among([2]), Vec::<u64>::new());
        stale.push(2, new);
        assert_eq!(stale.held_among([2]), vec![2]);
        stale.held.clear();

        // A request that goes away with its reservation unsettled: the item fails, and a
        // request waiting for it is told at once.
        let mut reserved = Reservations::new(Arc::clone(&store));
        let (taken, generation) = take(3).await;
        assert!(matches!(taken, Taken::Encode));
        reserved.push(3, generation);
        store.start(reserved.hashes().collect::<Vec<_>>());
        let (Taken::Pending(pending), _) = take(3).await else {
            panic!("waits for the reserving request");
        };
        drop(reserved);
        assert!(!pending.wait().await, "told of the abandoned reservation");
        store.with(|s| assert_eq!(s.state(3), None));
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
