//! Q4_K / Q5_K / Q6_K matmuls with 8-bit activations on CUDA (`tandem-kernels/cuda/kqmma.cu`),
//! the K-quant counterpart of [`super::cuda_qmma`]: the activations are quantised per 32-value
//! block (`q8_quantize_rows_sums`: codes, scale, and scale times code sum), each sub-block's dot product
//! with the weight codes is an exact integer (`__dp4a` in the warp-per-column GEMV for up to
//! eight rows, int8 `mma.sync` in a shared-memory tiled GEMM for more), and the sub-blocks' scaled terms are added in a chain
//! fixed by `k` alone (the kernel's header), so decode, verify chunks, batches and prefill give
//! a row the same bits. Against [`super::cuda_quant`]'s exact-weight f32 kernels this trades
//! the activations' last bits (as llama.cpp's CUDA build and the CPU's K-quant kernels do) for
//! coalesced weight reads in decode and the tensor cores in prefill. `TANDEM_KQ_MMA=0` sends
//! K-quants back to the f32 kernels, for comparisons.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::cuda_quant::WeightFormat;
use crate::error::{ModelError, Result};
use crate::ops::cuda_util::{alloc_f32, allow_dynamic_shared, cuda_device, i32_of, run, tensor, Inputs};

const MODULE: &str = "tandem_kqmma";

fn ptx() -> &'static str {
    tandem_kernels::ptx("kqmma", tandem_kernels::KQMMA)
}

/// Whether K-quant weights take these kernels (the default).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_KQ_MMA").map_or(true, |v| v != "0"))
}

/// Whether W (`fmt`, rows of `k` values at device address `w`) takes these kernels: Q4_K,
/// Q5_K or Q6_K, 16-byte aligned (Q6_K's 210-byte superblocks then start on even addresses;
/// the kernels copy the 16-byte aligned windows around them). The choice depends on the
/// matrix alone, never on the call's rows.
pub fn takes(fmt: WeightFormat, w: u64, k: usize) -> bool {
    matches!(fmt.suffix, "q4_k" | "q5_k" | "q6_k") && k.is_multiple_of(256) && w.is_multiple_of(16) && enabled()
}

/// Output columns per block of `qkgemm_*` (`KG_BN`).
const GEMM_COLS: usize = 64;

const BIG_MODULE: &str = "tandem_kqgemm";
/// Columns and rows of a `qkgemm64_*` block (`KB_BN`, `KB_BM`).
const BIG_TILE: usize = 64;
/// Rows from which calls take `qkgemm64_*`.
const BIG_ROWS: usize = 64;

/// Whether calls of 64+ rows take the prefill GEMM (`kqgemm.cu`; `TANDEM_KQ_GEMM64=0` keeps
/// them on `qkgemm_*_32`, for comparisons: the same bits).
fn big_gemm() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_KQ_GEMM64").map_or(true, |v| v != "0"))
}

/// `KbLayout<KT>::BYTES` of `kqgemm.cu`: two stages of raw superblocks (64 columns, each the
/// 16-byte aligned window around its superblock: 224 bytes for Q6_K) and of 64 activation rows
/// (272 bytes of codes, 48 of dx and 48 of dxs each), the decoded codes (64 x 272), the
/// factors (64 x 9 float2) and Q6_K's d (64 floats).
fn big_smem_bytes(suffix: &str) -> u32 {
    let st = match suffix {
        "q4_k" => 144,
        "q5_k" => 176,
        _ => 224,
    };
    let raw = BIG_TILE * st + 16;
    let bytes =
        2 * raw + 2 * BIG_TILE * 272 + 2 * 2 * BIG_TILE * 12 * 4 + BIG_TILE * 272 + BIG_TILE * 9 * 8 + BIG_TILE * 4;
    bytes as u32
}

/// Rows up to which calls take `qkmv_*` (a warp per output column) rather than `qkgemm_*`;
/// `TANDEM_KQ_GEMV_ROWS=N` moves the limit (0..8; 0: every call on the GEMM), for
/// comparisons. Both give the same bits. Measured on the H200 (9B Q4_K_M, verify steps of
/// 1..8 rows in decode steps): with 4, 1.49 / 1.88 / 2.25 / 2.53 / 2.69 / 2.77 / 2.80 for 1, 2,
/// 3, 4, 5, 7, 8 rows; with 8 the GEMV's 5..8 rows cost 2.95-3.77, with 2 its 3 rows 2.63.
fn gemv_max_rows() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TANDEM_KQ_GEMV_ROWS").ok().and_then(|v| v.parse().ok()).map_or(4, |n: usize| n.min(8))
    })
}

/// `x · Wᵀ` for `x` `[m, k]` and W `n` rows of `k` values in `fmt` at device address `w`
/// (checked by [`takes`], kept alive by the caller); `[m, n]` f32.
pub(crate) fn matmul(fmt: WeightFormat, w: u64, n: usize, k: usize, x: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("k-quant matmul: not a CUDA tensor".into()))?;
    let (m, xk) = x.dims2()?;
    if xk != k || !takes(fmt, w, k) {
        return Err(ModelError::Input(format!("k-quant matmul: x [{m}, {xk}] against W [{n}, {k}] ({})", fmt.suffix)));
    }
    let y = alloc_f32(&dev, m * n)?;
    if m == 0 || n == 0 {
        return Ok(tensor(y, &dev, (m, n)));
    }
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let (mi, ni, ki) = (i32_of(m)?, i32_of(n)?, i32_of(k)?);
    let nb = k / 32;
    // SAFETY: q8_quantize_rows_sums writes every code (m*k); dx and xs (each block's scale and
    // scaled code sum) are f32 buffers of m*nb.
    let xq = unsafe { dev.alloc::<i8>(m * k) }?;
    let xs = alloc_f32(&dev, m * nb)?;
    let dx = alloc_f32(&dev, m * nb)?;
    let inputs = Inputs::new(&[&x])?;
    let xv = inputs.view::<f32>(0)?;
    let f = dev.get_or_load_custom_func("q8_quantize_rows_sums", MODULE, ptx())?;
    let mut b = f.builder();
    b.arg(&xq).arg(&dx).arg(&xs).arg(&xv).arg(&mi).arg(&ki);
    let blocks =
        u32::try_from((m * nb).div_ceil(8)).map_err(|_| ModelError::Input("k-quant matmul: x too large".into()))?;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in q8_quantize_rows_sums' order; one warp per 32-value block of x [m, k].
    unsafe { run(&mut b, cfg, "q8_quantize_rows_sums")? };
    drop(b);

    if m >= BIG_ROWS && big_gemm() {
        // Many rows: the prefill GEMM (kqgemm.cu), 64 x 64 tiles decoded once a block.
        let name = format!("qkgemm64_{}", fmt.suffix);
        let f =
            dev.get_or_load_custom_func(&name, BIG_MODULE, tandem_kernels::ptx("kqgemm", tandem_kernels::KQGEMM))?;
        let smem = big_smem_bytes(fmt.suffix);
        allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), &name, smem)?;
        let grid_y = u32::try_from(n.div_ceil(BIG_TILE)).ok().filter(|&g| g <= 65_535);
        let grid_y = grid_y.ok_or_else(|| ModelError::Input(format!("k-quant matmul: {n} output columns")))?;
        let grid_x =
            u32::try_from(m.div_ceil(BIG_TILE)).map_err(|_| ModelError::Input("k-quant matmul: x too large".into()))?;
        let cfg = LaunchConfig { grid_dim: (grid_x, grid_y, 1), block_dim: (256, 1, 1), shared_mem_bytes: smem };
        let mut b = f.builder();
        b.arg(&y).arg(&xq).arg(&dx).arg(&xs).arg(&w).arg(&mi).arg(&ni).arg(&ki);
        // SAFETY: arguments in qkgemm64_*'s order (as qkgemm_*'s); eight warps a block, 64 columns
        // x 64 rows, `smem` bytes of dynamic shared memory (KbLayout's size, allowed above; the
        // kernel traps on less).
        unsafe { run(&mut b, cfg, &name)? };
        drop(b);
        drop(xv);
        drop(inputs);
        return Ok(tensor(y, &dev, (m, n)));
    }
    let (name, cfg) = if m <= gemv_max_rows() {
        let r = m.next_power_of_two();
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(4) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        (format!("qkmv_{}_{r}", fmt.suffix), cfg)
    } else {
        let nt = if m <= 16 { 16 } else { 32 };
        let grid_y = u32::try_from(n.div_ceil(GEMM_COLS)).ok().filter(|&g| g <= 65_535);
        let grid_y = grid_y.ok_or_else(|| ModelError::Input(format!("k-quant matmul: {n} output columns")))?;
        let cfg =
            LaunchConfig { grid_dim: (m.div_ceil(nt) as u32, grid_y, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        (format!("qkgemm_{}_{nt}", fmt.suffix), cfg)
    };
    let f = dev.get_or_load_custom_func(&name, MODULE, ptx())?;
    let mut b = f.builder();
    b.arg(&y).arg(&xq).arg(&dx).arg(&xs).arg(&w).arg(&mi).arg(&ni).arg(&ki);
    // SAFETY: arguments in qkmv_* / qkmma_*'s order; y holds m*n, xq m*k, dx and xs m*k/32, W n
    // rows of k/256 superblocks (16-byte aligned: checked by `takes`); static shared memory;
    // qkmv: 4 warps a block, a warp per column; qkgemm: 8 warps, 64 columns x nt rows a block.
    unsafe { run(&mut b, cfg, &name)? };
    drop(b);
    drop(xv);
    drop(inputs);
    Ok(tensor(y, &dev, (m, n)))
}
