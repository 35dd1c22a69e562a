//! candle's CPU `QMatMul` with every output row independent of how many rows the call has.
//!
//! Speculative decoding is lossless only if a verify chunk (k + 1 rows, or any rows of a ragged
//! batch) gives each row the bits a decode step (one row) gives it. candle 0.11 picks its x86_64 kernel per call from the number of rows `m`, and the kernels sum in
//! different orders:
//!
//! * **Q6K**: `m == 1` runs ggml's dot products on the compact blocks (`k_quants::matmul`),
//!   `m > 1` the repacked VNNI tiles (`repack_x86::matmul_tiles`, per-sub-block f32 scales):
//!   a few ulps apart, enough to flip a near-tie of two logits;
//! * **Q4K**: `m >= 32` runs AMX tiles where the CPU has AMX, smaller calls the repacked VNNI
//!   tiles (which are row-invariant among themselves). On AVX-512 VNNI CPUs a GGUF's (or
//!   `--quantize`'s) Q4K matrices do not come here at all: they load as [`super::kquant`]'s packed
//!   matrices, row-invariant by construction.
//!
//! [`forward`] keeps candle's decode arithmetic and routes the other calls so that every
//! row gets it: Q6K calls on x86 (several rows, and one row too unless
//! `TANDEM_Q6K_DECODE=candle`) go to [`super::q6k`] (a
//! row-tiled copy of candle's AVX2 dot product: same bits, each weight superblock decoded once
//! per tile of rows), or where candle would not use that kernel, to candle's `k_quants::matmul`
//! on the compact blocks (each (row, column) there is the same `vec_dot_4` / `vec_dot_2` /
//! `vec_dot` of the same column group whatever `m` and the thread split are); on AMX CPUs Q4K
//! calls are cut into pieces of fewer than 32 rows (not testable on a CPU without AMX). On
//! aarch64 with `dotprod` / `i8mm`, candle's repacked Q4K, Q5K and Q6K kernels sum a single row (a
//! gemv) differently from a multiple of 4 rows (tiles), so those calls are padded with zero
//! rows to a multiple of 4. Every other quantised type already gives each row the same bits
//! for any `m` (`tests/row_invariance.rs` checks them all, on aarch64 under `make test-neon`).
//!
//! Dense weights (`QMatMul::Tensor`: safetensors models, whose bf16 / f16 matrices stay 16-bit,
//! GGUF F32/F16/BF16 tensors, which candle dequantises to f32, and dense embeddings used as LM
//! heads) with CPU f32 inputs go,
//! for every `m` including decode's 1, to [`super::dense`], whose every element is one dot
//! product in a fixed order: candle's f32 matmul (`gemm`) sums a single row differently from
//! several. `TANDEM_DENSE_KERNEL=candle` sends them back to candle (for speed comparisons; not
//! row-invariant). On CUDA, dense f32/f16/bf16 weights go to [`super::cuda_dense`] (one fixed
//! order per element, every call size) for the same reason: cuBLAS picks algorithms by shape.
//! Quantised weights on CUDA go to [`super::cuda_quant`] (our kernels, every call size; Q2_K
//! and Q3_K stay on candle's, not row-invariant beyond its 8-row vector kernel;
//! `TANDEM_QUANT_KERNEL=candle` sends every type back there for speed comparisons). Other devices and
//! dtypes, and `QMatMul::TensorF16` (only made when `CANDLE_DEQUANTIZE_ALL_F16` is set), stay
//! on candle's path, not row-invariant.
//!
//! The price: multi-row Q6K calls (prefill, verify chunks) lose candle's repacked VNNI tiles,
//! about 2-2.5× slower on those matrices (about 15% of a Q4_K_M model's prefill); decode is
//! unchanged. The dense kernel is as fast as candle's for prefill and faster for decode
//! (candle's single-row f32 path is slow).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Result, Storage, Tensor};

/// `(silu(g) ⊙ u) · Wᵀ` in one kernel where the weights' CUDA kernel can form the activations
/// itself (the bits of [`forward`] of `silu_mul(g, u)`); `None` otherwise (the caller runs both).
pub fn forward_gated(w: &QMatMul, g: &Tensor, u: &Tensor) -> crate::error::Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    {
        if let QMatMul::QTensor(q) = w {
            if super::cuda_quant::supports(q, g) {
                return super::cuda_quant::forward_gated(q, g, u);
            }
        }
    }
    let _ = (w, g, u);
    Ok(None)
}

/// `x · Wᵀ` for `x` `[..., k]`, row-invariant (see the module docs).
pub fn forward(w: &QMatMul, x: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let QMatMul::Tensor(t) = w {
        if super::cuda_dense::supports(t, x) && dense_enabled() {
            return super::cuda_dense::forward(t, x).map_err(|e| candle_core::Error::Msg(e.to_string()));
        }
    }
    #[cfg(feature = "cuda")]
    if let QMatMul::QTensor(q) = w {
        if super::cuda_quant::supports(q, x) {
            return super::cuda_quant::forward(q, x).map_err(|e| candle_core::Error::Msg(e.to_string()));
        }
    }
    if let QMatMul::Tensor(t) = w {
        if t.device().is_cpu()
            && x.device().is_cpu()
            && matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16)
            && x.dtype() == DType::F32
            && t.rank() == 2
            && x.rank() >= 2
            && dense_enabled()
        {
            return super::dense::forward(t, x);
        }
    }
    if let QMatMul::QTensor(q) = w {
        if q.device().is_cpu() && x.device().is_cpu() && x.dtype() == DType::F32 && x.rank() >= 2 {
            let rows = x.elem_count() / x.dim(candle_core::D::Minus1)?.max(1);
            match q.dtype() {
                // Several rows always (candle's multi-row kernel sums in another order); one
                // row too (the same bits as candle's decode path, on our thread pool with the
                // weights prefetched), unless `TANDEM_Q6K_DECODE=candle`.
                GgmlDType::Q6K if cfg!(target_arch = "x86_64") && (rows > 1 || q6k_decode()) => {
                    return compact_matmul(q, x)
                }
                GgmlDType::Q4K if rows >= AMX_MIN_ROWS && amx_possible() => return in_pieces(w, x, AMX_PIECE),
                GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K if !rows.is_multiple_of(4) && arm_tiles() => {
                    return padded_to_tiles(w, x, rows)
                }
                _ => {}
            }
        }
    }
    if let QMatMul::Tensor(t) = w {
        if t.dtype() != x.dtype() {
            // 16-bit dense weights on candle's path (cuBLAS comparisons): products in the
            // weights' type, the result back in the activations'.
            return w.forward(&x.to_dtype(t.dtype())?)?.to_dtype(x.dtype());
        }
    }
    w.forward(x)
}

/// Whether dense f32 weights go to [`super::dense`]: yes unless `TANDEM_DENSE_KERNEL=candle`
/// (candle's own matmul, not row-invariant; for speed comparisons).
pub(crate) fn dense_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| !std::env::var("TANDEM_DENSE_KERNEL").is_ok_and(|v| v.eq_ignore_ascii_case("candle")))
}

/// Whether one-row Q6K calls go to [`super::q6k`] (where it runs, unless
/// `TANDEM_Q6K_DECODE=candle`).
fn q6k_decode() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OURS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OURS.get_or_init(|| {
            super::q6k::available()
                && !std::env::var("TANDEM_Q6K_DECODE").is_ok_and(|v| v.eq_ignore_ascii_case("candle"))
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// candle sends Q4K calls of at least this many rows to AMX.
const AMX_MIN_ROWS: usize = 32;
/// Rows per call on AMX CPUs: below [`AMX_MIN_ROWS`], a multiple of the VNNI kernel's 4-row
/// tile.
const AMX_PIECE: usize = 28;

/// Whether candle might use AMX here (its own test: CPUID leaf 7 AMX-TILE and AMX-INT8 on an
/// AVX-512 VNNI CPU; it also needs the kernel's permission, which we do not ask for, so this
/// may say yes where candle ends up not using AMX: that costs a little prefill speed only).
fn amx_possible() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static AMX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AMX.get_or_init(|| {
            if !(crate::ops::quant::avx512_allowed()
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vnni"))
            {
                return false;
            }
            // CPUID leaf 7 exists on every CPU with AVX-512.
            let info = core::arch::x86_64::__cpuid_count(7, 0);
            info.edx & (1 << 25) != 0 && info.edx & (1 << 24) != 0
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether candle runs Q4K / Q5K / Q6K on its repacked aarch64 kernels: with `dotprod` or
/// `i8mm` (Apple M1 and later, Graviton 2 and later), a call of a multiple of 4 rows takes the
/// tiled matmul, a single row (and the rows past a multiple of 4) the gemv, and the two sum in
/// different orders (Q4K and Q5K always, Q6K without i8mm: `tests/row_invariance.rs` under
/// `make test-neon`, which runs the CPUs of both kinds).
fn arm_tiles() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        static TILES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *TILES.get_or_init(|| {
            std::arch::is_aarch64_feature_detected!("dotprod") || std::arch::is_aarch64_feature_detected!("i8mm")
        })
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// `x` padded with zero rows to a multiple of 4 so every row takes candle's tiled aarch64
/// kernel (whose rows are independent of the call's size and of their place in a tile), the
/// padding cut off again. A decode step multiplies 4 rows for one: the same weight bytes,
/// which is what a memory-bound step costs.
fn padded_to_tiles(w: &QMatMul, x: &Tensor, rows: usize) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let k = dims[dims.len() - 1];
    let x2 = x.reshape((rows, k))?;
    let pad = Tensor::zeros((rows.next_multiple_of(4) - rows, k), x.dtype(), x.device())?;
    let y = w.forward(&Tensor::cat(&[&x2, &pad], 0)?)?.narrow(0, 0, rows)?;
    let mut out = dims;
    *out.last_mut().unwrap_or_else(|| unreachable!()) = y.dim(1)?;
    y.reshape(out)
}

/// The rows of `x` in calls of at most `piece` rows, concatenated.
fn in_pieces(w: &QMatMul, x: &Tensor, piece: usize) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let k = dims[dims.len() - 1];
    let x2 = x.reshape(((), k))?;
    let rows = x2.dim(0)?;
    let parts = (0..rows)
        .step_by(piece)
        .map(|r| w.forward(&x2.narrow(0, r, piece.min(rows - r))?))
        .collect::<Result<Vec<_>>>()?;
    let y = Tensor::cat(&parts, 0)?;
    let mut out = dims;
    *out.last_mut().unwrap_or_else(|| unreachable!()) = y.dim(1)?;
    y.reshape(out)
}

/// The product candle's `m == 1` Q6K path (its generic CPU quantised matmul on the compact
/// blocks) gives each row, for any number of rows: our row-tiled copy of its AVX2 kernel
/// ([`super::q6k`]) where that is what candle runs, else candle's generic matmul itself.
fn compact_matmul(q: &QTensor, x: &Tensor) -> Result<Tensor> {
    use candle_core::quantized::k_quants::{self, BlockQ6K};

    let (n, k) = q.shape().dims2()?;
    let dims = x.dims().to_vec();
    if dims[dims.len() - 1] != k {
        candle_core::bail!("Q6K matmul: input {dims:?} does not end in k = {k}");
    }
    let x = x.contiguous()?;
    let m = x.elem_count() / k;
    let data = q.data()?;
    let size = std::mem::size_of::<BlockQ6K>();
    if data.len() != n * k / k_quants::QK_K * size
        || !(data.as_ptr() as usize).is_multiple_of(std::mem::align_of::<BlockQ6K>())
    {
        candle_core::bail!("Q6K matmul: {} bytes of blocks for [{n}, {k}]", data.len());
    }
    // SAFETY: CPU QTensor storage is a `Vec<BlockQ6K>` (`repr(C)`, any bit pattern valid); the
    // size and alignment are checked above, and `data` borrows it for the whole call.
    let blocks = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const BlockQ6K, data.len() / size) };
    let mut dst = vec![0f32; m * n];
    {
        let (storage, layout) = x.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else { candle_core::bail!("Q6K matmul: input is not on the CPU") };
        let start = layout.start_offset();
        let lhs = &cpu.as_slice::<f32>()?[start..start + m * k];
        #[cfg(target_arch = "x86_64")]
        if super::q6k::available() {
            super::q6k::matmul(blocks, n, k, lhs, m, &mut dst);
        } else {
            k_quants::matmul::<BlockQ6K>((m, k, n), lhs, blocks, &mut dst)?;
        }
        #[cfg(not(target_arch = "x86_64"))]
        k_quants::matmul::<BlockQ6K>((m, k, n), lhs, blocks, &mut dst)?;
    }
    let mut out = dims;
    *out.last_mut().unwrap_or_else(|| unreachable!()) = n;
    Tensor::from_vec(dst, out, &Device::Cpu)
}
