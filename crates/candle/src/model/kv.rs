//! A sequence's keys and values, per layer, grown by doubling; blocks copied out for the
//! prefix cache and back in for another sequence.

use candle_core::{DType, Device, Tensor};

use super::ModelShape;

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
    pub(super) fn append(
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

    pub(super) fn commit(&mut self, n: usize) {
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
