//! The K-quant × Q8K kernels on AVX2 + FMA + F16C, for the x86 CPUs without AVX-512 VNNI (AMD
//! Zen 1-3, Intel's client cores before Ice Lake and the E-core parts): the tiles of
//! [`super::tile`], [`super::tile6`] and [`super::tile2`] as the AVX-512 kernels read them, each
//! 16-column tile as two halves of 8 columns (one 256-bit register, a 32-bit lane a column).
//!
//! Without `dpbusd` the integer sums are `vpmaddubsw` (unsigned weight byte × signed activation
//! byte, pairs summed to i16) and `vpmaddwd` against ones (i16 pairs summed to i32). The i16
//! partial sums are added before widening only as far as they provably fit: a product is at
//! most 128 · the largest weight value, so Q4K adds a whole 32-value sub-block (16 products per
//! i16, |sum| <= 30,720), Q5K two groups of 8 (31,744), Q6K one group (32,256), Q2K / Q3K a
//! whole 16-value sub-block. Every integer sum is therefore exact, the same integer `dpbusd`
//! gives, and the float steps after it are [`super::tile::dot`]'s in its order: each (row,
//! column) result has the bits of the reference and of the AVX-512 kernel. The byte masks of
//! Q5K's fifth and Q6K's top bits become byte vectors by a shuffle and a compare.

use std::arch::x86_64::*;

use super::tile::{HighBits, Tile, COLS};
use super::tile2::Tile2;
use super::tile50::{Tile32, ACT50_BYTES, ACT50_QS, ACT50_SUMS};
use super::tile6::Sub16;
use super::tile8::Tile8;
use super::x86::{ahead, ahead50, prefetch_next, prefetch_part, spread, RowPtr, Q8_BSUMS, Q8_BYTES, Q8_QS};

/// Whether this CPU runs these kernels.
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// Rows per pass over a tile: 16 vector registers hold the accumulators of this many rows.
pub const MAX_ROWS: usize = 4;

/// Columns per half tile.
const HALF: usize = COLS / 2;

/// The 32 bits `m` (bit `i` for byte `i`) as a vector of 0xFF / 0x00 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn byte_mask(m: u32) -> __m256i {
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let v = _mm256_shuffle_epi8(_mm256_set1_epi32(m as i32), spread);
    _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit)
}

/// `add` in the bytes of `v` whose bit of `m` is set.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn add_under(v: __m256i, m: u32, add: __m256i) -> __m256i {
    if m == 0 {
        return v;
    }
    _mm256_add_epi8(v, _mm256_and_si256(byte_mask(m), add))
}

/// 8 f16 values as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn half_f32(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// The pass structure of the 16-column tiles: with one or two rows both halves of each stretch
/// at once (the tile read once, each activation broadcast serving both, the halves' chains
/// side by side), with more rows half by half (their accumulators would not fit the 16
/// registers twice), the first half's pass prefetching for both. `$block` runs stretch `$b`
/// for halves `$h0 .. $h0 + $H` (`$H` a constant, 2 or 1) into `$acc`, prefetching `$pa`
/// tiles ahead; the accumulators then go to `out`.
macro_rules! by_halves {
    ($R:ident, $nb:expr, $cols:expr, $ahead:expr, $out:expr, $ldo:expr,
     |$H:ident, $b:ident, $pa:ident, $h0:ident, $acc:ident| $block:expr) => {{
        let (cols, ahead): (usize, usize) = ($cols, $ahead);
        let halves = cols.div_ceil(HALF);
        if $R <= 2 && halves == 2 {
            let mut all = [[_mm256_setzero_ps(); $R]; 2];
            for $b in 0..$nb {
                const $H: usize = 2;
                let ($pa, $h0, $acc) = (ahead, 0usize, &mut all);
                $block;
            }
            for (h, acc) in all.iter().enumerate() {
                store(acc, $out.add(h * HALF), $ldo, cols - h * HALF);
            }
        } else {
            for h in 0..halves {
                let mut one = [[_mm256_setzero_ps(); $R]; 1];
                for $b in 0..$nb {
                    const $H: usize = 1;
                    let ($pa, $h0, $acc) = (if h == 0 { ahead } else { 0 }, h, &mut one);
                    $block;
                }
                store(&one[0], $out.add(h * HALF), $ldo, cols - h * HALF);
            }
        }
    }};
}

/// `out[r][0..cols]` = the products of the column tile `tiles[0..nb]` (with `high[0..nb]`, the
/// Q5K fifth bits, where `high` is not null) with rows `rows[0..R]`, as
/// [`super::avx512::rows`].
///
/// # Safety
/// [`available`]; `tiles` (and `high` if not null) hold `nb` entries, each row pointer `nb`
/// superblocks, `out` room for `R` rows of `ldo` with `cols` at the front.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows<const R: usize>(
    tiles: *const Tile,
    high: *const HighBits,
    nb: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    if high.is_null() {
        rows45::<R, false>(tiles, high, nb, rows, out, ldo, cols)
    } else {
        rows45::<R, true>(tiles, high, nb, rows, out, ldo, cols)
    }
}

/// [`rows`] for Q4K (`Q5` false, `high` null) or Q5K tiles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows45<const R: usize, const Q5: bool>(
    tiles: *const Tile,
    high: *const HighBits,
    nb: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let sp = spread();
    by_halves!(R, nb, cols, ahead::<R>(), out, ldo, |H, b, pa, h0, acc| {
        if Q5 {
            prefetch_next!(high, b, nb, pa);
        }
        block45::<R, H, Q5>(tiles, pa, sp, high.wrapping_add(b), b, h0, rows, acc)
    });
}

/// Halves `h0 .. h0 + H` of superblock `b` (tile `tiles[b]`; `hb` its fifth bits for Q5K)
/// times rows `rows`, added to `acc[half - h0]` in [`super::tile::dot`]'s order; prefetches
/// tile `b + ahead` along the way, spread over `sp` steps (none for `ahead` 0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block45<const R: usize, const H: usize, const Q5: bool>(
    tiles: *const Tile,
    ahead: usize,
    sp: usize,
    hb: *const HighBits,
    b: usize,
    h0: usize,
    rows: &[RowPtr; R],
    acc: &mut [[__m256; R]; H],
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    let ones = _mm256_set1_epi16(1);
    let t = &*tiles.add(b);
    let d: [__m256; H] = std::array::from_fn(|i| half_f32(t.d.as_ptr().add((h0 + i) * HALF)));
    let mut tt = [[_mm256_setzero_ps(); R]; H];
    let q8: [*const i8; R] = std::array::from_fn(|r| rows[r].q8.add(b * Q8_BYTES + Q8_QS) as *const i8);
    for s in 0..8 {
        prefetch_part!(tiles, b, ahead, s, 8, sp);
        let mut isum = [[_mm256_setzero_si256(); R]; H];
        // Q4K: a whole sub-block in i16; Q5K: two groups (module docs).
        let span = if Q5 { 2 } else { 4 };
        for g0 in (4 * s..4 * s + 4).step_by(span) {
            let mut part = [[_mm256_setzero_si256(); R]; H];
            for g in g0..g0 + span {
                let a: [[__m256i; 2]; R] = std::array::from_fn(|r| {
                    let a = q8[r].add(8 * g) as *const i32;
                    [_mm256_set1_epi32(a.read_unaligned()), _mm256_set1_epi32(a.add(1).read_unaligned())]
                });
                // `i` indexes `part` and picks the half `h`.
                #[allow(clippy::needless_range_loop)]
                for i in 0..H {
                    let h = h0 + i;
                    let w = _mm256_load_si256(t.qs.as_ptr().add(64 * g + 32 * h) as *const __m256i);
                    let mut lo = _mm256_and_si256(w, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                    if Q5 {
                        let hb = &*hb;
                        lo = add_under(lo, (hb.0[2 * g] >> (32 * h)) as u32, sixteen);
                        hi = add_under(hi, (hb.0[2 * g + 1] >> (32 * h)) as u32, sixteen);
                    }
                    for r in 0..R {
                        let pl = _mm256_maddubs_epi16(lo, a[r][0]);
                        let ph = _mm256_maddubs_epi16(hi, a[r][1]);
                        part[i][r] = _mm256_add_epi16(part[i][r], _mm256_add_epi16(pl, ph));
                    }
                }
            }
            for i in 0..H {
                for r in 0..R {
                    isum[i][r] = _mm256_add_epi32(isum[i][r], _mm256_madd_epi16(part[i][r], ones));
                }
            }
        }
        for i in 0..H {
            let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                t.sc[s].as_ptr().add((h0 + i) * HALF) as *const __m128i
            )));
            let dsc = _mm256_mul_ps(d[i], sc);
            for r in 0..R {
                tt[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][r]), dsc, tt[i][r]);
            }
        }
    }
    for i in 0..H {
        let h = h0 + i;
        let dmin = half_f32(t.dmin.as_ptr().add(h * HALF));
        let mn: [__m256i; 4] = std::array::from_fn(|p| {
            _mm256_cvtepu8_epi16(_mm_loadu_si128(t.mn[p].as_ptr().add(2 * h * HALF) as *const __m128i))
        });
        for r in 0..R {
            let bs = &*rows[r].bsum.add(b);
            let mut ms = _mm256_setzero_si256();
            for p in 0..4 {
                ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mn[p], _mm256_set1_epi32(bs[p] as i32)));
            }
            let da = _mm256_set1_ps((rows[r].q8.add(b * Q8_BYTES) as *const f32).read_unaligned());
            acc[i][r] = _mm256_fmadd_ps(tt[i][r], da, acc[i][r]);
            acc[i][r] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ms), dmin), da, acc[i][r]);
        }
    }
}

/// The end of a 32-value block `s` for the Q8_0 / Q5_0 / Q4_0 tiles: each half's exact integer
/// sums `isum` times `d_s · d_a,s` added to `acc` (one multiply-add per lane, [`super::tile8::dot`]'s
/// order); `d` is the block's 16 column scales (f16), `blk` the rows' stretches of [`ACT50_BYTES`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_block<const R: usize, const H: usize>(
    isum: &[[__m256i; R]; H],
    d: *const u16,
    h0: usize,
    blk: &[*const u8; R],
    s: usize,
    acc: &mut [[__m256; R]; H],
) {
    for i in 0..H {
        let d = half_f32(d.add((h0 + i) * HALF));
        for r in 0..R {
            let da = _mm256_set1_ps((blk[r].add(4 * s) as *const f32).read_unaligned());
            acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][r]), _mm256_mul_ps(d, da), acc[i][r]);
        }
    }
}

/// [`rows`] for Q8_0 tiles ([`Tile8`]), as [`super::avx512::rows8`]. The stored `w + 128`
/// would overflow `vpmaddubsw`'s i16 pairs, so each group's weights are taken back to signed
/// and multiplied as `|w|` (unsigned, at most 128) by the activations under `w`'s sign
/// (`vpsignb`): a pair is at most 2 · 128 · 127 = 32,512, widened at once; the block's sum is
/// `Σ w · a`, the integer `dpbusd` gives after its `-128 · Σ a`. One or two rows take both
/// halves of each stretch at once (as [`rows`]), more rows go half by half. Of the last
/// stretch only its first `last` blocks are read: rows of a multiple of 32 values but not of
/// 256 (gemma3's 640) are padded to whole stretches ([`super::tile8::pack8`]) with blocks whose
/// products are exactly zero, so skipping them changes no bit and saves their bytes.
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows8<const R: usize>(
    tiles: *const Tile8,
    nb: usize,
    last: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let sp = spread();
    by_halves!(R, nb, cols, ahead::<R>(), out, ldo, |H, b, pa, h0, acc| {
        block8::<R, H>(tiles, pa, sp, b, if b + 1 == nb { last } else { 8 }, h0, rows, acc)
    });
}

/// Halves `h0 .. h0 + H` of the first `steps` blocks of stretch `b` of a Q8_0 tile times rows
/// `rows`, added to `acc[half - h0]` in [`super::tile8::dot`]'s order; prefetches tile `b +
/// ahead` along the way.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block8<const R: usize, const H: usize>(
    tiles: *const Tile8,
    ahead: usize,
    sp: usize,
    b: usize,
    steps: usize,
    h0: usize,
    rows: &[RowPtr; R],
    acc: &mut [[__m256; R]; H],
) {
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let ones = _mm256_set1_epi16(1);
    let t = &*tiles.add(b);
    let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].q8.add(b * ACT50_BYTES));
    for s in 0..steps {
        prefetch_part!(tiles, b, ahead, s, steps, sp);
        let mut isum = [[_mm256_setzero_si256(); R]; H];
        for g in 8 * s..8 * s + 8 {
            let a: [__m256i; R] = std::array::from_fn(|r| {
                _mm256_set1_epi32((blk[r].add(ACT50_QS + 4 * g) as *const i32).read_unaligned())
            });
            // `i` indexes `isum` and picks the half `h0 + i`.
            #[allow(clippy::needless_range_loop)]
            for i in 0..H {
                let w = _mm256_xor_si256(
                    _mm256_load_si256(t.qs.as_ptr().add(64 * g + 32 * (h0 + i)) as *const __m256i),
                    flip,
                );
                let aw = _mm256_sign_epi8(w, w);
                for r in 0..R {
                    let p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(a[r], w));
                    isum[i][r] = _mm256_add_epi32(isum[i][r], _mm256_madd_epi16(p, ones));
                }
            }
        }
        scale_block(&isum, t.d[s].as_ptr(), h0, &blk, s, acc);
    }
}

/// [`rows`] for Q5_0 and Q4_0 tiles ([`Tile32`]), as [`super::avx512::rows50`]: per 32-value
/// block the integer sum from `-OFFSET · Σ a`, two groups at a time in i16 (at most 8 · 31 ·
/// 128 = 31,744: the Q5K bound), then one multiply-add by `d_s · D`; the last stretch's padding
/// blocks skipped, as there. One or two rows take both halves at once (as [`rows`]).
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows50<T: Tile32, const R: usize>(
    tiles: *const T,
    nb: usize,
    last: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let sp = spread();
    by_halves!(R, nb, cols, ahead50::<R>(), out, ldo, |H, b, pa, h0, acc| {
        block50::<T, R, H>(tiles, pa, sp, b, if b + 1 == nb { last } else { 8 }, h0, rows, acc)
    });
}

/// Halves `h0 .. h0 + H` of the first `steps` blocks of stretch `b` of a Q5_0 / Q4_0 tile times
/// rows `rows`, added to `acc[half - h0]`; prefetches tile `b + ahead` along the way.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block50<T: Tile32, const R: usize, const H: usize>(
    tiles: *const T,
    ahead: usize,
    sp: usize,
    b: usize,
    steps: usize,
    h0: usize,
    rows: &[RowPtr; R],
    acc: &mut [[__m256; R]; H],
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let sixteen = _mm256_set1_epi8(16);
    let ones = _mm256_set1_epi16(1);
    let t = &*tiles.add(b);
    let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].q8.add(b * ACT50_BYTES));
    for s in 0..steps {
        prefetch_part!(tiles, b, ahead, s, steps, sp);
        let start: [__m256i; R] = std::array::from_fn(|r| {
            _mm256_set1_epi32(-T::OFFSET * (blk[r].add(ACT50_SUMS + 4 * s) as *const i32).read_unaligned())
        });
        let mut isum = [start; H];
        for g0 in [4 * s, 4 * s + 2] {
            let mut part = [[_mm256_setzero_si256(); R]; H];
            for g in g0..g0 + 2 {
                let a: [[__m256i; 2]; R] = std::array::from_fn(|r| {
                    let a = blk[r].add(ACT50_QS + 8 * g) as *const i32;
                    [_mm256_set1_epi32(a.read_unaligned()), _mm256_set1_epi32(a.add(1).read_unaligned())]
                });
                // `i` indexes `part` and picks the half `h0 + i`.
                #[allow(clippy::needless_range_loop)]
                for i in 0..H {
                    let h = h0 + i;
                    let w = _mm256_load_si256(t.qs().as_ptr().add(64 * g + 32 * h) as *const __m256i);
                    let mut lo = _mm256_and_si256(w, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                    if T::HIGH {
                        lo = add_under(lo, (t.high(2 * g) >> (32 * h)) as u32, sixteen);
                        hi = add_under(hi, (t.high(2 * g + 1) >> (32 * h)) as u32, sixteen);
                    }
                    for r in 0..R {
                        let pl = _mm256_maddubs_epi16(lo, a[r][0]);
                        let ph = _mm256_maddubs_epi16(hi, a[r][1]);
                        part[i][r] = _mm256_add_epi16(part[i][r], _mm256_add_epi16(pl, ph));
                    }
                }
            }
            for i in 0..H {
                for r in 0..R {
                    isum[i][r] = _mm256_add_epi32(isum[i][r], _mm256_madd_epi16(part[i][r], ones));
                }
            }
        }
        scale_block(&isum, t.d()[s].as_ptr(), h0, &blk, s, acc);
    }
}

/// [`rows`] for [`Sub16`] tiles (Q6K, Q3K), as [`super::avx512::rows6`].
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows6<T: Sub16, const R: usize>(
    tiles: *const T,
    nb: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let m4 = _mm256_set1_epi8(0x0F);
    let (c16, c32) = (_mm256_set1_epi8(16), _mm256_set1_epi8(32));
    let ones = _mm256_set1_epi16(1);
    let ahead = ahead::<R>();
    let sp = spread();
    for h in 0..2 {
        if h * HALF >= cols {
            break;
        }
        let mut acc = [_mm256_setzero_ps(); R];
        // The first half's pass prefetches the tiles for both.
        let pa = if h == 0 { ahead } else { 0 };
        for b in 0..nb {
            let t = &*tiles.add(b);
            let d = half_f32(t.d_bits().as_ptr().add(h * HALF));
            let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].q8.add(b * Q8_BYTES));
            let mut tt = [_mm256_setzero_ps(); R];
            let sc16: [__m256i; 8] = std::array::from_fn(|p| {
                _mm256_cvtepi8_epi16(_mm_loadu_si128(t.sc()[p].as_ptr().add(2 * h * HALF) as *const __m128i))
            });
            for (p, &v) in sc16.iter().enumerate() {
                prefetch_part!(tiles, b, pa, p, 8, sp);
                let scales = [
                    _mm256_cvtepi32_ps(_mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(v))),
                    _mm256_cvtepi32_ps(_mm256_srai_epi32::<16>(v)),
                ];
                for (q, sc) in scales.into_iter().enumerate() {
                    let mut isum = [_mm256_setzero_si256(); R];
                    let mut part = [_mm256_setzero_si256(); R];
                    for g in 4 * p + 2 * q..4 * p + 2 * q + 2 {
                        let w = _mm256_load_si256(t.qs().as_ptr().add(64 * g + 32 * h) as *const __m256i);
                        let mut lo = _mm256_and_si256(w, m4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m4);
                        if let Some(hm) = t.hm() {
                            lo = add_under(lo, (hm[4 * g] >> (32 * h)) as u32, c16);
                            lo = add_under(lo, (hm[4 * g + 1] >> (32 * h)) as u32, c32);
                            hi = add_under(hi, (hm[4 * g + 2] >> (32 * h)) as u32, c16);
                            hi = add_under(hi, (hm[4 * g + 3] >> (32 * h)) as u32, c32);
                        }
                        for r in 0..R {
                            let a = blk[r].add(Q8_QS + 8 * g) as *const i32;
                            let pl = _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a.read_unaligned()));
                            let ph = _mm256_maddubs_epi16(hi, _mm256_set1_epi32(a.add(1).read_unaligned()));
                            let pair = _mm256_add_epi16(pl, ph);
                            if t.hm().is_some() {
                                // Values up to 63: one group per i16 sum.
                                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pair, ones));
                            } else {
                                part[r] = _mm256_add_epi16(part[r], pair);
                            }
                        }
                    }
                    if t.hm().is_none() {
                        for r in 0..R {
                            isum[r] = _mm256_madd_epi16(part[r], ones);
                        }
                    }
                    let dsc = _mm256_mul_ps(d, sc);
                    for r in 0..R {
                        tt[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), dsc, tt[r]);
                    }
                }
            }
            let d32 = _mm256_mul_ps(d, _mm256_set1_ps(T::OFFSET as f32));
            for r in 0..R {
                let words = blk[r].add(Q8_BSUMS) as *const i32;
                let mut ms = _mm256_setzero_si256();
                for (p, &v) in sc16.iter().enumerate() {
                    ms = _mm256_add_epi32(ms, _mm256_madd_epi16(v, _mm256_set1_epi32(words.add(p).read_unaligned())));
                }
                let da = _mm256_set1_ps((blk[r] as *const f32).read_unaligned());
                acc[r] = _mm256_fmadd_ps(tt[r], da, acc[r]);
                acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ms), d32), da, acc[r]);
            }
        }
        store(&acc, out.add(h * HALF), ldo, cols - h * HALF);
    }
}

/// [`rows`] for Q2K tiles ([`Tile2`]), as [`super::avx512::rows2`].
///
/// # Safety
/// As [`rows`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn rows2<const R: usize>(
    tiles: *const Tile2,
    nb: usize,
    rows: &[RowPtr; R],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    let m2 = _mm256_set1_epi8(3);
    let m4w = _mm256_set1_epi16(0x0F);
    let ones = _mm256_set1_epi16(1);
    let ahead = ahead::<R>();
    let sp = spread();
    for h in 0..2 {
        if h * HALF >= cols {
            break;
        }
        let mut acc = [_mm256_setzero_ps(); R];
        // The first half's pass prefetches the tiles for both.
        let pa = if h == 0 { ahead } else { 0 };
        for b in 0..nb {
            let t = &*tiles.add(b);
            let d = half_f32(t.d.as_ptr().add(h * HALF));
            let blk: [*const u8; R] = std::array::from_fn(|r| rows[r].q8.add(b * Q8_BYTES));
            let mut tt = [_mm256_setzero_ps(); R];
            let raw: [__m256i; 8] = std::array::from_fn(|p| {
                _mm256_cvtepu8_epi16(_mm_loadu_si128(t.sc[p].as_ptr().add(2 * h * HALF) as *const __m128i))
            });
            for (p, &v) in raw.iter().enumerate() {
                prefetch_part!(tiles, b, pa, p, 8, sp);
                let sc = _mm256_and_si256(v, m4w);
                let scales = [
                    _mm256_cvtepi32_ps(_mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF))),
                    _mm256_cvtepi32_ps(_mm256_srli_epi32::<16>(sc)),
                ];
                for (q, scale) in scales.into_iter().enumerate() {
                    let sb = 2 * p + q;
                    let w = _mm256_load_si256(t.qs.as_ptr().add(64 * sb + 32 * h) as *const __m256i);
                    let planes = [
                        _mm256_and_si256(w, m2),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(w), m2),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(w), m2),
                        _mm256_and_si256(_mm256_srli_epi16::<6>(w), m2),
                    ];
                    let mut isum = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let a = blk[r].add(Q8_QS + 16 * sb) as *const i32;
                        let mut part = _mm256_setzero_si256();
                        for (u, &plane) in planes.iter().enumerate() {
                            let pr = _mm256_maddubs_epi16(plane, _mm256_set1_epi32(a.add(u).read_unaligned()));
                            part = _mm256_add_epi16(part, pr);
                        }
                        isum[r] = _mm256_madd_epi16(part, ones);
                    }
                    let dsc = _mm256_mul_ps(d, scale);
                    for r in 0..R {
                        tt[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), dsc, tt[r]);
                    }
                }
            }
            let dmin = half_f32(t.dmin.as_ptr().add(h * HALF));
            for r in 0..R {
                let words = blk[r].add(Q8_BSUMS) as *const i32;
                let mut ms = _mm256_setzero_si256();
                for (p, &v) in raw.iter().enumerate() {
                    let mn = _mm256_srli_epi16::<4>(v);
                    ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mn, _mm256_set1_epi32(words.add(p).read_unaligned())));
                }
                let da = _mm256_set1_ps((blk[r] as *const f32).read_unaligned());
                acc[r] = _mm256_fmadd_ps(tt[r], da, acc[r]);
                acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(ms), dmin), da, acc[r]);
            }
        }
        store(&acc, out.add(h * HALF), ldo, cols - h * HALF);
    }
}

/// Row `r` of `acc` to `out + r · ldo`, its first `cols` lanes (all 8 from 8 up).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn store<const R: usize>(acc: &[__m256; R], out: *mut f32, ldo: usize, cols: usize) {
    for (r, a) in acc.iter().enumerate() {
        if cols >= HALF {
            _mm256_storeu_ps(out.add(r * ldo), *a);
        } else {
            let mut lanes = [0f32; HALF];
            _mm256_storeu_ps(lanes.as_mut_ptr(), *a);
            std::ptr::copy_nonoverlapping(lanes.as_ptr(), out.add(r * ldo), cols);
        }
    }
}
