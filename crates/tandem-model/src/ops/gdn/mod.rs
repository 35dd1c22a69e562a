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
//! ([`device`]: CUDA kernels in `cuda` (token by token), `cuda_batch` (token by token for a
//! whole batch of sequences at once) and `cuda_chunked` (the WY form for prefill chunks), plain candle ops in [`portable`] elsewhere), each tested against these
//! slice kernels.

pub mod chunked;
pub mod conv;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_batch;
#[cfg(feature = "cuda")]
pub mod cuda_chunked;
pub mod device;
pub mod norm;
pub mod portable;
pub mod recurrent;
pub mod step;

pub use chunked::{gated_delta_chunked, CHUNK};
pub use conv::{causal_conv_silu, causal_conv_silu_taps, conv_taps};
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

/// Flushes subnormal floats to zero (x86 MXCSR FTZ + DAZ) on this thread until dropped, then
/// restores the previous mode. The delta rule's state decays geometrically (e^g per token), so
/// long inputs drive many of its values into the subnormal range, where every multiply and
/// add takes a microcode assist: the chunked prefill ran 1.4x slower for it on the random
/// 0.8B preset. Values below 1.2e-38 carry nothing a model can see; the recurrent and chunked
/// kernels both run under this guard, so they agree with each other. A no-op off x86.
pub(crate) struct FlushDenormals {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

impl FlushDenormals {
    #[allow(deprecated, clippy::new_without_default)]
    pub(crate) fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: reading and writing MXCSR only changes this thread's float modes; SSE is
            // part of x86_64.
            let saved = unsafe { std::arch::x86_64::_mm_getcsr() };
            unsafe { std::arch::x86_64::_mm_setcsr(saved | 0x8040) };
            Self { saved }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Self {}
    }
}

impl Drop for FlushDenormals {
    #[allow(deprecated)]
    fn drop(&mut self) {
        // SAFETY: restores the mode read in `new`.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::x86_64::_mm_setcsr(self.saved)
        };
    }
}

#[cfg(test)]
pub(crate) mod testdata {
    /// The deterministic xorshift generator the conformance suite uses.
    pub use crate::conformance::Rng;
}
