//! Gated DeltaNet (GDN) kernels on plain f32 slices: the causal depthwise conv with an explicit
//! conv state ([`conv`]), the normalisations ([`norm`]: L2 norm of q/k and the gated RMSNorm of
//! the output), and the gated delta rule itself in its recurrent form (decode, verify; see
//! [`recurrent`]) and its chunked WY/UT form (prefill; see [`chunked`]).
//!
//! Layouts (row-major, one sequence): q, k `[t, nk, dk]` (q already L2-normalised and scaled by
//! dk^-1/2, k L2-normalised), v `[t, nv, dv]`, β and g `[t, nv]` (g is the log decay, ≤ 0), the
//! state `[nv, dk, dv]` (f32), output `[t, nv, dv]`. V-head h reads q/k head `h / (nv / nk)`.
//! Maths: `docs/qwen-hybrid-architecture.md` §4 of the shared brief.
//!
//! Models on a GPU keep their state on the device and run the same ops on tensors
//! ([`device`]: CUDA kernels in `cuda` (token by token) and `cuda_chunked` (the WY form for
//! prefill chunks), plain candle ops in [`portable`] elsewhere), each tested against these
//! slice kernels.

pub mod chunked;
pub mod conv;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_chunked;
pub mod device;
pub mod norm;
pub mod portable;
pub mod recurrent;
pub mod step;

pub use chunked::{gated_delta_chunked, CHUNK};
pub use conv::causal_conv_silu;
pub use norm::{gated_rms_norm, l2_normalize};
pub use recurrent::{gated_delta_recurrent, gated_delta_recurrent_states};

/// One call's per-token inputs of the delta rule (`q`, `k`: `[t, nk, dk]`; `v`: `[t, nv, dv]`;
/// `beta`, `g`: `[t, nv]`), handed whole to each head's task.
#[derive(Clone, Copy)]
pub(crate) struct RuleInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub beta: &'a [f32],
    pub g: &'a [f32],
}

/// Shapes of one GDN layer's recurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    /// q/k heads.
    pub nk: usize,
    /// v heads (= number of states).
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
}

impl GdnDims {
    pub fn state_len(&self) -> usize {
        self.nv * self.dk * self.dv
    }
    /// V-heads per k-head.
    pub fn ratio(&self) -> usize {
        (self.nv / self.nk.max(1)).max(1)
    }
}

#[cfg(test)]
pub(crate) mod testdata {
    /// The deterministic xorshift generator the conformance suite uses.
    pub use crate::conformance::Rng;
}
