//! AVX2 + FMA (+ F16C) kernels, after ggml's `ggml_vec_dot_q4_1_q8_1` & co. in
//! `ggml-cpu/arch/x86/quants.c`, tiled over several rows and columns:
//!
//! * a weight block is unpacked to 32 bytes once (nibbles, plus the fifth bit for Q5) and
//!   multiplied with up to 4 activation rows (prefill); for a single row (decode) 4 columns
//!   are done at once so the activation block is loaded once per 4 weight rows;
//! * the f16 scales of the tile's columns are converted together (F16C), and multiplied by
//!   the activation's `(d, s)` pair in one vector: `[d_w·d_a, m_w·s_a]` per column;
//! * per (row, column, block): `maddubs` (u8·i8 → i16 pairs), `madd` with ones (→ 8 × i32),
//!   convert to f32 and `fma` with `d_w · d_a`; the `m_w · s_a` lanes are summed on the side.
//!
//! The integer part is exact, so results equal [`super::reference`] up to f32 summation order.
//!
//! Memory is read only through `lddqu` and pointers are moved with `wrapping_add`: the
//! workspace's dev profile keeps debug assertions on in our crates, and those add alignment
//! and overlap checks (and a trip through the stack) to raw derefs, `read_unaligned` and
//! `loadu` in the hot loop.

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::Q8Block;
use super::blocks::{QuantType, WeightBlock};

/// Whether this CPU can run [`plain`] (`vnni == false`) or [`vnni`].
pub(super) fn detected(vnni: bool) -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
        && (!vnni || is_x86_feature_detected!("avxvnni"))
}

/// 16 bytes at `p` (any alignment).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load16(p: *const u8) -> __m128i {
    _mm_lddqu_si128(p as *const __m128i)
}

/// Weights from 16 bytes of nibbles: bytes 0..16 the low nibbles, 16..32 the high ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(qs: *const u8) -> __m256i {
    let tmp = load16(qs);
    let bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(bytes, _mm256_set1_epi8(0x0F))
}

/// 0xFF in byte `j` where bit `j` of the little-endian `u32` at `qh` is set, else 0 (ggml's
/// `bytes_from_bits_32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn high_bits(qh: *const u8) -> __m256i {
    let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_broadcastd_epi32(load16(qh)), shuf);
    let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
}

/// The block at `p` as 32 weight bytes: unsigned `q` for Q4_1/Q5_1, signed `q - 16` for Q5_0,
/// signed `q` for Q8_0.
/// Byte offsets are those of the layouts in [`super::blocks`]; no load leaves the block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<B: WeightBlock>(p: *const B) -> __m256i {
    let p = p as *const u8;
    match B::TYPE {
        QuantType::Q4_1 => nibbles(p.wrapping_add(4)),
        QuantType::Q5_0 => {
            // q - 16 is the nibble with 0xF0 on top where the fifth bit is clear.
            let hi = _mm256_andnot_si256(high_bits(p.wrapping_add(2)), _mm256_set1_epi8(0xF0u8 as i8));
            _mm256_or_si256(nibbles(p.wrapping_add(6)), hi)
        }
        QuantType::Q5_1 => {
            let hi = _mm256_and_si256(high_bits(p.wrapping_add(4)), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles(p.wrapping_add(8)), hi)
        }
        QuantType::Q8_0 => _mm256_lddqu_si256(p.wrapping_add(2) as *const __m256i),
    }
}

/// The block at `p` as 32 unsigned bytes `w + OFFSET` for the VNNI kernels ([`offset`]): the
/// unsigned weights of Q4_1/Q5_1 as they are, `q` (= `w + 16`) for Q5_0, `w + 128` for Q8_0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn unpack_unsigned<B: WeightBlock>(p: *const B) -> __m256i {
    let b = p as *const u8;
    match B::TYPE {
        QuantType::Q4_1 | QuantType::Q5_1 => unpack::<B>(p),
        QuantType::Q5_0 => {
            let hi = _mm256_and_si256(high_bits(b.wrapping_add(2)), _mm256_set1_epi8(0x10));
            _mm256_or_si256(nibbles(b.wrapping_add(6)), hi)
        }
        QuantType::Q8_0 => {
            _mm256_xor_si256(_mm256_lddqu_si256(b.wrapping_add(2) as *const __m256i), _mm256_set1_epi8(0x80u8 as i8))
        }
    }
}

/// What [`unpack_unsigned`] adds to a signed type's weights (0 for the unsigned types). The
/// VNNI kernels take `Σ (w + o) · y` from `vpdpbusd` started at `-o · Σ y` (per lane of four
/// bytes), which is the lane's `Σ w · y` exactly: the integers ggml's sign trick gives, one
/// instruction fewer per (row, column, block).
pub(super) const fn offset(t: QuantType) -> i8 {
    match t {
        QuantType::Q5_0 => 16,
        QuantType::Q8_0 => -128, // 0x80 as the unsigned operand: 128
        QuantType::Q4_1 | QuantType::Q5_1 => 0,
    }
}

/// `[d0, m0, d1, m1, ...]` as f32 for the blocks at `p[0..C]` (C <= 4; unused lanes 0, `m`
/// lanes 0 for Q5_0): every type starts with `d: f16`, then `m: f16` if it has one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scales<B: WeightBlock, const C: usize>(p: [*const B; C]) -> __m256 {
    let ld = |c: usize| load16(p[c] as *const u8);
    let v = match C {
        1 => ld(0),
        2 => _mm_unpacklo_epi32(ld(0), ld(1)),
        3 => _mm_unpacklo_epi64(_mm_unpacklo_epi32(ld(0), ld(1)), ld(2)),
        _ => _mm_unpacklo_epi64(_mm_unpacklo_epi32(ld(0), ld(1)), _mm_unpacklo_epi32(ld(2), ld(3))),
    };
    // Keep the C used dwords (and only `d` for Q5_0) so no stray bits become NaNs or denormals.
    let word = if B::HAS_MIN { -1 } else { 0xFFFF };
    let keep = |c: usize| if c < C { word } else { 0 };
    _mm256_cvtph_ps(_mm_and_si128(v, _mm_setr_epi32(keep(0), keep(1), keep(2), keep(3))))
}

/// `[d, s, d, s, ...]` of the activation block at `a` (`d`, `s` are its last 8 bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn act_scales(a: *const Q8Block) -> __m256 {
    let tail = _mm256_lddqu_si256((a as *const u8).wrapping_add(8) as *const __m256i);
    _mm256_castsi256_ps(_mm256_permute4x64_epi64::<0xFF>(tail))
}

/// Lane `L` of `v` in all 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane<const L: i32>(v: __m256) -> __m256 {
    if L == 0 {
        _mm256_broadcastss_ps(_mm256_castps256_ps128(v))
    } else {
        _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(L))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum(x: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// 8 × i32 sums of 4 adjacent `u8 · i8` products (`w` unsigned, `y` signed): `maddubs` to i16
/// pairs (no saturation for our ranges: |sum| <= 2·31·127), then `madd` with ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_maddubs(w: __m256i, y: __m256i, ones: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), ones)
}

/// One activation row against the tile's columns for one block: `prod` = `[d_w·d_a, m_w·s_a]`
/// per column, the `m·s` lanes summed into `msum`, the integer dot products scaled into `acc`
/// (per lane, in block order, as ggml does).
macro_rules! row_step {
    ($B:ty, $dot:ident, $ab:expr, $wq:ident, $wabs:ident, $dm:ident, $ones:ident, $acc:expr, $msum:expr, [$($c:tt)+]) => {{
        let ab: *const Q8Block = $ab;
        let qy = _mm256_lddqu_si256(ab as *const __m256i);
        let das = act_scales(ab);
        let prod = _mm256_mul_ps($dm, das);
        if <$B>::HAS_MIN {
            // ggml's `summs += m * s` (m·s of two f16 values is exact: fused or not, same sum).
            $msum = _mm256_fmadd_ps($dm, das, $msum);
        }
        $(
            // Q5_0's and Q8_0's weights are signed: |w| times y with w's sign (ggml's
            // mul_sum_i8_pairs).
            let (wu, ys) = if <$B>::HAS_MIN {
                ($wq[$c], qy)
            } else {
                ($wabs[$c], _mm256_sign_epi8(qy, $wq[$c]))
            };
            let p = _mm256_cvtepi32_ps($dot(wu, ys, $ones));
            $acc[$c] = _mm256_fmadd_ps(lane::<{ 2 * $c }>(prod), p, $acc[$c]);
        )+
    }};
}

/// [`row_step!`] for the VNNI kernels: unsigned weights (`$wu`, from [`unpack_unsigned`]) and,
/// for the signed types, each lane's integer sum started at `-o · Σ y` instead of the sign
/// trick (same integers).
macro_rules! row_step_offset {
    ($B:ty, $ab:expr, $wu:ident, $dm:ident, $acc:expr, $msum:expr, [$($c:tt)+]) => {{
        let ab: *const Q8Block = $ab;
        let qy = _mm256_lddqu_si256(ab as *const __m256i);
        let das = act_scales(ab);
        let prod = _mm256_mul_ps($dm, das);
        let start = if <$B>::HAS_MIN {
            $msum = _mm256_fmadd_ps($dm, das, $msum);
            _mm256_setzero_si256()
        } else {
            let zero = _mm256_setzero_si256();
            _mm256_sub_epi32(zero, dpbusd256(zero, _mm256_set1_epi8(offset(<$B>::TYPE)), qy))
        };
        $(
            let p = _mm256_cvtepi32_ps(dpbusd256(start, $wu[$c], qy));
            $acc[$c] = _mm256_fmadd_ps(lane::<{ 2 * $c }>(prod), p, $acc[$c]);
        )+
    }};
}

/// Per-column pieces of [`tile!`] (a column list is passed around as one `[0 1 ..]` token).
macro_rules! cols {
    (zeros [$($c:tt)+]) => { [$({ let _ = $c; _mm256_setzero_ps() }),+] };
    (count [$($c:tt)+]) => { [$($c),+].len() };
    (ptrs $w:ident, $nb:ident, [$($c:tt)+]) => { [$($w.wrapping_add($c * $nb)),+] };
    (unpack $B:ty, $wp:ident, [$($c:tt)+]) => { [$(unpack::<$B>($wp[$c])),+] };
    (unpack_unsigned $B:ty, $wp:ident, [$($c:tt)+]) => { [$(unpack_unsigned::<$B>($wp[$c])),+] };
    (abs $wq:ident, [$($c:tt)+]) => { [$(_mm256_sign_epi8($wq[$c], $wq[$c])),+] };
    (bump $wp:ident, [$($c:tt)+]) => { $( $wp[$c] = $wp[$c].wrapping_add(1); )+ };
    (prefetch $wp:ident, $ahead:ident, [$($c:tt)+]) => {
        $( _mm_prefetch::<_MM_HINT_T1>($wp[$c].wrapping_add($ahead) as *const i8); )+
    };
    (store $B:ty, $acc:expr, $ms:ident, $y:expr, [$($c:tt)+]) => {
        $(
            let m = if <$B>::HAS_MIN { $ms[2 * $c + 1] } else { 0.0 };
            *$y.add($c) = hsum($acc[$c]) + m;
        )+
    };
}

/// Defines `$name`: rows `[$r..]` × columns `$cols`, written out so every accumulator has a
/// fixed name (the dev profile does not unroll loops over rows and columns reliably).
macro_rules! tile {
    ($name:ident, $feat:literal, $dot:ident, [$($r:tt)+], $cols:tt) => {
        /// `w`: the tile's first weight row (rows `nb` blocks apart); `a`: the first activation
        /// row (rows `nb` blocks apart); `y`: the output for (first row, first column), rows
        /// `n` apart.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn $name<B: WeightBlock>(w: *const B, a: *const Q8Block, nb: usize, y: *mut f32, n: usize) {
            let mut wp = cols!(ptrs w, nb, $cols);
            let mut ap = [$(a.wrapping_add($r * nb)),+];
            let mut acc = [$({ let _ = $r; cols!(zeros $cols) }),+];
            let mut msum = [$({ let _ = $r; _mm256_setzero_ps() }),+];
            // One row (decode): the weights come slower than they are used; each column's
            // stream is fetched `ahead` blocks on into L2 (on into the next tile's columns,
            // which follow in memory).
            let ahead = if [$($r),+].len() == 1 { super::super::block_prefetch() } else { 0 };
            for _ in 0..nb {
                if ahead > 0 {
                    cols!(prefetch wp, ahead, $cols);
                }
                let dm = scales::<B, { cols!(count $cols) }>(wp);
                block_step!($dot, B, wp, ap, dm, acc, msum, [$($r)+], $cols);
                cols!(bump wp, $cols);
                $( ap[$r] = ap[$r].wrapping_add(1); )+
            }
            $(
                let mut ms = [0f32; 8];
                _mm256_storeu_ps(ms.as_mut_ptr(), msum[$r]);
                cols!(store B, acc[$r], ms, y.add($r * n), $cols);
            )+
        }
    };
}

/// One block of a [`tile!`]: the VNNI kernels take unsigned weights and [`row_step_offset!`],
/// the others ggml's sign trick and [`row_step!`].
macro_rules! block_step {
    (dot_vnni, $B:ty, $wp:ident, $ap:ident, $dm:ident, $acc:ident, $msum:ident, [$($r:tt)+], $cols:tt) => {{
        let wu = cols!(unpack_unsigned $B, $wp, $cols);
        $( row_step_offset!($B, $ap[$r], wu, $dm, $acc[$r], $msum[$r], $cols); )+
    }};
    ($dot:ident, $B:ty, $wp:ident, $ap:ident, $dm:ident, $acc:ident, $msum:ident, [$($r:tt)+], $cols:tt) => {{
        let ones = _mm256_set1_epi16(1);
        let wq = cols!(unpack $B, $wp, $cols);
        let wabs = cols!(abs wq, $cols);
        $( row_step!($B, $dot, $ap[$r], wq, wabs, $dm, ones, $acc[$r], $msum[$r], $cols); )+
    }};
}

/// Weight bytes per column tile: the tile is reused by every row group, so keep it in L1/L2.
const TILE_BYTES: usize = 32 * 1024;

/// The tiles and the column driver for one instruction set.
macro_rules! kernels {
    ($feat:literal, $dot:ident, $wide:literal) => {
        use super::*;

        tile!(tile_1x1, $feat, $dot, [0], [0]);
        tile!(tile_1x4, $feat, $dot, [0], [0 1 2 3]);
        tile!(tile_2x1, $feat, $dot, [0 1], [0]);
        tile!(tile_2x2, $feat, $dot, [0 1], [0 1]);
        tile!(tile_3x1, $feat, $dot, [0 1 2], [0]);
        tile!(tile_3x2, $feat, $dot, [0 1 2], [0 1]);
        tile!(tile_4x1, $feat, $dot, [0 1 2 3], [0]);
        tile!(tile_4x2, $feat, $dot, [0 1 2 3], [0 1]);
        // 8-16 accumulators: taken only in the AVX-512 build (32 vector registers).
        tile!(tile_2x4, $feat, $dot, [0 1], [0 1 2 3]);
        tile!(tile_3x4, $feat, $dot, [0 1 2], [0 1 2 3]);
        tile!(tile_4x4, $feat, $dot, [0 1 2 3], [0 1 2 3]);

        /// `y[r, c]` for all rows `r < m` and the columns in `cols`: columns in tiles of about
        /// [`super::TILE_BYTES`] of weights, rows in groups of 4 within a tile.
        ///
        /// # Safety
        /// The CPU must support the module's features ([`super::detected`]); `w` holds `n` rows and `a` `m`
        /// rows of `nb` blocks; `y` must be valid for writes at `r * n + c` for every `r < m`,
        /// `c` in `cols`, with no other thread accessing those elements meanwhile.
        #[target_feature(enable = $feat)]
        pub(in super::super) unsafe fn matmul_cols<B: WeightBlock>(
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
                        ($f:ident, $c:literal) => {{
                            $f::<B>(w.as_ptr().add(c * nb), ap, nb, y.add(r0 * n + c), n);
                            c += $c;
                        }};
                    }
                    match rows {
                        1 => {
                            while c + 4 <= t1 {
                                run!(tile_1x4, 4);
                            }
                            while c < t1 {
                                run!(tile_1x1, 1);
                            }
                        }
                        2 => {
                            while $wide && c + 4 <= t1 {
                                run!(tile_2x4, 4);
                            }
                            while c + 2 <= t1 {
                                run!(tile_2x2, 2);
                            }
                            while c < t1 {
                                run!(tile_2x1, 1);
                            }
                        }
                        3 => {
                            while $wide && c + 4 <= t1 {
                                run!(tile_3x4, 4);
                            }
                            while c + 2 <= t1 {
                                run!(tile_3x2, 2);
                            }
                            while c < t1 {
                                run!(tile_3x1, 1);
                            }
                        }
                        _ => {
                            while $wide && c + 4 <= t1 {
                                run!(tile_4x4, 4);
                            }
                            while c + 2 <= t1 {
                                run!(tile_4x2, 2);
                            }
                            while c < t1 {
                                run!(tile_4x1, 1);
                            }
                        }
                    }
                    r0 += rows;
                }
                t0 = t1;
            }
        }
    };
}

/// AVX2 + FMA + F16C.
pub(super) mod plain {
    kernels!("avx2,fma,f16c", dot_maddubs, false);
}

/// The same with AVX-VNNI's `vpdpbusd` for the integer sums (bit-identical results).
pub(super) mod vnni {
    kernels!("avx2,fma,f16c,avxvnni", dot_vnni, false);

    /// AVX-VNNI's (VEX) `vpdpbusd` on 256 bits.
    #[inline]
    #[target_feature(enable = "avx2,avxvnni")]
    unsafe fn dpbusd256(src: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(src, a, b)
    }
}

/// [`vnni`] for AVX-512 CPUs: the same 256-bit `vpdpbusd`, EVEX-encoded (AVX-512 VNNI + VL:
/// Ice Lake, Sapphire Rapids and AMD Zen 4 / 5 have it, while Zen 4 and the Xeons before
/// Sapphire Rapids lack the VEX form), so the same bits, with 32 vector registers, enough for
/// tiles of 4 rows x 4 columns.
pub(super) mod vnni_wide {
    kernels!("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni", dot_vnni, true);

    /// AVX-512 VNNI's (EVEX) `vpdpbusd` on 256 bits.
    #[inline]
    #[target_feature(enable = "avx512vl,avx512vnni")]
    unsafe fn dpbusd256(src: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(src, a, b)
    }
}

/// Whether this CPU can run [`vnni_wide`] (and [`super::avx512`]): AVX2, FMA, F16C and
/// AVX-512 F / VL / BW / VNNI; AVX-VNNI is not needed.
pub(super) fn wide_detected() -> bool {
    detected(false)
        && super::avx512_allowed()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}
