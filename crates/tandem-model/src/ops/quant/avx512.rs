//! AVX-512 (F, BW, VL, VNNI) kernels for the 32-value block types: two weight columns per
//! 512-bit register, each in its own 256-bit half, so every column keeps ggml's AVX2 chain
//! exactly (see [`super::avx2`]): per block, eight lanes of exact four-product integer sums,
//! `acc = fma(d_w · d_a, sum, acc)` lane by lane, the lanes summed at the end in ggml's order.
//! The results are therefore bit-identical to the AVX2 and AVX-VNNI kernels; only the number
//! of columns per instruction differs (two per `vpdpbusd` / `vcvtdq2ps` / `vfmadd` instead of
//! one).
//!
//! Integer sums as in the VNNI kernels: unsigned weights `w + o` from `vpdpbusd` started at
//! `-o · Σ y`. The activation block is broadcast to both halves. A tile is up to 8 rows x
//! 4 columns (two column pairs, 16 accumulators); columns past the last multiple of 4 go to
//! the AVX-VNNI kernel built for AVX-512 registers (the same bits).

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::Q8Block;
use super::avx2::{act_scales, hsum, load16, offset, scales};
use super::blocks::{QuantType, WeightBlock};

/// Whether this CPU can run [`matmul_cols`].
pub(super) fn detected() -> bool {
    super::avx2::wide_detected()
}

/// The weights of two 16-byte nibble arrays: bytes 0..16 the low nibbles of `a`, 16..32 its
/// high nibbles, then the same for `b`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn nibbles_pair(a: *const u8, b: *const u8) -> __m512i {
    let (qa, qb) = (load16(a), load16(b));
    let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set_m128i(qa, qa)), _mm256_set_m128i(qb, qb));
    let shifted = _mm512_srlv_epi64(x, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    _mm512_and_si512(shifted, _mm512_set1_epi8(0x0F))
}

/// The fifth bits of two blocks (the little-endian `u32`s at `a` and `b`) as a byte mask.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn high_mask(a: *const u8, b: *const u8) -> __mmask64 {
    let ha = _mm_cvtsi128_si32(load16(a)) as u32 as u64;
    let hb = _mm_cvtsi128_si32(load16(b)) as u32 as u64;
    _cvtu64_mask64(ha | (hb << 32))
}

/// Columns `a` and `b` of one block as 64 unsigned bytes `w + o` (`a` in the low half), as
/// [`super::avx2`]'s `unpack_unsigned` gives each. No load leaves its block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn unpack_pair<B: WeightBlock>(a: *const B, b: *const B) -> __m512i {
    let (a, b) = (a as *const u8, b as *const u8);
    let bit5 = _mm512_set1_epi8(0x10);
    match B::TYPE {
        QuantType::Q4_1 => nibbles_pair(a.wrapping_add(4), b.wrapping_add(4)),
        QuantType::Q5_0 => {
            let nib = nibbles_pair(a.wrapping_add(6), b.wrapping_add(6));
            _mm512_mask_add_epi8(nib, high_mask(a.wrapping_add(2), b.wrapping_add(2)), nib, bit5)
        }
        QuantType::Q5_1 => {
            let nib = nibbles_pair(a.wrapping_add(8), b.wrapping_add(8));
            _mm512_mask_add_epi8(nib, high_mask(a.wrapping_add(4), b.wrapping_add(4)), nib, bit5)
        }
        QuantType::Q8_0 => {
            let lo = _mm256_lddqu_si256(a.wrapping_add(2) as *const __m256i);
            let hi = _mm256_lddqu_si256(b.wrapping_add(2) as *const __m256i);
            let x = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
            _mm512_xor_si512(x, _mm512_set1_epi8(0x80u8 as i8))
        }
    }
}

/// One tile: rows `[$r..]` x two column pairs (pair p = columns 2p, 2p + 1).
macro_rules! tile {
    ($name:ident, [$($r:tt)+]) => {
        /// `w`: the tile's first weight row (rows `nb` blocks apart); `a`: the first activation
        /// row (rows `nb` blocks apart); `y`: the output for (first row, first column), rows
        /// `n` apart.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        unsafe fn $name<B: WeightBlock>(
            w: *const B,
            a: *const Q8Block,
            st: *const __m256i,
            nb: usize,
            y: *mut f32,
            n: usize,
        ) {
            let mut wp = [[w, w.wrapping_add(nb)], [w.wrapping_add(2 * nb), w.wrapping_add(3 * nb)]];
            let mut ap = [$(a.wrapping_add($r * nb)),+];
            let mut acc = [$({ let _ = $r; [_mm512_setzero_ps(); 2] }),+];
            // m_w·s_a of the four columns in lanes 1, 3, 5, 7 (types with a minimum).
            let mut msum = [$({ let _ = $r; _mm256_setzero_ps() }),+];
            // d_w of pair 0's columns (lanes 0 and 2 of the scales) in its halves, pair 1's
            // (lanes 4 and 6).
            let idx = [
                _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6),
            ];
            let zero = _mm512_setzero_si512();
            let mut sp = [$(st.wrapping_add($r * nb)),+];
            for _ in 0..nb {
                let dm = scales::<B, 4>([wp[0][0], wp[0][1], wp[1][0], wp[1][1]]);
                let dw = [
                    _mm512_permutexvar_ps(idx[0], _mm512_castps256_ps512(dm)),
                    _mm512_permutexvar_ps(idx[1], _mm512_castps256_ps512(dm)),
                ];
                let wu = [unpack_pair::<B>(wp[0][0], wp[0][1]), unpack_pair::<B>(wp[1][0], wp[1][1])];
                $(
                    let ab: *const Q8Block = ap[$r];
                    let qy = _mm512_broadcast_i64x4(_mm256_lddqu_si256(ab as *const __m256i));
                    // d_w · d_a, the product ggml scales a block's sums by (as prod = dm · das
                    // in the AVX2 kernels: the same two factors).
                    let da = _mm512_set1_ps((*ab).d);
                    let start = if <B>::HAS_MIN {
                        msum[$r] = _mm256_fmadd_ps(dm, act_scales(ab), msum[$r]);
                        zero
                    } else {
                        // -o · Σ y per lane, made once per call ([`starts`]).
                        _mm512_broadcast_i64x4(_mm256_load_si256(sp[$r]))
                    };
                    pair_step!(0, dw, da, wu, qy, start, acc[$r]);
                    pair_step!(1, dw, da, wu, qy, start, acc[$r]);
                )+
                wp = [
                    [wp[0][0].wrapping_add(1), wp[0][1].wrapping_add(1)],
                    [wp[1][0].wrapping_add(1), wp[1][1].wrapping_add(1)],
                ];
                $( ap[$r] = ap[$r].wrapping_add(1); )+
                $( sp[$r] = sp[$r].wrapping_add(1); )+
            }
            $(
                pair_store!(B, 0, acc[$r], msum[$r], y.add($r * n));
                pair_store!(B, 1, acc[$r], msum[$r], y.add($r * n));
            )+
        }
    };
}

/// One row against column pair `$p` for one block.
macro_rules! pair_step {
    ($p:literal, $dw:ident, $da:ident, $wu:ident, $qy:ident, $start:ident, $acc:expr) => {{
        let d = _mm512_mul_ps($dw[$p], $da);
        let p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32($start, $wu[$p], $qy));
        $acc[$p] = _mm512_fmadd_ps(d, p, $acc[$p]);
    }};
}

/// The two results of column pair `$p` of one row: each half summed as ggml does, plus its
/// `m · s` sum (lanes `4p + 1`, `4p + 3` of `$msum`) for the types with a minimum.
macro_rules! pair_store {
    ($B:ty, $p:literal, $acc:expr, $msum:expr, $y:expr) => {{
        let mut ms = [0f32; 8];
        _mm256_storeu_ps(ms.as_mut_ptr(), $msum);
        let (m0, m1) = if <$B>::HAS_MIN { (ms[4 * $p + 1], ms[4 * $p + 3]) } else { (0.0, 0.0) };
        let out = $y.add(2 * $p);
        *out = hsum(_mm512_castps512_ps256($acc[$p])) + m0;
        *out.add(1) = hsum(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd($acc[$p])))) + m1;
    }};
}

tile!(tile_8x2, [0 1 2 3 4 5 6 7]);
tile!(tile_4x2, [0 1 2 3]);
tile!(tile_2x2, [0 1]);
tile!(tile_1x2, [0]);

/// One row against eight columns (two groups of four, each as [`tile_1x2`]): decode, where
/// nothing is shared across rows, gets twice the independent work per block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn tile_1x8<B: WeightBlock>(w: *const B, a: *const Q8Block, st: *const __m256i, nb: usize, y: *mut f32) {
    let col = |c: usize| w.wrapping_add(c * nb);
    let mut wp = [[col(0), col(1)], [col(2), col(3)], [col(4), col(5)], [col(6), col(7)]];
    let mut acc = [[_mm512_setzero_ps(); 2]; 2];
    let mut msum = [_mm256_setzero_ps(); 2];
    let idx = [
        _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
        _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6),
    ];
    let (mut ab, mut sp) = (a, st);
    // One row: the weights come slower than they are used; each column's stream is fetched
    // `ahead` blocks on into L2 (on into the columns that follow in memory), as the AVX2
    // kernels' one-row tiles do. Read once, outside the loop.
    let ahead = super::block_prefetch();
    for _ in 0..nb {
        if ahead > 0 {
            for p in &wp {
                _mm_prefetch::<_MM_HINT_T1>(p[0].wrapping_add(ahead) as *const i8);
                _mm_prefetch::<_MM_HINT_T1>(p[1].wrapping_add(ahead) as *const i8);
            }
        }
        let qy = _mm512_broadcast_i64x4(_mm256_lddqu_si256(ab as *const __m256i));
        let da = _mm512_set1_ps((*ab).d);
        let start = if B::HAS_MIN { _mm512_setzero_si512() } else { _mm512_broadcast_i64x4(_mm256_load_si256(sp)) };
        for q in 0..2 {
            let (p0, p1) = (wp[2 * q], wp[2 * q + 1]);
            let dm = scales::<B, 4>([p0[0], p0[1], p1[0], p1[1]]);
            if B::HAS_MIN {
                msum[q] = _mm256_fmadd_ps(dm, act_scales(ab), msum[q]);
            }
            let dw = [
                _mm512_permutexvar_ps(idx[0], _mm512_castps256_ps512(dm)),
                _mm512_permutexvar_ps(idx[1], _mm512_castps256_ps512(dm)),
            ];
            let wu = [unpack_pair::<B>(p0[0], p0[1]), unpack_pair::<B>(p1[0], p1[1])];
            pair_step!(0, dw, da, wu, qy, start, acc[q]);
            pair_step!(1, dw, da, wu, qy, start, acc[q]);
        }
        for p in wp.iter_mut() {
            *p = [p[0].wrapping_add(1), p[1].wrapping_add(1)];
        }
        ab = ab.wrapping_add(1);
        sp = sp.wrapping_add(1);
    }
    for q in 0..2 {
        pair_store!(B, 0, acc[q], msum[q], y.add(4 * q));
        pair_store!(B, 1, acc[q], msum[q], y.add(4 * q));
    }
}

/// Weight bytes per column tile: the tile is reused by every row group, so keep it in L1/L2.
const TILE_BYTES: usize = 32 * 1024;
/// Activation bytes (blocks and their starts) per block of rows.
const ROW_BLOCK_BYTES: usize = 1024 * 1024;
/// Bytes per activation block: the block and its start vector.
const ACT_BYTES: usize = std::mem::size_of::<Q8Block>() + 32;

/// `y[r, c]` for all rows `r < m` and the columns in `cols`: columns in tiles of about
/// [`TILE_BYTES`] of weights, rows in groups of 8 within a tile, 4 columns at a time; columns
/// past the last multiple of 4 on [`super::avx2::vnni_wide`].
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/VNNI, AVX2, FMA and F16C ([`detected`]);
/// `w` holds `n` rows and `a` `m` rows of `nb` blocks; `y` must be valid for writes at
/// `r * n + c` for every `r < m`, `c` in `cols`, with no other thread accessing those
/// elements meanwhile.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(super) unsafe fn matmul_cols<B: WeightBlock>(
    w: &[B],
    nb: usize,
    a: &[Q8Block],
    st: &[Start],
    m: usize,
    cols: Range<usize>,
    y: *mut f32,
    n: usize,
) {
    debug_assert!(w.len() >= cols.end * nb && a.len() >= m * nb);
    debug_assert!(B::HAS_MIN || st.len() >= m * nb);
    matmul_tiles(w, nb, a, st.as_ptr() as *const __m256i, m, cols, y, n);
}

/// Each activation block's starts for the signed types ([`starts`]), made once per call on
/// the calling thread and read by every column task; empty for the other types.
pub(super) fn with_starts<R>(ty: QuantType, a: &[Q8Block], f: impl FnOnce(&[Start]) -> R) -> R {
    thread_local! {
        static STARTS: std::cell::RefCell<Vec<Start>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let o = offset(ty);
    if o == 0 || !detected() {
        return f(&[]);
    }
    STARTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            // SAFETY: `detected()` checked above.
            unsafe { starts(o, a, &mut buf) };
            f(&buf)
        }
        Err(_) => {
            let mut buf = Vec::new();
            // SAFETY: as above.
            unsafe { starts(o, a, &mut buf) };
            f(&buf)
        }
    })
}

/// `out[i]` = each lane's `-o · Σ y` over its four bytes of block `a[i]`: where `vpdpbusd` of
/// the unsigned weights `w + o` starts, so that it ends at `Σ w · y`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn starts(o: i8, a: &[Q8Block], out: &mut Vec<Start>) {
    out.clear();
    out.reserve(a.len());
    let (zero, off) = (_mm256_setzero_si256(), _mm256_set1_epi8(o));
    for b in a {
        let qy = _mm256_lddqu_si256(b.qs.as_ptr() as *const __m256i);
        let mut s = Start([0; 8]);
        _mm256_store_si256(
            s.0.as_mut_ptr() as *mut __m256i,
            _mm256_sub_epi32(zero, _mm256_dpbusd_epi32(zero, off, qy)),
        );
        out.push(s);
    }
}

/// One activation block's start vector (eight i32 lanes, aligned for a vector load).
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct Start([i32; 8]);

/// [`matmul_cols`] with the blocks' starts at `st` (`m * nb`, unused for types with a minimum).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn matmul_tiles<B: WeightBlock>(
    w: &[B],
    nb: usize,
    a: &[Q8Block],
    st: *const __m256i,
    m: usize,
    cols: Range<usize>,
    y: *mut f32,
    n: usize,
) {
    let whole = cols.start..cols.start + (cols.end - cols.start) / 4 * 4;
    let tile_cols = ((TILE_BYTES / (nb * B::BYTES)).max(4) & !3).max(4);
    // Rows in blocks whose activations and starts stay in L2 while the task's columns pass
    // over them (a long k would otherwise stream every row from memory once per column tile).
    let block_rows = (ROW_BLOCK_BYTES / (nb * ACT_BYTES)).max(8) & !7;
    let mut b0 = 0;
    while b0 < m {
        let b1 = (b0 + block_rows).min(m);
        let mut t0 = whole.start;
        while t0 < whole.end {
            let t1 = (t0 + tile_cols).min(whole.end);
            let mut r0 = b0;
            while r0 < b1 {
                let rows = match b1 - r0 {
                    8.. => 8,
                    4..=7 => 4,
                    2..=3 => 2,
                    _ => 1,
                };
                let ap = a.as_ptr().add(r0 * nb);
                let sp = st.wrapping_add(r0 * nb);
                let mut c = t0;
                while rows == 1 && c + 8 <= t1 {
                    tile_1x8::<B>(w.as_ptr().add(c * nb), ap, sp, nb, y.add(r0 * n + c));
                    c += 8;
                }
                while c < t1 {
                    let (wp, yp) = (w.as_ptr().add(c * nb), y.add(r0 * n + c));
                    match rows {
                        8 => tile_8x2::<B>(wp, ap, sp, nb, yp, n),
                        4 => tile_4x2::<B>(wp, ap, sp, nb, yp, n),
                        2 => tile_2x2::<B>(wp, ap, sp, nb, yp, n),
                        _ => tile_1x2::<B>(wp, ap, sp, nb, yp, n),
                    }
                    c += 4;
                }
                r0 += rows;
            }
            t0 = t1;
        }
        b0 = b1;
    }
    if whole.end < cols.end {
        super::avx2::vnni_wide::matmul_cols(w, nb, a, m, whole.end..cols.end, y, n);
    }
}
