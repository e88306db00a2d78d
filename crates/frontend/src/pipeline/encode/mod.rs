//! Media encoding on the fleet's encoder workers: a request's items go to the encoder
//! workers that take their modality, the items one pool takes to one worker of it (so they
//! may share batches), chosen by `frontend.multimodal.encoder_policy`; a worker that cannot
//! take them hands them to the next; the request is routed once they
//! are encoded. Joint routing first: when the worker predicted to answer soonest already
//! holds the media's KV (the same image behind the same text), nothing is encoded and the
//! request is pinned to that worker.
//!
//! - [`plan`]: which encoder workers take which items, and whether to encode at all.
//! - [`encoders`]: sending the items to encoder workers, smaller when memory runs out.
//! - [`store`]: the feature store's part: items found, waited for, reserved and settled.
//! - [`prompt`]: what the prompt becomes when its media are resized or dropped.

mod encoders;
mod plan;
mod prompt;
mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use switchyard_core::WorkerId;
use switchyard_core::protocol::{MediaInput, Prompt};
use tokio::sync::watch;

use super::Frontend;
use crate::feature_store::{FeatureHold, Reservations};
use crate::media::{MediaItem, OnEncoderFailure};
use crate::openai::ApiError;
use plan::Plan;
use prompt::strip_media;
pub use prompt::{resize_media, resized_warning, text_only_warning};
use store::Work;

/// The response header that carries a warning about how the request was served.
pub const WARNING_HEADER: &str = "x-switchyard-warning";

/// Media items' embeddings by item hash, for LLM workers that merge them into the
/// sequences they prefill (real encoders compute them; modelled ones compute none).
pub type MediaFeatures = Arc<HashMap<u64, MediaInput>>;

/// Where a request sent ahead of its media stands with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaStatus {
    Encoding,
    /// Encoded; these items smaller than the prompt has them; the embeddings computed.
    Ready(Vec<Resized>, MediaFeatures),
    /// They could not be encoded: why, for the client.
    Failed(String),
}

/// A request's items held in the feature store, shared by the request and the encoding
/// that goes on behind it: let go when both are done.
pub type SharedHold = Arc<parking_lot::Mutex<FeatureHold>>;

/// A request's media, ready for its LLM worker or on their way to it.
#[derive(Debug)]
pub struct MediaReady {
    /// How the request is served differently from what it asked (its media were dropped).
    pub warning: Option<String>,
    /// Keeps the request's items in the feature store until dropped (when the response
    /// ends).
    pub hold: SharedHold,
    /// The worker the request must go to: it holds the media's KV, which is why they were
    /// not encoded.
    pub worker: Option<WorkerId>,
    /// The media are still being encoded and the request goes ahead of them
    /// (`frontend.multimodal.overlap`): this says when they are ready, or why not.
    pub pending: Option<watch::Receiver<MediaStatus>>,
    /// The embeddings of the items encoded (or found in the feature store) by now.
    pub features: MediaFeatures,
}

/// How many times an item an encoder has no memory for is halved before the request fails.
pub const MAX_HALVINGS: u32 = 3;

/// An item encoded smaller than the request sent it (its encoder ran out of memory): the
/// prompt's span of item `from` becomes `tokens` positions of item `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resized {
    pub from: u64,
    pub to: u64,
    pub tokens: u32,
}

/// What [`Frontend::encode_media`] did.
#[derive(Debug, Default)]
pub struct Encoded {
    /// The items encoded as they were.
    pub hashes: Vec<u64>,
    /// The items encoded smaller.
    pub resized: Vec<Resized>,
    /// Nothing was encoded because this worker holds the media's KV and is predicted to
    /// answer soonest: the request is to go there.
    pub holder: Option<WorkerId>,
    /// The embeddings the encoders computed, by the hash of the item encoded.
    pub features: HashMap<u64, MediaInput>,
}

impl Frontend {
    /// Encodes the request's media as [`Frontend::encode_media`] does, within
    /// `frontend.multimodal.encode_timeout`, except items whose features the feature store
    /// has (another turn sent them). With `frontend.multimodal.overlap`, the encoding goes
    /// on behind the request (see [`MediaReady::pending`]). When the media cannot be
    /// encoded, either the request fails (a 503) or, with `on_encoder_failure =
    /// "text_only"`, its media placeholders are stripped from `prompt` and the request goes
    /// on from its text alone: the warning to send with the response.
    pub async fn encode_or_fall_back(
        self: &Arc<Self>,
        items: &[MediaItem],
        prompt: &mut Prompt,
    ) -> Result<MediaReady, ApiError> {
        let (policy, timeout) = self.media.on_encoder_failure();
        let deadline = tokio::time::Instant::now() + timeout;
        let mut hold = FeatureHold::new(Arc::clone(&self.features));
        let mut reserved = Reservations::new(Arc::clone(&self.features));
        // Items other requests are encoding: waited for, not encoded again.
        let mut awaited = Vec::new();
        // The embeddings of the items the store has.
        let mut features = HashMap::new();
        let held = tokio::time::timeout_at(
            deadline,
            self.hold_features(items, &mut hold, &mut reserved, &mut awaited, &mut features),
        )
        .await;
        let hold = Arc::new(parking_lot::Mutex::new(hold));
        let outcome = match held {
            Ok(Some(to_encode)) => match self.plan_encoding(&to_encode, prompt) {
                Plan::Nothing if awaited.is_empty() => {
                    // Reserved items no encoder worker takes leave the store.
                    self.settle(reserved, None, &mut hold.lock());
                    Ok(Encoded::default())
                }
                Plan::Held(worker) => {
                    // Not encoded: the worker holds the media's KV.
                    self.settle(reserved, None, &mut hold.lock());
                    Ok(Encoded {
                        holder: Some(worker),
                        ..Encoded::default()
                    })
                }
                plan => {
                    let groups = match plan {
                        Plan::Encode(groups) => groups,
                        Plan::Nothing | Plan::Held(_) => Vec::new(),
                    };
                    // From here on other requests wait for this one's encoding of the
                    // items it reserved (started at once, or in the task spawned below).
                    self.features.start(reserved.hashes().collect::<Vec<_>>());
                    let work = Work {
                        groups,
                        reserved,
                        awaited,
                        deadline,
                        timeout,
                    };
                    if self.media.overlap() {
                        // The request goes ahead; its media follow.
                        let (status, pending) = watch::channel(MediaStatus::Encoding);
                        let frontend = Arc::clone(self);
                        let behind = Arc::clone(&hold);
                        let found = features.clone();
                        tokio::spawn(async move {
                            let outcome = frontend.encode_and_wait(work, &behind).await;
                            status.send_replace(match outcome {
                                Ok(encoded) => {
                                    let mut features = found;
                                    features.extend(encoded.features);
                                    MediaStatus::Ready(encoded.resized, Arc::new(features))
                                }
                                Err(e) => MediaStatus::Failed(e.message),
                            });
                        });
                        return Ok(MediaReady {
                            warning: None,
                            hold,
                            worker: None,
                            pending: Some(pending),
                            features: Arc::new(features),
                        });
                    }
                    self.encode_and_wait(work, &hold).await
                }
            },
            Ok(None) | Err(_) => {
                // Out of time before any encoding: the items reserved leave the store.
                self.settle(reserved, None, &mut hold.lock());
                Err(self.timed_out(timeout))
            }
        };
        match (outcome, policy) {
            (Ok(encoded), _) => {
                features.extend(encoded.features);
                Ok(MediaReady {
                    warning: resize_media(prompt, &encoded.resized),
                    hold,
                    worker: encoded.holder,
                    pending: None,
                    features: Arc::new(features),
                })
            }
            (Err(e), OnEncoderFailure::Fail) => Err(e),
            (Err(e), OnEncoderFailure::TextOnly) => Ok(MediaReady {
                warning: Some(self.text_only(prompt, &e.message)),
                hold,
                worker: None,
                pending: None,
                features: Arc::default(),
            }),
        }
    }

    /// Strips the media from `prompt` (they could not be encoded: `why`): the warning to
    /// send with the response.
    pub(super) fn text_only(&self, prompt: &mut Prompt, why: &str) -> String {
        strip_media(prompt);
        self.metrics.count_media_encode("text_only");
        tracing::warn!(error = %why, "media not encoded; answering from the text alone");
        text_only_warning(why)
    }

    /// The error for media that took longer than `timeout` to encode.
    fn timed_out(&self, timeout: Duration) -> ApiError {
        self.metrics.count_media_encode("timeout");
        ApiError::unavailable(
            format!(
                "The request's media took longer than {} to encode; retry shortly.",
                humantime::format_duration(timeout)
            ),
            Duration::from_secs(1),
        )
    }
}
