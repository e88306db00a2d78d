//! Reading a GGUF file: its header and metadata, the model's shape, and its tensors.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use candle_core::quantized::{QTensor, gguf_file};
use candle_core::{Device, Tensor};

use super::weight::Weight;
use super::{ModelError, ModelShape};

/// What a GGUF file holds besides the weights: its metadata, for the tokenizer and chat
/// template.
pub struct Gguf {
    pub content: gguf_file::Content,
    reader: BufReader<File>,
    path: String,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Gguf {
    /// Opens a GGUF file and reads its header; a missing, truncated or foreign file is a
    /// clear error.
    pub fn open(path: &Path) -> Result<Gguf, ModelError> {
        let name = path.display().to_string();
        let io = |error| ModelError::Io {
            path: name.clone(),
            error,
        };
        let mut file = File::open(path).map_err(io)?;
        let mut magic = [0u8; 4];
        let read = file.read(&mut magic).map_err(io)?;
        if read < 4 || &magic != b"GGUF" {
            return Err(ModelError::NotGguf {
                path: name,
                magic: magic[..read].to_vec(),
            });
        }
        let mut reader = BufReader::new(File::open(path).map_err(io)?);
        let content = gguf_file::Content::read(&mut reader).map_err(|e| ModelError::Invalid {
            path: name.clone(),
            message: e.to_string(),
        })?;
        Ok(Gguf {
            content,
            reader,
            path: name,
        })
    }

    pub(super) fn invalid(&self, message: impl Into<String>) -> ModelError {
        ModelError::Invalid {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    pub fn metadata(&self, key: &str) -> Option<&gguf_file::Value> {
        self.content.metadata.get(key)
    }

    pub(super) fn number(&self, key: &str) -> Result<f64, ModelError> {
        use gguf_file::Value as V;
        match self.metadata(key) {
            Some(V::U8(v)) => Ok(f64::from(*v)),
            Some(V::U16(v)) => Ok(f64::from(*v)),
            Some(V::U32(v)) => Ok(f64::from(*v)),
            Some(V::U64(v)) => Ok(*v as f64),
            Some(V::I32(v)) => Ok(f64::from(*v)),
            Some(V::I64(v)) => Ok(*v as f64),
            Some(V::F32(v)) => Ok(f64::from(*v)),
            Some(V::F64(v)) => Ok(*v),
            Some(_) => Err(self.invalid(format!("metadata {key} is not a number"))),
            None => Err(self.invalid(format!("metadata {key} is missing"))),
        }
    }

    pub fn string(&self, key: &str) -> Option<&str> {
        match self.metadata(key) {
            Some(gguf_file::Value::String(s)) => Some(s),
            _ => None,
        }
    }

    /// The shape of a Llama-architecture model.
    pub fn shape(&self) -> Result<ModelShape, ModelError> {
        let arch = self.string("general.architecture").unwrap_or("llama");
        if arch != "llama" {
            return Err(self.invalid(format!(
                "its architecture is {arch:?}; this engine runs llama-architecture models"
            )));
        }
        let n = |key: &str| -> Result<usize, ModelError> {
            let v = self.number(&format!("llama.{key}"))?;
            if v < 1.0 || v.fract() != 0.0 {
                return Err(self.invalid(format!("llama.{key} is {v}")));
            }
            Ok(v as usize)
        };
        let hidden = n("embedding_length")?;
        let heads = n("attention.head_count")?;
        let kv_heads = n("attention.head_count_kv").unwrap_or(heads);
        if hidden % heads != 0 || heads % kv_heads != 0 {
            return Err(self.invalid(format!(
                "{hidden} hidden over {heads} heads and {kv_heads} KV heads does not divide"
            )));
        }
        let vocab = match self.content.tensor_infos.get("token_embd.weight") {
            Some(info) => info.shape.dims()[0],
            None => return Err(self.invalid("it has no token_embd.weight")),
        };
        Ok(ModelShape {
            layers: n("block_count")?,
            hidden,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            vocab,
            context_length: n("context_length").unwrap_or(4096),
            rope_base: self.number("llama.rope.freq_base").unwrap_or(10_000.0) as f32,
            rms_eps: self
                .number("llama.attention.layer_norm_rms_epsilon")
                .unwrap_or(1e-5),
        })
    }

    pub(super) fn tensor(&mut self, name: &str) -> Result<QTensor, ModelError> {
        if !self.content.tensor_infos.contains_key(name) {
            return Err(self.invalid(format!("it has no tensor {name}")));
        }
        let path = self.path.clone();
        self.content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| ModelError::Invalid {
                path,
                message: format!("tensor {name}: {e}"),
            })
    }

    /// A weight matrix, in a type with fast CPU kernels (and dense as well, if asked).
    pub(super) fn matrix(&mut self, name: &str, dense: bool) -> Result<Weight, ModelError> {
        Ok(Weight::new(self.tensor(name)?, dense)?)
    }

    pub(super) fn vector(&mut self, name: &str) -> Result<Tensor, ModelError> {
        Ok(self.tensor(name)?.dequantize(&Device::Cpu)?)
    }
}
