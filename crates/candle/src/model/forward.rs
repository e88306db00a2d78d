//! One step of the model: every sequence's new tokens through the layers together,
//! attention per sequence over its own keys and values.

use candle_core::{DType, Tensor};
use candle_nn::attention::AttnMask;

use super::{Model, ModelError, SeqKv};

/// Called with each of an input's rows' logits in order (its index among the input's
/// tokens, the logits over the vocabulary).
pub type RowSink<'a> = &'a mut dyn FnMut(usize, &[f32]);

/// Rows whose logits are computed together, for a [`RowSink`] (64 rows of SmolLM2's
/// 49,152 logits are 12 MB).
const ROWS_AT_ONCE: usize = 64;

/// One sequence's part of a step.
pub struct StepInput<'a> {
    pub tokens: &'a [u32],
    pub kv: &'a mut SeqKv,
    /// Whether the last token's logits are needed (the end of a prompt, or a decode).
    pub logits: bool,
    /// Input embeddings that replace the tokens' own, as (index among `tokens`, rows
    /// [n, hidden]): the media merged into the sequence.
    pub embeds: Vec<(usize, Tensor)>,
    /// Every token's logits, not only the last one's (a prompt's log probabilities).
    pub rows: Option<RowSink<'a>>,
}

impl std::fmt::Debug for StepInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepInput")
            .field("tokens", &self.tokens.len())
            .field("logits", &self.logits)
            .field("embeds", &self.embeds.len())
            .field("rows", &self.rows.is_some())
            .finish()
    }
}

impl Model {
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
        // Every row's logits, for the inputs that want them, a slice of rows at a time.
        let mut start = 0;
        for input in inputs.iter_mut() {
            let n = input.tokens.len();
            if let Some(sink) = input.rows.as_mut() {
                let mut at = 0;
                while at < n {
                    let len = ROWS_AT_ONCE.min(n - at);
                    let logits = self.logits(&x.narrow(0, start + at, len)?)?;
                    for (j, row) in logits.iter().enumerate() {
                        sink(at + j, row);
                    }
                    at += len;
                }
            }
            start += n;
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
        let mut logits = self.logits(&x.index_select(&rows_t, 0)?)?.into_iter();
        for input in inputs.iter() {
            out.push(if input.logits && !input.tokens.is_empty() {
                logits.next()
            } else {
                None
            });
        }
        Ok(out)
    }

    /// The logits of hidden states [rows, hidden] after the last layer: one row each.
    fn logits(&self, hidden: &Tensor) -> candle_core::Result<Vec<Vec<f32>>> {
        let normed = candle_nn::ops::rms_norm(hidden, &self.norm, self.shape.rms_eps as f32)?;
        self.head
            .forward(&normed)?
            .to_dtype(DType::F32)?
            .to_vec2::<f32>()
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
