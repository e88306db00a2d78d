//! Video to frame tokens: read the container (MP4/H.264 with the `h264` feature, animated
//! GIF, MJPEG AVI) without any system library, pick frames by a strategy (`uniform`, `fps`,
//! `keyframe`) within a visual token budget, fit each to the vision tower's square, count
//! the tokens (pooled in space and optionally in time) and hash the frames with the
//! settings.

use std::io::Cursor;
use std::path::Path;

use fast_image_resize::Resizer;
use image::codecs::gif::GifDecoder;
use image::{AnimationDecoder, ImageDecoder, RgbImage};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use crate::MediaError;
use crate::image::{ImageSettings, fit};

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

impl VideoSettings {
    /// Checks the settings (with the image settings that shape each frame).
    pub fn validate(&self, image: &ImageSettings) -> Result<(), String> {
        let side = image.image_size / image.patch_size.max(1);
        if self.spatial_pool == 0 || !side.is_multiple_of(self.spatial_pool) {
            return Err(format!(
                "spatial_pool ({}) must divide the {side}-patch side of a frame",
                self.spatial_pool
            ));
        }
        if !(1..=16).contains(&self.temporal_pool) {
            return Err(format!(
                "temporal_pool ({}) must be 1 to 16",
                self.temporal_pool
            ));
        }
        if !(1..=1_024).contains(&self.max_frames) {
            return Err(format!(
                "max_frames ({}) must be 1 to 1024",
                self.max_frames
            ));
        }
        if !(self.fps.is_finite() && self.fps > 0.0 && self.fps <= 120.0) {
            return Err(format!(
                "fps ({}) must be above 0 and at most 120",
                self.fps
            ));
        }
        if !(0.0..=1.0).contains(&self.keyframe_threshold) {
            return Err(format!(
                "keyframe_threshold ({}) must be 0 to 1",
                self.keyframe_threshold
            ));
        }
        if !(self.max_seconds.is_finite() && self.max_seconds > 0.0) {
            return Err(format!(
                "max_seconds ({}) must be positive",
                self.max_seconds
            ));
        }
        if self.token_budget == 0 || self.max_source_frames == 0 || self.max_bytes == 0 {
            return Err("token_budget, max_source_frames and max_bytes must be positive".into());
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

/// `n` indices evenly spread over `0..total` (the middle of each of `n` equal spans), or all
/// of them if there are no more than `n`.
pub fn uniform(total: usize, n: usize) -> Vec<usize> {
    if total <= n {
        return (0..total).collect();
    }
    (0..n).map(|i| (2 * i + 1) * total / (2 * n)).collect()
}

/// The first frame at or after each multiple of `1 / fps` seconds.
pub fn at_fps(times: &[f64], fps: f64) -> Vec<usize> {
    let step = 1.0 / fps;
    let mut out = Vec::new();
    let mut next = 0.0;
    for (i, t) in times.iter().enumerate() {
        if *t + 1e-9 >= next {
            out.push(i);
            next = (((*t + 1e-9) / step).floor() + 1.0) * step;
        }
    }
    out
}

const THUMB: u32 = 64;

/// A 64 × 64 grey thumbnail.
fn thumbnail(frame: &RgbImage) -> Vec<u8> {
    let small = image::imageops::thumbnail(frame, THUMB, THUMB);
    small
        .pixels()
        .map(|p| {
            ((u32::from(p[0]) * 299 + u32::from(p[1]) * 587 + u32::from(p[2]) * 114) / 1000) as u8
        })
        .collect()
}

fn mean_difference(a: &[u8], b: &[u8]) -> f64 {
    let total: u64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| u64::from(x.abs_diff(*y)))
        .sum();
    total as f64 / (a.len().max(1) as f64 * 255.0)
}

/// What a container says of its video.
struct Header {
    format: &'static str,
    width: u32,
    height: u32,
    /// Each frame's presentation time, in seconds, in display order.
    times: Vec<f64>,
    seconds: f64,
}

/// A container's frames: their times, and decoding of chosen ones in order.
trait FrameSource {
    fn header(&self) -> &Header;
    /// Decodes the frames at `wanted` (ascending display indices), handing each to `sink`.
    fn decode(
        &mut self,
        wanted: &[usize],
        sink: &mut dyn FnMut(usize, RgbImage) -> Result<(), MediaError>,
    ) -> Result<(), MediaError>;
}

/// Refuses empty frames and frames over the image limits.
fn check_size(width: u32, height: u32, image: &ImageSettings) -> Result<(), MediaError> {
    if width == 0 || height == 0 {
        return Err(MediaError::Undecodable(
            "the video's frames are empty".into(),
        ));
    }
    image.check_pixels(width, height)
}

fn open<'a>(
    bytes: &'a [u8],
    image: &ImageSettings,
) -> Result<Box<dyn FrameSource + 'a>, MediaError> {
    let check_size = |width, height| check_size(width, height, image);
    if bytes.starts_with(b"GIF8") {
        let source = Gif::open(bytes)?;
        check_size(source.header().width, source.header().height)?;
        return Ok(Box::new(source));
    }
    if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"AVI " {
        let source = Mjpeg::open(bytes)?;
        check_size(source.header().width, source.header().height)?;
        return Ok(Box::new(source));
    }
    if bytes.len() >= 12 && &bytes[4..8] == b"ftyp" {
        #[cfg(feature = "h264")]
        {
            let source = h264::Mp4::open(bytes)?;
            check_size(source.header().width, source.header().height)?;
            return Ok(Box::new(source));
        }
        #[cfg(not(feature = "h264"))]
        return Err(MediaError::UnknownFormat(
            "this build reads animated GIF and MJPEG AVI video; MP4 needs the `h264` feature"
                .into(),
        ));
    }
    Err(MediaError::UnknownFormat(
        "not a video this server reads (MP4/H.264, animated GIF or MJPEG AVI)".into(),
    ))
}

/// An animated GIF: frames with their delays.
struct Gif<'a> {
    bytes: &'a [u8],
    header: Header,
}

impl<'a> Gif<'a> {
    fn open(bytes: &'a [u8]) -> Result<Self, MediaError> {
        let bad = |e: image::ImageError| MediaError::Undecodable(format!("the GIF: {e}"));
        let decoder = GifDecoder::new(Cursor::new(bytes)).map_err(bad)?;
        let (width, height) = decoder.dimensions();
        // The delays are only known frame by frame: a first pass reads them (GIF frames are
        // small and quick), the second keeps the wanted ones.
        let mut times = Vec::new();
        let mut at = 0.0;
        for frame in decoder.into_frames() {
            let frame = frame.map_err(bad)?;
            times.push(at);
            let (numerator, denominator) = frame.delay().numer_denom_ms();
            // Browsers show delays under 20 ms as 100 ms.
            let delay = f64::from(numerator) / f64::from(denominator.max(1));
            at += if delay < 20.0 { 100.0 } else { delay } / 1_000.0;
            if times.len() > 100_000 {
                break;
            }
        }
        Ok(Gif {
            bytes,
            header: Header {
                format: "gif",
                width,
                height,
                times,
                seconds: at,
            },
        })
    }
}

impl FrameSource for Gif<'_> {
    fn header(&self) -> &Header {
        &self.header
    }
    fn decode(
        &mut self,
        wanted: &[usize],
        sink: &mut dyn FnMut(usize, RgbImage) -> Result<(), MediaError>,
    ) -> Result<(), MediaError> {
        let bad = |e: image::ImageError| MediaError::Undecodable(format!("the GIF: {e}"));
        let decoder = GifDecoder::new(Cursor::new(self.bytes)).map_err(bad)?;
        let mut next = wanted.iter().peekable();
        for (i, frame) in decoder.into_frames().enumerate() {
            let Some(&&want) = next.peek() else {
                break;
            };
            let frame = frame.map_err(bad)?;
            if i == want {
                next.next();
                sink(
                    i,
                    image::DynamicImage::ImageRgba8(frame.into_buffer()).into_rgb8(),
                )?;
            }
        }
        Ok(())
    }
}

/// An AVI of JPEG frames (motion JPEG): the frames' places in the file, decoded on demand.
struct Mjpeg<'a> {
    bytes: &'a [u8],
    frames: Vec<(usize, usize)>,
    header: Header,
}

impl<'a> Mjpeg<'a> {
    fn open(bytes: &'a [u8]) -> Result<Self, MediaError> {
        let mut frames = Vec::new();
        let mut micros_per_frame = 0u32;
        walk_riff(&bytes[12..], 12, 0, &mut |id, offset, data| {
            if id == b"avih" && data.len() >= 4 {
                micros_per_frame = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            } else if (id[2..] == *b"dc" || id[2..] == *b"db") && data.starts_with(&[0xFF, 0xD8]) {
                frames.push((offset, data.len()));
            }
        })?;
        let Some(&(first, len)) = frames.first() else {
            return Err(MediaError::UnknownFormat(
                "the AVI has no JPEG frames (only motion-JPEG AVI is read)".into(),
            ));
        };
        let (width, height) = image::ImageReader::with_format(
            Cursor::new(&bytes[first..first + len]),
            image::ImageFormat::Jpeg,
        )
        .into_dimensions()
        .map_err(|e| MediaError::Undecodable(format!("the AVI's first frame: {e}")))?;
        let step = if micros_per_frame == 0 {
            1.0 / 25.0
        } else {
            f64::from(micros_per_frame) / 1e6
        };
        let times: Vec<f64> = (0..frames.len()).map(|i| i as f64 * step).collect();
        Ok(Mjpeg {
            bytes,
            header: Header {
                format: "avi",
                width,
                height,
                times,
                seconds: frames.len() as f64 * step,
            },
            frames,
        })
    }
}

/// Sees a RIFF chunk: its id, where its data starts in the file, its data.
type ChunkVisitor<'v> = dyn FnMut(&[u8; 4], usize, &[u8]) + 'v;

/// Walks RIFF chunks in `data` (which starts at `base` in the file), entering `LIST`s, and
/// hands every other chunk's id, file offset and data to `visit`.
fn walk_riff(
    data: &[u8],
    base: usize,
    depth: u32,
    visit: &mut ChunkVisitor<'_>,
) -> Result<(), MediaError> {
    if depth > 8 {
        return Err(MediaError::Undecodable(
            "the AVI nests lists too deep".into(),
        ));
    }
    let mut at = 0usize;
    while at + 8 <= data.len() {
        let id: [u8; 4] = [data[at], data[at + 1], data[at + 2], data[at + 3]];
        let size =
            u32::from_le_bytes([data[at + 4], data[at + 5], data[at + 6], data[at + 7]]) as usize;
        let start = at + 8;
        // A truncated last chunk keeps what is there.
        let end = start.saturating_add(size).min(data.len());
        if &id == b"LIST" && end >= start + 4 {
            walk_riff(&data[start + 4..end], base + start + 4, depth + 1, visit)?;
        } else {
            visit(&id, base + start, &data[start..end]);
        }
        at = end + (size & 1);
    }
    Ok(())
}

impl FrameSource for Mjpeg<'_> {
    fn header(&self) -> &Header {
        &self.header
    }
    fn decode(
        &mut self,
        wanted: &[usize],
        sink: &mut dyn FnMut(usize, RgbImage) -> Result<(), MediaError>,
    ) -> Result<(), MediaError> {
        for &i in wanted {
            let (offset, len) = self.frames[i];
            let mut reader = image::ImageReader::with_format(
                Cursor::new(&self.bytes[offset..offset + len]),
                image::ImageFormat::Jpeg,
            );
            let mut limits = image::Limits::default();
            limits.max_image_width = Some(self.header.width.max(1) * 2);
            limits.max_image_height = Some(self.header.height.max(1) * 2);
            reader.limits(limits);
            let frame = reader
                .decode()
                .map_err(|e| MediaError::Undecodable(format!("the AVI's frame {i}: {e}")))?;
            sink(i, frame.into_rgb8())?;
        }
        Ok(())
    }
}

mod ffmpeg {
    //! Any container and codec a local ffmpeg reads: `ffprobe` for the frame count and
    //! duration, `ffmpeg` for the chosen frames as raw RGB, each run under a time limit.

    use std::io::Read;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use image::RgbImage;

    use super::{FrameSource, Header};
    use crate::MediaError;
    use crate::image::ImageSettings;

    /// Longest an ffmpeg or ffprobe run may take.
    const LIMIT: Duration = Duration::from_secs(30);

    pub(super) struct Ffmpeg {
        ffmpeg: PathBuf,
        file: TempFile,
        header: Header,
    }

    /// The video written to a file (containers such as MP4 may keep their index at the end,
    /// which a pipe cannot seek to), removed when dropped.
    struct TempFile(PathBuf);

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    impl Ffmpeg {
        pub(super) fn open(
            bytes: &[u8],
            ffmpeg: &Path,
            image: &ImageSettings,
        ) -> Result<Self, MediaError> {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let path = std::env::temp_dir().join(format!(
                "switchyard-video-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&path, bytes)
                .map_err(|e| MediaError::Internal(format!("cannot stage the video: {e}")))?;
            let file = TempFile(path);
            let ffprobe = ffmpeg.with_file_name(
                ffmpeg
                    .file_name()
                    .and_then(|n| n.to_str())
                    .map_or("ffprobe".into(), |n| n.replacen("ffmpeg", "ffprobe", 1)),
            );
            let mut probe = Command::new(&ffprobe);
            probe
                .args(["-v", "error", "-select_streams", "v:0", "-count_packets"])
                .args([
                    "-show_entries",
                    "stream=width,height,nb_read_packets:format=duration",
                ])
                .args(["-of", "default=noprint_wrappers=1"])
                .arg(&file.0);
            let out = run(&mut probe)?;
            let text = String::from_utf8_lossy(&out);
            let field = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            };
            let (Some(width), Some(height), Some(frames)) =
                (field("width"), field("height"), field("nb_read_packets"))
            else {
                return Err(MediaError::UnknownFormat(
                    "not a video ffmpeg reads (no video stream)".into(),
                ));
            };
            let (width, height) = (width as u32, height as u32);
            super::check_size(width, height, image)?;
            let frames = frames as usize;
            let seconds = field("duration").unwrap_or(frames as f64 / 25.0);
            let step = if frames == 0 {
                0.0
            } else {
                seconds / frames as f64
            };
            Ok(Ffmpeg {
                ffmpeg: ffmpeg.to_path_buf(),
                file,
                header: Header {
                    format: "ffmpeg",
                    width,
                    height,
                    times: (0..frames).map(|i| i as f64 * step).collect(),
                    seconds,
                },
            })
        }
    }

    /// Runs a command to completion within [`LIMIT`], returning its output; killed if it
    /// takes longer. A failure is the video's (ffmpeg reports bad input with an exit code).
    fn run(command: &mut Command) -> Result<Vec<u8>, MediaError> {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| MediaError::Internal(format!("cannot run ffmpeg: {e}")))?;
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = stdout.read_to_end(&mut out);
            out
        });
        let errors = std::thread::spawn(move || {
            let mut out = String::new();
            let _ = stderr.read_to_string(&mut out);
            out
        });
        let started = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() < LIMIT => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(MediaError::Undecodable(format!(
                        "decoding the video took over {} s",
                        LIMIT.as_secs()
                    )));
                }
            }
        };
        let out = reader.join().unwrap_or_default();
        let errors = errors.join().unwrap_or_default();
        if !status.success() {
            let first = errors.lines().next().unwrap_or("no message");
            return Err(MediaError::Undecodable(format!(
                "ffmpeg cannot read the video: {}",
                crate::cap(first)
            )));
        }
        Ok(out)
    }

    impl FrameSource for Ffmpeg {
        fn header(&self) -> &Header {
            &self.header
        }
        fn decode(
            &mut self,
            wanted: &[usize],
            sink: &mut dyn FnMut(usize, RgbImage) -> Result<(), MediaError>,
        ) -> Result<(), MediaError> {
            if wanted.is_empty() {
                return Ok(());
            }
            let select: Vec<String> = wanted.iter().map(|i| format!("eq(n\\,{i})")).collect();
            let mut command = Command::new(&self.ffmpeg);
            command
                .args(["-v", "error", "-nostdin", "-i"])
                .arg(&self.file.0)
                .args(["-map", "0:v:0", "-vf"])
                .arg(format!("select='{}'", select.join("+")))
                .args([
                    "-fps_mode",
                    "passthrough",
                    "-f",
                    "rawvideo",
                    "-pix_fmt",
                    "rgb24",
                ])
                .arg("pipe:1");
            let out = run(&mut command)?;
            let frame_bytes = self.header.width as usize * self.header.height as usize * 3;
            for (&i, pixels) in wanted.iter().zip(out.chunks_exact(frame_bytes)) {
                let frame =
                    RgbImage::from_raw(self.header.width, self.header.height, pixels.to_vec())
                        .ok_or_else(|| MediaError::Internal("a frame has the wrong size".into()))?;
                sink(i, frame)?;
            }
            Ok(())
        }
    }
}

#[cfg(feature = "h264")]
mod h264 {
    //! MP4 with H.264 video, decoded with OpenH264 (built from its bundled source).

    use std::io::Cursor;

    use image::RgbImage;
    use openh264::decoder::{Decoder, DecoderConfig, Flush};
    use openh264::formats::YUVSource;

    use super::{FrameSource, Header};
    use crate::MediaError;

    pub(super) struct Mp4<'a> {
        reader: mp4::Mp4Reader<Cursor<&'a [u8]>>,
        track: u32,
        samples: u32,
        /// Bytes of each NAL unit's length prefix in the samples.
        length_size: usize,
        /// SPS and PPS in Annex B form, sent before the first sample.
        parameters: Vec<u8>,
        header: Header,
    }

    impl<'a> Mp4<'a> {
        pub(super) fn open(bytes: &'a [u8]) -> Result<Self, MediaError> {
            let bad = |e: mp4::Error| MediaError::Undecodable(format!("the MP4: {e}"));
            let reader =
                mp4::Mp4Reader::read_header(Cursor::new(bytes), bytes.len() as u64).map_err(bad)?;
            let Some(track) = reader
                .tracks()
                .values()
                .find(|t| matches!(t.media_type(), Ok(mp4::MediaType::H264)))
            else {
                return Err(MediaError::UnknownFormat(
                    "the MP4 has no H.264 video track (only H.264 is read)".into(),
                ));
            };
            let avc = track
                .trak
                .mdia
                .minf
                .stbl
                .stsd
                .avc1
                .as_ref()
                .ok_or_else(|| MediaError::UnknownFormat("the MP4's video is not avc1".into()))?;
            let mut parameters = Vec::new();
            for nal in avc
                .avcc
                .sequence_parameter_sets
                .iter()
                .chain(&avc.avcc.picture_parameter_sets)
            {
                parameters.extend_from_slice(&[0, 0, 0, 1]);
                parameters.extend_from_slice(&nal.bytes);
            }
            let samples = track.sample_count();
            let seconds = track.duration().as_secs_f64();
            let step = if samples == 0 {
                0.0
            } else {
                seconds / f64::from(samples)
            };
            Ok(Mp4 {
                track: track.track_id(),
                samples,
                length_size: usize::from(avc.avcc.length_size_minus_one & 3) + 1,
                parameters,
                header: Header {
                    format: "mp4",
                    width: u32::from(track.width()),
                    height: u32::from(track.height()),
                    times: (0..samples).map(|i| f64::from(i) * step).collect(),
                    seconds,
                },
                reader,
            })
        }
    }

    /// Rewrites length-prefixed NAL units as Annex B (start codes), appending to `out`.
    fn annex_b(sample: &[u8], length_size: usize, out: &mut Vec<u8>) -> Result<(), MediaError> {
        let mut at = 0;
        while at + length_size <= sample.len() {
            let len = sample[at..at + length_size]
                .iter()
                .fold(0usize, |n, b| (n << 8) | usize::from(*b));
            at += length_size;
            let end = at
                .checked_add(len)
                .filter(|end| *end <= sample.len())
                .ok_or_else(|| MediaError::Undecodable("an MP4 sample is truncated".into()))?;
            out.extend_from_slice(&[0, 0, 0, 1]);
            out.extend_from_slice(&sample[at..end]);
            at = end;
        }
        Ok(())
    }

    impl FrameSource for Mp4<'_> {
        fn header(&self) -> &Header {
            &self.header
        }
        fn decode(
            &mut self,
            wanted: &[usize],
            sink: &mut dyn FnMut(usize, RgbImage) -> Result<(), MediaError>,
        ) -> Result<(), MediaError> {
            let bad = |e: openh264::Error| MediaError::Undecodable(format!("the H.264 video: {e}"));
            let config = DecoderConfig::new().flush_after_decode(Flush::NoFlush);
            let mut decoder =
                Decoder::with_api_config(openh264::OpenH264API::from_source(), config)
                    .map_err(bad)?;
            let mut next = wanted.iter().copied().peekable();
            // Frames come out in display order; `shown` counts them.
            let mut shown = 0usize;
            let mut packet = self.parameters.clone();
            let mut emit = |yuv: &openh264::decoder::DecodedYUV<'_>,
                            shown: &mut usize|
             -> Result<bool, MediaError> {
                let index = *shown;
                *shown += 1;
                if next.peek() == Some(&index) {
                    next.next();
                    let (w, h) = yuv.dimensions();
                    let mut rgb = vec![0u8; w * h * 3];
                    yuv.write_rgb8(&mut rgb);
                    let frame = RgbImage::from_raw(w as u32, h as u32, rgb).ok_or_else(|| {
                        MediaError::Internal("a decoded frame has the wrong size".into())
                    })?;
                    sink(index, frame)?;
                }
                Ok(next.peek().is_none())
            };
            for id in 1..=self.samples {
                let Some(sample) = self
                    .reader
                    .read_sample(self.track, id)
                    .map_err(|e| MediaError::Undecodable(format!("the MP4: {e}")))?
                else {
                    continue;
                };
                annex_b(&sample.bytes, self.length_size, &mut packet)?;
                let decoded = decoder.decode(&packet).map_err(bad)?;
                packet.clear();
                if let Some(yuv) = decoded
                    && emit(&yuv, &mut shown)?
                {
                    return Ok(());
                }
            }
            for yuv in decoder.flush_remaining().map_err(bad)? {
                if emit(&yuv, &mut shown)? {
                    break;
                }
            }
            Ok(())
        }
    }
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
        assert!(odd.validate(&image).unwrap_err().contains("spatial_pool"));
    }
}
