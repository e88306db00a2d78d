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
//!
//! Files: `gguf.rs` reads the file ([`Gguf`]) and `tokenizer.rs` the tokenizer it holds
//! ([`TokenizerFiles`]); `weight.rs` keeps each matrix in a type with fast kernels;
//! `forward.rs` computes a step ([`Model::forward`], [`StepInput`]); `kv.rs` holds a
//! sequence's keys and values ([`SeqKv`]).

mod forward;
mod gguf;
mod kv;
mod tokenizer;
mod weight;

use candle_core::{DType, Device, Tensor};
use thiserror::Error;

pub use forward::StepInput;
pub use gguf::Gguf;
pub use kv::SeqKv;
pub use tokenizer::TokenizerFiles;
use weight::Weight;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("cannot read the model file {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("{path} is not a GGUF file (it starts with {magic:02x?}, not \"GGUF\")")]
    NotGguf { path: String, magic: Vec<u8> },
    #[error("{path} is not a usable GGUF model: {message}")]
    Invalid { path: String, message: String },
    /// The engine's settings are not ones to load the model with.
    #[error("{path} is not a usable GGUF model: {source}")]
    Settings {
        path: String,
        #[source]
        source: switchyard_worker::InvalidConfig,
    },
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
