//! Q6K × Q8K matmul for several activation rows whose every (row, column) result is, bit for
//! bit, candle's x86 `vec_dot_q6k_q8k` (`candle-core/src/quantized/avx.rs`, ggml's AVX2
//! `ggml_vec_dot_q6_K_q8_K`): the value candle's own decode path (`m == 1`) gives that row.
//!
//! candle sends calls of more than one row to repacked VNNI tiles that sum in another order
//! ([`super::row_stable`]), so a verify chunk would not reproduce decode's logits. Here every
//! weight superblock is decoded once per tile of up to 4 (AVX2) or 8 (AVX-512) rows, and each
//! row then goes through the instructions of candle's kernel: the same eight i32 lanes of
//! `Σ scale · (q - 32) · q8` per superblock (integers, exact), the same `cvt` + `fma` with
//! `d = d_a · d_w`, the same final horizontal sum. Activations are quantised by candle's own
//! `BlockQ8K::from_float`, so a row's result does not depend on the tile, the number of rows or
//! the thread split.
//!
//! The kernel is compiled twice, for AVX2 + FMA and with AVX-512 VL/BW enabled as well: the
//! same 256-bit instructions, but 32 vector registers instead of 16, enough for 8-row tiles.

use std::arch::x86_64::*;

use super::matrix::{for_column_chunks, OutPtr};

use candle_core::quantized::k_quants::{BlockQ6K, BlockQ8K, GgmlType, QK_K};

/// candle's `BlockQ6K` layout (its fields are crate-private).
#[repr(C)]
struct Q6 {
    ql: [u8; QK_K / 2],
    qh: [u8; QK_K / 4],
    scales: [i8; QK_K / 16],
    d: u16,
}

/// candle's `BlockQ8K` layout.
#[repr(C)]
struct Q8 {
    d: f32,
    qs: [i8; QK_K],
    #[allow(dead_code)]
    bsums: [i16; QK_K / 16],
}

const _: () = assert!(std::mem::size_of::<Q6>() == std::mem::size_of::<BlockQ6K>());
const _: () = assert!(std::mem::align_of::<Q6>() == std::mem::align_of::<BlockQ6K>());
const _: () = assert!(std::mem::size_of::<Q8>() == std::mem::size_of::<BlockQ8K>());
const _: () = assert!(std::mem::align_of::<Q8>() == std::mem::align_of::<BlockQ8K>());

/// Whether this CPU runs candle's AVX2 Q6K dot product (and so [`matmul`]).
pub fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// candle's `get_scale_shuffle(i)`: bytes `2i` and `2i + 1` of the scales, 8 times each.
const SHUFFLE: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut i = 0;
    while i < 8 {
        let mut j = 0;
        while j < 16 {
            t[i][j] = (2 * i + j / 8) as u8;
            j += 1;
        }
        i += 1;
    }
    t
};

/// Activation bytes per block of rows: kept in L2 while every column of a task passes over it.
const ROW_BLOCK_BYTES: usize = 256 * 1024;

/// The kernels for one set of target features.
macro_rules! kernels {
    ($feat:literal, $max_rows:literal) => {
        use super::*;

        /// candle's `hsum_float_8`.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn hsum(x: __m256) -> f32 {
            let res = _mm256_extractf128_ps(x, 1);
            let res = _mm_add_ps(res, _mm256_castps256_ps128(x));
            let res = _mm_add_ps(res, _mm_movehl_ps(res, res));
            let res = _mm_add_ss(res, _mm_movehdup_ps(res));
            _mm_cvtss_f32(res)
        }

        /// `y[r]` for one weight column `w` (`nb` superblocks) and `R` activation rows starting
        /// at `a`, rows `nb` blocks apart: each row as candle's `vec_dot_q6k_q8k` (its
        /// instructions per row), each weight superblock decoded once for the `R` rows.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn tile<const R: usize>(w: *const Q6, a: *const Q8, nb: usize) -> [f32; R] {
            let m4 = _mm256_set1_epi8(0xF);
            let m2 = _mm256_set1_epi8(3);
            let m32s = _mm256_set1_epi8(32);
            let mut acc = [_mm256_setzero_ps(); R];
            // Decode (one or two rows): the weights come slower than they are used, so fetch
            // the block `ahead` on into L2 (on into the next column, which follows in memory).
            let ahead = if R <= 2 { crate::ops::quant::pair_prefetch() } else { 0 };
            for b in 0..nb {
                if ahead > 0 {
                    let p = w.wrapping_add(b + ahead) as *const i8;
                    for off in [0, 64, 128, 192, std::mem::size_of::<Q6>() - 1] {
                        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off));
                    }
                }
                let x = &*w.add(b);
                let scales = _mm_loadu_si128(x.scales.as_ptr() as *const __m128i);
                let mut sumi = [_mm256_setzero_si256(); R];
                for j in 0..QK_K / 128 {
                    let q4 = x.ql.as_ptr().add(64 * j);
                    let q4bits1 = _mm256_loadu_si256(q4 as *const __m256i);
                    let q4bits2 = _mm256_loadu_si256(q4.add(32) as *const __m256i);
                    let q4bits_h = _mm256_loadu_si256(x.qh.as_ptr().add(32 * j) as *const __m256i);
                    macro_rules! group {
                        ($i:literal, $bits:expr, $lo_shift:literal, $hi_shift:literal) => {{
                            let shuffle = _mm_loadu_si128(SHUFFLE[4 * j + $i].as_ptr() as *const __m128i);
                            let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuffle));
                            let qh_part =
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q4bits_h, $hi_shift), m2), 4);
                            // 32 weights q (0..63, i.e. the signed weight + 32).
                            let q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16($bits, $lo_shift), m4), qh_part);
                            for r in 0..R {
                                let q8 = (*a.add(r * nb + b)).qs.as_ptr().add(128 * j + 32 * $i);
                                let q8i = _mm256_loadu_si256(q8 as *const __m256i);
                                let q8s = _mm256_maddubs_epi16(m32s, q8i);
                                let p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, q8i), q8s);
                                // Integer sums: exact, so their grouping does not matter.
                                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(sc, p16));
                            }
                        }};
                    }
                    group!(0, q4bits1, 0, 0);
                    group!(1, q4bits2, 0, 2);
                    group!(2, q4bits1, 4, 4);
                    group!(3, q4bits2, 4, 6);
                }
                let xd = half::f16::from_bits(x.d).to_f32();
                for r in 0..R {
                    let d = (*a.add(r * nb + b)).d * xd;
                    acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                }
            }
            let mut out = [0f32; R];
            for r in 0..R {
                out[r] = hsum(acc[r]);
            }
            out
        }

        /// `y[r, c]` for `r < m`, `c` in `cols` (`y` row-major `[m, n]`): rows in blocks that
        /// stay in L2, and within a block each column (a few KB, in L1) against even groups of at most
        /// `$max_rows` rows.
        ///
        /// # Safety
        /// The CPU has the module's features; `w` has at least `cols.end * nb` blocks, `a`
        /// `m * nb`; `y` valid for exclusive writes at `r * n + c` for those `r`, `c`.
        #[target_feature(enable = $feat)]
        pub(super) unsafe fn matmul_cols(
            w: &[Q6],
            nb: usize,
            a: &[Q8],
            m: usize,
            cols: std::ops::Range<usize>,
            y: *mut f32,
            n: usize,
        ) {
            let block_rows = (ROW_BLOCK_BYTES / (nb * std::mem::size_of::<Q8>())).max($max_rows);
            let mut b0 = 0;
            while b0 < m {
                let b1 = (b0 + block_rows).min(m);
                for c in cols.clone() {
                    let wp = w.as_ptr().add(c * nb);
                    let mut r0 = b0;
                    while r0 < b1 {
                        // Even groups of at most $max_rows rows (5 = 3 + 2 rather than 4 + 1).
                        let left = b1 - r0;
                        let rows = left.div_ceil(left.div_ceil($max_rows));
                        let ap = a.as_ptr().add(r0 * nb);
                        macro_rules! run {
                            ($r:literal) => {
                                for (i, v) in tile::<$r>(wp, ap, nb).into_iter().enumerate() {
                                    *y.add((r0 + i) * n + c) = v;
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
        }
    };
}

mod pair;
mod q8k;

/// candle's `BlockQ8K::from_float` of one row: [`q8k`]'s AVX-512 or AVX2 copy of it where the
/// CPU has them (the same blocks), else candle's own.
pub(super) fn quantize_q8k(row: &[f32], out: &mut [BlockQ8K]) {
    if q8k::available() {
        // SAFETY: `Q8` is `BlockQ8K`'s layout (size and alignment asserted above), plain data;
        // the CPU has AVX-512 F/BW (checked).
        unsafe {
            let q = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut Q8, out.len());
            q8k::quantize_row(row, q);
        }
    } else if q8k::available_avx2() {
        // SAFETY: as above; the CPU has AVX2 (checked).
        unsafe {
            let q = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut Q8, out.len());
            q8k::quantize_row_avx2(row, q);
        }
    } else {
        BlockQ8K::from_float(row, out);
    }
}

/// AVX2 + FMA.
mod plain {
    kernels!("avx2,fma", 4);
}

/// The same instructions with AVX-512 VL/BW on: 32 vector registers, 8-row tiles.
mod wide {
    kernels!("avx2,fma,avx512f,avx512vl,avx512bw", 8);
}

fn wide_available() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| {
        crate::ops::quant::avx512_allowed()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
    })
}

/// # Safety
/// As the modules' `matmul_cols`, with AVX2 + FMA present (and AVX-512 VL/BW for `wide`).
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_cols(
    kind: Kind,
    w: &[Q6],
    nb: usize,
    a: &[Q8],
    m: usize,
    cols: std::ops::Range<usize>,
    y: *mut f32,
    n: usize,
) {
    match kind {
        Kind::Plain => plain::matmul_cols(w, nb, a, m, cols, y, n),
        Kind::Wide => wide::matmul_cols(w, nb, a, m, cols, y, n),
        Kind::Pair => pair::matmul_cols(w, nb, a, m, cols, y, n),
    }
}

/// Whether the two-columns-per-register build runs here (then decode takes it too).
pub fn pair_available() -> bool {
    Kind::Pair.available()
}

/// Which build of the kernel runs (all give the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// AVX2 + FMA, tiles of up to 4 rows.
    Plain,
    /// The same with AVX-512 registers, tiles of up to 8 rows.
    Wide,
    /// Two columns per 512-bit register ([`pair`]).
    Pair,
}

impl Kind {
    fn available(self) -> bool {
        match self {
            Kind::Plain => available(),
            Kind::Wide => available() && wide_available(),
            Kind::Pair => available() && pair::available(),
        }
    }
}

/// `y[m, n] = x[m, k] · Wᵀ` for Q6K blocks `w` (`n` rows of `k / 256`), every element equal to
/// candle's `vec_dot_q6k_q8k` of that row and column. Panics unless [`available`].
pub fn matmul(w: &[BlockQ6K], n: usize, k: usize, x: &[f32], m: usize, y: &mut [f32]) {
    let kind = [Kind::Pair, Kind::Wide].into_iter().find(|k| k.available()).unwrap_or(Kind::Plain);
    matmul_impl(kind, w, n, k, x, m, y)
}

fn matmul_impl(kind: Kind, w: &[BlockQ6K], n: usize, k: usize, x: &[f32], m: usize, y: &mut [f32]) {
    assert!(kind.available(), "Q6K matmul: {kind:?} needs AVX2 + FMA (and AVX-512 for Wide, Pair)");
    assert!(k.is_multiple_of(QK_K), "Q6K matmul: k = {k}");
    let nb = k / QK_K;
    assert_eq!(w.len(), n * nb, "Q6K matmul: {} blocks for [{n}, {k}]", w.len());
    assert_eq!(x.len(), m * k, "Q6K matmul: x has {} values, want {m} × {k}", x.len());
    assert_eq!(y.len(), m * n, "Q6K matmul: y has {} values, want {m} × {n}", y.len());
    if m == 0 || n == 0 {
        return;
    }
    let mut acts = vec![BlockQ8K::zeros(); m * nb];
    // Each row on its own (candle's quantisation of that row), in parallel for prefill.
    if m >= 4 && rayon::current_num_threads() > 1 && crate::ops::cpu_threads::limit() > 1 {
        use rayon::prelude::*;
        acts.par_chunks_exact_mut(nb).zip(x.par_chunks_exact(k)).for_each(|(a, row)| quantize_q8k(row, a));
    } else {
        for (row, a) in x.chunks_exact(k).zip(acts.chunks_exact_mut(nb)) {
            quantize_q8k(row, a);
        }
    }
    // SAFETY: same size and alignment (asserted above), plain data.
    let a = unsafe { std::slice::from_raw_parts(acts.as_ptr() as *const Q8, acts.len()) };
    let w = unsafe { std::slice::from_raw_parts(w.as_ptr() as *const Q6, w.len()) };
    let out = OutPtr(y.as_mut_ptr());
    let threads = crate::ops::cpu_threads::threads();
    for_column_chunks(n, threads, m * n * k, 8, 1, |cols| {
        // SAFETY: available() asserted; sizes asserted; y borrowed mutably for the call and
        // tasks write disjoint column ranges.
        unsafe { matmul_cols(kind, w, nb, a, m, cols, out.get(), n) };
    });
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    use super::*;

    /// The AVX-512 and AVX2 quantisers (each where this CPU has it) give candle's `from_float`
    /// blocks exactly: random rows of every scale, a largest magnitude that is negative, shared
    /// by + and -, or first in a later lane; halves (round away from zero), zeros, NaN,
    /// infinities and subnormals.
    #[test]
    fn q8k_quantiser_equals_candles() {
        type Quantise = unsafe fn(&[f32], &mut [Q8]);
        let kinds: Vec<(&str, Quantise)> = [
            ("avx512", q8k::available(), q8k::quantize_row as Quantise),
            ("avx2", q8k::available_avx2(), q8k::quantize_row_avx2 as Quantise),
        ]
        .into_iter()
        .filter(|k| k.1)
        .map(|k| (k.0, k.2))
        .collect();
        if kinds.is_empty() {
            eprintln!("no AVX2 here: skipped");
            return;
        }
        let mut rows: Vec<Vec<f32>> = Vec::new();
        let mut s = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        for scale in [1e-3f32, 1.0, 37.0, 1e4] {
            for _ in 0..40 {
                rows.push((0..512).map(|_| next() * scale).collect());
            }
        }
        let mut r: Vec<f32> = (0..256).map(|i| (i as f32 - 128.0) * 0.25).collect();
        r[200] = -40.0;
        r[201] = 40.0; // the same magnitude after the first: candle keeps -40
        rows.push(r);
        // iscale = -1: x.5 values round away from zero.
        let mut r: Vec<f32> = (0..256).map(|i| (i % 50) as f32 - 24.5).collect();
        r[3] = 127.0;
        rows.push(r);
        rows.push(vec![0.0; 256]);
        rows.push((0..256).map(|i| if i % 7 == 0 { f32::NAN } else { i as f32 }).collect());
        rows.push(vec![f32::NAN; 256]);
        rows.push((0..256).map(|i| if i == 9 { f32::INFINITY } else { 1.0 }).collect());
        rows.push((0..256).map(|i| if i == 9 { 1e-40 } else { 0.0 }).collect());
        for (i, row) in rows.iter().enumerate() {
            let nb = row.len() / QK_K;
            let mut want = vec![BlockQ8K::zeros(); nb];
            BlockQ8K::from_float(row, &mut want);
            // SAFETY: BlockQ8K is plain `repr(C)` data (f32, i8s, i16s), no padding.
            let bytes = |b: &[BlockQ8K]| unsafe {
                std::slice::from_raw_parts(b.as_ptr() as *const u8, std::mem::size_of_val(b)).to_vec()
            };
            for (name, quantise) in &kinds {
                let mut got = vec![BlockQ8K::zeros(); nb];
                // SAFETY: the CPU has the kernel's features (filtered above); `Q8` is
                // `BlockQ8K`'s layout.
                unsafe {
                    let q = std::slice::from_raw_parts_mut(got.as_mut_ptr() as *mut Q8, got.len());
                    quantise(row, q);
                }
                assert_eq!(bytes(&got), bytes(&want), "row {i}, {name}");
            }
        }
    }

    /// Every row of `x` through every build this CPU runs equals candle's own single-row
    /// result for weights `w`, bit for bit.
    fn check_rows_equal_candles(w: &Tensor, x: &Tensor, what: &str) {
        let (n, k) = w.dims2().unwrap();
        let m = x.dim(0).unwrap();
        let q = std::sync::Arc::new(QTensor::quantize(w, GgmlDType::Q6K).unwrap());
        let data = q.data().unwrap();
        // SAFETY: a CPU QTensor's storage is a Vec<BlockQ6K>.
        let blocks = unsafe {
            std::slice::from_raw_parts(data.as_ptr() as *const BlockQ6K, data.len() / std::mem::size_of::<BlockQ6K>())
        };
        let qm = QMatMul::QTensor(q.clone());
        let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for kind in [Kind::Plain, Kind::Wide, Kind::Pair].into_iter().filter(|k| k.available()) {
            let mut y = vec![0f32; m * n];
            matmul_impl(kind, blocks, n, k, &xs, m, &mut y);
            for r in 0..m {
                let want = qm.forward(&x.narrow(0, r, 1).unwrap()).unwrap();
                let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                for c in 0..n {
                    assert_eq!(y[r * n + c].to_bits(), want[c].to_bits(), "{what}: m={m} row {r} col {c} {kind:?}");
                }
            }
        }
    }

    /// Every row of every row count equals candle's own single-row result, bit for bit, over
    /// row counts with 1..=3 leftover rows and odd column counts, for every build this CPU runs.
    #[test]
    fn rows_equal_candles_decode_bits() {
        if !available() {
            return;
        }
        let dev = Device::Cpu;
        for (n, k) in [(37, 256), (64, 768), (19, 2048)] {
            let w = Tensor::randn(0f32, 0.05, (n, k), &dev).unwrap();
            for m in [1, 2, 3, 4, 5, 7, 11, 16] {
                let x = Tensor::randn(0f32, 1.0, (m, k), &dev).unwrap();
                check_rows_equal_candles(&w, &x, &format!("[{n}, {k}]"));
            }
        }
    }

    /// The integer lanes at their extremes: weights whose 6-bit values are all 0 (`q - 32 =
    /// -32`) or all 63 beside activations of 127 and -128 (the largest `maddubs` pairs) and
    /// the largest scales; every build still gives candle's bits.
    #[test]
    fn extreme_lanes_equal_candles_decode_bits() {
        if !available() {
            return;
        }
        let dev = Device::Cpu;
        let (n, k) = (6, 512);
        // Columns: all -1 (every q = 0), all +1, alternating signs, ramps.
        let w: Vec<f32> = (0..n * k)
            .map(|i| match i / k {
                0 => -1.0,
                1 => 1.0,
                2 => [-1.0, 1.0][i % 2],
                3 => -((i % 16) as f32),
                4 => (i % 64) as f32 - 32.0,
                _ => [0.01, -3.0][usize::from(i % 17 == 0)],
            })
            .collect();
        let w = Tensor::from_vec(w, (n, k), &dev).unwrap();
        // Rows whose largest magnitude is negative (-1 gives q8 = -128, 0.99 gives 127), the
        // same positive, all equal, and mixed.
        let x: Vec<f32> = (0..5 * k)
            .map(|i| match i / k {
                0 => [0.9921875, -1.0][usize::from(i % k == 0)],
                1 => -1.0,
                2 => 1.0,
                3 => [-1.0, 0.9921875][i % 2],
                _ => [-0.9921875, 1.0][usize::from(i % 3 == 0)],
            })
            .collect();
        let x = Tensor::from_vec(x, (5, k), &dev).unwrap();
        check_rows_equal_candles(&w, &x, "extremes");
    }
}
