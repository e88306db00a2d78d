//! The feature store's part in encoding a request's media: items another turn sent are
//! found there, items another request is encoding are waited for, the rest are reserved
//! for this request and settled (encoded, or gone) once its encoding ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::protocol::MediaInput;

use super::plan::Group;
use super::{Encoded, Frontend};
use crate::feature_store::{FeatureHold, Pending, Reservations, Taken};
use crate::media::MediaItem;
use crate::openai::ApiError;

/// What a request's media take once the store has been asked: its own encoding, the items
/// it reserved for it, the items other requests are encoding, and its deadline.
pub(super) struct Work {
    pub(super) groups: Vec<Group>,
    pub(super) reserved: Reservations,
    pub(super) awaited: Vec<(MediaItem, Pending)>,
    pub(super) deadline: tokio::time::Instant,
    pub(super) timeout: Duration,
}

impl Frontend {
    /// Settles the items a request reserved in the feature store: those `encoded` are
    /// recorded, with their embeddings when the encoders computed them; the others leave
    /// it (and the request's hold).
    pub(super) fn settle(
        &self,
        reserved: Reservations,
        encoded: Option<&Encoded>,
        hold: &mut FeatureHold,
    ) {
        let reserved = reserved.take_all();
        let encoded_hashes: &[u64] = encoded.map_or(&[], |e| e.hashes.as_slice());
        self.features.with_payloads(|store, payloads| {
            for &hash in &reserved {
                let settled = if encoded_hashes.contains(&hash) {
                    store.encoded(hash)
                } else {
                    store.failed(hash)
                };
                match settled {
                    Ok(()) => {
                        if let Some(input) = encoded.and_then(|e| e.features.get(&hash)) {
                            payloads.insert(hash, input.clone());
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the feature store could not settle an item")
                    }
                }
            }
        });
        for &hash in reserved.iter().filter(|h| !encoded_hashes.contains(h)) {
            hold.forget(hash);
        }
    }

    /// Encodes `work.groups` (none: nothing) while waiting, both within the deadline, for
    /// the items other requests are encoding. The items this request reserved are settled
    /// in the store as soon as its own encoding ends, not after the wait: another request
    /// may be waiting for them. An item whose other encoding failed (its encoder failed, or
    /// encoded it smaller under another hash after running out of memory) has left the
    /// store, and this request's hold on it with it: the request encodes it itself.
    pub(super) async fn encode_and_wait(
        &self,
        work: Work,
        hold: &parking_lot::Mutex<FeatureHold>,
    ) -> Result<Encoded, ApiError> {
        let Work {
            groups,
            reserved,
            awaited,
            deadline,
            timeout,
        } = work;
        let own = async {
            let outcome = self.run_plan_by(&groups, deadline, timeout).await;
            // The items this request reserved are encoded now, or leave the store.
            self.settle(reserved, outcome.as_ref().ok(), &mut hold.lock());
            outcome
        };
        let others =
            futures::future::join_all(awaited.into_iter().map(|(item, pending)| async move {
                let done = tokio::time::timeout_at(deadline, pending.wait()).await.ok();
                (item, done)
            }));
        let (own, others) = futures::join!(own, others);
        let mut again = Vec::new();
        let mut waited = Vec::new();
        let mut late = false;
        for (item, done) in others {
            match done {
                Some(true) => waited.push(item.hash),
                Some(false) => {
                    hold.lock().forget(item.hash);
                    again.push(item);
                }
                None => late = true,
            }
        }
        let mut encoded = own?;
        if late {
            return Err(self.timed_out(timeout));
        }
        if !waited.is_empty() {
            self.metrics.count_media_encode("waited");
        }
        for hash in waited {
            // Not encoded again: the store had it by the time it was needed.
            self.hit(hash, &mut encoded.features);
        }
        if !again.is_empty() {
            let more = self.encode_again(&again, hold, deadline, timeout).await?;
            encoded.hashes.extend(more.hashes);
            encoded.resized.extend(more.resized);
            encoded.features.extend(more.features);
        }
        Ok(encoded)
    }

    /// Encodes `items` whose other encoding failed: taken from the store again (reserved,
    /// or found there; one another request is encoding again is encoded too rather than
    /// waited for twice), then encoded and settled.
    async fn encode_again(
        &self,
        items: &[MediaItem],
        hold: &parking_lot::Mutex<FeatureHold>,
        deadline: tokio::time::Instant,
        timeout: Duration,
    ) -> Result<Encoded, ApiError> {
        let per_token = self.media.encoder_cost().embedding_bytes_per_token;
        let mut reserved = Reservations::new(Arc::clone(&self.features));
        let mut to_encode = Vec::new();
        let mut found = HashMap::new();
        for item in items {
            let bytes = u64::from(item.tokens).saturating_mul(per_token);
            let bound = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.features.take(item.hash, bytes, bound).await {
                Some(Ok((taken, generation))) => {
                    hold.lock().push(item.hash, generation);
                    match taken {
                        Taken::Encode => {
                            reserved.push(item.hash, generation);
                            to_encode.push(item.clone());
                        }
                        Taken::Hit => self.hit(item.hash, &mut found),
                        Taken::Pending(_) | Taken::EncodeToo => to_encode.push(item.clone()),
                    }
                }
                Some(Err(_)) => to_encode.push(item.clone()),
                None => {
                    self.settle(reserved, None, &mut hold.lock());
                    return Err(self.timed_out(timeout));
                }
            }
        }
        self.features.start(reserved.hashes().collect::<Vec<_>>());
        let groups = self.groups_for(&to_encode);
        let outcome = self.run_plan_by(&groups, deadline, timeout).await;
        self.settle(reserved, outcome.as_ref().ok(), &mut hold.lock());
        outcome.map(|mut encoded| {
            encoded.features.extend(found);
            encoded
        })
    }

    /// Item `hash` found in the feature store: counted as a hit, its embeddings (if the
    /// store keeps any) added to `features`.
    fn hit(&self, hash: u64, features: &mut HashMap<u64, MediaInput>) {
        self.metrics.feature_store_hits.inc();
        if let Some(input) = self.features.payload(hash) {
            features.insert(hash, input);
        }
    }

    /// Takes the request's items in the feature store: those it has are not encoded
    /// again; the others are reserved (`reserved`) and returned, to encode. An item a
    /// request sends twice is encoded once. Waits while the store has no room (bounded by
    /// the caller's timeout). Without encoder workers nothing is encoded, so nothing is
    /// stored. `None` when no room came in time.
    pub(super) async fn hold_features(
        &self,
        items: &[MediaItem],
        hold: &mut FeatureHold,
        reserved: &mut Reservations,
        awaited: &mut Vec<(MediaItem, Pending)>,
        features: &mut HashMap<u64, MediaInput>,
    ) -> Option<Vec<MediaItem>> {
        if items.is_empty() || self.routing.encoders().is_empty() {
            return Some(items.to_vec());
        }
        let per_token = self.media.encoder_cost().embedding_bytes_per_token;
        let mut to_encode: Vec<MediaItem> = Vec::new();
        for item in items {
            if to_encode.iter().any(|i| i.hash == item.hash) || hold.holds(item.hash) {
                continue;
            }
            let bytes = u64::from(item.tokens).saturating_mul(per_token);
            // No room: wait for memory to be given back (the caller bounds the wait).
            let taken = self
                .features
                .take(item.hash, bytes, self.media.on_encoder_failure().1)
                .await;
            {
                match taken {
                    Some(Ok((Taken::Pending(pending), generation))) => {
                        // Another request is encoding it: wait for that encoding.
                        hold.push(item.hash, generation);
                        awaited.push((item.clone(), pending));
                    }
                    Some(Ok((Taken::EncodeToo, generation))) => {
                        // Reserved by a request that has not started on it (it may be
                        // waiting for room): encode it too rather than wait.
                        hold.push(item.hash, generation);
                        to_encode.push(item.clone());
                    }
                    Some(Ok((Taken::Hit, generation))) => {
                        hold.push(item.hash, generation);
                        self.hit(item.hash, features);
                    }
                    Some(Ok((Taken::Encode, generation))) => {
                        hold.push(item.hash, generation);
                        reserved.push(item.hash, generation);
                        to_encode.push(item.clone());
                    }
                    // Out of time (the caller's timeout has passed by now).
                    None => return None,
                    Some(Err(e)) => {
                        // Larger than the whole store: encoded, not kept.
                        tracing::debug!(error = %e, "a media item bypasses the feature store");
                        to_encode.push(item.clone());
                    }
                }
            }
        }
        Some(to_encode)
    }
}
