//! The Q6K x Q8K kernel with AVX-512: two weight columns per 512-bit register, each 256-bit
//! half running exactly the instructions candle's AVX2 `vec_dot_q6k_q8k` runs for that column
//! (the same exact integer lanes per superblock, the same `fma(d, cvt(sumi), acc)` with `d =
//! d_a · d_w`, the same final horizontal sum), so every result has the bits of the one-column
//! kernels in [`super`]; the activation's bytes are broadcast to both halves, and each weight
//! pair's 6-bit values are decoded once for up to 8 rows. An odd last column goes to the
//! one-column AVX-512 kernel.

use std::arch::x86_64::*;

use super::{Q6, Q8, QK_K, ROW_BLOCK_BYTES, SHUFFLE};

/// Whether this CPU can run [`matmul_cols`].
pub(super) fn available() -> bool {
    crate::ops::quant::avx512_allowed()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("fma")
}

/// 32 bytes of column `a` and 32 of column `b` (`a` in the low half).
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw")]
unsafe fn load_pair(a: *const u8, b: *const u8) -> __m512i {
    let lo = _mm256_loadu_si256(a as *const __m256i);
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), _mm256_loadu_si256(b as *const __m256i))
}

/// candle's `hsum_float_8` of each half: `[column a, column b]`.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw")]
unsafe fn hsum_pair(x: __m512) -> [f32; 2] {
    let h = |v: __m256| {
        let res = _mm256_extractf128_ps(v, 1);
        let res = _mm_add_ps(res, _mm256_castps256_ps128(v));
        let res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        let res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    };
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
    [h(_mm512_castps512_ps256(x)), h(hi)]
}

/// `y[r][0..2]` for weight columns `w0`, `w1` (`nb` superblocks each) and `R` activation rows
/// from `a`, rows `nb` blocks apart.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw")]
unsafe fn tile<const R: usize>(w0: *const Q6, w1: *const Q6, a: *const Q8, nb: usize) -> [[f32; 2]; R] {
    let m4 = _mm512_set1_epi8(0xF);
    let m2 = _mm512_set1_epi8(3);
    let m32s = _mm512_set1_epi8(32);
    let mut acc = [_mm512_setzero_ps(); R];
    // Read once, outside the loop: a call inside it would make the compiler save every live
    // vector register around it.
    let ahead = if R <= 4 { crate::ops::quant::pair_prefetch() } else { 0 };
    // Where the prefetch stands: block `pr` of the pair `pq` pairs on (a pair's two columns lie
    // one after another and the next pair after them, so past a column's end it runs on into
    // the pairs this thread reads next). Past the matrix's end it fetches nothing useful; a
    // prefetch never faults.
    let (mut pq, mut pr) = ahead.checked_div(nb).map_or((0, 0), |q| (q, ahead % nb));
    for b in 0..nb {
        if ahead > 0 {
            // The two columns' blocks `ahead` on (210 bytes each), into L2, as the K-quant
            // tiles do (calls of a few rows: decode, verify chunks).
            let off = 2 * nb * pq + pr;
            for w in [w0, w1] {
                let p = w.wrapping_add(off) as *const i8;
                for line in 0..std::mem::size_of::<Q6>().div_ceil(64) + 1 {
                    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * line));
                }
            }
            pr += 1;
            if pr == nb {
                pr = 0;
                pq += 1;
            }
        }
        let (x0, x1) = (&*w0.add(b), &*w1.add(b));
        let scales0 = _mm_loadu_si128(x0.scales.as_ptr() as *const __m128i);
        let scales1 = _mm_loadu_si128(x1.scales.as_ptr() as *const __m128i);
        let mut sumi = [_mm512_setzero_si512(); R];
        for j in 0..QK_K / 128 {
            let q4bits1 = load_pair(x0.ql.as_ptr().add(64 * j), x1.ql.as_ptr().add(64 * j));
            let q4bits2 = load_pair(x0.ql.as_ptr().add(64 * j + 32), x1.ql.as_ptr().add(64 * j + 32));
            let q4bits_h = load_pair(x0.qh.as_ptr().add(32 * j), x1.qh.as_ptr().add(32 * j));
            macro_rules! group {
                ($i:literal, $bits:expr, $lo_shift:literal, $hi_shift:literal) => {{
                    let shuffle = _mm_loadu_si128(SHUFFLE[4 * j + $i].as_ptr() as *const __m128i);
                    let sc_bytes =
                        _mm256_set_m128i(_mm_shuffle_epi8(scales1, shuffle), _mm_shuffle_epi8(scales0, shuffle));
                    let sc = _mm512_cvtepi8_epi16(sc_bytes);
                    let qh_part = _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(q4bits_h, $hi_shift), m2), 4);
                    // 32 weights q (0..63, the signed weight + 32) of each column.
                    let q = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16($bits, $lo_shift), m4), qh_part);
                    for r in 0..R {
                        let q8 = (*a.add(r * nb + b)).qs.as_ptr().add(128 * j + 32 * $i);
                        let q8i = _mm512_broadcast_i64x4(_mm256_loadu_si256(q8 as *const __m256i));
                        let q8s = _mm512_maddubs_epi16(m32s, q8i);
                        let p16 = _mm512_sub_epi16(_mm512_maddubs_epi16(q, q8i), q8s);
                        sumi[r] = _mm512_add_epi32(sumi[r], _mm512_madd_epi16(sc, p16));
                    }
                }};
            }
            group!(0, q4bits1, 0, 0);
            group!(1, q4bits2, 0, 2);
            group!(2, q4bits1, 4, 4);
            group!(3, q4bits2, 4, 6);
        }
        let xd0 = half::f16::from_bits(x0.d).to_f32();
        let xd1 = half::f16::from_bits(x1.d).to_f32();
        let xd = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(xd0))),
            _mm256_castps_pd(_mm256_set1_ps(xd1)),
        ));
        for r in 0..R {
            // d = d_a · d_w per half, as candle's `y.d * x.d`.
            let d = _mm512_mul_ps(_mm512_set1_ps((*a.add(r * nb + b)).d), xd);
            acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    let mut out = [[0f32; 2]; R];
    for r in 0..R {
        out[r] = hsum_pair(acc[r]);
    }
    out
}

/// As [`super`]'s `matmul_cols`, two columns at a time; an odd last column on the one-column
/// AVX-512 kernel.
///
/// # Safety
/// [`available`]; `w` has at least `cols.end * nb` blocks, `a` `m * nb`; `y` valid for
/// exclusive writes at `r * n + c` for `r < m`, `c` in `cols`.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512bw")]
pub(super) unsafe fn matmul_cols(
    w: &[Q6],
    nb: usize,
    a: &[Q8],
    m: usize,
    cols: std::ops::Range<usize>,
    y: *mut f32,
    n: usize,
) {
    let pairs_end = cols.start + (cols.end - cols.start) / 2 * 2;
    let block_rows = (ROW_BLOCK_BYTES / (nb * std::mem::size_of::<Q8>())).max(8);
    let mut b0 = 0;
    while b0 < m {
        let b1 = (b0 + block_rows).min(m);
        for c in (cols.start..pairs_end).step_by(2) {
            let (w0, w1) = (w.as_ptr().add(c * nb), w.as_ptr().add((c + 1) * nb));
            let mut r0 = b0;
            while r0 < b1 {
                let left = b1 - r0;
                let rows = left.div_ceil(left.div_ceil(8));
                let ap = a.as_ptr().add(r0 * nb);
                macro_rules! run {
                    ($r:literal) => {
                        for (i, v) in tile::<$r>(w0, w1, ap, nb).into_iter().enumerate() {
                            *y.add((r0 + i) * n + c) = v[0];
                            *y.add((r0 + i) * n + c + 1) = v[1];
                        }
                    };
                }
                match rows {
                    1 => run!(1),
                    2 => run!(2),
                    3 => run!(3),
                    4 => run!(4),
                    5 => run!(5),
                    6 => run!(6),
                    7 => run!(7),
                    _ => run!(8),
                }
                r0 += rows;
            }
        }
        b0 = b1;
    }
    if pairs_end < cols.end {
        super::wide::matmul_cols(w, nb, a, m, pairs_end..cols.end, y, n);
    }
}
