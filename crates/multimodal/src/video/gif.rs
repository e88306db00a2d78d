//! Animated GIF: the frames' delays in a first pass, the wanted frames in a second.

use std::io::Cursor;

use image::codecs::gif::GifDecoder;
use image::{AnimationDecoder, ImageDecoder, RgbImage};

use super::container::{FrameSource, Header};
use crate::MediaError;

/// An animated GIF: frames with their delays.
pub(super) struct Gif<'a> {
    bytes: &'a [u8],
    header: Header,
}

impl<'a> Gif<'a> {
    pub(super) fn open(bytes: &'a [u8]) -> Result<Self, MediaError> {
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
