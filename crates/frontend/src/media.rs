//! Media in chat requests: each `image_url`, `input_audio` and `video_url` part fetched or
//! decoded, prepared off the async threads, and turned into placeholder tokens whose blocks
//! carry the item's content hash.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_core::protocol::MediaInput;
use switchyard_core::{MediaSpan, Modality, WorkerId};
use switchyard_multimodal::{
    AudioSettings, Detail, ImageSettings, LogMel, MediaError, MediaRef, PreprocessPool,
    VideoSettings, decode_base64, halve_squares, parse_url, prepare_audio, prepare_image,
    prepare_video, reduced_hash,
};

use switchyard_router::routing::encoders::{EncoderCost, EncoderLedger, EncoderPolicy};

use crate::openai::ApiError;
use crate::openai::request::{ChatCompletionRequest, MessageContent};

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
    pub feature_store: crate::features::FeatureStoreConfig,
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
            feature_store: crate::features::FeatureStoreConfig::default(),
        }
    }
}

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

    /// The item made smaller for an encoder that ran out of memory on it: a video with half
    /// its frames (every other one), an image at half the resolution (a quarter of the
    /// tokens). It is another item (its own hash). None for audio, or when nothing is
    /// left to halve.
    pub fn reduced(&self, item: &MediaItem) -> Option<MediaItem> {
        let (image, video) = (&self.config.image, &self.config.video);
        let (tokens, input) = match (item.modality, &item.input) {
            (Modality::Audio, _) => return None,
            (Modality::Image, Some(MediaInput::Squares { side, rgb })) => {
                let (half, smaller) = halve_squares(*side, rgb, image.patch_size)?;
                let squares = rgb.len() / (*side as usize * *side as usize * 3).max(1);
                let per_square = (half / image.patch_size).pow(2);
                let input = MediaInput::Squares {
                    side: half,
                    rgb: smaller.into(),
                };
                (per_square * squares as u32, Some(input))
            }
            (Modality::Video, Some(MediaInput::Squares { side, rgb })) => {
                let size = *side as usize * *side as usize * 3;
                let frames = rgb.len() / size.max(1);
                if frames < 2 {
                    return None;
                }
                let kept: Vec<u8> = rgb
                    .chunks_exact(size)
                    .step_by(2)
                    .flatten()
                    .copied()
                    .collect();
                let input = MediaInput::Squares {
                    side: *side,
                    rgb: kept.into(),
                };
                (
                    video.tokens_for(frames.div_ceil(2) as u32, image),
                    Some(input),
                )
            }
            // Timed items only (no input): their token counts alone.
            (Modality::Image, _) if item.tokens >= 4 => (item.tokens / 4, None),
            (Modality::Video, _) if item.tokens >= 2 => (item.tokens.div_ceil(2), None),
            _ => return None,
        };
        Some(MediaItem {
            modality: item.modality,
            tokens,
            hash: reduced_hash(item.hash, 1),
            input,
        })
    }

    /// Orders the encoder workers by `encoder_policy`: in turn, or the least estimated
    /// outstanding work first (see [`EncoderLedger`]).
    pub(crate) fn order_encoders(&self, encoders: &mut [switchyard_runtime::WorkerInstance]) {
        let mut ids: Vec<WorkerId> = encoders.iter().map(|e| e.worker_id).collect();
        self.encoder_load
            .lock()
            .order(self.config.encoder_policy, &mut ids);
        encoders.sort_by_key(|e| ids.iter().position(|&id| id == e.worker_id));
    }

    /// The estimated work outstanding on `encoder`, in milliseconds.
    pub fn outstanding_ms(&self, encoder: WorkerId) -> f64 {
        self.encoder_load.lock().outstanding_ms(encoder)
    }

    /// Counts `ms` of estimated work on `encoder` until the guard is dropped.
    pub(crate) fn charge(&self, encoder: WorkerId, ms: f64) -> Charge<'_> {
        self.encoder_load.lock().charge(encoder, ms);
        Charge {
            stage: self,
            encoder,
            ms,
        }
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

    /// A media URL's bytes: decoded, fetched or read, at most `limit` of them.
    async fn bytes(&self, url: &str, limit: usize) -> Result<Vec<u8>, MediaError> {
        match parse_url(url, limit, self.config.media_dir.as_deref())? {
            MediaRef::Data { bytes, .. } => Ok(bytes),
            MediaRef::Http(url) => self.fetch(&url, limit).await,
            MediaRef::File(path) => {
                let root = self.config.media_dir.as_deref().unwrap_or(Path::new("/"));
                read_file(path, root, limit).await
            }
        }
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

    async fn fetch(&self, url: &str, limit: usize) -> Result<Vec<u8>, MediaError> {
        if !self.config.fetch_urls {
            return Err(MediaError::BadUrl(
                "this server does not fetch media URLs; send the media as a data: URL".into(),
            ));
        }
        let failed = |e: reqwest::Error| {
            MediaError::BadUrl(if e.is_timeout() {
                format!(
                    "fetching the media timed out after {:?}",
                    self.config.fetch_timeout
                )
            } else {
                format!("cannot fetch the media: {}", without_url(&e))
            })
        };
        let Some(client) = &self.client else {
            return Err(MediaError::BadUrl(
                "this server cannot fetch media URLs; send the media as a data: URL".into(),
            ));
        };
        if !self.config.fetch_private && !public_host(url) {
            return Err(MediaError::BadUrl(
                "media URLs must name a public address".into(),
            ));
        }
        let _permit = self.fetches.try_acquire().map_err(|_| MediaError::Busy)?;
        let mut response = client.get(url).send().await.map_err(failed)?;
        if !response.status().is_success() {
            return Err(MediaError::BadUrl(format!(
                "fetching the media answered HTTP {}",
                response.status().as_u16()
            )));
        }
        let too_large = |bytes: u64| MediaError::TooLarge {
            bytes,
            limit: limit as u64,
        };
        if let Some(length) = response.content_length()
            && length > limit as u64
        {
            return Err(too_large(length));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(failed)? {
            if body.len() + chunk.len() > limit {
                return Err(too_large((body.len() + chunk.len()) as u64));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// Estimated work charged to an encoder while a request waits on it.
pub(crate) struct Charge<'a> {
    stage: &'a MediaStage,
    encoder: WorkerId,
    ms: f64,
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        self.stage
            .encoder_load
            .lock()
            .discharge(self.encoder, self.ms);
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

/// A reqwest error's message without the URL (which may be long, and is the client's own).
fn without_url(e: &reqwest::Error) -> String {
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut last = None;
    while let Some(s) = source {
        last = Some(s.to_string());
        source = s.source();
    }
    last.unwrap_or_else(|| "the request failed".into())
}

async fn read_file(path: PathBuf, root: &Path, limit: usize) -> Result<Vec<u8>, MediaError> {
    // Resolved, so a link under the directory cannot lead out of it; one message for every
    // refusal, so the server's files are not probed through it.
    let refused = || MediaError::BadUrl(format!("no readable media file at {}", path.display()));
    let (Ok(real), Ok(real_root)) = (
        tokio::fs::canonicalize(&path).await,
        tokio::fs::canonicalize(root).await,
    ) else {
        return Err(refused());
    };
    if !real.starts_with(&real_root) {
        return Err(refused());
    }
    let meta = tokio::fs::metadata(&real).await.map_err(|_| refused())?;
    if !meta.is_file() {
        return Err(refused());
    }
    if meta.len() > limit as u64 {
        return Err(MediaError::TooLarge {
            bytes: meta.len(),
            limit: limit as u64,
        });
    }
    tokio::fs::read(&real).await.map_err(|_| refused())
}

/// Redirects: at most 5, and (unless private addresses are allowed) never to a literal
/// non-public address (host names go through [`PublicOnly`]).
fn redirects(private: bool) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 5 {
            attempt.error("too many redirects")
        } else if !private && !public_host(attempt.url().as_str()) {
            attempt.error("a redirect to a non-public address")
        } else {
            attempt.follow()
        }
    })
}

/// Whether a URL's host is a name (checked when resolved) or a public IP address.
fn public_host(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return false;
    };
    match url.host() {
        Some(url::Host::Ipv4(ip)) => public_ip(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => public_ip(IpAddr::V6(ip)),
        Some(url::Host::Domain(name)) => !name.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// Not loopback, private, link-local, shared, documentation, unspecified or multicast.
pub fn public_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_documentation()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b)))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return public_ip(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80)
        }
    }
}

/// A resolver that keeps only public addresses, so a host name cannot lead a fetch into
/// the server's own network.
#[derive(Debug)]
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .filter(|a| public_ip(a.ip()))
                .collect();
            if addrs.is_empty() {
                return Err(format!("{host} has no public address").into());
            }
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
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

/// Marks where a media item goes in the rendered chat text; a private-use character, which
/// client text cannot smuggle in (it is replaced in client text before rendering).
pub const MEDIA_MARK: char = '\u{E000}';

/// Replaces the media mark in client text, so only the frontend's marks remain.
pub fn unmark(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(MEDIA_MARK) {
        std::borrow::Cow::Owned(text.replace(MEDIA_MARK, "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// The prompt's tokens and media spans: the text between marks tokenized by `encode`, each
/// mark replaced by its item's placeholder tokens.
pub fn splice(
    text: &str,
    items: &[MediaItem],
    placeholder: u32,
    mut encode: impl FnMut(&str) -> Result<Vec<u32>, ApiError>,
) -> Result<(Vec<u32>, Vec<MediaSpan>), ApiError> {
    let pieces: Vec<&str> = text.split(MEDIA_MARK).collect();
    if pieces.len() != items.len() + 1 {
        return Err(ApiError::invalid_param(
            "messages",
            format!(
                "the chat template kept {} of the request's {} media items",
                pieces.len() - 1,
                items.len()
            ),
        ));
    }
    let mut tokens = Vec::new();
    let mut spans = Vec::with_capacity(items.len());
    for (piece, item) in pieces.iter().zip(items.iter().map(Some).chain([None])) {
        tokens.extend(encode(piece)?);
        if let Some(item) = item {
            spans.push(MediaSpan {
                modality: item.modality,
                media_hash: item.hash,
                offset: tokens.len() as u32,
                length: item.tokens,
            });
            tokens.extend(std::iter::repeat_n(placeholder, item.tokens as usize));
        }
    }
    Ok((tokens, spans))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(tokens: u32, hash: u64) -> MediaItem {
        MediaItem {
            modality: Modality::Image,
            tokens,
            hash,
            input: None,
        }
    }

    #[test]
    fn marks_become_placeholder_runs_with_spans() {
        let text = format!("ab{MEDIA_MARK}cde{MEDIA_MARK}f");
        let encode = |s: &str| Ok(s.bytes().map(u32::from).collect());
        let (tokens, spans) = splice(&text, &[item(3, 7), item(2, 9)], 0, encode).unwrap();
        assert_eq!(tokens, [97, 98, 0, 0, 0, 99, 100, 101, 0, 0, 102]);
        assert_eq!(
            spans
                .iter()
                .map(|s| (s.offset, s.length, s.media_hash))
                .collect::<Vec<_>>(),
            [(2, 3, 7), (8, 2, 9)]
        );
    }

    #[test]
    fn a_template_that_drops_or_repeats_media_is_refused() {
        let encode = |s: &str| Ok(s.bytes().map(u32::from).collect());
        let dropped = splice("no marks", &[item(3, 7)], 0, encode);
        assert!(dropped.is_err());
        let twice = format!("{MEDIA_MARK}{MEDIA_MARK}");
        assert!(splice(&twice, &[item(3, 7)], 0, encode).is_err());
        assert_eq!(unmark(&format!("x{MEDIA_MARK}y")), "x\u{FFFD}y");
    }
}
