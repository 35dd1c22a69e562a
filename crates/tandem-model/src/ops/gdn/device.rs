//! The GDN ops on tensors of any device, dispatched by where the tensors live: CUDA kernels
//! ([`super::cuda`]) on CUDA devices, the plain candle-op versions ([`super::portable`]) on
//! every other device (Metal). CPU models keep using the slice kernels in place on host state
//! (`arch/qwen_hybrid/gdn.rs`), which are the references for both.

use candle_core::Tensor;

use super::{portable, GdnDims};
use crate::error::Result;

/// Causal conv + SiLU with state; see [`portable::conv_silu`].
pub fn conv_silu(x: &Tensor, state: &Tensor, w: &Tensor, lanes: bool) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return super::cuda::conv_silu(x, state, w, lanes);
    }
    portable::conv_silu(x, state, w, lanes)
}

/// The gated delta rule with state; see [`portable::delta_rule`].
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    beta: &Tensor,
    g: &Tensor,
    state: &Tensor,
    d: GdnDims,
    lanes: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() {
        return super::cuda::delta_rule(q, k, v, beta, g, state, d, lanes);
    }
    portable::delta_rule(q, k, v, beta, g, state, d, lanes)
}
