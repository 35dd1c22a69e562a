//! The candle side: [`GgmlMatrix::forward`] runs the matmul on a CPU tensor through a
//! `CustomOp1` (CPU only; GPU weights stay on candle's `QMatMul`).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

use super::matrix::GgmlMatrix;

struct MatMulOp<'a>(&'a GgmlMatrix);

impl CustomOp1 for MatMulOp<'_> {
    fn name(&self) -> &'static str {
        "ggml-quant-matmul"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let w = self.0;
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("{}: input must be f32, got {:?}", self.name(), storage.dtype());
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{}: input must be contiguous", self.name());
        };
        let dims = layout.dims();
        match dims.last() {
            Some(&k) if k == w.k() => {}
            _ => candle_core::bail!("{}: input {dims:?} does not end in k = {} ({w:?})", self.name(), w.k()),
        }
        let x = &data[start..end];
        let m = x.len() / w.k();
        let y = w.matmul_vec(x, m);
        let mut out = dims.to_vec();
        *out.last_mut().unwrap_or_else(|| unreachable!()) = w.n();
        Ok((CpuStorage::F32(y), Shape::from(out)))
    }
}

impl GgmlMatrix {
    /// `x · Wᵀ` for a CPU tensor `[..., k]` (any float dtype, any strides): f32 `[..., n]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if !x.device().is_cpu() {
            candle_core::bail!("{self:?} lives on the CPU, input is on {:?}", x.device());
        }
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        x.apply_op1_no_bwd(&MatMulOp(self))
    }
}
