//! Sending a request's items to encoder workers: each group to its first worker that
//! succeeds, and again halved when an encoder has no memory for it.

use std::time::Duration;

use futures::StreamExt;
use switchyard_core::MediaSpan;
use switchyard_core::protocol::{
    EngineError, GenerateOutput, GenerateRequest, MediaInput, Phase, Prompt,
};
use switchyard_runtime::WorkerInstance;

use super::plan::Group;
use super::{Encoded, Frontend, MAX_HALVINGS, Resized};
use crate::media::MediaItem;
use crate::openai::ApiError;

/// Why a group of items could not be encoded.
#[derive(Debug)]
struct GroupFailure {
    /// The last encoder's error.
    message: String,
    /// An encoder had no memory for the items: smaller ones may fit.
    out_of_memory: bool,
}

impl Frontend {
    /// [`Frontend::run_plan`] by `deadline` (else the timeout's error); nothing to do for
    /// no groups.
    pub(super) async fn run_plan_by(
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
    pub(super) async fn run_plan(&self, groups: &[Group]) -> Result<Encoded, ApiError> {
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
