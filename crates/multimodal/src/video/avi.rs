//! Motion-JPEG AVI: a walk over the RIFF chunks finds the JPEG frames, decoded on demand.

use std::io::Cursor;

use image::RgbImage;

use super::container::{FrameSource, Header};
use crate::MediaError;

/// An AVI of JPEG frames (motion JPEG): the frames' places in the file, decoded on demand.
pub(super) struct Mjpeg<'a> {
    bytes: &'a [u8],
    frames: Vec<(usize, usize)>,
    header: Header,
}

impl<'a> Mjpeg<'a> {
    pub(super) fn open(bytes: &'a [u8]) -> Result<Self, MediaError> {
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
