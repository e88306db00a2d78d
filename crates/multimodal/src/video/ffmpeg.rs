//! Any container and codec a local ffmpeg reads: `ffprobe` for the frame count and
//! duration, `ffmpeg` for the chosen frames as raw RGB, each run under a time limit.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use image::RgbImage;

use super::container::{FrameSource, Header, check_size};
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
        check_size(width, height, image)?;
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
            let frame = RgbImage::from_raw(self.header.width, self.header.height, pixels.to_vec())
                .ok_or_else(|| MediaError::Internal("a frame has the wrong size".into()))?;
            sink(i, frame)?;
        }
        Ok(())
    }
}
