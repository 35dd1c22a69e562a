//! candle's `BlockQ8K::from_float` (the activations of a Q6K product) in AVX-512, bit for bit:
//! per 256 values the first value of the largest magnitude `max`, `iscale = -127 / max`, `q =
//! round(iscale · x)` (half away from zero, clamped to -128..=127, NaN to 0), the sums of each
//! 16 `q`, `d = 1 / iscale`; a block of zeros (or of NaN) is all zero. candle's loop is scalar
//! with a `roundf` call per value: up to 10% of a K-quant prefill. The values and their order are
//! candle's, so every Q6K result keeps the bits of candle's decode path.

use std::arch::x86_64::*;

use super::{Q8, QK_K};

/// Whether this CPU runs [`quantize_row`].
pub(super) fn available() -> bool {
    crate::ops::quant::avx512_allowed()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// `x` (`out.len() · 256` values) into `out`, as candle's `from_float`.
///
/// # Safety
/// [`available`].
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize_row(x: &[f32], out: &mut [Q8]) {
    assert_eq!(x.len(), out.len() * QK_K, "Q8K: {} values for {} blocks", x.len(), out.len());
    let sign = _mm512_set1_ps(-0.0);
    for (xs, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let p = xs.as_ptr();
        let v: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(p.add(16 * i)));
        // max |x|, NaN skipped (`max_ps` returns its second operand when either is NaN).
        let mut m = _mm512_setzero_ps();
        for vi in &v {
            m = _mm512_max_ps(_mm512_andnot_ps(sign, *vi), m);
        }
        let amax = _mm512_reduce_max_ps(m);
        if amax == 0.0 {
            y.d = 0.0;
            y.qs.fill(0);
            y.bsums.fill(0);
            continue;
        }
        // The first value whose magnitude is amax (candle keeps the first strictly larger).
        let target = _mm512_set1_ps(amax);
        let mut max = amax;
        for (i, vi) in v.iter().enumerate() {
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_andnot_ps(sign, *vi), target);
            if hit != 0 {
                max = xs[16 * i + hit.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127f32 / max;
        let s = _mm512_set1_ps(iscale);
        let (half, one) = (_mm512_set1_ps(0.5), _mm512_set1_ps(1.0));
        let (lo, hi) = (_mm512_set1_ps(-128.0), _mm512_set1_ps(127.0));
        for (i, vi) in v.iter().enumerate() {
            let t = _mm512_mul_ps(s, *vi);
            // round half away from zero: trunc, then one step away where |t - trunc| >= 0.5
            // (t - trunc(t) is exact).
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
            let frac = _mm512_andnot_ps(sign, _mm512_sub_ps(t, r));
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
            let step = _mm512_or_ps(_mm512_and_ps(t, sign), one);
            let r = _mm512_mask_add_ps(r, up, r, step);
            let r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
            // NaN (from a NaN input, or 0 · inf) converts to 0, as `NaN as i8` does.
            let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(t, t);
            let q = _mm512_maskz_cvttps_epi32(ordered, r);
            _mm_storeu_si128(y.qs.as_mut_ptr().add(16 * i) as *mut __m128i, _mm512_cvtepi32_epi8(q));
            y.bsums[i] = _mm512_reduce_add_epi32(q) as i16;
        }
        y.d = 1.0 / iscale;
    }
}

/// Whether this CPU runs [`quantize_row_avx2`].
pub(super) fn available_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// [`quantize_row`] on AVX2 (the same bytes): 8 values a register, reloaded from L1 where the
/// AVX-512 version keeps all 256 in registers.
///
/// # Safety
/// [`available_avx2`].
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_row_avx2(x: &[f32], out: &mut [Q8]) {
    assert_eq!(x.len(), out.len() * QK_K, "Q8K: {} values for {} blocks", x.len(), out.len());
    let sign = _mm256_set1_ps(-0.0);
    for (xs, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let p = xs.as_ptr();
        // max |x|, NaN skipped (`max_ps` returns its second operand when either is NaN).
        let mut m = _mm256_setzero_ps();
        for i in 0..QK_K / 8 {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * i))), m);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
        if amax == 0.0 {
            y.d = 0.0;
            y.qs.fill(0);
            y.bsums.fill(0);
            continue;
        }
        // The first value whose magnitude is amax (candle keeps the first strictly larger).
        let max = *xs.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
        let iscale = -127f32 / max;
        let s = _mm256_set1_ps(iscale);
        let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
        let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
        for i in 0..QK_K / 16 {
            let mut q = [_mm256_setzero_si256(); 2];
            for (u, qu) in q.iter_mut().enumerate() {
                let t = _mm256_mul_ps(s, _mm256_loadu_ps(p.add(16 * i + 8 * u)));
                // round half away from zero, as in `quantize_row`.
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
                let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(t, r));
                let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, half);
                let step = _mm256_and_ps(_mm256_or_ps(_mm256_and_ps(t, sign), one), up);
                let r = _mm256_add_ps(r, step);
                let r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
                // NaN converts to 0, as `NaN as i8` does.
                let ordered = _mm256_cmp_ps::<_CMP_ORD_Q>(t, t);
                *qu = _mm256_cvttps_epi32(_mm256_and_ps(r, ordered));
            }
            // 16 values in -128..=127: the saturating packs are exact; they interleave the
            // 128-bit lanes, which the permute puts back in order.
            let w16 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
            let b8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256::<1>(w16));
            _mm_storeu_si128(y.qs.as_mut_ptr().add(16 * i) as *mut __m128i, b8);
            let s8 = _mm256_add_epi32(q[0], q[1]);
            let s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256::<1>(s8));
            let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
            let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2));
            y.bsums[i] = _mm_cvtsi128_si32(s1) as i16;
        }
        y.d = 1.0 / iscale;
    }
}
