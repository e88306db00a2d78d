//! A Llama-architecture model from a GGUF file, computed with candle on the CPU, for many
//! sequences at once.
//!
//! One [`Model::forward`] call computes a step: the new tokens of every sequence in it
//! (a chunk of a prompt, or one decoded token) go through the projections and the MLP as one
//! matrix, so the weights are read once per step whatever the batch; attention runs per
//! sequence over its own keys and values ([`SeqKv`]). Logits are computed only for the last
//! token of the sequences that need them.
//!
//! Weights stay quantized. Those of a type candle has no fast x86 kernel for (Q4_1, Q5_x)
//! are converted to Q8_0 at load time, whose matrix products use AVX2/AVX-512 kernels
//! chosen at run time; on CPUs with VNNI, padded so that they take candle's repacked
//! kernels ([`Weight::new`]).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::attention::AttnMask;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("cannot read the model file {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path} is not a GGUF file (it starts with {magic:02x?}, not \"GGUF\")")]
    NotGguf { path: String, magic: Vec<u8> },
    #[error("{path} is not a usable GGUF model: {message}")]
    Invalid { path: String, message: String },
    #[error("the model failed: {0}")]
    Compute(#[from] candle_core::Error),
    #[error(transparent)]
    Profile(#[from] switchyard_mocker::perf::ProfileError),
}

/// The model's shape, from the GGUF metadata.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelShape {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub rope_base: f32,
    pub rms_eps: f64,
}

impl ModelShape {
    /// Bytes of keys and values one token takes in the cache (f32).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.layers * self.kv_heads * self.head_dim * 4
    }
}

/// Rows from which a product goes through the dense copy of a weight (when there is one,
/// on CPUs without VNNI): candle's generic quantized CPU product costs the same per row
/// whatever the batch, while the dense one amortises the weights over the rows (measured
/// on a 576×1536 matrix: Q8_0 51 µs per row at any batch; f32 104 µs at 1 row, 22 µs at
/// 16, 14 µs at 64).
const DENSE_ROWS: usize = 8;

/// Whether candle's repacked x86 kernels multiply Q8_0 weights here: they need VNNI
/// (AVX-512 or AVX), a reduced dimension that is a multiple of [`VNNI_K`] and rows a
/// multiple of [`VNNI_ROWS`].
fn q8_0_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        (std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vnni"))
            || (std::arch::is_x86_feature_detected!("avxvnni")
                && std::arch::is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The block of the reduced dimension candle's repacked x86 kernels take.
const VNNI_K: usize = 256;
/// Rows of a weight those kernels take at a time (a weight whose rows are not a multiple
/// of it stays on the generic kernel).
const VNNI_ROWS: usize = 16;

/// A weight matrix: quantized (single rows: decode), and optionally dense too (batches and
/// prompt chunks).
struct Weight {
    quantized: QMatMul,
    /// Zero columns appended to the quantized matrix (and to its inputs) so that its
    /// reduced dimension is a multiple of [`VNNI_K`].
    pad: usize,
    dense: Option<Tensor>,
}

impl Weight {
    /// A weight in a type with fast CPU kernels: Q4_x, Q5_x and Q8_1 become Q8_0 (candle
    /// has no fast x86 kernel for them). On CPUs with VNNI, Q8_0 products take candle's
    /// repacked kernels, for which a reduced dimension that is not a multiple of 256 is
    /// padded with zero columns; those kernels beat a dense f32 product at every batch
    /// size, so no dense copy is kept then (measured on this 2-core EPYC, per row of a
    /// 1536×576 weight: 44 µs through the generic Q8_0 kernel, 9 µs padded to 1536×768 at
    /// one row and 5 µs at 4 to 512, against 55 to 10 µs for f32). Elsewhere `dense` keeps
    /// an f32 copy (4 bytes a parameter) for products of many rows.
    fn new(tensor: QTensor, dense: bool) -> candle_core::Result<Weight> {
        let legacy = matches!(
            tensor.dtype(),
            GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q8_1
        );
        let (n, k) = tensor.shape().dims2()?;
        let vnni =
            (legacy || tensor.dtype() == GgmlDType::Q8_0) && n % VNNI_ROWS == 0 && q8_0_vnni();
        let pad = if vnni {
            k.next_multiple_of(VNNI_K) - k
        } else {
            0
        };
        let dense = dense && !vnni;
        let values = if dense || legacy || pad > 0 {
            Some(tensor.dequantize(&Device::Cpu)?)
        } else {
            None
        };
        let quantized = match &values {
            Some(w) if legacy || pad > 0 => {
                QTensor::quantize(&w.pad_with_zeros(1, 0, pad)?, GgmlDType::Q8_0)?
            }
            _ => tensor,
        };
        Ok(Weight {
            quantized: QMatMul::from_qtensor(quantized)?,
            pad,
            dense: if dense { values } else { None },
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match &self.dense {
            Some(w) if x.dim(0)? >= DENSE_ROWS => x.matmul(&w.t()?),
            _ if self.pad > 0 => {
                self.quantized
                    .forward(&x.pad_with_zeros(candle_core::D::Minus1, 0, self.pad)?)
            }
            _ => self.quantized.forward(x),
        }
    }
}

struct Layer {
    attn_norm: Tensor,
    q: Weight,
    k: Weight,
    v: Weight,
    o: Weight,
    ffn_norm: Tensor,
    gate: Weight,
    up: Weight,
    down: Weight,
}

/// The model, loaded.
pub struct Model {
    pub shape: ModelShape,
    embed: Tensor,
    /// The root mean square of the token embeddings.
    embed_rms: f32,
    layers: Vec<Layer>,
    norm: Tensor,
    head: Weight,
    cos: Tensor,
    sin: Tensor,
    device: Device,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

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

    fn invalid(&self, message: impl Into<String>) -> ModelError {
        ModelError::Invalid {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    pub fn metadata(&self, key: &str) -> Option<&gguf_file::Value> {
        self.content.metadata.get(key)
    }

    fn number(&self, key: &str) -> Result<f64, ModelError> {
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

    fn tensor(&mut self, name: &str) -> Result<QTensor, ModelError> {
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
    fn matrix(&mut self, name: &str, dense: bool) -> Result<Weight, ModelError> {
        Ok(Weight::new(self.tensor(name)?, dense)?)
    }

    fn vector(&mut self, name: &str) -> Result<Tensor, ModelError> {
        Ok(self.tensor(name)?.dequantize(&Device::Cpu)?)
    }
}

impl Model {
    /// Loads the weights of an opened GGUF file; with `dense`, also an f32 copy of each
    /// matrix (4 bytes a parameter more) for the products over many rows.
    pub fn load(gguf: &mut Gguf, dense: bool) -> Result<Model, ModelError> {
        let shape = gguf.shape()?;
        let embed_q = gguf.tensor("token_embd.weight")?;
        let embed = embed_q.dequantize(&Device::Cpu)?;
        let head = if gguf.content.tensor_infos.contains_key("output.weight") {
            gguf.matrix("output.weight", dense)?
        } else {
            // Tied embeddings.
            Weight::new(embed_q, dense)?
        };
        let mut layers = Vec::with_capacity(shape.layers);
        for i in 0..shape.layers {
            let p = format!("blk.{i}");
            layers.push(Layer {
                attn_norm: gguf.vector(&format!("{p}.attn_norm.weight"))?,
                q: gguf.matrix(&format!("{p}.attn_q.weight"), dense)?,
                k: gguf.matrix(&format!("{p}.attn_k.weight"), dense)?,
                v: gguf.matrix(&format!("{p}.attn_v.weight"), dense)?,
                o: gguf.matrix(&format!("{p}.attn_output.weight"), dense)?,
                ffn_norm: gguf.vector(&format!("{p}.ffn_norm.weight"))?,
                gate: gguf.matrix(&format!("{p}.ffn_gate.weight"), dense)?,
                up: gguf.matrix(&format!("{p}.ffn_up.weight"), dense)?,
                down: gguf.matrix(&format!("{p}.ffn_down.weight"), dense)?,
            });
        }
        let norm = gguf.vector("output_norm.weight")?;
        let (cos, sin) = rope_tables(&shape)?;
        let embed_rms = embed.sqr()?.mean_all()?.sqrt()?.to_scalar::<f32>()?;
        Ok(Model {
            shape,
            embed,
            embed_rms,
            layers,
            norm,
            head,
            cos,
            sin,
            device: Device::Cpu,
        })
    }

    /// The fixed projection of encoder embeddings `dim` values wide into the model's
    /// embedding space: a seeded random matrix [dim, hidden] of unit-variance outputs for
    /// unit-variance inputs. This model comes with no trained projector for any encoder;
    /// the merge is real (the sequence's media positions take these rows, and they shape
    /// every later token), the meaning of the projected rows is not.
    pub fn media_projector(&self, dim: usize) -> Result<Tensor, ModelError> {
        use rand::{Rng, SeedableRng};
        let hidden = self.shape.hidden;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0x6d65_6469_6100 ^ dim as u64);
        let bound = (3.0 / dim as f32).sqrt();
        let values: Vec<f32> = (0..dim * hidden)
            .map(|_| rng.random_range(-bound..bound))
            .collect();
        Ok(Tensor::from_vec(values, (dim, hidden), &self.device)?)
    }

    /// The input embeddings of a media span of `length` positions from an item's encoder
    /// rows (`rows`, `dim` values each; `projector` from [`Self::media_projector`]): each
    /// position takes the row at its place in the item (position j of `length` ← row
    /// j·rows/length), normalised to zero mean and unit variance, projected, and scaled to
    /// the token embeddings' magnitude. [length, hidden].
    pub fn media_embeddings(
        &self,
        projector: &Tensor,
        rows: &[f32],
        dim: usize,
        length: usize,
    ) -> Result<Tensor, ModelError> {
        let count = rows.len() / dim.max(1);
        if count == 0 || length == 0 || projector.dims() != [dim, self.shape.hidden] {
            return Err(ModelError::Compute(candle_core::Error::Msg(format!(
                "cannot merge {count} rows of {dim} values into {length} positions"
            ))));
        }
        let mut picked = Vec::with_capacity(length * dim);
        for j in 0..length {
            let r = j * count / length;
            let row = &rows[r * dim..(r + 1) * dim];
            let mean = row.iter().sum::<f32>() / dim as f32;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / dim as f32;
            let scale = 1.0 / (var + 1e-6).sqrt();
            picked.extend(row.iter().map(|v| (v - mean) * scale));
        }
        let x = Tensor::from_vec(picked, (length, dim), &self.device)?;
        Ok((x.matmul(projector)? * f64::from(self.embed_rms))?)
    }

    /// Computes one step. Each input's tokens are appended to its keys and values, at the
    /// positions after what they already hold. Returns the logits (f32, one per vocabulary
    /// entry) of the last token of each input that asks for them.
    pub fn forward(
        &self,
        inputs: &mut [StepInput<'_>],
    ) -> Result<Vec<Option<Vec<f32>>>, ModelError> {
        let s = self.shape;
        let total: usize = inputs.iter().map(|i| i.tokens.len()).sum();
        if total == 0 {
            return Ok(inputs.iter().map(|_| None).collect());
        }
        let mut ids = Vec::with_capacity(total);
        let mut positions = Vec::with_capacity(total);
        for input in inputs.iter() {
            let start = input.kv.len();
            if start + input.tokens.len() > s.context_length {
                return Err(ModelError::Compute(candle_core::Error::Msg(format!(
                    "{} tokens exceed the model's context of {}",
                    start + input.tokens.len(),
                    s.context_length
                ))));
            }
            ids.extend_from_slice(input.tokens);
            positions.extend((start..start + input.tokens.len()).map(|p| p as u32));
        }
        let ids = Tensor::new(ids.as_slice(), &self.device)?;
        let positions = Tensor::new(positions.as_slice(), &self.device)?;
        let cos = self.cos.index_select(&positions, 0)?;
        let sin = self.sin.index_select(&positions, 0)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        // Media positions take their embeddings instead of their placeholder's.
        let mut start = 0;
        for input in inputs.iter() {
            for (at, rows) in &input.embeds {
                x = x.slice_scatter0(rows, start + at)?;
            }
            start += input.tokens.len();
        }
        // Cosine and sine per token, shaped for a rotation of [tokens, heads, 1, d].
        let half = s.head_dim / 2;
        let cos = cos.reshape((total, 1, half))?;
        let sin = sin.reshape((total, 1, half))?;
        for (l, layer) in self.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, s.rms_eps as f32)?;
            // q: [total, heads, d]; k, v: [total, kv_heads, d] (position-major, as the cache).
            let q = rotate(&layer.q.forward(&h)?, s.heads, s.head_dim, &cos, &sin)?;
            let k = rotate(&layer.k.forward(&h)?, s.kv_heads, s.head_dim, &cos, &sin)?;
            let v = layer
                .v
                .forward(&h)?
                .reshape((total, s.kv_heads, s.head_dim))?;
            let mut outputs = Vec::with_capacity(inputs.len());
            let mut offset = 0;
            for input in inputs.iter_mut() {
                let n = input.tokens.len();
                if n == 0 {
                    continue;
                }
                let q = q.narrow(0, offset, n)?;
                let k = k.narrow(0, offset, n)?;
                let v = v.narrow(0, offset, n)?;
                offset += n;
                let past = input.kv.len();
                let (keys, values) = input.kv.append(l, &k, &v)?;
                outputs.push(self.attend(&q, &keys, &values, past)?);
            }
            let attn = Tensor::cat(&outputs, 0)?;
            x = (x + layer.o.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, s.rms_eps as f32)?;
            let gate = candle_nn::ops::silu(&layer.gate.forward(&h)?)?;
            let mlp = layer.down.forward(&(gate * layer.up.forward(&h)?)?)?;
            x = (x + mlp)?;
        }
        for input in inputs.iter_mut() {
            input.kv.commit(input.tokens.len());
        }
        // The last token of each input that wants logits.
        let mut rows = Vec::new();
        let mut end = 0;
        for input in inputs.iter() {
            end += input.tokens.len();
            if input.logits && !input.tokens.is_empty() {
                rows.push((end - 1) as u32);
            }
        }
        let mut out = Vec::with_capacity(inputs.len());
        if rows.is_empty() {
            out.extend(inputs.iter().map(|_| None));
            return Ok(out);
        }
        let rows_t = Tensor::new(rows.as_slice(), &self.device)?;
        let last = x.index_select(&rows_t, 0)?;
        let last = candle_nn::ops::rms_norm(&last, &self.norm, s.rms_eps as f32)?;
        let logits = self
            .head
            .forward(&last)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()?;
        let mut logits = logits.into_iter();
        for input in inputs.iter() {
            out.push(if input.logits && !input.tokens.is_empty() {
                logits.next()
            } else {
                None
            });
        }
        Ok(out)
    }

    /// Attention of `n` new queries ([n, heads, d]) over `keys`/`values` ([T, kv_heads, d],
    /// the new ones last), causal: query i sees positions up to `past + i`. Returns
    /// [n, heads·d].
    ///
    /// A decode (one query) goes through candle's CPU flash attention, which reads the
    /// cache in place and splits the heads over the cores; a prompt chunk through two
    /// matrix products per KV head, which amortise the keys over the chunk's queries.
    fn attend(
        &self,
        q: &Tensor,
        keys: &Tensor,
        values: &Tensor,
        past: usize,
    ) -> Result<Tensor, ModelError> {
        let s = self.shape;
        let n = q.dim(0)?;
        if n == 1 {
            let scale = 1.0 / (s.head_dim as f32).sqrt();
            let out = candle_nn::attention::flash_attn::<f32>(
                &q.unsqueeze(0)?,
                &keys.unsqueeze(0)?,
                &values.unsqueeze(0)?,
                scale,
                AttnMask::causal_with_offset(past),
                None,
                None,
            )?; // [1, heads, 1, d]
            return Ok(out.reshape((1, s.heads * s.head_dim))?);
        }
        let group = s.heads / s.kv_heads;
        let t = keys.dim(0)?;
        // Heads sharing a KV head are consecutive: [kv_heads, group·n, d].
        let q = q
            .transpose(0, 1)?
            .contiguous()?
            .reshape((s.kv_heads, group * n, s.head_dim))?;
        let keys = keys.transpose(0, 1)?.contiguous()?; // [kv_heads, T, d]
        let values = values.transpose(0, 1)?.contiguous()?;
        let scale = 1.0 / (s.head_dim as f64).sqrt();
        let scores = (q.matmul(&keys.t()?)? * scale)?;
        let mask: Vec<f32> = (0..n)
            .flat_map(|i| (0..t).map(move |j| if j > past + i { f32::NEG_INFINITY } else { 0.0 }))
            .collect();
        let mask = Tensor::from_vec(mask, (1, 1, n, t), &self.device)?;
        let scores = scores
            .reshape((s.kv_heads, group, n, t))?
            .broadcast_add(&mask)?
            .reshape((s.kv_heads, group * n, t))?;
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.matmul(&values)?; // [kv_heads, group·n, d]
        let out = out
            .reshape((s.heads, n, s.head_dim))?
            .transpose(0, 1)?
            .reshape((n, s.heads * s.head_dim))?;
        Ok(out)
    }
}

/// Projections [total, heads·d] rotated to [total, heads, d], with `cos`/`sin` per token
/// ([total, 1, d/2]); GGUF's Llama weights are laid out for the interleaved rotation.
fn rotate(
    x: &Tensor,
    heads: usize,
    d: usize,
    cos: &Tensor,
    sin: &Tensor,
) -> candle_core::Result<Tensor> {
    let total = x.dim(0)?;
    candle_nn::rotary_emb::rope_i(&x.reshape((total, heads, 1, d))?, cos, sin)?
        .reshape((total, heads, d))
}

fn rope_tables(s: &ModelShape) -> candle_core::Result<(Tensor, Tensor)> {
    let half = s.head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / s.rope_base.powf(2.0 * i as f32 / s.head_dim as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, half), &Device::Cpu)?;
    let pos = Tensor::arange(0u32, s.context_length as u32, &Device::Cpu)?
        .to_dtype(DType::F32)?
        .reshape((s.context_length, 1))?;
    let freqs = pos.broadcast_mul(&inv)?;
    Ok((freqs.cos()?, freqs.sin()?))
}

/// One sequence's part of a step.
#[derive(Debug)]
pub struct StepInput<'a> {
    pub tokens: &'a [u32],
    pub kv: &'a mut SeqKv,
    /// Whether the last token's logits are needed (the end of a prompt, or a decode).
    pub logits: bool,
    /// Input embeddings that replace the tokens' own, as (index among `tokens`, rows
    /// [n, hidden]): the media merged into the sequence.
    pub embeds: Vec<(usize, Tensor)>,
}

/// A sequence's keys and values, per layer, [positions, kv_heads, d] (position-major, as
/// candle's flash attention reads them), contiguous and grown by doubling.
pub struct SeqKv {
    layers: Vec<(Tensor, Tensor)>,
    /// Tokens held (committed after a step).
    len: usize,
    capacity: usize,
    n_layers: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl std::fmt::Debug for SeqKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeqKv")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl SeqKv {
    pub fn new(shape: &ModelShape) -> SeqKv {
        SeqKv {
            layers: Vec::new(),
            len: 0,
            capacity: 0,
            n_layers: shape.layers,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        self.layers.len() * 2 * self.kv_heads * self.capacity * self.head_dim * 4
    }

    /// Room for `needed` tokens in every layer, keeping what is held.
    fn ensure(&mut self, needed: usize) -> candle_core::Result<()> {
        if needed <= self.capacity {
            return Ok(());
        }
        let capacity = needed.next_power_of_two().max(64);
        let mut grown = Vec::with_capacity(self.n_layers);
        for l in 0..self.n_layers {
            let k = Tensor::zeros(
                (capacity, self.kv_heads, self.head_dim),
                DType::F32,
                &Device::Cpu,
            )?;
            let v = k.zeros_like()?;
            if let Some((old_k, old_v)) = self.layers.get(l)
                && self.len > 0
            {
                k.slice_set(&old_k.narrow(0, 0, self.len)?, 0, 0)?;
                v.slice_set(&old_v.narrow(0, 0, self.len)?, 0, 0)?;
            }
            grown.push((k, v));
        }
        self.layers = grown;
        self.capacity = capacity;
        Ok(())
    }

    /// Writes layer `l`'s new keys and values after what is held; returns all of that
    /// layer's so far (views).
    fn append(
        &mut self,
        l: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let n = k.dim(0)?;
        self.ensure(self.len + n)?;
        let (keys, values) = &self.layers[l];
        keys.slice_set(&k.contiguous()?, 0, self.len)?;
        values.slice_set(&v.contiguous()?, 0, self.len)?;
        Ok((
            keys.narrow(0, 0, self.len + n)?,
            values.narrow(0, 0, self.len + n)?,
        ))
    }

    fn commit(&mut self, n: usize) {
        self.len += n;
    }

    /// Keys and values of positions `from..from + n` of every layer, copied (a block for
    /// the prefix cache).
    pub fn slice(&self, from: usize, n: usize) -> candle_core::Result<Vec<(Tensor, Tensor)>> {
        self.layers
            .iter()
            .map(|(k, v)| {
                Ok((
                    owned(&k.narrow(0, from, n)?)?,
                    owned(&v.narrow(0, from, n)?)?,
                ))
            })
            .collect()
    }

    /// Makes room for `tokens` tokens at once (a request's prompt and output), so the
    /// buffers are not grown step by step.
    pub fn reserve(&mut self, tokens: usize) -> candle_core::Result<()> {
        self.ensure(tokens)
    }

    /// Appends cached blocks' keys and values (every layer, `size` tokens each) after what
    /// is held: one copy per layer for all of them.
    pub fn extend_from(
        &mut self,
        blocks: &[&[(Tensor, Tensor)]],
        size: usize,
    ) -> candle_core::Result<()> {
        if blocks.is_empty() {
            return Ok(());
        }
        let n = blocks.len() * size;
        self.ensure(self.len + n)?;
        for l in 0..self.n_layers {
            let keys: Vec<&Tensor> = blocks.iter().map(|b| &b[l].0).collect();
            let values: Vec<&Tensor> = blocks.iter().map(|b| &b[l].1).collect();
            self.layers[l]
                .0
                .slice_set(&Tensor::cat(&keys, 0)?, 0, self.len)?;
            self.layers[l]
                .1
                .slice_set(&Tensor::cat(&values, 0)?, 0, self.len)?;
        }
        self.len += n;
        Ok(())
    }
}

/// A compact copy of `t` that shares no storage with it (`copy` of a contiguous view would
/// clone the whole buffer it views).
fn owned(t: &Tensor) -> candle_core::Result<Tensor> {
    t.force_contiguous()
}

/// A GGUF model's tokenizer and chat template, as the files a frontend reads from a model
/// directory: `tokenizer.json` (a byte-level BPE built from `tokenizer.ggml.tokens` and
/// `merges`), `tokenizer_config.json` (`tokenizer.chat_template`, the BOS and EOS tokens)
/// and `config.json` (the context length).
#[derive(Debug, Clone)]
pub struct TokenizerFiles {
    pub tokenizer: String,
    pub tokenizer_config: String,
    pub config: String,
}

impl Gguf {
    /// The tokenizer files of a GGUF model with a byte-level BPE tokenizer
    /// (`tokenizer.ggml.model = "gpt2"`): vocabulary, merges and the added tokens
    /// (control tokens special), with the pre-tokenizer `tokenizer.ggml.pre` names (`smollm`:
    /// digits split one by one; `gpt2` and unnamed: GPT-2's). Other tokenizers are an
    /// error that says to pass the model's tokenizer directory instead.
    pub fn tokenizer_files(&self) -> Result<TokenizerFiles, ModelError> {
        use serde_json::{Value, json};
        let model = self.string("tokenizer.ggml.model").unwrap_or("gpt2");
        if model != "gpt2" {
            return Err(self.invalid(format!(
                "its tokenizer is {model:?}; only byte-level BPE (\"gpt2\") tokenizers are read from GGUF files (give the model's tokenizer directory with --tokenizer)"
            )));
        }
        let pre = self.string("tokenizer.ggml.pre").unwrap_or("gpt2");
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let pre_tokenizer = match pre {
            "smollm" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level]}),
            "gpt2" | "default" => byte_level,
            other => {
                return Err(self.invalid(format!(
                    "its pre-tokenizer {other:?} is not one this build reads from GGUF files (give the model's tokenizer directory with --tokenizer)"
                )));
            }
        };
        let strings = |key: &str| -> Result<Vec<String>, ModelError> {
            match self.metadata(key) {
                Some(gguf_file::Value::Array(items)) => items
                    .iter()
                    .map(|v| match v {
                        gguf_file::Value::String(s) => Ok(s.clone()),
                        _ => Err(self.invalid(format!("{key} holds a non-string"))),
                    })
                    .collect(),
                _ => Err(self.invalid(format!("{key} is missing"))),
            }
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<i64> = match self.metadata("tokenizer.ggml.token_type") {
            Some(gguf_file::Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    gguf_file::Value::I32(t) => i64::from(*t),
                    gguf_file::Value::U32(t) => i64::from(*t),
                    _ => 1,
                })
                .collect(),
            _ => vec![1; tokens.len()],
        };
        // llama.cpp's token types: 1 normal, 3 control, 4 user-defined.
        let added: Vec<Value> = tokens
            .iter()
            .zip(types.iter().chain(std::iter::repeat(&1)))
            .enumerate()
            .filter(|(_, (_, t))| matches!(**t, 3 | 4))
            .map(|(id, (content, t))| {
                json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                       "rstrip": false, "normalized": false, "special": *t == 3})
            })
            .collect();
        let vocab: serde_json::Map<String, Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), json!(i)))
            .collect();
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": merges},
        });
        let token = |key: &str| -> Option<String> {
            let id = self.number(key).ok()? as usize;
            tokens.get(id).cloned()
        };
        let mut tokenizer_config = serde_json::Map::new();
        if let Some(template) = self.string("tokenizer.chat_template") {
            tokenizer_config.insert("chat_template".into(), template.into());
        }
        if let Some(bos) = token("tokenizer.ggml.bos_token_id") {
            tokenizer_config.insert("bos_token".into(), bos.into());
        }
        if let Some(eos) = token("tokenizer.ggml.eos_token_id") {
            tokenizer_config.insert("eos_token".into(), eos.into());
        }
        for key in ["add_bos_token", "add_eos_token"] {
            if let Some(gguf_file::Value::Bool(add)) =
                self.metadata(&format!("tokenizer.ggml.{key}"))
            {
                tokenizer_config.insert(key.into(), (*add).into());
            }
        }
        let mut config = serde_json::Map::new();
        if let Ok(context) = self.number("llama.context_length") {
            config.insert("max_position_embeddings".into(), (context as u64).into());
        }
        Ok(TokenizerFiles {
            tokenizer: tokenizer.to_string(),
            tokenizer_config: Value::Object(tokenizer_config).to_string(),
            config: Value::Object(config).to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> ModelShape {
        ModelShape {
            layers: 2,
            hidden: 8,
            heads: 2,
            kv_heads: 1,
            head_dim: 4,
            vocab: 16,
            context_length: 256,
            rope_base: 10_000.0,
            rms_eps: 1e-5,
        }
    }

    /// Keys and values for `n` positions from `first`: position p holds p·10 + j in its j-th
    /// value (values negated).
    fn positions(first: usize, n: usize) -> (Tensor, Tensor) {
        let k: Vec<f32> = (first..first + n)
            .flat_map(|p| (0..4).map(move |j| (p * 10 + j) as f32))
            .collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        (
            Tensor::from_vec(k, (n, 1, 4), &Device::Cpu).unwrap(),
            Tensor::from_vec(v, (n, 1, 4), &Device::Cpu).unwrap(),
        )
    }

    fn storage_len(t: &Tensor) -> usize {
        let (storage, _) = t.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(cpu) => cpu.as_slice::<f32>().unwrap().len(),
            _ => unreachable!("CPU tensors only"),
        }
    }

    #[test]
    fn cached_blocks_are_compact_copies_and_come_back_in_place() {
        let s = shape();
        let mut kv = SeqKv::new(&s);
        // Enough appends to grow the buffers past their first capacity (64).
        for (first, n) in [(0, 40), (40, 30), (70, 10)] {
            let (k, v) = positions(first, n);
            for l in 0..s.layers {
                let (keys, values) = kv.append(l, &k, &v).unwrap();
                assert_eq!(keys.dims(), [first + n, 1, 4]);
                assert_eq!(values.dims(), [first + n, 1, 4]);
            }
            kv.commit(n);
        }
        assert_eq!(kv.len(), 80);
        let block = kv.slice(32, 16).unwrap();
        assert_eq!(block.len(), s.layers);
        let (want_k, want_v) = positions(32, 16);
        for (k, v) in &block {
            // Only the block's own values: a view would keep the whole buffer alive.
            assert_eq!(storage_len(k), 16 * 4);
            assert_eq!(storage_len(v), 16 * 4);
            assert_eq!(
                k.to_vec3::<f32>().unwrap(),
                want_k.to_vec3::<f32>().unwrap()
            );
            assert_eq!(
                v.to_vec3::<f32>().unwrap(),
                want_v.to_vec3::<f32>().unwrap()
            );
        }
        // Another sequence takes the first 48 positions from blocks of 16.
        let blocks: Vec<Vec<(Tensor, Tensor)>> =
            (0..3).map(|b| kv.slice(b * 16, 16).unwrap()).collect();
        let refs: Vec<&[(Tensor, Tensor)]> = blocks.iter().map(Vec::as_slice).collect();
        let mut other = SeqKv::new(&s);
        other.extend_from(&refs, 16).unwrap();
        assert_eq!(other.len(), 48);
        let (k, v) = positions(48, 1);
        let (keys, values) = other.append(1, &k, &v).unwrap();
        let (want_k, want_v) = positions(0, 49);
        assert_eq!(
            keys.to_vec3::<f32>().unwrap(),
            want_k.to_vec3::<f32>().unwrap()
        );
        assert_eq!(
            values.to_vec3::<f32>().unwrap(),
            want_v.to_vec3::<f32>().unwrap()
        );
    }
}
