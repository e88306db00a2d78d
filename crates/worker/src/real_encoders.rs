//! Real encoders behind an encoder worker (feature `encoders`): a DINOv2-style vision tower
//! on ONNX Runtime for images and video frames, Whisper's audio encoder on candle for
//! audio. Each runs on its own batcher thread, so items of one modality from different
//! requests share forward passes. The embeddings go back to the frontend, which hands them
//! to LLM workers that merge them into the sequences they prefill.

use bytes::Bytes;
use switchyard_core::Modality;
use switchyard_core::protocol::{EngineError, MediaInput};
use switchyard_encoders::{AudioEncoder, EncoderError, VisionEncoder, WINDOW_FRAMES};

use crate::batcher::{BatchModel, Batcher};
use crate::encoder::EncoderModels;
use crate::error::WorkerError;

/// One unit's embeddings: `tokens` rows of `dim` values.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub tokens: usize,
    pub dim: usize,
    pub values: Vec<f32>,
}

/// An item's units' embeddings as one input for an LLM worker: their rows one after
/// another (units of one item share their width).
pub fn item_embeddings(units: &[Encoded]) -> Option<MediaInput> {
    let dim = units.first()?.dim;
    if units.iter().any(|u| u.dim != dim) {
        return None;
    }
    let values: Vec<f32> = units
        .iter()
        .flat_map(|u| u.values.iter().copied())
        .collect();
    Some(MediaInput::embeddings(dim as u32, &values))
}

/// A model's failure as the request's error: an allocation failure (ONNX Runtime's
/// "Failed to allocate memory", `bad_alloc`, a tensor library's "out of memory") is
/// [`EngineError::OutOfMemory`], so the frontend sends the item again smaller; anything
/// else is internal.
pub fn model_error(modality: Modality, message: String) -> EngineError {
    let lower = message.to_lowercase();
    let allocation = [
        "out of memory",
        "failed to allocate",
        "bad_alloc",
        "bad allocation",
        "cannot allocate",
        "memory allocation",
    ]
    .iter()
    .any(|m| lower.contains(m));
    if allocation {
        EngineError::OutOfMemory(format!(
            "the {modality:?} encoder ran out of memory: {message}"
        ))
    } else {
        EngineError::Internal(format!("the {modality:?} encoder failed: {message}"))
    }
}

/// The real encoders of one worker.
#[derive(Debug, Clone)]
pub struct RealEncoders {
    vision: Option<Batcher<Vision>>,
    audio: Option<(Batcher<Audio>, usize)>,
}

impl RealEncoders {
    /// Loads the models `models` names (none: `Ok(None)`).
    pub fn load(models: &EncoderModels) -> Result<Option<Self>, WorkerError> {
        if models.vision.is_none() && models.audio.is_none() {
            return Ok(None);
        }
        let threads = if models.threads == 0 {
            std::thread::available_parallelism().map_or(1, usize::from)
        } else {
            models.threads
        };
        let failed = |e: &dyn std::fmt::Display| WorkerError::Start(e.to_string());
        let vision = match &models.vision {
            Some(model) => {
                let runtime = models.onnxruntime.as_deref().ok_or_else(|| {
                    WorkerError::Start(
                        "a vision model needs ONNX Runtime: set `onnxruntime` to the path of libonnxruntime.so".into(),
                    )
                })?;
                let encoder =
                    VisionEncoder::load(runtime, model, threads).map_err(|e| failed(&e))?;
                Some(
                    Batcher::start(
                        "vision-encoder",
                        Vision(encoder),
                        models.max_batch,
                        models.batch_timeout,
                    )
                    .map_err(|e| failed(&e))?,
                )
            }
            None => None,
        };
        let audio = match &models.audio {
            Some(model) => {
                let encoder = AudioEncoder::load(model).map_err(|e| failed(&e))?;
                let bins = encoder.mel_bins();
                let batcher = Batcher::start(
                    "audio-encoder",
                    Audio(encoder),
                    models.max_batch,
                    models.batch_timeout,
                )
                .map_err(|e| failed(&e))?;
                Some((batcher, bins))
            }
            None => None,
        };
        Ok(Some(RealEncoders { vision, audio }))
    }

    /// Whether a real encoder takes `modality` (the others keep the cost model's timing).
    pub fn takes(&self, modality: Modality) -> bool {
        match modality {
            Modality::Image | Modality::Video => self.vision.is_some(),
            Modality::Audio => self.audio.is_some(),
        }
    }

    /// Encodes one item: the shape of each unit's embeddings.
    pub async fn encode(
        &self,
        modality: Modality,
        input: &MediaInput,
    ) -> Result<Vec<Encoded>, EngineError> {
        let units = input
            .units()
            .map_err(|e| EngineError::Invalid(e.to_string()))?;
        let wrong = || {
            EngineError::Unsupported(format!(
                "a {modality:?} item came with the wrong kind of input for this encoder"
            ))
        };
        let run = |e: crate::batcher::BatchError| model_error(modality, e.to_string());
        match (modality, input) {
            (Modality::Image | Modality::Video, MediaInput::Squares { side, rgb }) => {
                let vision = self.vision.as_ref().ok_or_else(wrong)?;
                let size = *side as usize * *side as usize * 3;
                let squares = (0..units)
                    .map(|i| (*side as usize, rgb.slice(i * size..(i + 1) * size)))
                    .collect();
                vision.run(squares).await.map_err(run)
            }
            (
                Modality::Audio,
                MediaInput::Mel {
                    bins,
                    frames,
                    values,
                },
            ) => {
                let (audio, want) = self.audio.as_ref().ok_or_else(wrong)?;
                if *bins as usize != *want || *frames as usize != WINDOW_FRAMES {
                    return Err(EngineError::Unsupported(format!(
                        "the audio encoder takes windows of {want} mel bins × {WINDOW_FRAMES} frames, not {bins} × {frames}"
                    )));
                }
                let size = *bins as usize * WINDOW_FRAMES * 4;
                let windows = (0..units)
                    .map(|i| values.slice(i * size..(i + 1) * size))
                    .collect();
                audio.run(windows).await.map_err(run)
            }
            _ => Err(wrong()),
        }
    }

    /// Forward passes run so far, per modality (vision, audio).
    pub fn passes(&self) -> (u64, u64) {
        let count =
            |s: &crate::batcher::BatchStats| s.passes.load(std::sync::atomic::Ordering::Relaxed);
        (
            self.vision.as_ref().map_or(0, |b| count(b.stats())),
            self.audio.as_ref().map_or(0, |(b, _)| count(b.stats())),
        )
    }
}

/// The vision tower: units are squares (side, RGB), of any side.
struct Vision(VisionEncoder);

impl BatchModel for Vision {
    type Unit = (usize, Bytes);
    type Output = Encoded;
    type Error = EncoderError;

    fn run(&mut self, units: Vec<(usize, Bytes)>) -> Result<Vec<Encoded>, EncoderError> {
        let mut out = Vec::with_capacity(units.len());
        // Squares of one side go through in one pass (resized alike).
        let mut rest = &units[..];
        while let Some(&(side, _)) = rest.first() {
            let run = rest.iter().take_while(|(s, _)| *s == side).count();
            let rgb: Vec<u8> = rest[..run]
                .iter()
                .flat_map(|(_, b)| b.iter().copied())
                .collect();
            let embeddings = self.0.encode_any(side, &rgb)?;
            out.extend((0..embeddings.batch).map(|i| Encoded {
                tokens: embeddings.tokens,
                dim: embeddings.dim,
                values: embeddings.item(i).to_vec(),
            }));
            rest = &rest[run..];
        }
        Ok(out)
    }
}

/// Whisper's encoder: units are 30-second log-mel windows (f32, little-endian).
struct Audio(AudioEncoder);

impl BatchModel for Audio {
    type Unit = Bytes;
    type Output = Encoded;
    type Error = EncoderError;

    fn run(&mut self, units: Vec<Bytes>) -> Result<Vec<Encoded>, EncoderError> {
        let windows: Vec<Vec<f32>> = units
            .iter()
            .map(|w| {
                w.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect()
            })
            .collect();
        let refs: Vec<&[f32]> = windows.iter().map(Vec::as_slice).collect();
        let embeddings = self.0.encode(&refs)?;
        Ok((0..embeddings.batch)
            .map(|i| Encoded {
                tokens: embeddings.tokens,
                dim: embeddings.dim,
                values: embeddings.item(i).to_vec(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_failures_are_out_of_memory_and_others_internal() {
        for message in [
            "Non-zero status code returned while running MatMul node. Failed to allocate memory for requested buffer of size 1073741824",
            "std::bad_alloc",
            "CUDA error: out of memory",
        ] {
            assert!(
                matches!(model_error(Modality::Image, message.into()), EngineError::OutOfMemory(m) if m.contains(message)),
                "{message}"
            );
        }
        assert!(matches!(
            model_error(Modality::Audio, "shape mismatch in Conv".into()),
            EngineError::Internal(_)
        ));
    }
}
