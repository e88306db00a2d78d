//! `frontend.multimodal`: how media in requests is read, limited, encoded and kept.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_multimodal::{AudioSettings, ImageSettings, VideoSettings};
use switchyard_router::routing::encoders::{EncoderCost, EncoderPolicy};

/// `frontend.multimodal`: how media in requests is read and turned into tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MultimodalConfig {
    /// The vision tower's input: square size, patch size, tiles, size limits.
    pub image: ImageSettings,
    /// The audio encoder's input: sample rate, mel bins, windows, limits.
    pub audio: AudioSettings,
    /// How videos are read and sampled into frames (each frame fitted as `image` says).
    pub video: VideoSettings,
    /// An `ffmpeg` binary (with `ffprobe` beside it) for video containers and codecs read
    /// nowhere else (WebM, VP8/VP9, AV1, MP4 without the `h264` feature...); none: refused.
    pub ffmpeg: Option<PathBuf>,
    /// Media items prepared at once (0: one per core).
    pub preprocess_threads: usize,
    /// Media items that may wait for a thread; beyond, requests with media get 503.
    pub preprocess_queue: usize,
    /// Most media items in one request.
    pub max_items: usize,
    /// Fetch `http(s)` media URLs (with this timeout, at most 5 redirects); off: only
    /// `data:` and files.
    pub fetch_urls: bool,
    #[serde(with = "humantime_serde")]
    pub fetch_timeout: Duration,
    /// Fetch from loopback, private, link-local and other non-public addresses too (off:
    /// a client cannot make the server reach its own network).
    pub fetch_private: bool,
    /// Fetches at once; beyond, requests with media URLs get 503.
    pub max_fetches: usize,
    /// `file://` URLs are read only under this directory (none: refused).
    pub media_dir: Option<PathBuf>,
    /// The token id a media item's placeholder positions take.
    pub placeholder_token: u32,
    /// Mock encoder workers `serve` starts beside its LLM workers (0, the default: none,
    /// and media costs no encoding time unless encoder workers join). With encoder workers
    /// in the fleet (these, or `switchyard worker --role encoder` processes), a request's
    /// media is encoded on one of them (chosen by `encoder_policy`) before it is routed.
    pub encoders: usize,
    pub encoder_policy: EncoderPolicy,
    pub encoder_cost: EncoderCost,
    /// How long a request's media may take to encode, from sending it to an encoder
    /// worker to its answer (retries on other workers included).
    #[serde(with = "humantime_serde")]
    pub encode_timeout: Duration,
    /// What a request whose media cannot be encoded (every encoder failed, or the
    /// timeout passed) gets: a 503, or its text alone.
    pub on_encoder_failure: OnEncoderFailure,
    /// Send a request to its LLM worker while its media are encoded: the worker computes
    /// the prompt up to its first media position (and other requests) meanwhile, and goes
    /// on once told the media are ready. Off: the request is routed once they are.
    pub overlap: bool,
    /// Joint routing: a request whose media a worker already holds (as KV) goes there
    /// without encoding them when that worker is predicted to give its first token
    /// soonest. Off: media are always encoded.
    pub joint_routing: bool,
    /// Encoded features kept across requests (memory budgets, and what happens after
    /// prefill).
    pub feature_store: crate::feature_store::FeatureStoreConfig,
}

/// What a request whose media could not be encoded gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnEncoderFailure {
    /// A 503 saying why (the client may retry).
    #[default]
    Fail,
    /// The request runs on its text alone (the media's placeholders stripped), with a
    /// warning in the response's `x-switchyard-warning` header.
    TextOnly,
}

impl MultimodalConfig {
    /// The encoders' cost model with these settings' tokens per unit (an image square, an
    /// audio window, a video frame): what encoder workers are timed by.
    pub fn encoder_cost(&self) -> EncoderCost {
        EncoderCost {
            image_tokens: self.image.tokens_per_square(),
            audio_window_tokens: self.audio.tokens_per_chunk,
            video_frame_tokens: self.video.frame_tokens(&self.image),
            ..self.encoder_cost.clone()
        }
    }
}

impl Default for MultimodalConfig {
    fn default() -> Self {
        MultimodalConfig {
            image: ImageSettings::default(),
            audio: AudioSettings::default(),
            video: VideoSettings::default(),
            ffmpeg: None,
            preprocess_threads: 0,
            preprocess_queue: 256,
            max_items: 16,
            fetch_urls: true,
            fetch_timeout: Duration::from_secs(10),
            fetch_private: false,
            max_fetches: 64,
            media_dir: None,
            placeholder_token: 0,
            encoders: 0,
            encoder_policy: EncoderPolicy::default(),
            encoder_cost: EncoderCost::default(),
            encode_timeout: Duration::from_secs(30),
            on_encoder_failure: OnEncoderFailure::Fail,
            overlap: true,
            joint_routing: true,
            feature_store: crate::feature_store::FeatureStoreConfig::default(),
        }
    }
}
