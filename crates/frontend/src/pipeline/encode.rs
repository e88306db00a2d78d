//! Media encoding on the fleet's encoder workers: a request's items go to one encoder
//! worker (so they may share batches), chosen by `frontend.multimodal.encoder_policy`; a
//! worker that cannot take them hands them to the next; the request is routed once they
//! are encoded. Joint routing first: when the worker predicted to answer soonest already
//! holds the media's KV (the same image behind the same text), nothing is encoded.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use switchyard_core::protocol::{GenerateOutput, GenerateRequest, Phase, Prompt};
use switchyard_core::{MediaSpan, RequestId};
use switchyard_router::routing::encoders::MediaWork;

use super::Frontend;
use crate::media::MediaItem;
use crate::openai::ApiError;

impl Frontend {
    /// Encodes the request's media on an encoder worker and returns once it is done; at
    /// once when there are no items or no encoder workers (media then costs no encoding
    /// time). A 503 when no encoder worker takes them.
    pub async fn encode_media(&self, items: &[MediaItem], prompt: &Prompt) -> Result<(), ApiError> {
        if items.is_empty() {
            return Ok(());
        }
        let mut encoders = self.routing.encoders();
        if encoders.is_empty() {
            return Ok(());
        }
        self.media.order_encoders(&mut encoders);
        let cost = self.media.encoder_cost();
        let estimate_ms: f64 = items
            .iter()
            .map(|i| {
                let work = MediaWork {
                    owner: 0,
                    modality: i.modality,
                    tokens: i.tokens,
                };
                cost.batch_time(&[work]).as_secs_f64() * 1e3
            })
            .sum();
        // The soonest the media could reach a worker: the first encoder's queue, this
        // request's batches, and the embeddings' transfer.
        let media_tokens: u64 = items.iter().map(|i| u64::from(i.tokens)).sum();
        let ready = self.media.outstanding_ms(encoders[0].worker_id) + estimate_ms;
        let encode = Duration::from_secs_f64(ready / 1e3) + cost.transfer_time(media_tokens);
        if self.routing.holder_is_sooner(prompt, encode) {
            self.metrics.count_media_encode("skipped");
            return Ok(());
        }
        let mut job = Prompt::tokens(Vec::new());
        job.media = items
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
        let inputs: Option<Vec<_>> = items.iter().map(|i| i.input.clone()).collect();
        let request = GenerateRequest {
            phase: Phase::Encode,
            prompt: job,
            media_inputs: inputs.unwrap_or_default(),
            ..GenerateRequest::text(
                RequestId(self.next_id.fetch_add(1, Ordering::Relaxed)),
                Vec::new(),
                0,
            )
        };
        let mut last_error = String::from("no encoder worker answered");
        for encoder in &encoders {
            let _charge = self.media.charge(encoder.worker_id, estimate_ms);
            let outcome = match self.requests.generate(encoder, request.clone()).await {
                Ok(mut stream) => match stream.next().await {
                    Some(Ok(GenerateOutput::Finished { .. })) => Ok(()),
                    Some(Ok(_)) => Err("an encoder worker answered with tokens".to_owned()),
                    Some(Err(e)) => Err(e.to_string()),
                    None => Err("the encoder worker's answer ended early".to_owned()),
                },
                Err(e) => Err(e.to_string()),
            };
            match outcome {
                Ok(()) => {
                    self.metrics.count_media_encode("encoded");
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(encoder = %encoder.worker_id, error = %e, "an encoder worker failed; trying the next");
                    last_error = e;
                }
            }
        }
        self.metrics.count_media_encode("failed");
        Err(ApiError::unavailable(
            format!(
                "No encoder worker could encode the request's media ({last_error}); retry shortly."
            ),
            Duration::from_secs(1),
        ))
    }
}
