//! Video to frame tokens: read the container (MP4/H.264 with the `h264` feature, animated
//! GIF, MJPEG AVI) without any system library, pick frames by a strategy (`uniform`, `fps`,
//! `keyframe`) within a visual token budget, fit each to the vision tower's square, count
//! the tokens (pooled in space and optionally in time) and hash the frames with the
//! settings.
//!
//! The settings are in `settings`, the frame choice in `sample`, the readers behind one
//! trait in `container` (`gif`, `avi`, `h264`, and `ffmpeg` for anything else); this file
//! ties them together.

mod avi;
mod container;
mod ffmpeg;
mod gif;
#[cfg(feature = "h264")]
mod h264;
mod sample;
mod settings;

use std::path::Path;

use fast_image_resize::Resizer;
use image::RgbImage;
use xxhash_rust::xxh3::Xxh3;

use self::container::open;
pub use self::sample::{at_fps, uniform};
use self::sample::{mean_difference, thumbnail};
pub use self::settings::{FrameStrategy, VideoSettings, VideoSettingsError};
use crate::MediaError;
use crate::image::{ImageSettings, fit};

/// A video ready for a vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedVideo {
    /// `mp4`, `gif` or `avi`.
    pub format: &'static str,
    pub width: u32,
    pub height: u32,
    pub seconds: f64,
    pub source_frames: u32,
    /// The kept frames' times, in seconds, and their RGB squares.
    pub times: Vec<f64>,
    pub squares: Vec<Vec<u8>>,
    pub tokens: u32,
    /// Content hash: the kept frames as fitted and everything that shapes the tokens.
    pub hash: u64,
}

/// Decodes and prepares a video, keeping at most `room` tokens (the request's room in the
/// context) and the settings' budget. Containers this crate does not read go through
/// `ffmpeg` (the path of an `ffmpeg` binary with `ffprobe` beside it) when one is given.
/// CPU-bound (tens of milliseconds for a short clip): call it off the async threads.
pub fn prepare_video(
    bytes: &[u8],
    image: &ImageSettings,
    settings: &VideoSettings,
    room: u32,
    ffmpeg: Option<&Path>,
) -> Result<PreparedVideo, MediaError> {
    if bytes.len() > settings.max_bytes {
        return Err(MediaError::TooLarge {
            bytes: bytes.len() as u64,
            limit: settings.max_bytes as u64,
        });
    }
    let budget = settings.token_budget.min(room);
    if budget < settings.frame_tokens(image) {
        return Err(MediaError::BadSetting(format!(
            "the video needs at least {} tokens for one frame; the request has room for {budget}",
            settings.frame_tokens(image)
        )));
    }
    let mut source = match open(bytes, image) {
        Err(MediaError::UnknownFormat(why)) => match ffmpeg {
            Some(ffmpeg) => Box::new(ffmpeg::Ffmpeg::open(bytes, ffmpeg, image)?),
            None => return Err(MediaError::UnknownFormat(why)),
        },
        other => other?,
    };
    let times = source.header().times.clone();
    if times.is_empty() {
        return Err(MediaError::Undecodable("the video has no frames".into()));
    }
    let seconds = source.header().seconds;
    if seconds > settings.max_seconds || times.len() > settings.max_source_frames as usize {
        return Err(MediaError::BadSetting(format!(
            "the video is {seconds:.1} s and {} frames; up to {} s and {} frames are accepted",
            times.len(),
            settings.max_seconds,
            settings.max_source_frames
        )));
    }
    let keep = settings.frames_within(budget, image) as usize;
    let (width, height) = (source.header().width, source.header().height);
    let side = image.image_size;
    let mut resizer = Resizer::new();
    let mut square = |frame: RgbImage| -> Result<Vec<u8>, MediaError> {
        let (w, h) = frame.dimensions();
        let mut pixels = frame.into_raw();
        fit(&mut resizer, &mut pixels, w, h, side, side)
    };
    let mut kept: Vec<(usize, Vec<u8>)> = Vec::with_capacity(keep);
    match settings.strategy {
        FrameStrategy::Uniform => {
            let wanted = uniform(times.len(), keep);
            source.decode(&wanted, &mut |i, frame| {
                kept.push((i, square(frame)?));
                Ok(())
            })?;
        }
        FrameStrategy::Fps => {
            let at_rate = at_fps(&times, settings.fps);
            let wanted: Vec<usize> = uniform(at_rate.len(), keep)
                .into_iter()
                .map(|i| at_rate[i])
                .collect();
            source.decode(&wanted, &mut |i, frame| {
                kept.push((i, square(frame)?));
                Ok(())
            })?;
        }
        FrameStrategy::Keyframe => {
            let candidates = at_fps(&times, settings.fps.min(4.0));
            let mut last: Option<Vec<u8>> = None;
            // (difference from the frame kept before, index, square)
            let mut best: Vec<(f64, usize, Vec<u8>)> = Vec::new();
            source.decode(&candidates, &mut |i, frame| {
                let thumb = thumbnail(&frame);
                let difference = match &last {
                    None => f64::INFINITY,
                    Some(previous) => mean_difference(previous, &thumb),
                };
                if difference > settings.keyframe_threshold {
                    last = Some(thumb);
                    best.push((difference, i, square(frame)?));
                    if best.len() > keep {
                        let weakest = best
                            .iter()
                            .enumerate()
                            .min_by(|a, b| a.1.0.total_cmp(&b.1.0))
                            .map_or(0, |(at, _)| at);
                        best.remove(weakest);
                    }
                }
                Ok(())
            })?;
            kept = best.into_iter().map(|(_, i, s)| (i, s)).collect();
        }
    }
    if kept.is_empty() {
        return Err(MediaError::Undecodable(
            "no frame of the video could be decoded".into(),
        ));
    }
    kept.sort_by_key(|(i, _)| *i);
    let tokens = settings.tokens_for(kept.len() as u32, image);
    let mut hasher = Xxh3::new();
    hasher.update(b"video/1");
    for value in [
        image.image_size,
        image.patch_size,
        settings.spatial_pool,
        settings.temporal_pool,
        kept.len() as u32,
    ] {
        hasher.update(&value.to_le_bytes());
    }
    for (_, square) in &kept {
        hasher.update(square);
    }
    Ok(PreparedVideo {
        format: source.header().format,
        width,
        height,
        seconds,
        source_frames: times.len() as u32,
        times: kept.iter().map(|(i, _)| times[*i]).collect(),
        squares: kept.into_iter().map(|(_, s)| s).collect(),
        tokens,
        hash: hasher.digest(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_takes_the_middle_of_equal_spans() {
        assert_eq!(uniform(10, 2), [2, 7]);
        assert_eq!(uniform(3, 8), [0, 1, 2]);
        assert_eq!(uniform(300, 4), [37, 112, 187, 262]);
    }

    #[test]
    fn fps_takes_the_first_frame_of_each_step() {
        let times: Vec<f64> = (0..30).map(|i| f64::from(i) / 10.0).collect();
        assert_eq!(at_fps(&times, 2.0), [0, 5, 10, 15, 20, 25]);
        assert_eq!(at_fps(&times, 100.0).len(), 30);
    }

    #[test]
    fn the_budget_picks_the_frame_count() {
        let image = ImageSettings::default();
        let video = VideoSettings::default();
        assert_eq!(video.frame_tokens(&image), 144);
        assert_eq!(video.frames_within(16_384, &image), 32);
        assert_eq!(video.frames_within(1_000, &image), 6);
        let pooled = VideoSettings {
            temporal_pool: 2,
            ..video
        };
        assert_eq!(pooled.frames_within(1_000, &image), 12);
        assert_eq!(pooled.tokens_for(12, &image), 6 * 144);
        assert_eq!(pooled.tokens_for(11, &image), 6 * 144);
        assert!(video.validate(&image).is_ok());
        let odd = VideoSettings {
            spatial_pool: 5,
            ..video
        };
        assert!(
            odd.validate(&image)
                .unwrap_err()
                .to_string()
                .contains("spatial_pool")
        );
    }
}
