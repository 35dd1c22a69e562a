//! Row-invariant quantised matmuls on CUDA (`tandem-kernels/cuda/qmatmul.cu`) for GGML weights
//! of every type tandem loads (Q4_0 .. Q8_0, Q2_K .. Q6_K, dense f32/f16/bf16), at every call size.
//!
//! candle's CUDA kernels pick by row count (a vector kernel up to 8 rows, a tiled one beyond)
//! and quantise the activations to 8 bits; the tiled kernel, and for Q8_0 / Q6_K even the
//! vector kernel, sum a row differently from the same row computed alone, so a verify chunk
//! could flip a near-tie that plain decoding resolves the other way. Here every row gets one
//! fixed order (see the kernel's header), weights are decoded to the CPU dequantisation's
//! bits and activations stay f32. [`WeightFormat`] also describes the stacked expert weights
//! the MoE kernels read (`ops::moe`). `matmul_raw` hands Q8_0 to [`super::cuda_qmma`], Q4_K /
//! Q5_K / Q6_K rows that fit to [`super::cuda_kqmma`] and bf16 to [`super::cuda_tmma`] (the
//! tensor-core kernels, each row-invariant in its own chain); the choice depends on the matrix
//! alone, never on the call's rows.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};

use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, cuda_device, i32_of, run, tensor, Inputs};

/// Output columns per thread block of `qmatmul_*` (4 warps x 4 columns, `qmatmul.cu`).
const COLS_PER_BLOCK: usize = 16;

/// A weight row format the kernels decode: the kernel-name suffix and the bytes of a block of
/// `block` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightFormat {
    pub suffix: &'static str,
    pub block: usize,
    pub block_bytes: usize,
}

impl WeightFormat {
    /// The format of a GGML type, `None` for the types the kernels do not decode.
    pub fn of_ggml(t: GgmlDType) -> Option<Self> {
        let (suffix, block, block_bytes) = match t {
            GgmlDType::F32 => ("f32", 1, 4),
            GgmlDType::F16 => ("f16", 1, 2),
            GgmlDType::BF16 => ("bf16", 1, 2),
            GgmlDType::Q4_0 => ("q4_0", 32, 18),
            GgmlDType::Q4_1 => ("q4_1", 32, 20),
            GgmlDType::Q5_0 => ("q5_0", 32, 22),
            GgmlDType::Q5_1 => ("q5_1", 32, 24),
            GgmlDType::Q8_0 => ("q8_0", 32, 34),
            GgmlDType::Q4K => ("q4_k", 256, 144),
            GgmlDType::Q5K => ("q5_k", 256, 176),
            GgmlDType::Q6K => ("q6_k", 256, 210),
            GgmlDType::Q2K => ("q2_k", 256, 84),
            GgmlDType::Q3K => ("q3_k", 256, 110),
            _ => return None,
        };
        Some(Self { suffix, block, block_bytes })
    }

    /// The format of a dense tensor dtype.
    pub fn of_dtype(t: DType) -> Option<Self> {
        match t {
            DType::F32 => Self::of_ggml(GgmlDType::F32),
            DType::F16 => Self::of_ggml(GgmlDType::F16),
            DType::BF16 => Self::of_ggml(GgmlDType::BF16),
            _ => None,
        }
    }

    /// Whether rows of `k` values fit: quantised rows of whole blocks (and 32-value units);
    /// dense rows of a multiple of 4 values (rows start 16-byte aligned for vector loads; a
    /// last partial unit is handled value by value).
    pub fn fits(&self, k: usize) -> bool {
        match self.block {
            1 => k > 0 && k.is_multiple_of(4),
            b => k > 0 && k.is_multiple_of(32) && k.is_multiple_of(b),
        }
    }

    /// Bytes of a row of `k` values.
    pub fn row_bytes(&self, k: usize) -> usize {
        k / self.block * self.block_bytes
    }
}

/// Whether `q` `[n, k]` and `x` go to the kernel here (`TANDEM_QUANT_KERNEL=candle` sends
/// them back to candle's kernels: faster prefill, not row-invariant).
pub fn supports(q: &QTensor, x: &Tensor) -> bool {
    q.device().is_cuda()
        && x.device().is_cuda()
        && x.rank() >= 2
        && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && q.shape().dims2().is_ok_and(|(_, k)| WeightFormat::of_ggml(q.dtype()).is_some_and(|f| f.fits(k)))
        && !super::Kernel::candle_only()
}

/// `x · Wᵀ` for `x` `[..., k]`, f32 out.
pub fn forward(q: &QTensor, x: &Tensor) -> Result<Tensor> {
    let fmt = WeightFormat::of_ggml(q.dtype())
        .ok_or_else(|| ModelError::Input(format!("quantised matmul: {:?} has no CUDA kernel", q.dtype())))?;
    let (n, k) = q.shape().dims2()?;
    let ptr = q.device_ptr()? as u64;
    matmul_raw(fmt, ptr, n, k, x)
}

/// `(silu(g) ⊙ u) · Wᵀ` in one launch where the format's kernel can form the activations
/// itself ([`matmul_raw_gated`]); `None` otherwise.
pub fn forward_gated(q: &QTensor, g: &Tensor, u: &Tensor) -> Result<Option<Tensor>> {
    let Some(fmt) = WeightFormat::of_ggml(q.dtype()) else { return Ok(None) };
    let (n, k) = q.shape().dims2()?;
    matmul_raw_gated(fmt, q.device_ptr()? as u64, n, k, g, u)
}

/// Whether a gated MLP's down projection forms its activations in the matmul's own kernels
/// where its format's kernels can ([`matmul_raw_gated`]; bits checked by check-device's `gated down
/// projection` rows). `TANDEM_GATED_GEMV`: unset or `1`, every format that can (Q8_0: 9B decode
/// 225.2 -> 227.3 tok/s on an H100; Q4_K: pp512 +1.9%, decode the same, on an H200, both
/// 2026-12-07); `0` none (a separate `silu_mul_rows` pass first, the same bits).
pub fn gated_enabled() -> bool {
    static MODE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| std::env::var("TANDEM_GATED_GEMV").as_deref() != Ok("0"))
}

/// [`matmul_raw`] of `silu(g) ⊙ u` where the format's kernels form the activations as they
/// read them: Q8_0 and the K-quants quantise `silu(g) ⊙ u` directly (every row count); `None`
/// where the caller must run `silu_mul` and [`matmul_raw`] (other formats, views that do not
/// suit). bf16 weights are not fused: their GEMV splits the activations in every column block,
/// so each of its 256 blocks would compute silu over the whole row again (measured 13% slower
/// on the 9B decode, H100, docs/PERFORMANCE.md).
pub(crate) fn matmul_raw_gated(
    fmt: WeightFormat,
    w: u64,
    n: usize,
    k: usize,
    g: &Tensor,
    u: &Tensor,
) -> Result<Option<Tensor>> {
    // The kernels use silu_mul_rows' expression: not where `silu_mul` runs candle's ops.
    if !gated_enabled() || !crate::ops::norm::enabled() || g.rank() != 2 || g.dim(1)? != k || !fmt.fits(k) {
        return Ok(None);
    }
    let q8 = fmt.suffix == "q8_0" && super::cuda_qmma::enabled();
    if !q8 && !super::cuda_kqmma::takes(fmt, w, k) {
        return Ok(None);
    }
    // The quantisers' scalar loads: rows on 4-byte boundaries.
    let Some(rows) = crate::ops::cuda_util::gated_rows(g, u, 4)? else { return Ok(None) };
    if q8 {
        return super::cuda_qmma::matmul_q8_0_of(w, n, k, fmt.row_bytes(k), g, Some(rows)).map(Some);
    }
    super::cuda_kqmma::matmul_of(fmt, w, n, k, g, Some(rows)).map(Some)
}

/// Rows from which a call takes `qmatmul_tiled_*` (`qmatmul.cu`).
const TILED_MIN_ROWS: usize = 16;
/// Rows and columns per block of the tiled kernel (`TT_R`, `TT_W * TT_C`).
const TILED_ROWS: usize = 16;
const TILED_COLS: usize = 32;

/// Which tiled kernel calls of many rows take: `TANDEM_QMATMUL_TILED` = 2 (the default: the
/// register budget of two blocks per SM; 32% faster than 1 for f32 weights on the H200, the
/// same for quantised ones), 1 (one block per SM) or 0 (none: every call on the small-row
/// kernel, for comparisons). All give the same bits.
fn tiled_variant() -> u8 {
    static V: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *V.get_or_init(|| match std::env::var("TANDEM_QMATMUL_TILED").as_deref() {
        Ok("0") => 0,
        Ok("1") => 1,
        _ => 2,
    })
}

/// Whether one-row calls take `qmatmul1_*` (one column per warp: 9B Q8_0 decode 120 tok/s on
/// the H200 against 53 on the 2..15-row kernel; 2 or 4 columns per warp were slower).
/// `TANDEM_QMATMUL_DECODE=rows` sends them to the 2..15-row kernel, for comparisons; both give
/// the same bits.
fn single_row_kernel() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("TANDEM_QMATMUL_DECODE").as_deref() != Ok("rows"))
}

/// Calls of 2..=8 rows on dense weights (f32 / f16 / bf16) take `qmatmul_staged_*` (a warp per
/// output column, the row staged through shared memory by cp.async) instead of `qmatmul_*` (4
/// columns x 8 rows a warp); `TANDEM_DENSE_STAGED=0` keeps them there, `=1` sends one row too
/// (one row stays on `qmatmul1_*` by default). All give the same bits. Measured on the H200 (9B
/// bf16): a K = 4 verify step 65.2 steps/s against 46.2; one row 157.9 tok/s against 168.8.
const STAGED_ROWS: std::ops::RangeInclusive<usize> = 2..=8;

fn staged_rows(m: usize) -> bool {
    static V: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let v = *V.get_or_init(|| match std::env::var("TANDEM_DENSE_STAGED").as_deref() {
        Ok("0") => None,
        Ok("1") => Some(true),
        _ => Some(false),
    });
    match v {
        None => false,
        Some(one) => STAGED_ROWS.contains(&m) || (one && m == 1),
    }
}

/// `x · Wᵀ` for W `n` rows of `k` values in `fmt` at device address `w` (kept alive by the
/// caller for the call; all on one stream).
pub(crate) fn matmul_raw(fmt: WeightFormat, w: u64, n: usize, k: usize, x: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("quantised matmul: not a CUDA tensor".into()))?;
    let mut out_shape = x.dims().to_vec();
    let last = out_shape.len() - 1;
    if out_shape[last] != k || !fmt.fits(k) {
        return Err(ModelError::Input(format!(
            "quantised matmul: x {:?} against W [{n}, {k}] ({})",
            x.dims(),
            fmt.suffix
        )));
    }
    out_shape[last] = n;
    let m = x.elem_count() / k;
    if fmt.suffix == "q8_0" && super::cuda_qmma::enabled() {
        let x = x.reshape((m, k))?;
        return Ok(super::cuda_qmma::matmul_q8_0(w, n, k, fmt.row_bytes(k), &x)?.reshape(out_shape)?);
    }
    if super::cuda_kqmma::takes(fmt, w, k) {
        let x = x.reshape((m, k))?;
        return Ok(super::cuda_kqmma::matmul(fmt, w, n, k, &x)?.reshape(out_shape)?);
    }
    if fmt.suffix == "bf16" && super::cuda_tmma::enabled() && super::cuda_tmma::fits(w, n, k) {
        let x = x.reshape((m, k))?;
        return Ok(super::cuda_tmma::matmul_bf16(w, n, k, &x)?.reshape(out_shape)?);
    }
    let mut x = x.reshape((m, k))?.to_dtype(DType::F32)?.contiguous()?;
    if !x.layout().start_offset().is_multiple_of(4) {
        // float4 loads need rows on 16-byte boundaries: a compact copy starts at offset 0
        // (`copy` would keep the offset, and the whole buffer).
        x = x.force_contiguous()?;
    }
    // Calls of TILED_MIN_ROWS+ rows take the tiled kernel: the same arithmetic per element,
    // so the choice never changes a row's bits.
    let tiled = m >= TILED_MIN_ROWS && tiled_variant() != 0;
    // One row (decode) takes a kernel of one column per warp (more warps over the matrix).
    let single = m == 1 && single_row_kernel();
    // Dense rows of whole 32-value units, 16-byte aligned, for calls of 2..8 rows: the staged
    // kernel (the same chain per row as qmatmul1 / qmatmul).
    let staged = fmt.block == 1 && staged_rows(m) && k.is_multiple_of(32) && w.is_multiple_of(16);
    if staged {
        let name = format!("qmatmul_staged_{}_{}", fmt.suffix, m.next_power_of_two());
        let f = dev.kernel(&name, tandem_kernels::ptx(tandem_kernels::QMATMUL))?;
        let inputs = Inputs::new(&[&x])?;
        let xv = inputs.view::<f32>(0)?;
        let y = alloc_f32(&dev, m * n)?;
        let (mi, ni, ki) = (i32_of(m)?, i32_of(n)?, i32_of(k)?);
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(4) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        let mut b = f.builder();
        b.arg(&y).arg(&xv).arg(&w).arg(&mi).arg(&ni).arg(&ki);
        // SAFETY: arguments in qmatmul_staged_*'s order; y holds m*n, x m*k (contiguous f32,
        // rows 16-byte aligned), W n dense rows of k values (k a multiple of 32, so rows are
        // whole 16-byte pieces; W 16-byte aligned); 4 warps a block, static shared memory.
        unsafe { run(&mut b, cfg, &name)? };
        drop(b);
        drop(xv);
        drop(inputs);
        return Ok(tensor(y, &dev, (m, n)).reshape(out_shape)?);
    }
    let name = match (tiled, tiled_variant()) {
        (true, 2) => format!("qmatmul_tiled2_{}", fmt.suffix),
        (true, _) => format!("qmatmul_tiled_{}", fmt.suffix),
        _ if single => format!("qmatmul1_{}", fmt.suffix),
        _ => format!("qmatmul_{}", fmt.suffix),
    };
    let f = dev.kernel(&name, tandem_kernels::ptx(tandem_kernels::QMATMUL))?;
    let inputs = Inputs::new(&[&x])?;
    let xv = inputs.view::<f32>(0)?;
    let y = alloc_f32(&dev, m * n)?;
    let (mi, ni, ki, rb) = (i32_of(m)?, i32_of(n)?, i32_of(k)?, fmt.row_bytes(k) as i64);
    let cfg = if tiled {
        LaunchConfig {
            grid_dim: (n.div_ceil(TILED_COLS) as u32, m.div_ceil(TILED_ROWS) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    } else if single {
        LaunchConfig { grid_dim: (n.div_ceil(4) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 }
    } else {
        LaunchConfig {
            grid_dim: (n.div_ceil(COLS_PER_BLOCK) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        }
    };
    let mut b = f.builder();
    b.arg(&y).arg(&xv).arg(&w).arg(&mi).arg(&ni).arg(&ki).arg(&rb);
    // SAFETY: arguments in the kernel's order; y holds m*n, x m*k (contiguous, f32, rows start
    // 16-byte aligned as k is a multiple of 32), W n rows of `rb` bytes.
    if m > 0 {
        unsafe { run(&mut b, cfg, &name)? };
    }
    drop(b);
    drop(xv);
    drop(inputs);
    Ok(tensor(y, &dev, (m, n)).reshape(out_shape)?)
}
