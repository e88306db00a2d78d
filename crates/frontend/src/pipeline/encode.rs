//! Media encoding on the fleet's encoder workers: a request's items go to the encoder
//! workers that take their modality, the items one pool takes to one worker of it (so they
//! may share batches), chosen by `frontend.multimodal.encoder_policy`; a worker that cannot
//! take them hands them to the next; the request is routed once they
//! are encoded. Joint routing first: when the worker predicted to answer soonest already
//! holds the media's KV (the same image behind the same text), nothing is encoded and the
//! request is pinned to that worker.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::{
    EngineError, GenerateOutput, GenerateRequest, MediaInput, Phase, Prompt,
};
use switchyard_core::{MediaSpan, WorkerId};
use switchyard_router::routing::encoders::{MediaWork, job_estimate_ms};
use switchyard_runtime::WorkerInstance;
use tokio::sync::watch;

use super::Frontend;
use crate::features::{FeatureHold, Pending, Reservations, Taken};
use crate::media::{MediaItem, OnEncoderFailure};
use crate::openai::ApiError;

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

/// Why a group of items could not be encoded.
#[derive(Debug)]
struct GroupFailure {
    /// The last encoder's error.
    message: String,
    /// An encoder had no memory for the items: smaller ones may fit.
    out_of_memory: bool,
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

/// Items that go to the same encoder workers (the best first), and how long they are
/// estimated to take.
struct Group {
    takers: Vec<WorkerInstance>,
    members: Vec<MediaItem>,
    estimate_ms: f64,
}

/// What encoding a request's media takes.
enum Plan {
    /// Nothing: no items, or no encoder worker takes them.
    Nothing,
    /// Nothing: the worker predicted to answer soonest holds the media's KV.
    Held(WorkerId),
    Encode(Vec<Group>),
}

/// What a request's media take once the store has been asked: its own encoding, the items
/// it reserved for it, the items other requests are encoding, and its deadline.
struct Work {
    groups: Vec<Group>,
    reserved: Reservations,
    awaited: Vec<(MediaItem, Pending)>,
    deadline: tokio::time::Instant,
    timeout: Duration,
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

    /// Settles the items a request reserved in the feature store: those `encoded` are
    /// recorded, with their embeddings when the encoders computed them; the others leave
    /// it (and the request's hold).
    fn settle(&self, reserved: Reservations, encoded: Option<&Encoded>, hold: &mut FeatureHold) {
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
    async fn encode_and_wait(
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
    async fn hold_features(
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

    /// Encodes the request's media on encoder workers and returns once it is done (with the
    /// hashes of the items encoded); at once when there are no items or no encoder workers
    /// (media then costs no encoding time).
    /// Items go to the workers that take their modality, all the items one set of workers
    /// takes to one of them (so they may share batches); items no encoder worker takes are
    /// not encoded. A 503 when no encoder worker takes a group.
    pub async fn encode_media(
        &self,
        items: &[MediaItem],
        prompt: &Prompt,
    ) -> Result<Encoded, ApiError> {
        match self.plan_encoding(items, prompt) {
            Plan::Nothing => Ok(Encoded::default()),
            Plan::Held(worker) => Ok(Encoded {
                holder: Some(worker),
                ..Encoded::default()
            }),
            Plan::Encode(groups) => self.run_plan(&groups).await,
        }
    }

    /// Groups the items by the encoder workers that take them and, jointly with routing,
    /// decides whether to encode them at all.
    fn plan_encoding(&self, items: &[MediaItem], prompt: &Prompt) -> Plan {
        if items.is_empty() {
            return Plan::Nothing;
        }
        let groups = self.groups_for(items);
        if groups.is_empty() {
            return Plan::Nothing;
        }
        if !self.config.multimodal.joint_routing {
            return Plan::Encode(groups);
        }
        // The soonest the media could reach a worker: per group, the first encoder's queue
        // and the group's batches; the last group to finish, and the embeddings' transfer.
        let ready_ms = groups
            .iter()
            .map(|g| self.media.outstanding_ms(g.takers[0].worker_id) + g.estimate_ms)
            .fold(0f64, f64::max);
        let media_tokens: u64 = items.iter().map(|i| u64::from(i.tokens)).sum();
        let encode = Duration::from_secs_f64(ready_ms / 1e3)
            + self.media.encoder_cost().transfer_time(media_tokens);
        match self.routing.sooner_holder(prompt, encode) {
            Some(holder) => {
                self.metrics.count_media_encode("skipped");
                Plan::Held(holder)
            }
            None => Plan::Encode(groups),
        }
    }

    /// The items grouped by the encoder workers that take them (the best first), with
    /// their estimated time; none without encoder workers.
    fn groups_for(&self, items: &[MediaItem]) -> Vec<Group> {
        let encoders = self.routing.encoders();
        if encoders.is_empty() {
            return Vec::new();
        }
        let cost = self.media.encoder_cost();
        group_by_takers(items, &encoders)
            .into_iter()
            .map(|(mut takers, members)| {
                self.media.order_encoders(&mut takers);
                let estimate_ms = job_estimate_ms(
                    &cost,
                    members.iter().map(|i| MediaWork {
                        owner: 0,
                        modality: i.modality,
                        tokens: i.tokens,
                    }),
                );
                Group {
                    takers,
                    members: members.into_iter().cloned().collect(),
                    estimate_ms,
                }
            })
            .collect()
    }

    /// [`Frontend::run_plan`] by `deadline` (else the timeout's error); nothing to do for
    /// no groups.
    async fn run_plan_by(
        &self,
        groups: &[Group],
        deadline: tokio::time::Instant,
        timeout: Duration,
    ) -> Result<Encoded, ApiError> {
        if groups.is_empty() {
            return Ok(Encoded::default());
        }
        tokio::time::timeout_at(deadline, self.run_plan(groups))
            .await
            .unwrap_or_else(|_| Err(self.timed_out(timeout)))
    }

    /// Encodes every group (at once, each on its first worker that succeeds): the items
    /// encoded, or a 503 when a group could not be. A group an encoder has no memory for
    /// is sent again smaller (see [`Frontend::encode_shrinking`]).
    async fn run_plan(&self, groups: &[Group]) -> Result<Encoded, ApiError> {
        let outcomes =
            futures::future::join_all(groups.iter().map(|g| self.encode_shrinking(g))).await;
        let mut encoded = Encoded::default();
        let mut failure = None;
        for outcome in outcomes {
            match outcome {
                Ok(group) => {
                    encoded.hashes.extend(group.hashes);
                    encoded.resized.extend(group.resized);
                    encoded.features.extend(group.features);
                }
                Err(e) => failure = Some(e),
            }
        }
        match failure {
            None => {
                self.metrics.count_media_encode("encoded");
                if !encoded.resized.is_empty() {
                    self.metrics.count_media_encode("reduced");
                }
                Ok(encoded)
            }
            Some(last) => {
                self.metrics.count_media_encode("failed");
                Err(ApiError::unavailable(
                    format!(
                        "No encoder worker could encode the request's media ({}); retry shortly.",
                        last.message
                    ),
                    Duration::from_secs(1),
                ))
            }
        }
    }

    /// Encodes a group; when its encoders run out of memory on it, sends its items again
    /// halved (half the frames of a video, half the resolution of an image; up to
    /// [`MAX_HALVINGS`] times).
    async fn encode_shrinking(&self, group: &Group) -> Result<Encoded, GroupFailure> {
        let mut members = group.members.clone();
        let mut estimate_ms = group.estimate_ms;
        for halvings in 0.. {
            match self
                .encode_group(&group.takers, &members, estimate_ms)
                .await
            {
                Ok(inputs) => {
                    let features = members
                        .iter()
                        .map(|m| m.hash)
                        .zip(inputs.unwrap_or_default())
                        .collect();
                    let (same, resized) = group.members.iter().zip(&members).fold(
                        (Vec::new(), Vec::new()),
                        |(mut same, mut resized), (original, now)| {
                            if original.hash == now.hash {
                                same.push(now.hash);
                            } else {
                                resized.push(Resized {
                                    from: original.hash,
                                    to: now.hash,
                                    tokens: now.tokens,
                                });
                            }
                            (same, resized)
                        },
                    );
                    return Ok(Encoded {
                        hashes: same,
                        resized,
                        holder: None,
                        features,
                    });
                }
                Err(failure) if failure.out_of_memory && halvings < MAX_HALVINGS => {
                    let smaller: Vec<Option<MediaItem>> =
                        members.iter().map(|m| self.media.reduced(m)).collect();
                    if smaller.iter().all(Option::is_none) {
                        return Err(failure);
                    }
                    tracing::info!(error = %failure.message, halvings = halvings + 1, "an encoder ran out of memory: sending the media again smaller");
                    members = members
                        .into_iter()
                        .zip(smaller)
                        .map(|(m, s)| s.unwrap_or(m))
                        .collect();
                    estimate_ms /= 2.0;
                }
                Err(failure) => return Err(failure),
            }
        }
        unreachable!("the loop returns")
    }

    /// Encodes `members` on the first of `takers` that succeeds (with the items'
    /// embeddings, one per member, when that encoder computed them); the last error
    /// otherwise.
    async fn encode_group(
        &self,
        takers: &[WorkerInstance],
        members: &[MediaItem],
        estimate_ms: f64,
    ) -> Result<Option<Vec<MediaInput>>, GroupFailure> {
        let mut job = Prompt::tokens(Vec::new());
        job.media = members
            .iter()
            .map(|i| MediaSpan {
                modality: i.modality,
                media_hash: i.hash,
                offset: 0,
                length: i.tokens,
            })
            .collect();
        // The prepared inputs go along for encoders that compute real embeddings; they are
        // all there or none is.
        let inputs: Option<Vec<_>> = members.iter().map(|i| i.input.clone()).collect();
        let request = GenerateRequest {
            phase: Phase::Encode,
            prompt: job,
            media_inputs: inputs.unwrap_or_default(),
            ..GenerateRequest::text(self.side_id(), Vec::new(), 0)
        };
        let mut failure = GroupFailure {
            message: String::from("no encoder worker answered"),
            out_of_memory: false,
        };
        for encoder in takers {
            let _charge = self.media.charge(encoder.worker_id, estimate_ms);
            self.metrics.encoder_jobs.inc();
            let outcome = match self.requests.generate(encoder, request.clone()).await {
                Ok(mut stream) => {
                    let mut features = None;
                    loop {
                        match stream.next().await {
                            Some(Ok(GenerateOutput::Features { items }))
                                if items.len() == members.len() =>
                            {
                                features = Some(items);
                            }
                            Some(Ok(GenerateOutput::Finished { .. })) => break Ok(features),
                            Some(Ok(_)) => {
                                break Err(EngineError::Internal(
                                    "an encoder worker answered with something else than embeddings".to_owned(),
                                ));
                            }
                            Some(Err(e)) => break Err(e),
                            None => break Err(EngineError::Disconnected),
                        }
                    }
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(features) => return Ok(features),
                Err(e) => {
                    tracing::warn!(encoder = %encoder.worker_id, error = %e, "an encoder worker failed; trying the next");
                    failure.out_of_memory |= matches!(e, EngineError::OutOfMemory(_));
                    failure.message = e.to_string();
                }
            }
        }
        Err(failure)
    }
}

/// The warning a request answered from its text alone carries (`why`: what failed).
pub fn text_only_warning(why: &str) -> String {
    format!("media not encoded, answered from the text alone: {why}")
}

/// Gives the prompt's media the sizes they were encoded at (see [`Resized`]): each span
/// of a resized item takes its new length (in the placeholder token it had) and hash, the
/// positions after it move. The warning to send with the response, when any was.
pub fn resize_media(prompt: &mut Prompt, resized: &[Resized]) -> Option<String> {
    if resized.is_empty() {
        return None;
    }
    let mut tokens = Vec::with_capacity(prompt.token_ids.len());
    let mut at = 0usize;
    let mut shift = 0i64;
    for span in &mut prompt.media {
        let start = (span.offset as usize).min(prompt.token_ids.len());
        let end = (span.end() as usize).min(prompt.token_ids.len());
        tokens.extend_from_slice(&prompt.token_ids[at.min(start)..start]);
        span.offset = (i64::from(span.offset) + shift) as u32;
        match resized.iter().find(|r| r.from == span.media_hash) {
            Some(r) => {
                let placeholder = prompt.token_ids.get(start).copied().unwrap_or_default();
                tokens.extend(std::iter::repeat_n(placeholder, r.tokens as usize));
                shift += i64::from(r.tokens) - i64::from(span.length);
                span.media_hash = r.to;
                span.length = r.tokens;
            }
            None => tokens.extend_from_slice(&prompt.token_ids[start..end]),
        }
        at = at.max(end);
    }
    tokens.extend_from_slice(&prompt.token_ids[at.min(prompt.token_ids.len())..]);
    prompt.token_ids = tokens;
    Some(resized_warning(resized.len()))
}

/// The warning a request whose media were encoded smaller carries (`n` items).
pub fn resized_warning(n: usize) -> String {
    format!(
        "{n} media item(s) did not fit the encoder's memory and were encoded at half size or less"
    )
}

/// Removes the media's placeholder positions from the prompt: the text alone is left.
fn strip_media(prompt: &mut Prompt) {
    let spans = std::mem::take(&mut prompt.media);
    let mut kept = Vec::with_capacity(prompt.token_ids.len());
    let mut at = 0usize;
    for span in &spans {
        let start = (span.offset as usize).min(prompt.token_ids.len());
        let end = (span.end() as usize).min(prompt.token_ids.len());
        kept.extend_from_slice(&prompt.token_ids[at.min(start)..start]);
        at = at.max(end);
    }
    kept.extend_from_slice(&prompt.token_ids[at.min(prompt.token_ids.len())..]);
    prompt.token_ids = kept;
}

/// A request's items grouped by the encoder workers that take their modality; items no
/// encoder worker takes are left out.
fn group_by_takers<'a>(
    items: &'a [MediaItem],
    encoders: &[WorkerInstance],
) -> Vec<(Vec<WorkerInstance>, Vec<&'a MediaItem>)> {
    let mut groups: Vec<(Vec<WorkerInstance>, Vec<&MediaItem>)> = Vec::new();
    for item in items {
        let takers: Vec<WorkerInstance> = encoders
            .iter()
            .filter(|e| e.modalities.contains(item.modality))
            .cloned()
            .collect();
        if takers.is_empty() {
            continue;
        }
        match groups.iter_mut().find(|(t, _)| same_workers(t, &takers)) {
            Some((_, members)) => members.push(item),
            None => groups.push((takers, vec![item])),
        }
    }
    groups
}

/// Whether two lists name the same workers (in any order).
fn same_workers(a: &[WorkerInstance], b: &[WorkerInstance]) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|x| b.iter().any(|y| y.worker_id == x.worker_id))
}

#[cfg(test)]
mod tests {
    use switchyard_core::{Modalities, Modality, WorkerId, WorkerRole};

    use super::*;

    fn encoder(id: u64, modalities: &[Modality]) -> WorkerInstance {
        WorkerInstance {
            role: WorkerRole::Encoder,
            modalities: Modalities::from(modalities.to_vec()),
            ..WorkerInstance::new(WorkerId(id), "m")
        }
    }

    fn item(modality: Modality, hash: u64) -> MediaItem {
        MediaItem {
            modality,
            tokens: 10,
            hash,
            input: None,
        }
    }

    fn ids(workers: &[WorkerInstance]) -> Vec<u64> {
        let mut ids: Vec<u64> = workers.iter().map(|w| w.worker_id.0).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn stripping_media_leaves_the_text_around_it_in_order() {
        let mut prompt = Prompt::tokens(vec![1, 2, 0, 0, 0, 3, 0, 0, 4]);
        prompt.media = [(2, 3), (6, 2)]
            .into_iter()
            .map(|(offset, length)| MediaSpan {
                modality: Modality::Image,
                media_hash: 9,
                offset,
                length,
            })
            .collect();
        strip_media(&mut prompt);
        assert_eq!(prompt.token_ids, vec![1, 2, 3, 4]);
        assert!(prompt.media.is_empty());
    }

    #[test]
    fn an_item_encoded_smaller_takes_fewer_positions_and_the_rest_moves_up() {
        // Text, a video of 4 positions (hash 7), text, an image of 2 (hash 8), text.
        let mut prompt = Prompt::tokens(vec![1, 2, 0, 0, 0, 0, 3, 5, 5, 4]);
        prompt.media = [(Modality::Video, 7, 2, 4), (Modality::Image, 8, 7, 2)]
            .into_iter()
            .map(|(modality, media_hash, offset, length)| MediaSpan {
                modality,
                media_hash,
                offset,
                length,
            })
            .collect();
        let original = prompt.clone();
        assert!(resize_media(&mut prompt, &[]).is_none());
        assert_eq!(prompt, original);
        let resized = [Resized {
            from: 7,
            to: 70,
            tokens: 2,
        }];
        let warning = resize_media(&mut prompt, &resized).unwrap();
        assert!(warning.contains("1 media item"), "{warning}");
        assert_eq!(prompt.token_ids, vec![1, 2, 0, 0, 3, 5, 5, 4]);
        let spans: Vec<_> = prompt
            .media
            .iter()
            .map(|s| (s.media_hash, s.offset, s.length))
            .collect();
        assert_eq!(spans, vec![(70, 2, 2), (8, 5, 2)]);
        // The image, now: its placeholder token is kept.
        let resized = [Resized {
            from: 8,
            to: 80,
            tokens: 1,
        }];
        resize_media(&mut prompt, &resized).unwrap();
        assert_eq!(prompt.token_ids, vec![1, 2, 0, 0, 3, 5, 4]);
        assert_eq!(prompt.media[1].length, 1);
    }

    #[test]
    fn items_go_to_the_encoders_of_their_modality_and_share_one_when_the_pool_is_the_same() {
        use Modality::*;
        let fleet = [
            encoder(1, &[]),
            encoder(2, &[Audio]),
            encoder(3, &[Image, Video]),
        ];
        let items = [
            item(Image, 1),
            item(Audio, 2),
            item(Video, 3),
            item(Image, 4),
        ];
        let groups = group_by_takers(&items, &fleet);
        let shape: Vec<(Vec<u64>, Vec<u64>)> = groups
            .iter()
            .map(|(t, m)| (ids(t), m.iter().map(|i| i.hash).collect()))
            .collect();
        // Images and video: worker 1 (everything) and 3; audio: 1 and 2.
        assert_eq!(
            shape,
            vec![(vec![1, 3], vec![1, 3, 4]), (vec![1, 2], vec![2])]
        );
        // No encoder takes images: they are not encoded; audio still is.
        let audio_only = [encoder(2, &[Audio])];
        let groups = group_by_takers(&items, &audio_only);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].1.len(), 1);
        assert_eq!(groups[0].1[0].modality, Audio);
    }
}
