//! Row-invariant dense f32 matmul `y = x · Wᵀ` on the CPU (`x` `[m, k]`, `W` `[n, k]`): the
//! kernel [`super::row_stable`] sends dense weights (`QMatMul::Tensor`) to, so a decode step
//! (`m == 1`) and a speculative verify chunk (`m > 1`) give a row the same bits. candle's own
//! f32 matmul (the `gemm` crate) takes a different kernel, and so a different summation order,
//! for one row than for several.
//!
//! Every output `y[i, j]` is one dot product of row `i` of `x` and row `j` of `W`, computed
//! wholly by one thread in one fixed sequence of operations:
//!
//! 1. eight f32 lanes, lane `l` accumulating `x[t] · w[t]` for `t ≡ l (mod 8)`,
//!    `t < k - k % 8`, in increasing `t`, each step one fused multiply-add (from `+0.0`);
//! 2. the lanes summed as `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` (the usual AVX
//!    `extract` / `movehl` / `movehdup` horizontal sum);
//! 3. the `k % 8` tail added one fused multiply-add at a time, in increasing `t`.
//!
//! None of that depends on `m`, on which register tile the row or column lands in, or on how
//! the columns are split over threads, so each row is independent of the call it is in. The
//! kernels only differ in how much they compute at once:
//!
//! * [`DenseKernel::Portable`]: plain Rust with `f32::mul_add` (vectorised where the target has
//!   FMA; a libm call per lane on an x86 CPU without it, correct but slow);
//! * [`DenseKernel::Avx2`]: AVX2 + FMA, register tiles of 2 rows × 6 columns (12 accumulators:
//!   each loaded weight vector feeds 2 rows, each activation vector 6 columns);
//! * [`DenseKernel::Avx512`]: the same 256-bit instructions compiled with AVX-512 VL so the
//!   compiler has 32 vector registers: 4 × 6 tiles.
//!
//! All three give identical bits (lane-wise FMA is exact IEEE arithmetic whatever the vector
//! width), so the choice only changes speed. Columns are split over candle's barrier pool (the
//! threads the engine configured, as the quantised kernels do); within a task, rows are taken
//! in blocks whose activations stay in L2 while each group of 6 weight rows passes over them.

use super::matrix::{for_column_chunks, OutPtr};

/// The stored type of a weight element: f32, or a 16-bit float widened exactly to f32 as it
/// is read (so a bf16 or f16 matrix gives the bits of the same values held as f32, in half
/// the memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElemKind {
    F32,
    Bf16,
    F16,
}

/// A weight element the dense kernels read.
pub trait DenseElem: Copy + Send + Sync + 'static {
    const KIND: ElemKind;
    fn to_f32(self) -> f32;
}
impl DenseElem for f32 {
    const KIND: ElemKind = ElemKind::F32;
    fn to_f32(self) -> f32 {
        self
    }
}
impl DenseElem for half::bf16 {
    const KIND: ElemKind = ElemKind::Bf16;
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}
impl DenseElem for half::f16 {
    const KIND: ElemKind = ElemKind::F16;
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// Which implementation computes the dot products (all give the same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenseKernel {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2 + FMA (x86_64).
    Avx2,
    /// AVX2 + FMA instructions with AVX-512 VL's 32 registers (x86_64).
    Avx512,
}

impl DenseKernel {
    /// Every kernel, fastest last.
    pub const ALL: [DenseKernel; 3] = [DenseKernel::Portable, DenseKernel::Avx2, DenseKernel::Avx512];

    /// Whether this kernel can run on this CPU.
    pub fn available(self) -> bool {
        match self {
            DenseKernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            DenseKernel::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            DenseKernel::Avx512 => {
                DenseKernel::Avx2.available()
                    && crate::ops::quant::avx512_allowed()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest available kernel.
    pub fn best() -> DenseKernel {
        static BEST: std::sync::OnceLock<DenseKernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            DenseKernel::ALL.iter().rev().copied().find(|k| k.available()).unwrap_or(DenseKernel::Portable)
        })
    }
}

/// Columns per register tile (every kernel; the last tile of a range repeats its last column).
const COLS: usize = 6;
/// Activation bytes per block of rows: kept in L2 while every column of a task passes over it.
#[cfg(target_arch = "x86_64")]
const ROW_BLOCK_BYTES: usize = 512 * 1024;

/// `y[m, n] = x[m, k] · w[n, k]ᵀ` with the best kernel, columns split over candle's barrier
/// pool. Every element has the bits described in the module docs.
pub fn matmul<E: DenseElem>(w: &[E], n: usize, k: usize, x: &[f32], m: usize, y: &mut [f32]) {
    let threads = crate::ops::cpu_threads::threads();
    matmul_with(DenseKernel::best(), threads, w, n, k, x, m, y)
}

/// [`matmul`] with the given kernel (panics if it is not available here), its columns cut
/// into about `4 × threads` tasks (`threads <= 1`: all on this thread). Neither changes the
/// result.
#[allow(clippy::too_many_arguments)]
pub fn matmul_with<E: DenseElem>(
    kernel: DenseKernel,
    threads: usize,
    w: &[E],
    n: usize,
    k: usize,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) {
    assert!(kernel.available(), "{kernel:?} dense kernel is not available on this CPU");
    assert_eq!(w.len(), n * k, "dense matmul: w has {} values, want {n} × {k}", w.len());
    assert_eq!(x.len(), m * k, "dense matmul: x has {} values, want {m} × {k}", x.len());
    assert_eq!(y.len(), m * n, "dense matmul: y has {} values, want {m} × {n}", y.len());
    if m == 0 || n == 0 {
        return;
    }
    let out = OutPtr(y.as_mut_ptr());
    for_column_chunks(n, threads, m * n * k, 2 * COLS, COLS, |cols| {
        // SAFETY: sizes asserted; y is borrowed mutably for the whole call and tasks write
        // disjoint column ranges.
        unsafe { matmul_cols(kernel, w, k, x, m, cols, out.get(), n) };
    });
}

/// # Safety
/// `kernel` is available; `w` is `[n, k]`, `x` `[m, k]`, `cols` within `0..n`; `y` is valid
/// for exclusive writes at `r * n + c` for `r < m`, `c` in `cols`.
#[allow(clippy::too_many_arguments)]
unsafe fn matmul_cols<E: DenseElem>(
    kernel: DenseKernel,
    w: &[E],
    k: usize,
    x: &[f32],
    m: usize,
    cols: std::ops::Range<usize>,
    y: *mut f32,
    n: usize,
) {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded; the kernel's features are available.
        DenseKernel::Avx2 => unsafe { simd::plain::matmul_cols(w, k, x, m, cols, y, n) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        DenseKernel::Avx512 => unsafe { simd::wide::matmul_cols(w, k, x, m, cols, y, n) },
        _ => {
            for c in cols {
                let wr: Vec<f32> = w[c * k..(c + 1) * k].iter().map(|v| v.to_f32()).collect();
                for r in 0..m {
                    // SAFETY: forwarded from the caller.
                    unsafe { *y.add(r * n + c) = dot(&x[r * k..(r + 1) * k], &wr) };
                }
            }
        }
    }
}

/// The module docs' sum of four lanes pairs, as the AVX horizontal sum does it.
#[inline(always)]
fn hsum8(a: [f32; 8]) -> f32 {
    let h = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// One dot product in the module docs' order: the reference every kernel matches bit for bit.
pub fn dot(x: &[f32], w: &[f32]) -> f32 {
    assert_eq!(x.len(), w.len(), "dot of {} and {} values", x.len(), w.len());
    let k8 = x.len() - x.len() % 8;
    let mut acc = [0f32; 8];
    for (xc, wc) in x[..k8].chunks_exact(8).zip(w[..k8].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] = xc[l].mul_add(wc[l], acc[l]);
        }
    }
    let mut s = hsum8(acc);
    for (a, b) in x[k8..].iter().zip(&w[k8..]) {
        s = a.mul_add(*b, s);
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{DenseElem, ElemKind, COLS, ROW_BLOCK_BYTES};

    /// The tile kernels for one set of target features, with tiles of up to `$max_rows` rows.
    macro_rules! kernels {
        ($feat:literal, $max_rows:literal) => {
            use super::*;

            /// `hsum8` on a vector (same additions, same order).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn hsum(v: __m256) -> f32 {
                let h = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
                let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)))
            }

            /// Eight weights at `p` as f32 (16-bit values widened exactly).
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn load8<E: DenseElem>(p: *const E) -> __m256 {
                match E::KIND {
                    ElemKind::F32 => _mm256_loadu_ps(p as *const f32),
                    ElemKind::Bf16 => {
                        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
                    }
                    ElemKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                }
            }

            /// `out[r][c]` = row `r` of the `R` rows at `x` (`k` apart) · the weight row at
            /// `w[c]`, each in the module docs' order; every loaded vector feeds a whole row or
            /// column of the tile.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn tile<const R: usize, E: DenseElem>(
                x: *const f32,
                w: [*const E; COLS],
                k: usize,
            ) -> [[f32; COLS]; R] {
                let k8 = k - k % 8;
                let mut acc = [[_mm256_setzero_ps(); COLS]; R];
                let mut t = 0;
                while t < k8 {
                    let mut xv = [_mm256_setzero_ps(); R];
                    for r in 0..R {
                        xv[r] = _mm256_loadu_ps(x.add(r * k + t));
                    }
                    for c in 0..COLS {
                        let wv = load8(w[c].add(t));
                        for r in 0..R {
                            acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
                        }
                    }
                    t += 8;
                }
                let mut out = [[0f32; COLS]; R];
                for r in 0..R {
                    for c in 0..COLS {
                        let mut s = hsum(acc[r][c]);
                        for t in k8..k {
                            s = (*x.add(r * k + t)).mul_add((*w[c].add(t)).to_f32(), s);
                        }
                        out[r][c] = s;
                    }
                }
                out
            }

            thread_local! {
                /// A column tile's 16-bit weights widened to f32 (one task's scratch).
                static WIDE_ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
            }

            /// Rows `rows` of `x` (`k` apart) against the tile's columns at `wp` (output
            /// columns `c0..`, `live` of them real), in even groups of at most `$max_rows`.
            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn rows_of<E: DenseElem>(
                wp: [*const E; COLS],
                x: *const f32,
                k: usize,
                y: *mut f32,
                n: usize,
                rows: std::ops::Range<usize>,
                c0: usize,
                live: usize,
            ) {
                let mut r0 = rows.start;
                while r0 < rows.end {
                    // Even groups of at most $max_rows rows (5 = 3 + 2 rather than 4 + 1).
                    let left = rows.end - r0;
                    let g = left.div_ceil(left.div_ceil($max_rows));
                    let xp = x.add(r0 * k);
                    macro_rules! run {
                        ($r:literal) => {
                            for (i, row) in tile::<$r, E>(xp, wp, k).iter().enumerate() {
                                for (j, v) in row[..live].iter().enumerate() {
                                    *y.add((r0 + i) * n + c0 + j) = *v;
                                }
                            }
                        };
                    }
                    match g {
                        1 => run!(1),
                        2 => run!(2),
                        3 => run!(3),
                        _ => run!(4),
                    }
                    r0 += g;
                }
            }

            /// `y[r, c]` for `r < m`, `c` in `cols`.
            ///
            /// # Safety
            /// As `super::super::matmul_cols`, with this module's features present.
            #[target_feature(enable = $feat)]
            pub(in super::super) unsafe fn matmul_cols<E: DenseElem>(
                w: &[E],
                k: usize,
                x: &[f32],
                m: usize,
                cols: std::ops::Range<usize>,
                y: *mut f32,
                n: usize,
            ) {
                let block_rows = (ROW_BLOCK_BYTES / (k * 4).max(1)).max($max_rows);
                let last = cols.end - 1;
                let mut b0 = 0;
                while b0 < m {
                    let b1 = (b0 + block_rows).min(m);
                    let mut c0 = cols.start;
                    while c0 < cols.end {
                        // A short last tile repeats the range's last column (results dropped).
                        let wp: [*const E; COLS] = std::array::from_fn(|i| w.as_ptr().add((c0 + i).min(last) * k));
                        let live = COLS.min(cols.end - c0);
                        // 16-bit weights against many rows: widened once into f32 rows here
                        // (the same values, so the same bits) instead of once per row group.
                        if E::KIND != ElemKind::F32 && b1 - b0 > $max_rows {
                            WIDE_ROWS.with(|cell| {
                                let mut buf = cell.borrow_mut();
                                buf.resize(COLS * k, 0.0);
                                for (i, &p) in wp.iter().enumerate() {
                                    let row = &mut buf[i * k..(i + 1) * k];
                                    let mut t = 0;
                                    while t + 8 <= k {
                                        _mm256_storeu_ps(row.as_mut_ptr().add(t), load8(p.add(t)));
                                        t += 8;
                                    }
                                    for (j, v) in row.iter_mut().enumerate().skip(t) {
                                        *v = (*p.add(j)).to_f32();
                                    }
                                }
                                let wf: [*const f32; COLS] = std::array::from_fn(|i| buf.as_ptr().add(i * k));
                                rows_of(wf, x.as_ptr(), k, y, n, b0..b1, c0, live);
                            });
                        } else {
                            rows_of(wp, x.as_ptr(), k, y, n, b0..b1, c0, live);
                        }
                        c0 += COLS;
                    }
                    b0 = b1;
                }
            }
        };
    }
    /// AVX2 + FMA: 16 registers, 2 × 6 tiles.
    pub(super) mod plain {
        kernels!("avx2,fma,f16c", 2);
    }

    /// The same instructions with AVX-512 VL on: 32 registers, 4 × 6 tiles.
    pub(super) mod wide {
        kernels!("avx2,fma,f16c,avx512f,avx512vl", 4);
    }
}

/// `x · Wᵀ` for a CPU f32 `x` `[..., k]` and a CPU `W` `[n, k]` of f32, bf16 or f16 (any
/// strides: a non-contiguous `W` is copied, per call), every row with the bits of [`dot`] (of
/// the weights widened to f32).
pub fn forward(w: &candle_core::Tensor, x: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
    use candle_core::{DType, Device, Storage, Tensor};

    let (n, k) = w.dims2()?;
    let dims = x.dims().to_vec();
    let weight_ok = matches!(w.dtype(), DType::F32 | DType::BF16 | DType::F16);
    if dims.last() != Some(&k) || !weight_ok || x.dtype() != DType::F32 {
        candle_core::bail!("dense matmul: input {dims:?} {:?} against weight [{n}, {k}] {:?}", x.dtype(), w.dtype());
    }
    let (w, x) = (w.contiguous()?, x.contiguous()?);
    let m: usize = dims[..dims.len() - 1].iter().product();
    let mut dst = vec![0f32; m * n];
    if k > 0 {
        let (ws, wl) = w.storage_and_layout();
        let (xs, xl) = x.storage_and_layout();
        let (Storage::Cpu(wc), Storage::Cpu(xc)) = (&*ws, &*xs) else {
            candle_core::bail!("dense matmul: tensors are not on the CPU")
        };
        let (wo, xo) = (wl.start_offset(), xl.start_offset());
        let xv = &xc.as_slice::<f32>()?[xo..xo + m * k];
        match w.dtype() {
            DType::BF16 => matmul(&wc.as_slice::<half::bf16>()?[wo..wo + n * k], n, k, xv, m, &mut dst),
            DType::F16 => matmul(&wc.as_slice::<half::f16>()?[wo..wo + n * k], n, k, xv, m, &mut dst),
            _ => matmul(&wc.as_slice::<f32>()?[wo..wo + n * k], n, k, xv, m, &mut dst),
        }
    }
    let mut out = dims;
    *out.last_mut().unwrap_or_else(|| unreachable!()) = n;
    Tensor::from_vec(dst, out, &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1), a few of them 8× larger.
    fn values(seed: u64, len: usize) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                if i % 53 == 0 {
                    u * 8.0
                } else {
                    u
                }
            })
            .collect()
    }

    fn kernels() -> impl Iterator<Item = DenseKernel> {
        DenseKernel::ALL.into_iter().filter(|k| k.available())
    }

    /// Every kernel, tile shape and thread split gives every element the bits of [`dot`].
    #[test]
    fn every_kernel_gives_dots_bits() {
        let shapes =
            [(1, 1, 1), (1, 5, 7), (2, 13, 8), (3, 7, 13), (5, 6, 100), (9, 50, 257), (17, 19, 64), (7, 200, 300)];
        for (m, n, k) in shapes {
            let w = values(n as u64 * 7 + k as u64, n * k);
            let x = values(m as u64 * 3 + 1, m * k);
            let want: Vec<u32> = (0..m * n)
                .map(|i| dot(&x[i / n * k..(i / n + 1) * k], &w[i % n * k..(i % n + 1) * k]).to_bits())
                .collect();
            for kernel in kernels() {
                for threads in [1, 2, 3] {
                    let mut y = vec![f32::NAN; m * n];
                    matmul_with(kernel, threads, &w, n, k, &x, m, &mut y);
                    let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{kernel:?} {threads} threads, [{m}, {k}] × [{n}, {k}]ᵀ");
                }
            }
        }
    }

    /// bf16 and f16 weights give every element the bits of [`dot`] over the same values widened
    /// to f32, in every kernel (16-bit weights are read as they are stored, not copied to f32).
    #[test]
    fn sixteen_bit_weights_give_the_widened_bits() {
        fn check<E: DenseElem>(from: fn(f32) -> E) {
            for (m, n, k) in [(1, 7, 9), (3, 13, 64), (5, 6, 100), (9, 20, 257)] {
                let w: Vec<E> = values(n as u64 + 11 * k as u64, n * k).into_iter().map(from).collect();
                let wide: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
                let x = values(m as u64 * 5 + 2, m * k);
                let want: Vec<u32> = (0..m * n)
                    .map(|i| dot(&x[i / n * k..(i / n + 1) * k], &wide[i % n * k..(i % n + 1) * k]).to_bits())
                    .collect();
                for kernel in kernels() {
                    let mut y = vec![f32::NAN; m * n];
                    matmul_with(kernel, 2, &w, n, k, &x, m, &mut y);
                    let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{:?} {kernel:?} [{m}, {k}] × [{n}, {k}]ᵀ", E::KIND);
                }
            }
        }
        check::<half::bf16>(half::bf16::from_f32);
        check::<half::f16>(half::f16::from_f32);
    }

    /// Thread counts 1, 2 and 3 give the same bits on a matrix big enough to be split.
    #[test]
    fn thread_count_does_not_change_bits() {
        let (m, n, k) = (11, 333, 517);
        assert!(m * n * k >= 1 << 17);
        let w = values(5, n * k);
        let x = values(6, m * k);
        let kernel = DenseKernel::best();
        let mut first = vec![0f32; m * n];
        matmul_with(kernel, 1, &w, n, k, &x, m, &mut first);
        for threads in [2, 3] {
            let mut y = vec![0f32; m * n];
            matmul_with(kernel, threads, &w, n, k, &x, m, &mut y);
            assert!(y.iter().zip(&first).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
        }
    }

    /// Close to an f64 reference: within a few units of f32 rounding per term of `Σ|x w|`.
    #[test]
    fn close_to_f64_reference() {
        for (m, n, k) in [(3, 17, 31), (4, 9, 1024), (2, 5, 4099)] {
            let w = values(11 + k as u64, n * k);
            let x = values(12 + m as u64, m * k);
            let mut y = vec![0f32; m * n];
            matmul_with(DenseKernel::best(), 2, &w, n, k, &x, m, &mut y);
            for r in 0..m {
                for c in 0..n {
                    let (xr, wr) = (&x[r * k..(r + 1) * k], &w[c * k..(c + 1) * k]);
                    let exact: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let mag: f64 = xr.iter().zip(wr).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                    let tol = (k as f64 / 8.0 + 8.0) * f32::EPSILON as f64 * mag;
                    let err = (y[r * n + c] as f64 - exact).abs();
                    assert!(err <= tol, "[{m}, {n}, {k}] ({r}, {c}): {} vs {exact} (tol {tol})", y[r * n + c]);
                }
            }
        }
    }

    /// [`forward`] on tensors: a transposed (non-contiguous) weight and a 3-D input give what
    /// the contiguous 2-D call gives, and candle's matmul to within rounding.
    #[test]
    fn forward_handles_layouts() {
        use candle_core::{Device, Tensor};
        let (n, k) = (23, 45);
        let w = Tensor::from_vec(values(1, n * k), (n, k), &Device::Cpu).unwrap();
        let wt = Tensor::from_vec(values(1, n * k), (n, k), &Device::Cpu)
            .unwrap()
            .t()
            .unwrap()
            .contiguous()
            .unwrap()
            .t()
            .unwrap();
        assert!(!wt.is_contiguous());
        let x = Tensor::from_vec(values(2, 6 * k), (2, 3, k), &Device::Cpu).unwrap();
        let a = forward(&w, &x).unwrap();
        let b = forward(&wt, &x.reshape((6, k)).unwrap()).unwrap();
        assert_eq!(a.dims(), &[2, 3, n]);
        let a: Vec<u32> = a.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect();
        let b: Vec<u32> = b.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect();
        assert_eq!(a, b);
        let c = x
            .reshape((6, k))
            .unwrap()
            .matmul(&w.t().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for (got, want) in a.iter().zip(&c) {
            assert!((f32::from_bits(*got) - want).abs() <= 1e-4 * want.abs().max(1.0));
        }
    }
}
