//! Media in requests, up to what routing and engines need.
//!
//! - [`source`]: where the bytes come from (a `data:` URL, an `http(s)` URL, an
//!   allow-listed file).
//! - [`image`]: an image to patch tokens with a content hash.
//! - [`audio`]: audio to a log-mel spectrogram and encoder tokens.
//! - [`video`]: a video to sampled frames within a token budget.
//! - [`pool`]: a bounded pool that keeps that CPU work off the async threads.
//! - [`store`]: the encoded-feature store's bookkeeping (which items' embeddings exist,
//!   in what state, within the CPU and staging budgets).
//!
//! The content hash of an item covers its decoded pixels and every setting that shapes its
//! tokens; it is folded into the KV block hashes of the blocks its placeholder tokens take
//! (`switchyard_core::MediaSpan`), so two different images never share cached KV and the
//! same image twice does.

pub mod audio;
pub mod image;
pub mod pool;
pub mod source;
pub mod store;
pub mod video;

pub use crate::audio::{AudioSettings, AudioSettingsError, LogMel, PreparedAudio, prepare_audio};
pub use crate::image::{
    Detail, ImageSettings, ImageSettingsError, PreparedImage, best_grid, halve_squares,
    prepare_image, reduced_hash,
};
pub use crate::pool::PreprocessPool;
pub use crate::source::{MediaRef, decode_base64, parse_url};
pub use crate::video::{
    FrameStrategy, PreparedVideo, VideoSettings, VideoSettingsError, prepare_video,
};

use thiserror::Error;

/// Why a media item was refused. Every variant but [`MediaError::Busy`] and
/// [`MediaError::Internal`] is the client's (a 400 naming the content part).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MediaError {
    #[error("{0}")]
    BadUrl(String),
    #[error("the media is {bytes} bytes, over the limit of {limit}")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("{0}")]
    UnknownFormat(String),
    #[error("{0}")]
    Undecodable(String),
    #[error(
        "the image is {width}×{height} pixels; sides up to {max_side} and {max_pixels} pixels in all are accepted"
    )]
    TooManyPixels {
        width: u32,
        height: u32,
        max_side: u32,
        max_pixels: u64,
    },
    #[error("{0}")]
    BadSetting(String),
    #[error("media preprocessing is saturated; retry shortly")]
    Busy,
    #[error("{0}")]
    Internal(String),
}

impl MediaError {
    /// Whether the request, not the server, is at fault.
    pub fn is_client_error(&self) -> bool {
        !matches!(self, MediaError::Busy | MediaError::Internal(_))
    }
}

/// At most 64 characters of client input, for error messages.
pub(crate) fn cap(input: &str) -> String {
    match input.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &input[..end]),
        None => input.to_owned(),
    }
}
