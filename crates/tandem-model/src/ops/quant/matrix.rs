//! [`GgmlMatrix`]: a `[n, k]` weight matrix in raw GGML blocks, and `y = x · Wᵀ` on it.
//!
//! A call quantises the rows of `x` into a thread-local scratch of [`Q8Block`]s (no heap
//! allocation once warm), then splits the output columns over candle's barrier pool
//! ([`for_column_chunks`], shared with the Q6K and dense kernels). Within a task the kernel walks column tiles and, inside each, groups of 4
//! rows, so for prefill every weight block is unpacked once per 4 rows.

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use super::activation::{quantize_row, Q8Block};
use super::blocks::{parse_blocks, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, QuantType, WeightBlock, QK};
use super::{reference, Kernel};

/// The AVX-512 kernel's per-block starts, made once per call (nothing elsewhere).
#[cfg(target_arch = "x86_64")]
type Starts<'a> = &'a [super::avx512::Start];
#[cfg(not(target_arch = "x86_64"))]
type Starts<'a> = std::marker::PhantomData<&'a ()>;

/// The blocks of a matrix, row-major: row `c` is blocks `c*nb .. (c+1)*nb`.
#[derive(Clone)]
enum Blocks {
    Q4_1(Vec<BlockQ4_1>),
    Q5_0(Vec<BlockQ5_0>),
    Q5_1(Vec<BlockQ5_1>),
    Q8_0(Vec<BlockQ8_0>),
}

/// Calls `$body` with `$w` bound to the typed block vector.
macro_rules! with_blocks {
    ($blocks:expr, $w:ident => $body:expr) => {
        match $blocks {
            Blocks::Q4_1($w) => $body,
            Blocks::Q5_0($w) => $body,
            Blocks::Q5_1($w) => $body,
            Blocks::Q8_0($w) => $body,
        }
    };
}

/// A quantised weight matrix of `n` output rows by `k` inputs (PyTorch order; a GGUF tensor
/// with dims `[k, n]`), stored as the file's GGML blocks.
#[derive(Clone)]
pub struct GgmlMatrix {
    n: usize,
    k: usize,
    blocks: Blocks,
}

impl std::fmt::Debug for GgmlMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GgmlMatrix({:?}, n={}, k={})", self.quant_type(), self.n, self.k)
    }
}

impl GgmlMatrix {
    /// From the raw bytes of a tensor in GGUF layout: `n` rows of `k / 32` blocks.
    pub fn from_bytes(ty: QuantType, n: usize, k: usize, bytes: &[u8]) -> candle_core::Result<Self> {
        if k == 0 || !k.is_multiple_of(QK) {
            candle_core::bail!("{ty:?} matrix: k = {k} is not a positive multiple of {QK}");
        }
        let want = n * (k / QK) * ty.block_bytes();
        if bytes.len() != want {
            candle_core::bail!("{ty:?} matrix [{n}, {k}]: expected {want} bytes, got {}", bytes.len());
        }
        let blocks = match ty {
            QuantType::Q4_1 => Blocks::Q4_1(parse_blocks(bytes)),
            QuantType::Q5_0 => Blocks::Q5_0(parse_blocks(bytes)),
            QuantType::Q5_1 => Blocks::Q5_1(parse_blocks(bytes)),
            QuantType::Q8_0 => Blocks::Q8_0(parse_blocks(bytes)),
        };
        Ok(Self { n, k, blocks })
    }

    /// From a 2-D candle `QTensor` `[n, k]` of a supported type (`Ok(None)` for other types).
    pub fn from_qtensor(q: &candle_core::quantized::QTensor) -> candle_core::Result<Option<Self>> {
        let Some(ty) = QuantType::from_ggml(q.dtype()) else { return Ok(None) };
        let (n, k) = q.shape().dims2()?;
        Ok(Some(Self::from_bytes(ty, n, k, &q.data()?)?))
    }

    /// From typed blocks (`n` rows of `k / 32`).
    pub fn from_blocks<B: WeightBlock>(n: usize, k: usize, blocks: &[B]) -> candle_core::Result<Self> {
        let mut bytes = Vec::with_capacity(blocks.len() * B::BYTES);
        blocks.iter().for_each(|b| b.write(&mut bytes));
        Self::from_bytes(B::TYPE, n, k, &bytes)
    }

    pub fn quant_type(&self) -> QuantType {
        match &self.blocks {
            Blocks::Q4_1(_) => QuantType::Q4_1,
            Blocks::Q5_0(_) => QuantType::Q5_0,
            Blocks::Q5_1(_) => QuantType::Q5_1,
            Blocks::Q8_0(_) => QuantType::Q8_0,
        }
    }
    /// Output features (rows of W).
    pub fn n(&self) -> usize {
        self.n
    }
    /// Input features (columns of W).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The matrix in GGUF byte layout.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.n * self.k / QK * self.quant_type().block_bytes());
        with_blocks!(&self.blocks, w => w.iter().for_each(|b| b.write(&mut out)));
        out
    }

    /// Row `c` of W as f32 (`k` values), as ggml's `dequantize_row_*`.
    pub fn dequantize_row(&self, c: usize, out: &mut [f32]) {
        assert!(c < self.n && out.len() == self.k, "dequantize_row {c} of {self:?} into {}", out.len());
        let nb = self.k / QK;
        with_blocks!(&self.blocks, w => {
            for (b, o) in w[c * nb..(c + 1) * nb].iter().zip(out.chunks_exact_mut(QK)) {
                b.dequantize(o);
            }
        })
    }

    /// The whole matrix as f32, row-major `[n, k]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for (c, row) in out.chunks_exact_mut(self.k).enumerate() {
            self.dequantize_row(c, row);
        }
        out
    }

    /// `y[m, n] = x[m, k] · Wᵀ` with the best kernel for this CPU ([`Kernel::best`]).
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        self.matmul_with(Kernel::best(), x, m, y)
    }

    /// `y[m, n] = x[m, k] · Wᵀ` with the given kernel (panics if it is not available here).
    pub fn matmul_with(&self, kernel: Kernel, x: &[f32], m: usize, y: &mut [f32]) {
        assert_eq!(y.len(), m * self.n, "matmul: y has {} values, want {m} × {}", y.len(), self.n);
        // SAFETY: y holds m × n values (asserted) and is borrowed mutably for the call.
        unsafe { self.matmul_raw(kernel, x, m, y.as_mut_ptr()) }
    }

    /// `x[m, k] · Wᵀ` as a new `m × n` vector with the best kernel, written once (no zeroing
    /// of the output first: every element is one kernel store).
    pub fn matmul_vec(&self, x: &[f32], m: usize) -> Vec<f32> {
        let len = m * self.n;
        let mut y = Vec::<f32>::with_capacity(len);
        // SAFETY: the allocation holds `len` values; `matmul_raw` writes every one of them
        // (each column of each row is stored by exactly one task) before `set_len`.
        unsafe {
            self.matmul_raw(Kernel::best(), x, m, y.as_mut_ptr());
            y.set_len(len);
        }
        y
    }

    /// # Safety
    /// `y` must be valid for writes of `m × n` f32 values, with no other access meanwhile.
    unsafe fn matmul_raw(&self, kernel: Kernel, x: &[f32], m: usize, y: *mut f32) {
        assert!(kernel.available(), "{kernel:?} kernel is not available on this CPU");
        assert_eq!(x.len(), m * self.k, "matmul: x has {} values, want {m} × {}", x.len(), self.k);
        if m == 0 || self.n == 0 {
            return;
        }
        let nb = self.k / QK;
        with_scratch(m * nb, |acts| {
            quantize_rows(kernel, x, self.k, acts);
            let out = OutPtr(y);
            let threads = crate::ops::cpu_threads::threads();
            let run = |starts: Starts<'_>| {
                // Columns in multiples of 4 (the decode tile).
                for_column_chunks(self.n, threads, m * self.n * self.k, 16, 4, |cols| {
                    // SAFETY: y is m × n (the caller's contract) for the whole call; tasks
                    // write disjoint column ranges.
                    unsafe { self.matmul_cols(kernel, acts, starts, m, cols, out.get()) };
                });
            };
            #[cfg(target_arch = "x86_64")]
            if kernel == Kernel::Avx512Vnni {
                return super::avx512::with_starts(self.quant_type(), acts, run);
            }
            run(Default::default())
        })
    }

    /// # Safety
    /// `y` must be valid for writes at `r * n + c` for `r < m`, `c` in `cols`, exclusively.
    unsafe fn matmul_cols(
        &self,
        kernel: Kernel,
        acts: &[Q8Block],
        starts: Starts<'_>,
        m: usize,
        cols: Range<usize>,
        y: *mut f32,
    ) {
        let _ = starts;
        let nb = self.k / QK;
        with_blocks!(&self.blocks, w => match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `available()` was asserted by the caller; sizes checked there.
            Kernel::Avx2 => unsafe { super::avx2::plain::matmul_cols(w, nb, acts, m, cols, y, self.n) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Kernel::AvxVnni => unsafe { super::avx2::vnni::matmul_cols(w, nb, acts, m, cols, y, self.n) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Kernel::Avx512Vnni => unsafe { super::avx512::matmul_cols(w, nb, acts, starts, m, cols, y, self.n) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            Kernel::Neon => unsafe { super::neon::matmul_cols(super::neon::Flavor::Base, w, nb, acts, m, cols, y, self.n) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            Kernel::NeonDot => unsafe { super::neon::matmul_cols(super::neon::Flavor::Dot, w, nb, acts, m, cols, y, self.n) },
            // SAFETY: forwarded from the caller.
            _ => unsafe { reference::matmul_cols(w, nb, acts, m, cols, y, self.n) },
        })
    }
}

/// Cuts a matmul's output columns `0..n` into about four tasks per thread (each at least
/// `min_cols` columns, a multiple of `align`) and runs `f` on each over candle's barrier pool:
/// the pool (spin, then park) its own kernels run on, so one set of workers stays hot instead
/// of two fighting over the cores, which matters for the many short matmuls of a decode step.
/// With one thread, or under ~100k multiply-adds (`work`), where a task costs more than it
/// saves, `f` gets all columns on this thread. Each column is computed whole by one task, so
/// the cut never changes a result.
pub(super) fn for_column_chunks(
    n: usize,
    threads: usize,
    work: usize,
    min_cols: usize,
    align: usize,
    f: impl Fn(Range<usize>) + Sync,
) {
    if threads <= 1 || work < 1 << 17 {
        f(0..n);
        return;
    }
    let chunk = n.div_ceil(threads * 4).max(min_cols).next_multiple_of(align.max(1));
    let run = |tasks: Range<usize>| {
        for t in tasks {
            f(t * chunk..((t + 1) * chunk).min(n));
        }
    };
    crate::ops::cpu_threads::execute_chunked(n.div_ceil(chunk), run);
}

/// The output pointer, shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
// SAFETY: only used for disjoint writes while the owning slice is mutably borrowed.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
impl OutPtr {
    /// A method (not field access) so closures capture the whole `Sync` wrapper.
    pub(super) fn get(self) -> *mut f32 {
        self.0
    }
}

/// Quantises the `m = acts.len() / nb` rows of `x`, in parallel for long inputs.
fn quantize_rows(kernel: Kernel, x: &[f32], k: usize, acts: &mut [Q8Block]) {
    let nb = k / QK;
    if x.len() >= 1 << 15 && rayon::current_num_threads() > 1 && crate::ops::cpu_threads::limit() > 1 {
        acts.par_chunks_mut(nb).zip(x.par_chunks(k)).for_each(|(a, x)| quantize_row(kernel, x, a));
    } else {
        acts.chunks_mut(nb).zip(x.chunks(k)).for_each(|(a, x)| quantize_row(kernel, x, a));
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<Q8Block>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` scratch blocks: this thread's buffer, or a fresh one if it is in use
/// (a nested call through rayon work stealing).
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Q8Block]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < len {
                buf.resize(len, Q8Block::ZERO);
            }
            f(&mut buf[..len])
        }
        Err(_) => f(&mut vec![Q8Block::ZERO; len]),
    })
}
