//! Media in chat requests: each `image_url`, `input_audio` and `video_url` part fetched or
//! decoded, prepared off the async threads, and turned into placeholder tokens whose blocks
//! carry the item's content hash.
//!
//! - [`config`]: the `frontend.multimodal` settings.
//! - [`fetch`]: a media URL's bytes, from public addresses only.
//! - [`encoders`]: the encoder worker to try first, and items made smaller.
//! - [`marks`]: media marks in the chat text, and the prompt they become.

mod config;
mod encoders;
mod fetch;
mod marks;

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::protocol::MediaInput;
use switchyard_core::{Modality, WorkerId};
use switchyard_multimodal::{
    Detail, LogMel, MediaError, PreprocessPool, decode_base64, prepare_audio, prepare_image,
    prepare_video,
};
use switchyard_router::routing::encoders::{EncoderCost, EncoderLedger};

use crate::openai::ApiError;
use crate::openai::request::{ChatCompletionRequest, MessageContent};
pub use config::{MultimodalConfig, OnEncoderFailure};
pub use fetch::public_ip;
use fetch::{PublicOnly, redirects};
pub use marks::{MEDIA_MARK, splice, unmark};

/// The frontend's media stage: its settings, its pool and its HTTP client.
#[derive(Debug)]
pub struct MediaStage {
    config: MultimodalConfig,
    pool: PreprocessPool,
    /// None if it could not be built (fetching is then refused).
    client: Option<reqwest::Client>,
    fetches: Arc<tokio::sync::Semaphore>,
    mel: Arc<LogMel>,
    /// The encoder workers' estimated outstanding work, in milliseconds, and the next in
    /// turn: how the request's encoder is chosen.
    encoder_load: parking_lot::Mutex<EncoderLedger<WorkerId>>,
}

/// One prepared media item, in the order of the request's parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaItem {
    pub modality: Modality,
    pub tokens: u32,
    pub hash: u64,
    /// What a real encoder computes its embeddings from (shared, cheap to clone).
    pub input: Option<MediaInput>,
}

impl MediaStage {
    /// The stage for `config` (checked by `FrontendConfig::validate`).
    pub fn new(config: MultimodalConfig) -> Self {
        let threads = if config.preprocess_threads == 0 {
            std::thread::available_parallelism().map_or(1, usize::from)
        } else {
            config.preprocess_threads
        };
        let mut builder = reqwest::Client::builder()
            .timeout(config.fetch_timeout)
            .redirect(redirects(config.fetch_private));
        if !config.fetch_private {
            builder = builder.dns_resolver(Arc::new(PublicOnly));
        }
        let client = match builder.build() {
            Ok(client) => Some(client),
            Err(e) => {
                tracing::error!(
                    "cannot build the media HTTP client, media URLs will be refused: {e}"
                );
                None
            }
        };
        MediaStage {
            pool: PreprocessPool::new(threads, config.preprocess_queue),
            fetches: Arc::new(tokio::sync::Semaphore::new(config.max_fetches.max(1))),
            mel: Arc::new(LogMel::new(
                config.audio.sample_rate,
                config.audio.n_mels as usize,
            )),
            config,
            client,
            encoder_load: parking_lot::Mutex::new(EncoderLedger::default()),
        }
    }

    pub fn config(&self) -> &MultimodalConfig {
        &self.config
    }

    /// Prepares every media part of a chat request, in order; the first bad one is a 400
    /// naming its part. `room` gives what the context has left for media (its length less
    /// the text and `max_tokens`), asked only when the request has videos, which share it,
    /// each sampling as many frames as fit.
    pub async fn prepare_chat(
        &self,
        request: &ChatCompletionRequest,
        room: impl FnOnce() -> u32,
    ) -> Result<Vec<MediaItem>, ApiError> {
        let videos = count_videos(request);
        let video_room = match videos {
            0 => u32::MAX,
            n => room() / n,
        };
        let mut items = Vec::new();
        for (i, message) in request.messages.iter().enumerate() {
            let Some(MessageContent::Parts(parts)) = &message.content else {
                continue;
            };
            for (j, part) in parts.iter().enumerate() {
                let name = |field: &str| format!("messages[{i}].content[{j}].{field}");
                let kind = part.kind.as_str();
                if !matches!(kind, "image_url" | "input_audio" | "video_url") {
                    continue;
                }
                if items.len() == self.config.max_items {
                    return Err(ApiError::invalid_param(
                        &name(kind),
                        format!(
                            "at most {} media items are accepted per request",
                            self.config.max_items
                        ),
                    ));
                }
                let item = match kind {
                    "image_url" => {
                        let Some(image) = &part.image_url else {
                            return Err(ApiError::invalid_param(
                                &name(kind),
                                "an image_url part needs `image_url` with a `url`",
                            ));
                        };
                        self.image(&image.url, image.detail.as_deref()).await
                    }
                    "input_audio" => {
                        let Some(audio) = &part.input_audio else {
                            return Err(ApiError::invalid_param(
                                &name(kind),
                                "an input_audio part needs `input_audio` with `data` and `format`",
                            ));
                        };
                        self.audio(&audio.data, &audio.format).await
                    }
                    _ => {
                        let Some(video) = &part.video_url else {
                            return Err(ApiError::invalid_param(
                                &name(kind),
                                "a video_url part needs `video_url` with a `url`",
                            ));
                        };
                        self.video(&video.url, video_room).await
                    }
                };
                items.push(item.map_err(|e| media_error(&name(kind), e))?);
            }
        }
        Ok(items)
    }

    async fn image(&self, url: &str, detail: Option<&str>) -> Result<MediaItem, MediaError> {
        let detail = detail.map_or(Ok(Detail::Auto), Detail::parse)?;
        let settings = self.config.image;
        let bytes = self.bytes(url, settings.max_bytes).await?;
        let (prepared, input) = self
            .pool
            .run(move || {
                let prepared = prepare_image(&bytes, detail, &settings)?;
                let input = MediaInput::squares(settings.image_size, &prepared.squares);
                Ok::<_, MediaError>((prepared, input))
            })
            .await?;
        Ok(MediaItem {
            modality: Modality::Image,
            tokens: prepared.tokens,
            hash: prepared.hash,
            input: Some(input),
        })
    }

    /// What a request whose media could not be encoded gets, and how long encoding may take.
    pub fn on_encoder_failure(&self) -> (OnEncoderFailure, Duration) {
        (self.config.on_encoder_failure, self.config.encode_timeout)
    }

    /// The encoders' cost model (see [`MultimodalConfig::encoder_cost`]).
    pub fn encoder_cost(&self) -> EncoderCost {
        self.config.encoder_cost()
    }

    /// Whether requests go to their LLM worker while their media are encoded.
    pub fn overlap(&self) -> bool {
        self.config.overlap
    }

    async fn video(&self, url: &str, room: u32) -> Result<MediaItem, MediaError> {
        let (image, settings) = (self.config.image, self.config.video);
        let ffmpeg = self.config.ffmpeg.clone();
        let bytes = self.bytes(url, settings.max_bytes).await?;
        let (prepared, input) = self
            .pool
            .run(move || {
                let prepared = prepare_video(&bytes, &image, &settings, room, ffmpeg.as_deref())?;
                let input = MediaInput::squares(image.image_size, &prepared.squares);
                Ok::<_, MediaError>((prepared, input))
            })
            .await?;
        Ok(MediaItem {
            modality: Modality::Video,
            tokens: prepared.tokens,
            hash: prepared.hash,
            input: Some(input),
        })
    }

    async fn audio(&self, data: &str, format: &str) -> Result<MediaItem, MediaError> {
        let settings = self.config.audio;
        let bytes = decode_base64(data, settings.max_bytes, "the audio data")?;
        let format = format.to_ascii_lowercase();
        let mel = Arc::clone(&self.mel);
        let (prepared, input) = self
            .pool
            .run(move || {
                let prepared = prepare_audio(&bytes, &format, &settings, &mel)?;
                // Windows of one length (always, when they are padded to 30 s).
                let bins = settings.n_mels;
                let frames = prepared.mels.first().map_or(0, |w| w.len() / bins as usize);
                let input = prepared
                    .mels
                    .iter()
                    .all(|w| w.len() == frames * bins as usize)
                    .then(|| MediaInput::mel(bins, frames as u32, &prepared.mels));
                Ok::<_, MediaError>((prepared, input))
            })
            .await?;
        Ok(MediaItem {
            modality: Modality::Audio,
            tokens: prepared.tokens,
            hash: prepared.hash,
            input,
        })
    }
}

/// The `video_url` parts of a chat request.
fn count_videos(request: &ChatCompletionRequest) -> u32 {
    let parts = request.messages.iter().filter_map(|m| match &m.content {
        Some(MessageContent::Parts(parts)) => Some(parts),
        _ => None,
    });
    parts
        .flatten()
        .filter(|p| p.kind == "video_url")
        .count()
        .try_into()
        .unwrap_or(u32::MAX)
}

fn media_error(param: &str, e: MediaError) -> ApiError {
    match e {
        MediaError::Busy => ApiError::unavailable(
            "Media preprocessing is saturated; retry shortly.",
            Duration::from_secs(1),
        ),
        MediaError::Internal(message) => ApiError::internal(message),
        other => ApiError::invalid_param(param, other.to_string()),
    }
}
