//! How a video becomes tokens: the frame strategy, the budget and pooling settings, and
//! their checks.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::image::ImageSettings;

/// Which frames of a video are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameStrategy {
    /// Evenly spaced over the whole video, as many as the budget allows.
    #[default]
    Uniform,
    /// One every `1 / fps` seconds (thinned evenly if over the budget).
    Fps,
    /// Frames that differ from the last kept one (mean absolute difference of 64×64 grey
    /// thumbnails over `keyframe_threshold`), the most different first if over the budget.
    Keyframe,
}

/// How video becomes tokens (defaults: up to 32 frames, each a 336-pixel square pooled 2×2
/// in space, 144 tokens a frame).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct VideoSettings {
    pub strategy: FrameStrategy,
    /// Frames per second sampled by `fps` (and the rate `keyframe` looks at, up to 4).
    pub fps: f64,
    /// Most frames kept.
    pub max_frames: u32,
    /// Patch tokens pooled per side (2: a 24 × 24 patch grid becomes 12 × 12 tokens).
    pub spatial_pool: u32,
    /// Consecutive kept frames pooled into one frame's tokens (1: none).
    pub temporal_pool: u32,
    /// Most visual tokens one video takes (the request's room in the context may lower it).
    pub token_budget: u32,
    /// `keyframe`'s threshold: mean absolute grey difference, 0 to 1.
    pub keyframe_threshold: f64,
    /// Longest video accepted, in seconds, and most frames in it.
    pub max_seconds: f64,
    pub max_source_frames: u32,
    /// Largest encoded video accepted, in bytes.
    pub max_bytes: usize,
}

impl Default for VideoSettings {
    fn default() -> Self {
        VideoSettings {
            strategy: FrameStrategy::Uniform,
            fps: 2.0,
            max_frames: 32,
            spatial_pool: 2,
            temporal_pool: 1,
            token_budget: 16_384,
            keyframe_threshold: 0.08,
            max_seconds: 600.0,
            max_source_frames: 36_000,
            max_bytes: 20 << 20,
        }
    }
}

/// The first of the [`VideoSettings`] that cannot work.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum VideoSettingsError {
    #[error("spatial_pool ({spatial_pool}) must divide the {side}-patch side of a frame")]
    SpatialPool { spatial_pool: u32, side: u32 },
    #[error("temporal_pool ({0}) must be 1 to 16")]
    TemporalPool(u32),
    #[error("max_frames ({0}) must be 1 to 1024")]
    MaxFrames(u32),
    #[error("fps ({0}) must be above 0 and at most 120")]
    Fps(f64),
    #[error("keyframe_threshold ({0}) must be 0 to 1")]
    KeyframeThreshold(f64),
    #[error("max_seconds ({0}) must be positive")]
    MaxSeconds(f64),
    #[error("token_budget, max_source_frames and max_bytes must be positive")]
    ZeroLimit,
}

impl VideoSettings {
    /// Checks the settings (with the image settings that shape each frame).
    pub fn validate(&self, image: &ImageSettings) -> Result<(), VideoSettingsError> {
        let side = image.image_size / image.patch_size.max(1);
        if self.spatial_pool == 0 || !side.is_multiple_of(self.spatial_pool) {
            return Err(VideoSettingsError::SpatialPool {
                spatial_pool: self.spatial_pool,
                side,
            });
        }
        if !(1..=16).contains(&self.temporal_pool) {
            return Err(VideoSettingsError::TemporalPool(self.temporal_pool));
        }
        if !(1..=1_024).contains(&self.max_frames) {
            return Err(VideoSettingsError::MaxFrames(self.max_frames));
        }
        if !(self.fps.is_finite() && self.fps > 0.0 && self.fps <= 120.0) {
            return Err(VideoSettingsError::Fps(self.fps));
        }
        if !(0.0..=1.0).contains(&self.keyframe_threshold) {
            return Err(VideoSettingsError::KeyframeThreshold(
                self.keyframe_threshold,
            ));
        }
        if !(self.max_seconds.is_finite() && self.max_seconds > 0.0) {
            return Err(VideoSettingsError::MaxSeconds(self.max_seconds));
        }
        if self.token_budget == 0 || self.max_source_frames == 0 || self.max_bytes == 0 {
            return Err(VideoSettingsError::ZeroLimit);
        }
        Ok(())
    }

    /// Tokens one kept frame takes (before temporal pooling).
    pub fn frame_tokens(&self, image: &ImageSettings) -> u32 {
        let side = image.image_size / image.patch_size / self.spatial_pool;
        side * side
    }

    /// Tokens for `frames` kept frames.
    pub fn tokens_for(&self, frames: u32, image: &ImageSettings) -> u32 {
        frames.div_ceil(self.temporal_pool) * self.frame_tokens(image)
    }

    /// Most frames within `budget` tokens (at least one) and `max_frames`.
    pub fn frames_within(&self, budget: u32, image: &ImageSettings) -> u32 {
        let groups = budget / self.frame_tokens(image);
        (groups.saturating_mul(self.temporal_pool))
            .min(self.max_frames)
            .max(1)
    }
}
