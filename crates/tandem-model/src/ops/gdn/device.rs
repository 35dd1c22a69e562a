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

/// The layer's parameters for [`step`] (f32 tensors on the model's device): `dt_bias`,
/// `neg_a` `[nv]`, the output norm's weight `[dv]`, the q scale and the norm's eps.
pub struct StepTensors<'a> {
    pub dt_bias: &'a Tensor,
    pub neg_a: &'a Tensor,
    pub norm_w: &'a Tensor,
    pub scale: f32,
    pub eps: f32,
}

/// Prefill chunks of at least this many tokens (without verify lanes) take the chunked WY
/// kernels on CUDA; shorter ones, decode and verify the token-by-token fused kernel.
pub const CHUNKED_MIN_TOKENS: usize = 64;

/// Whether the chunked WY kernels are on (`TANDEM_GDN_CHUNKED=0` turns them off, for
/// comparisons: every chunk then takes the token-by-token kernel).
#[cfg(feature = "cuda")]
fn chunked_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_GDN_CHUNKED").map_or(true, |v| v != "0"))
}

/// Whether a part of `t` tokens (`lanes`: verify mode) takes the chunked WY kernels in [`step`].
pub fn takes_chunked(u_device: &candle_core::Device, t: usize, lanes: bool, d: GdnDims) -> bool {
    #[cfg(feature = "cuda")]
    if u_device.is_cuda() {
        return !lanes && d.dk <= 256 && t >= CHUNKED_MIN_TOKENS && chunked_enabled();
    }
    let _ = (u_device, t, lanes, d);
    false
}

/// Whether the token-by-token parts of a batch run together in one set of launches
/// ([`super::cuda_batch::step_batch`]): CUDA with the column-split step, not turned off by
/// `TANDEM_GDN_BATCH=0` (for comparisons, which then run one sequence at a time).
pub fn batches(device: &candle_core::Device, d: GdnDims) -> bool {
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var("TANDEM_GDN_BATCH").map_or(true, |v| v != "0"));
        return on && super::cuda::split_columns() && d.dk <= 256;
    }
    let _ = (device, d);
    false
}

/// The layer's step after the conv (norms, gates, delta rule, gated output norm; see
/// [`super::step`]): on CUDA one fused token-by-token kernel, or for prefill chunks of
/// [`CHUNKED_MIN_TOKENS`] or more the chunked WY kernels; plain candle ops elsewhere.
#[allow(clippy::too_many_arguments)]
pub fn step(
    u: &Tensor,
    z: &Tensor,
    b: &Tensor,
    a: &Tensor,
    state: &Tensor,
    p: &StepTensors<'_>,
    d: GdnDims,
    lanes: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    #[cfg(feature = "cuda")]
    if takes_chunked(u.device(), u.dim(0)?, lanes, d) {
        let (o, next) = super::cuda_chunked::step_chunked(u, z, b, a, state, p, d)?;
        return Ok((o, next, None));
    }
    #[cfg(feature = "cuda")]
    if u.device().is_cuda() && d.dk <= 256 && d.dv <= 256 {
        return super::cuda::delta_fused(u, z, b, a, state, p, d, lanes);
    }
    portable::step(u, z, b, a, state, p, d, lanes)
}
