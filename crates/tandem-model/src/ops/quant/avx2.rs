//! AVX2 + FMA (+ F16C) kernels, after ggml's `ggml_vec_dot_q4_1_q8_1` & co. in
//! `ggml-cpu/arch/x86/quants.c`, tiled over several rows and columns:
//!
//! * a weight block is unpacked to 32 bytes once (nibbles, plus the fifth bit for Q5) and
//!   multiplied with up to 4 activation rows (prefill); for a single row (decode) 4 columns
//!   are done at once so the activation block is loaded once per 4 weight rows;
//! * per (row, column, block): `maddubs` (u8·i8 → i16 pairs), `madd` with ones (→ 8 × i32),
//!   convert to f32 and `fma` with `d_w · d_a`; the `m_w · s_a` term is summed on the side.
//!
//! The integer part is exact, so results equal [`super::reference`] up to f32 summation order.

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::Q8Block;
use super::blocks::{BlockQ4_1, BlockQ5_0, BlockQ5_1, QuantType, WeightBlock};

/// Whether this CPU can run the kernels in this file.
pub(super) fn detected() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

/// Weights from 16 bytes of nibbles: bytes 0..16 the low nibbles, 16..32 the high ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(qs as *const __m128i);
    let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(bytes, _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte `j` where bit `j` of the little-endian `qh` is set, else 0 (ggml's
/// `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn high_bits(qh: *const u8) -> __m256i {
    let x32 = u32::from_le_bytes(std::ptr::read_unaligned(qh as *const [u8; 4]));
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
    let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn h2f(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The block's 32 weights as bytes (unsigned `q` for Q4_1/Q5_1, signed `q - 16` for Q5_0),
/// its scale and its minimum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<B: WeightBlock>(p: *const B) -> (__m256i, f32, f32) {
    match B::TYPE {
        QuantType::Q4_1 => {
            let b = &*(p as *const BlockQ4_1);
            (nibbles(b.qs.as_ptr()), h2f(b.d), h2f(b.m))
        }
        QuantType::Q5_0 => {
            let b = &*(p as *const BlockQ5_0);
            // q - 16 is the nibble with 0xF0 on top where the fifth bit is clear.
            let hi = _mm256_andnot_si256(high_bits(b.qh.as_ptr()), _mm256_set1_epi8(0xF0u8 as i8));
            (_mm256_or_si256(nibbles(b.qs.as_ptr()), hi), h2f(b.d), 0.0)
        }
        QuantType::Q5_1 => {
            let b = &*(p as *const BlockQ5_1);
            let hi = _mm256_and_si256(high_bits(b.qh.as_ptr()), _mm256_set1_epi8(0x10));
            (_mm256_or_si256(nibbles(b.qs.as_ptr()), hi), h2f(b.d), h2f(b.m))
        }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(x: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// `R` activation rows × `C` weight rows. `w` points at the first weight row (rows `nb`
/// blocks apart), `a` at the first activation row (rows `nb` blocks apart), `y` at the output
/// element of the first row and column (rows `n` apart).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<B: WeightBlock, const R: usize, const C: usize>(
    w: *const B,
    a: *const Q8Block,
    nb: usize,
    y: *mut f32,
    n: usize,
) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut msum = [[0f32; C]; R];
    for b in 0..nb {
        let mut wq = [_mm256_setzero_si256(); C];
        let mut wabs = [_mm256_setzero_si256(); C];
        let mut wd = [0f32; C];
        let mut wm = [0f32; C];
        for c in 0..C {
            (wq[c], wd[c], wm[c]) = unpack::<B>(w.add(c * nb + b));
            if !B::HAS_MIN {
                wabs[c] = _mm256_sign_epi8(wq[c], wq[c]);
            }
        }
        for r in 0..R {
            let ab = &*a.add(r * nb + b);
            let qy = _mm256_loadu_si256(ab.qs.as_ptr() as *const __m256i);
            for c in 0..C {
                let pairs = if B::HAS_MIN {
                    _mm256_maddubs_epi16(wq[c], qy)
                } else {
                    _mm256_maddubs_epi16(wabs[c], _mm256_sign_epi8(qy, wq[c]))
                };
                let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(wd[c] * ab.d), p, acc[r][c]);
                if B::HAS_MIN {
                    msum[r][c] += wm[c] * ab.s;
                }
            }
        }
    }
    for r in 0..R {
        for c in 0..C {
            *y.add(r * n + c) = hsum(acc[r][c]) + msum[r][c];
        }
    }
}

/// Weight bytes per column tile: the tile is reused by every row group, so keep it in L1/L2.
const TILE_BYTES: usize = 32 * 1024;

/// `y[r, c]` for all rows `r < m` and the columns in `cols`: columns in tiles of about
/// [`TILE_BYTES`] of weights, rows in groups of 4 within a tile.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`detected`]); `w` holds `n` rows and `a` `m`
/// rows of `nb` blocks; `y` must be valid for writes at `r * n + c` for every `r < m`,
/// `c` in `cols`, with no other thread accessing those elements meanwhile.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn matmul_cols<B: WeightBlock>(
    w: &[B],
    nb: usize,
    a: &[Q8Block],
    m: usize,
    cols: Range<usize>,
    y: *mut f32,
    n: usize,
) {
    debug_assert!(w.len() >= cols.end * nb && a.len() >= m * nb);
    let tile_cols = (TILE_BYTES / (nb * B::BYTES)).max(4) & !3;
    let mut t0 = cols.start;
    while t0 < cols.end {
        let t1 = (t0 + tile_cols).min(cols.end);
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(4);
            let ap = a.as_ptr().add(r0 * nb);
            let mut c = t0;
            macro_rules! run {
                ($r:literal, $c:literal) => {{
                    tile::<B, $r, $c>(w.as_ptr().add(c * nb), ap, nb, y.add(r0 * n + c), n);
                    c += $c;
                }};
            }
            match rows {
                1 => {
                    while c + 4 <= t1 {
                        run!(1, 4);
                    }
                    while c < t1 {
                        run!(1, 1);
                    }
                }
                2 => {
                    while c + 2 <= t1 {
                        run!(2, 2);
                    }
                    while c < t1 {
                        run!(2, 1);
                    }
                }
                3 => {
                    while c + 2 <= t1 {
                        run!(3, 2);
                    }
                    while c < t1 {
                        run!(3, 1);
                    }
                }
                _ => {
                    while c + 2 <= t1 {
                        run!(4, 2);
                    }
                    while c < t1 {
                        run!(4, 1);
                    }
                }
            }
            r0 += rows;
        }
        t0 = t1;
    }
}
