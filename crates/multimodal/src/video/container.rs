//! What every container gives: a [`Header`] (size, frame times) and a [`FrameSource`] that
//! decodes chosen frames in order; [`open`] picks the reader by the magic bytes.

use image::RgbImage;

use super::avi::Mjpeg;
use super::gif::Gif;
#[cfg(feature = "h264")]
use super::h264;
use crate::MediaError;
use crate::image::ImageSettings;

/// What a container says of its video.
pub(super) struct Header {
    pub(super) format: &'static str,
    pub(super) width: u32,
    pub(super) height: u32,
    /// Each frame's presentation time, in seconds, in display order.
    pub(super) times: Vec<f64>,
    pub(super) seconds: f64,
}

/// A container's frames: their times, and decoding of chosen ones in order.
pub(super) trait FrameSource {
    fn header(&self) -> &Header;
    /// Decodes the frames at `wanted` (ascending display indices), handing each to `sink`.
    fn decode(
        &mut self,
        wanted: &[usize],
        sink: &mut dyn FnMut(usize, RgbImage) -> Result<(), MediaError>,
    ) -> Result<(), MediaError>;
}

/// Refuses empty frames and frames over the image limits.
pub(super) fn check_size(width: u32, height: u32, image: &ImageSettings) -> Result<(), MediaError> {
    if width == 0 || height == 0 {
        return Err(MediaError::Undecodable(
            "the video's frames are empty".into(),
        ));
    }
    image.check_pixels(width, height)
}

/// Reads the container's header, by its magic bytes.
pub(super) fn open<'a>(
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
