//! Weight matrices in the types candle has fast CPU kernels for, padded for its repacked
//! VNNI kernels where they apply, with a dense copy for products of many rows elsewhere.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

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
pub(super) struct Weight {
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
    pub(super) fn new(tensor: QTensor, dense: bool) -> candle_core::Result<Weight> {
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

    pub(super) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
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
