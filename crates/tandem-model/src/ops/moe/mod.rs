//! Mixture-of-experts on the device: routing (softmax + top-k) and the grouped expert matmuls
//! over stacked expert weights, with no host round trip (`tandem-kernels/cuda/moe.cu` and
//! `qmatmul.cu`; launchers in `cuda`).
//!
//! The CPU keeps the per-expert path in `arch::qwen_hybrid::ffn` (router logits on the host,
//! one matmul per chosen expert); [`reference`] is the plain version of the same maths both
//! are checked against. An [`ExpertStack`] is one projection of every expert, `[E, n, k]`, as
//! the file stores it (dense or GGML blocks; the gate and up halves of a fused `gate_up` tensor
//! are two stacks over the same storage at different row offsets).

#[cfg(feature = "cuda")]
mod cuda;
pub mod reference;

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::Tensor;

use crate::error::{ModelError, Result};

/// Storage of stacked expert weights.
#[derive(Debug, Clone)]
pub enum StackData {
    /// GGML blocks (`[E, rows, k]` or `[E * rows, k]`).
    Quant(Arc<QTensor>),
    /// A dense `[E, rows, k]` tensor (f32, f16 or bf16).
    Dense(Tensor),
}

/// One projection of every expert: expert `e`'s `[n, k]` matrix starts `row0` rows into its
/// `rows_per_expert` rows of the storage.
#[derive(Debug, Clone)]
pub struct ExpertStack {
    pub data: StackData,
    pub experts: usize,
    pub rows_per_expert: usize,
    pub row0: usize,
    pub n: usize,
    pub k: usize,
}

impl ExpertStack {
    /// Checks the storage's shape against the stated sizes.
    pub fn new(
        data: StackData,
        experts: usize,
        rows_per_expert: usize,
        row0: usize,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        let elems = match &data {
            StackData::Quant(q) => q.shape().elem_count(),
            StackData::Dense(t) => t.elem_count(),
        };
        if elems != experts * rows_per_expert * k || row0 + n > rows_per_expert {
            return Err(ModelError::Config(format!(
                "expert stack of {elems} values does not hold {experts} experts of [{n}, {k}] at row {row0} of \
                 {rows_per_expert}"
            )));
        }
        Ok(Self { data, experts, rows_per_expert, row0, n, k })
    }
}

/// The routed experts of an MoE layer on one device: `down(silu(gate(x)) ⊙ up(x))` of each
/// token's `top_k` experts, weighted by their router probabilities.
#[derive(Debug, Clone)]
pub struct RoutedExperts {
    pub gate: ExpertStack,
    pub up: ExpertStack,
    pub down: ExpertStack,
    pub top_k: usize,
    /// Renormalise the chosen experts' probabilities to sum to one.
    pub norm_topk: bool,
}

impl RoutedExperts {
    pub fn new(gate: ExpertStack, up: ExpertStack, down: ExpertStack, top_k: usize, norm_topk: bool) -> Result<Self> {
        let e = gate.experts;
        let ok = up.experts == e
            && down.experts == e
            && gate.n == up.n
            && gate.k == up.k
            && down.k == gate.n
            && down.n == gate.k
            && (1..=e).contains(&top_k);
        if !ok {
            return Err(ModelError::Config(format!(
                "MoE experts do not fit together: gate {}x[{}, {}], up {}x[{}, {}], down {}x[{}, {}], top-k {top_k}",
                gate.experts, gate.n, gate.k, up.experts, up.n, up.k, down.experts, down.n, down.k
            )));
        }
        Ok(Self { gate, up, down, top_k, norm_topk })
    }

    /// Whether this device has kernels for these stacks.
    pub fn supported(&self) -> bool {
        #[cfg(feature = "cuda")]
        {
            cuda::supported(self)
        }
        #[cfg(not(feature = "cuda"))]
        {
            false
        }
    }

    /// `x` `[m, hidden]`, `logits` `[m, experts]` (the router's output) → `[m, hidden]` f32.
    pub fn forward(&self, x: &Tensor, logits: &Tensor) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            return cuda::forward(self, x, logits);
        }
        let _ = (x, logits);
        Err(ModelError::Input(format!("routed experts: no kernels for {:?}", x.device().location())))
    }
}
