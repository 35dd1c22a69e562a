//! The K-quant × Q8K kernels on AVX-512 VNNI (Q4K / Q5K here; Q6K / Q3K in `rows6`, Q2K in
//! `rows2`): 16 columns in the 16 lanes of a register, `R`
//! (1..=8) activation rows per pass over a column tile, each tile's weights decoded once for the
//! `R` rows (Q5K: the fifth bits added as 16 by a byte-masked add). Per lane it runs [`super::tile::dot`]'s arithmetic: the sub-block integer sums by
//! `dpbusd` (exact), the mins by `dpwssd` (exact), then the same `fma`s in the same order.

use std::arch::x86_64::*;

use super::tile::{HighBits, Tile, COLS};
use super::tile2::Tile2;
use super::tile50::{Tile32, ACT50_BYTES, ACT50_QS, ACT50_SUMS};
use super::tile6::Sub16;
use super::tile8::Tile8;
use super::x86::{ahead, ahead50, prefetch_next, prefetch_part, spread, RowPtr, Q8_BSUMS, Q8_BYTES, Q8_QS};

/// Whether this CPU runs [`rows`].
pub fn available() -> bool {
    crate::ops::quant::avx512_allowed()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
}

/// [`rows`] for Q8_0 tiles ([`Tile8`]): per 32-value block, eight `dpbusd`s (two chains a
/// row, so one row is not held up by their latency) started at `-128 · Σ a`, then one
/// multiply-add by `d_s · d_a,s` ([`super::tile8::dot`]'s order).
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn rows8<const R: usize>(
    tiles: *const Tile8,
    nb: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let mut acc = [_mm512_setzero_ps(); R];
    let ahead = ahead::<R>();
    let sp = spread();
    for b in 0..nb {
        let t = &*tiles.add(b);
        let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].q8.add(b * ACT50_BYTES));
        for s in 0..8 {
            prefetch_part!(tiles, b, ahead, s, 8, sp);
            let mut even = [_mm512_setzero_si512(); R];
            let mut odd = [_mm512_setzero_si512(); R];
            for r in 0..R {
                let sum = (blk[r].add(ACT50_SUMS + 4 * s) as *const i32).read_unaligned();
                even[r] = _mm512_set1_epi32(-128 * sum);
            }
            for q in 0..4 {
                let g = 8 * s + 2 * q;
                let w0 = _mm512_load_si512(t.qs.as_ptr().add(64 * g) as *const __m512i);
                let w1 = _mm512_load_si512(t.qs.as_ptr().add(64 * g + 64) as *const __m512i);
                for r in 0..R {
                    let a = blk[r].add(ACT50_QS + 4 * g) as *const i32;
                    even[r] = _mm512_dpbusd_epi32(even[r], w0, _mm512_set1_epi32(a.read_unaligned()));
                    odd[r] = _mm512_dpbusd_epi32(odd[r], w1, _mm512_set1_epi32(a.add(1).read_unaligned()));
                }
            }
            let d = _mm512_cvtph_ps(_mm256_load_si256(t.d[s].as_ptr() as *const __m256i));
            for r in 0..R {
                let da = _mm512_set1_ps((blk[r].add(4 * s) as *const f32).read_unaligned());
                let i = _mm512_add_epi32(even[r], odd[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(d, da), acc[r]);
            }
        }
    }
    store(&acc, out, ldo, cols);
}

/// [`rows`] for Q5_0 and Q4_0 tiles ([`Tile32`]): per 32-value block, the four groups'
/// nibbles (Q5_0: with the fifth bits added as 16 under byte masks), eight `dpbusd`s (two
/// chains a row) started at `-OFFSET · Σ a`, then one multiply-add by `d_s · D`
/// ([`super::tile50::dot`]'s order); in the last stretch only its first `last` blocks (the
/// rest pad the row to whole stretches).
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn rows50<T: Tile32, const R: usize>(
    tiles: *const T,
    nb: usize,
    last: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    let mut acc = [_mm512_setzero_ps(); R];
    let ahead = ahead50::<R>();
    let sp = spread();
    for b in 0..nb {
        let t = &*tiles.add(b);
        let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].q8.add(b * ACT50_BYTES));
        // The last stretch's padding blocks (d = 0 against zero activations) add an exact
        // +0.0 to a sum that is never -0.0: skipping them keeps the reference's bits.
        let steps = if b + 1 == nb { last } else { 8 };
        for s in 0..steps {
            prefetch_part!(tiles, b, ahead, s, steps, sp);
            let mut even = [_mm512_setzero_si512(); R];
            let mut odd = [_mm512_setzero_si512(); R];
            for r in 0..R {
                let sum = (blk[r].add(ACT50_SUMS + 4 * s) as *const i32).read_unaligned();
                even[r] = _mm512_set1_epi32(-T::OFFSET * sum);
            }
            for g in 4 * s..4 * s + 4 {
                let w = _mm512_load_si512(t.qs().as_ptr().add(64 * g) as *const __m512i);
                let mut lo = _mm512_and_si512(w, m4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                if T::HIGH {
                    lo = _mm512_mask_add_epi8(lo, t.high(2 * g), lo, sixteen);
                    hi = _mm512_mask_add_epi8(hi, t.high(2 * g + 1), hi, sixteen);
                }
                for r in 0..R {
                    let a = blk[r].add(ACT50_QS + 8 * g) as *const i32;
                    even[r] = _mm512_dpbusd_epi32(even[r], lo, _mm512_set1_epi32(a.read_unaligned()));
                    odd[r] = _mm512_dpbusd_epi32(odd[r], hi, _mm512_set1_epi32(a.add(1).read_unaligned()));
                }
            }
            let d = _mm512_cvtph_ps(_mm256_load_si256(t.d()[s].as_ptr() as *const __m256i));
            for r in 0..R {
                let da = _mm512_set1_ps((blk[r].add(4 * s) as *const f32).read_unaligned());
                let i = _mm512_add_epi32(even[r], odd[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(d, da), acc[r]);
            }
        }
    }
    store(&acc, out, ldo, cols);
}

/// `out[r][0..cols]` = the products of the column tile `tiles[0..nb]` (16 columns along k;
/// with `high[0..nb]`, its Q5K fifth bits, where `high` is not null) with rows `rows[0..R]`;
/// `out` rows `ldo` floats apart, `cols` (1..=16) columns written.
///
/// # Safety
/// [`available`]; `tiles` (and `high` if not null) hold `nb` entries, each row pointer `nb`
/// superblocks, `out` room for `R` rows of `ldo` with `cols` at the front.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn rows<const R: usize>(
    tiles: *const Tile,
    high: *const HighBits,
    nb: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(16);
    let mut acc = [_mm512_setzero_ps(); R];
    let ahead = ahead::<R>();
    let sp = spread();
    for b in 0..nb {
        if !high.is_null() {
            prefetch_next!(high, b, nb, ahead);
        }
        let t = &*tiles.add(b);
        let hb = if high.is_null() { None } else { Some(&*high.add(b)) };
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(t.d.as_ptr() as *const __m256i));
        let mut tt = [_mm512_setzero_ps(); R];
        let q8: [*const i8; R] = std::array::from_fn(|r| rows[r].q8.add(b * Q8_BYTES + Q8_QS) as *const i8);
        for s in 0..8 {
            prefetch_part!(tiles, b, ahead, s, 8, sp);
            let mut isum = [_mm512_setzero_si512(); R];
            for g in 4 * s..4 * s + 4 {
                let w = _mm512_load_si512(t.qs.as_ptr().add(64 * g) as *const __m512i);
                let mut lo = _mm512_and_si512(w, m4);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                if let Some(h) = hb {
                    lo = _mm512_mask_add_epi8(lo, h.0[2 * g], lo, sixteen);
                    hi = _mm512_mask_add_epi8(hi, h.0[2 * g + 1], hi, sixteen);
                }
                for r in 0..R {
                    let a = q8[r].add(8 * g) as *const i32;
                    isum[r] = _mm512_dpbusd_epi32(isum[r], lo, _mm512_set1_epi32(a.read_unaligned()));
                    isum[r] = _mm512_dpbusd_epi32(isum[r], hi, _mm512_set1_epi32(a.add(1).read_unaligned()));
                }
            }
            let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(t.sc[s].as_ptr() as *const __m128i)));
            let dsc = _mm512_mul_ps(d, sc);
            for r in 0..R {
                tt[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), dsc, tt[r]);
            }
        }
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(t.dmin.as_ptr() as *const __m256i));
        let mn: [__m512i; 4] =
            std::array::from_fn(|p| _mm512_cvtepu8_epi16(_mm256_loadu_si256(t.mn[p].as_ptr() as *const __m256i)));
        for r in 0..R {
            let bs = &*rows[r].bsum.add(b);
            let mut ms = _mm512_setzero_si512();
            for p in 0..4 {
                ms = _mm512_dpwssd_epi32(ms, mn[p], _mm512_set1_epi32(bs[p] as i32));
            }
            let da = _mm512_set1_ps((rows[r].q8.add(b * Q8_BYTES) as *const f32).read_unaligned());
            acc[r] = _mm512_fmadd_ps(tt[r], da, acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ms), dmin), da, acc[r]);
        }
    }
    store(&acc, out, ldo, cols);
}

/// [`rows`] for tiles of 16-value sub-blocks with signed scales ([`Sub16`]: Q6K, the top two
/// bits added as 16 and 32 under byte masks, and Q3K, whole values in the nibbles), the
/// values' offset (32, 4) as a bsum term.
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn rows6<T: Sub16, const R: usize>(
    tiles: *const T,
    nb: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let m4 = _mm512_set1_epi8(0x0F);
    let (c16, c32) = (_mm512_set1_epi8(16), _mm512_set1_epi8(32));
    let mut acc = [_mm512_setzero_ps(); R];
    let ahead = ahead::<R>();
    let sp = spread();
    for b in 0..nb {
        let t = &*tiles.add(b);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(t.d_bits().as_ptr() as *const __m256i));
        let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].q8.add(b * Q8_BYTES));
        let mut tt = [_mm512_setzero_ps(); R];
        let sc16: [__m512i; 8] =
            std::array::from_fn(|p| _mm512_cvtepi8_epi16(_mm256_load_si256(t.sc()[p].as_ptr() as *const __m256i)));
        for (p, &v) in sc16.iter().enumerate() {
            prefetch_part!(tiles, b, ahead, p, 8, sp);
            let scales = [
                _mm512_cvtepi32_ps(_mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(v))),
                _mm512_cvtepi32_ps(_mm512_srai_epi32::<16>(v)),
            ];
            for (q, sc) in scales.into_iter().enumerate() {
                let mut isum = [_mm512_setzero_si512(); R];
                for g in 4 * p + 2 * q..4 * p + 2 * q + 2 {
                    let w = _mm512_load_si512(t.qs().as_ptr().add(64 * g) as *const __m512i);
                    let mut lo = _mm512_and_si512(w, m4);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), m4);
                    if let Some(hm) = t.hm() {
                        lo = _mm512_mask_add_epi8(lo, hm[4 * g], lo, c16);
                        lo = _mm512_mask_add_epi8(lo, hm[4 * g + 1], lo, c32);
                        hi = _mm512_mask_add_epi8(hi, hm[4 * g + 2], hi, c16);
                        hi = _mm512_mask_add_epi8(hi, hm[4 * g + 3], hi, c32);
                    }
                    for r in 0..R {
                        let a = blk[r].add(Q8_QS + 8 * g) as *const i32;
                        isum[r] = _mm512_dpbusd_epi32(isum[r], lo, _mm512_set1_epi32(a.read_unaligned()));
                        isum[r] = _mm512_dpbusd_epi32(isum[r], hi, _mm512_set1_epi32(a.add(1).read_unaligned()));
                    }
                }
                let dsc = _mm512_mul_ps(d, sc);
                for r in 0..R {
                    tt[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), dsc, tt[r]);
                }
            }
        }
        let d32 = _mm512_mul_ps(d, _mm512_set1_ps(T::OFFSET as f32));
        for r in 0..R {
            // The activation's 16-value sums, two to a 32-bit word: the pairs `dpwssd` takes.
            let words = blk[r].add(Q8_BSUMS) as *const i32;
            let mut ms = _mm512_setzero_si512();
            for (p, &v) in sc16.iter().enumerate() {
                ms = _mm512_dpwssd_epi32(ms, v, _mm512_set1_epi32(words.add(p).read_unaligned()));
            }
            let da = _mm512_set1_ps((blk[r] as *const f32).read_unaligned());
            acc[r] = _mm512_fmadd_ps(tt[r], da, acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ms), d32), da, acc[r]);
        }
    }
    store(&acc, out, ldo, cols);
}

/// [`rows`] for Q2K tiles ([`Tile2`]): per sub-block of 16 values one 64-byte load, its four
/// 2-bit planes each a `dpbusd` with four activation bytes; the mins as a bsum term under
/// `dmin` ([`super::tile2::dot`]'s order).
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn rows2<const R: usize>(
    tiles: *const Tile2,
    nb: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let m2 = _mm512_set1_epi8(3);
    let m4w = _mm512_set1_epi16(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    let ahead = ahead::<R>();
    let sp = spread();
    for b in 0..nb {
        let t = &*tiles.add(b);
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(t.d.as_ptr() as *const __m256i));
        let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].q8.add(b * Q8_BYTES));
        let mut tt = [_mm512_setzero_ps(); R];
        // The scale bytes widened to the i16 pairs (sub-blocks 2p, 2p + 1 of each column).
        let raw: [__m512i; 8] =
            std::array::from_fn(|p| _mm512_cvtepu8_epi16(_mm256_load_si256(t.sc[p].as_ptr() as *const __m256i)));
        for (p, &v) in raw.iter().enumerate() {
            prefetch_part!(tiles, b, ahead, p, 8, sp);
            let sc = _mm512_and_si512(v, m4w);
            let scales = [
                _mm512_cvtepi32_ps(_mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF))),
                _mm512_cvtepi32_ps(_mm512_srli_epi32::<16>(sc)),
            ];
            for (q, scale) in scales.into_iter().enumerate() {
                let sb = 2 * p + q;
                let w = _mm512_load_si512(t.qs.as_ptr().add(64 * sb) as *const __m512i);
                let planes = [
                    _mm512_and_si512(w, m2),
                    _mm512_and_si512(_mm512_srli_epi16::<2>(w), m2),
                    _mm512_and_si512(_mm512_srli_epi16::<4>(w), m2),
                    _mm512_and_si512(_mm512_srli_epi16::<6>(w), m2),
                ];
                let mut isum = [_mm512_setzero_si512(); R];
                for r in 0..R {
                    let a = blk[r].add(Q8_QS + 16 * sb) as *const i32;
                    for (u, &plane) in planes.iter().enumerate() {
                        isum[r] = _mm512_dpbusd_epi32(isum[r], plane, _mm512_set1_epi32(a.add(u).read_unaligned()));
                    }
                }
                let dsc = _mm512_mul_ps(d, scale);
                for r in 0..R {
                    tt[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), dsc, tt[r]);
                }
            }
        }
        let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(t.dmin.as_ptr() as *const __m256i));
        for r in 0..R {
            // The activation's 16-value sums, two to a 32-bit word: the pairs `dpwssd` takes.
            let words = blk[r].add(Q8_BSUMS) as *const i32;
            let mut ms = _mm512_setzero_si512();
            for (p, &v) in raw.iter().enumerate() {
                let mn = _mm512_srli_epi16::<4>(v);
                ms = _mm512_dpwssd_epi32(ms, mn, _mm512_set1_epi32(words.add(p).read_unaligned()));
            }
            let da = _mm512_set1_ps((blk[r] as *const f32).read_unaligned());
            acc[r] = _mm512_fmadd_ps(tt[r], da, acc[r]);
            acc[r] = _mm512_fnmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(ms), dmin), da, acc[r]);
        }
    }
    store(&acc, out, ldo, cols);
}

/// Row `r` of `acc` to `out + r · ldo`, its first `cols` (1..=16) lanes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store<const R: usize>(acc: &[__m512; R], out: *mut f32, ldo: usize, cols: usize) {
    let mask: __mmask16 = if cols >= COLS { 0xFFFF } else { (1u16 << cols) - 1 };
    for (r, a) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(out.add(r * ldo), mask, *a);
    }
}
