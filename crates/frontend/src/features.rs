//! The frontend's encoded-feature store: which media items' features exist in the fleet,
//! so an item sent again (the next turn of a conversation) is not encoded again, within
//! the memory budgets of `frontend.multimodal.feature_store`. The bookkeeping is
//! [`switchyard_multimodal::store::FeatureStore`]; this wraps it for concurrent requests
//! and keeps its metrics current. A request holds its items from encoding until its
//! response ends ([`FeatureHold`]); then the policy drops or keeps them. Beside the
//! bookkeeping it keeps the embeddings real encoders computed, for as long as the store
//! keeps their item.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use switchyard_core::protocol::MediaInput;
use switchyard_multimodal::store::{AfterPrefill, FeatureState, FeatureStore, StoreStats};

use crate::metrics::{FeatureStateLabels, Metrics};

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
}

impl Default for FeatureStoreConfig {
    fn default() -> Self {
        FeatureStoreConfig {
            cpu_mib: 16 << 10,
            staging_mib: 4 << 10,
            after_prefill: AfterPrefill::Discard,
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
    waits: Counter,
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
        let out = f(store, payloads);
        if !payloads.is_empty() {
            payloads.retain(|&hash, _| store.state(hash).is_some());
        }
        let stats = store.stats();
        self.evictions.inc_by(stats.evictions - reported.evictions);
        self.waits.inc_by(stats.waits - reported.waits);
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
}

/// A request's hold on its media items' features: let go when dropped (when its response
/// has ended, or it failed).
#[derive(Debug)]
pub struct FeatureHold {
    store: Arc<SharedFeatureStore>,
    held: Vec<u64>,
}

impl FeatureHold {
    pub fn new(store: Arc<SharedFeatureStore>) -> Self {
        FeatureHold {
            store,
            held: Vec::new(),
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
    }

    pub fn store(&self) -> &Arc<SharedFeatureStore> {
        &self.store
    }
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
