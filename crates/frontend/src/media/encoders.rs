//! The media stage's part in encoding: which encoder worker goes first (by
//! `encoder_policy` and the work outstanding on each), and items made smaller for an
//! encoder that ran out of memory.

use switchyard_core::protocol::MediaInput;
use switchyard_core::{Modality, WorkerId};
use switchyard_multimodal::{halve_squares, reduced_hash};

use super::{MediaItem, MediaStage};

impl MediaStage {
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
