//! Activations quantised to 8 bits per 32-value block, as ggml's x86 `quantize_row_q8_0` and
//! `quantize_row_q8_1` do before every quantised dot product:
//!
//! `amax = max |x|`, `d = amax / 127`, `q = round_half_even(x · 127/amax)`, `s = d · Σq`,
//! with `d` and `s` stored as f16. Q8_0 and Q8_1 only differ in whether `s` is kept, so one
//! [`Q8Block`] serves both: Q4_1 and Q5_1 weights use `s` (their minimum times the activation
//! sum), Q5_0 ignores it.
//!
//! `d` and `s` are kept here as the f32 values of those f16 numbers: the arithmetic is the
//! same as ggml's, without an f16 conversion in the dot-product loop. The scalar and AVX2
//! quantisers give bit-identical blocks (tested).

use half::f16;

use super::blocks::QK;
use super::Kernel;

/// 32 activations as `d · qs[j]`, with `s = d · Σ qs` (both rounded through f16). `d` and `s`
/// are adjacent and 8-byte aligned so a kernel can load them as one pair.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(8))]
pub struct Q8Block {
    pub qs: [i8; QK],
    pub d: f32,
    pub s: f32,
}

const _: () = assert!(std::mem::size_of::<Q8Block>() == 40 && std::mem::offset_of!(Q8Block, d) == 32);

impl Q8Block {
    pub const ZERO: Q8Block = Q8Block { qs: [0; QK], d: 0.0, s: 0.0 };

    /// The 32 values as f32 (`d · q`).
    pub fn dequantize(&self, out: &mut [f32]) {
        for (o, &q) in out[..QK].iter_mut().zip(&self.qs) {
            *o = q as f32 * self.d;
        }
    }
}

#[inline(always)]
pub(super) fn finish(d: f32, sum: i32) -> (f32, f32) {
    (f16::from_f32(d).to_f32(), f16::from_f32(d * sum as f32).to_f32())
}

/// Plain Rust quantiser (the reference).
pub fn quantize_row_scalar(x: &[f32], out: &mut [Q8Block]) {
    assert_eq!(x.len(), out.len() * QK, "quantize_row: {} values for {} blocks", x.len(), out.len());
    for (blk, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        let amax = xs.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in blk.qs.iter_mut().zip(xs) {
            let r = (v * id).round_ties_even() as i32;
            *q = r as i8;
            sum += r;
        }
        (blk.d, blk.s) = finish(d, sum);
    }
}

/// Quantises one row of `out.len() * 32` values with the given kernel.
pub fn quantize_row(kernel: Kernel, x: &[f32], out: &mut [Q8Block]) {
    match kernel {
        Kernel::Reference => quantize_row_scalar(x, out),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 | Kernel::AvxVnni | Kernel::Avx512Vnni => {
            assert_eq!(x.len(), out.len() * QK, "quantize_row: {} values for {} blocks", x.len(), out.len());
            assert!(Kernel::Avx2.available());
            // SAFETY: the CPU has AVX2 (checked above); lengths checked above.
            unsafe { avx2::quantize_row(x, out) }
        }
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon | Kernel::NeonDot => super::neon::quantize_row(x, out),
        #[allow(unreachable_patterns)]
        _ => quantize_row_scalar(x, out),
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{finish, Q8Block, QK};

    /// ggml's AVX2 `quantize_row_q8_1`. Caller guarantees `x.len() == out.len() * 32`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quantize_row(x: &[f32], out: &mut [Q8Block]) {
        let sign = _mm256_set1_ps(-0.0);
        let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (i, blk) in out.iter_mut().enumerate() {
            let p = x.as_ptr().add(i * QK);
            let mut v0 = _mm256_loadu_ps(p);
            let mut v1 = _mm256_loadu_ps(p.add(8));
            let mut v2 = _mm256_loadu_ps(p.add(16));
            let mut v3 = _mm256_loadu_ps(p.add(24));
            let mut ma = _mm256_andnot_ps(sign, v0);
            ma = _mm256_max_ps(ma, _mm256_andnot_ps(sign, v1));
            ma = _mm256_max_ps(ma, _mm256_andnot_ps(sign, v2));
            ma = _mm256_max_ps(ma, _mm256_andnot_ps(sign, v3));
            let mut m4 = _mm_max_ps(_mm256_extractf128_ps(ma, 1), _mm256_castps256_ps128(ma));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            let amax = _mm_cvtss_f32(m4);

            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mul = _mm256_set1_ps(id);
            const RN: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            v0 = _mm256_round_ps::<RN>(_mm256_mul_ps(v0, mul));
            v1 = _mm256_round_ps::<RN>(_mm256_mul_ps(v1, mul));
            v2 = _mm256_round_ps::<RN>(_mm256_mul_ps(v2, mul));
            v3 = _mm256_round_ps::<RN>(_mm256_mul_ps(v3, mul));
            let i0 = _mm256_cvtps_epi32(v0);
            let i1 = _mm256_cvtps_epi32(v1);
            let i2 = _mm256_cvtps_epi32(v2);
            let i3 = _mm256_cvtps_epi32(v3);

            let s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b01));
            let sum = _mm_cvtsi128_si32(s1);

            let p01 = _mm256_packs_epi32(i0, i1);
            let p23 = _mm256_packs_epi32(i2, i3);
            let bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
            _mm256_storeu_si256(blk.qs.as_mut_ptr() as *mut __m256i, bytes);
            (blk.d, blk.s) = finish(d, sum);
        }
    }
}
