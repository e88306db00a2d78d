//! MP4 with H.264 video, decoded with OpenH264 (built from its bundled source).

use std::io::Cursor;

use image::RgbImage;
use openh264::decoder::{Decoder, DecoderConfig, Flush};
use openh264::formats::YUVSource;

use super::container::{FrameSource, Header};
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
            Decoder::with_api_config(openh264::OpenH264API::from_source(), config).map_err(bad)?;
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
