//! bf16 matmuls on the tensor cores (`tandem-kernels/cuda/tmma.cu`): the activations are split
//! into two bf16 halves (`hi = bf16(x)`, `lo = bf16(x - hi)`: about 16 significant bits, where
//! candle's bf16 matmul keeps 8), each 16-value product is a bf16 `mma.sync` into f32
//! accumulators, and the products are added in a chain fixed by `k` alone (the kernel's header),
//! so every call size (decode, verify chunks, batches, prefill) gives a row the same bits. The
//! weights are the mma's A operand, so calls of 1-8 rows cost one weight read and nothing more:
//! a verify chunk of k + 1 <= 8 positions reads the matrix once, as a decode step does.
//! Against [`super::cuda_quant`]'s CUDA-core f32 chain this trades the activations' lowest
//! bits (x is carried to ~2^-16 of itself, the products are exact, the tensor core adds them)
//! for the tensor cores. Measured on the H200 (9B bf16, docs/PERFORMANCE.md): prefill 846 ->
//! 5,194 tok/s, batch 64 729 -> 2,191, a K = 4 verify step 73 -> 110 steps/s (1.42 decode
//! steps, was 2.35), batch-1 decode 172 -> 156 tok/s (the one loss: `qmatmul1`'s f32 chain
//! reads a row a little faster than the tensor-core GEMV; speculation more than makes it up).
//! `TANDEM_BF16_MMA=0` sends bf16 weights back to the CUDA-core kernels, for comparisons.
//!
//! [`Bf16Activations::Bf16`] (`--bf16-activations bf16`) runs the same chain on the hi halves
//! alone (the `_h` kernels): activations rounded to bf16, as other engines' bf16 GEMMs carry
//! them, for half the tensor-core products and half the activation traffic of the tiled
//! prefill and batch GEMMs. Every call size still gives a row the same bits; the results move
//! from the split's ~2^-16 of the f32 products to bf16's ~2^-9 per activation.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, allow_dynamic_shared, cuda_device, i32_of, run, tensor, Inputs};

use super::bf16_act::{activations, Bf16Activations};

/// The kernels' name suffix for the process's choice (`_h`: the hi halves alone).
fn suffix() -> &'static str {
    match activations() {
        Bf16Activations::Split => "",
        Bf16Activations::Bf16 => "_h",
    }
}

/// Whether bf16 weights take the tensor-core kernels (the default).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_BF16_MMA").map_or(true, |v| v != "0"))
}

/// Rows from which calls take the tiled kernels (`tmmk_bf16` up to [`split_rows`] rows on
/// narrow enough matrices, else `tmmg_bf16`: 128 rows x 64 columns a block, weights and
/// activations staged in shared memory; on Hopper [`super::cuda_tmma_wg`]'s wgmma kernels
/// in its place) rather than `tmv_bf16_*` (16 columns a block, row
/// tiles of up to 16 rows, each tile reading the weights again);
/// `TANDEM_BF16_GEMM_ROWS=N` moves it, for comparisons. Both give the same bits.
fn gemm_min_rows() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TANDEM_BF16_GEMM_ROWS").ok().and_then(|v| v.parse().ok()).map_or(17, |n: usize| n.max(1))
    })
}

/// Calls of `gemm_min_rows()..=split_rows()` rows on matrices of at most `split_cols(m)`
/// columns take `tmmk_bf16`: 64 x 64 tiles, one partition of the chain a block, the eight
/// partitions' accumulators added in order by `tmmk_sum` (tmmg_bf16's fold, so the same bits).
/// A batch of 64 rows on tmmg_bf16's 128-row tiles idles half the warps, and a 4,096-column
/// matrix makes only 64 blocks. Up to 64 rows every 9B matrix but the LM head gains (32 768
/// columns); at 65-128 rows only the narrow ones (8,192), where the wide ones' partials (32 m n
/// bytes) cost more than the idle warps (H100, docs/PERFORMANCE.md). `TANDEM_BF16_SPLIT_ROWS=0`
/// turns it off; `TANDEM_BF16_SPLIT_COLS=N` sets one column limit for every row count.
fn split_rows() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("TANDEM_BF16_SPLIT_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(128))
}
fn split_cols(m: usize) -> usize {
    static N: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let set = *N.get_or_init(|| std::env::var("TANDEM_BF16_SPLIT_COLS").ok().and_then(|v| v.parse().ok()));
    set.unwrap_or(if m <= 64 { 32_768 } else { 8_192 })
}
/// `tmmk_bf16`'s dynamic shared memory: three stages of 64 weight rows and 64 rows' two halves
/// (one half for `tmmk_bf16_h`).
fn tk_smem(halves: u32) -> u32 {
    3 * (64 + halves * 64) * 64
}

/// Warps of a `tmv_bf16_*` block and the shared memory one segment takes (`tmma.cu`: `TM_WARPS`,
/// `TV_STAGE`).
const TV_WARPS: usize = 8;
const TV_STAGE_BYTES: usize = 16 * 544;

/// Segments in flight per warp in `tmv_bf16_*`: 1 (68 KB a block, two blocks an SM: the
/// default) or 2 (136 KB, one block an SM; 9B decode 123 against 137 tok/s when last
/// measured, with the activations split by a separate pass),
/// `TANDEM_BF16_GEMV_STAGES`. Both give the same bits.
fn gemv_stages() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| if std::env::var("TANDEM_BF16_GEMV_STAGES").as_deref() == Ok("2") { 2 } else { 1 })
}

/// Whether the kernels take W `[n, k]` at device address `w`: rows of a multiple of 32 values
/// (whole steps), the matrix 16-byte aligned. A property of the weight alone, so every call on
/// it takes the same chain.
pub fn fits(w: u64, n: usize, k: usize) -> bool {
    n > 0 && k > 0 && k.is_multiple_of(32) && w.is_multiple_of(16)
}

/// `x · Wᵀ` for `x` `[m, k]` and W `n` bf16 rows of `k` values at device address `w` (kept
/// alive by the caller, [`fits`]); `[m, n]` f32.
pub(crate) fn matmul_bf16(w: u64, n: usize, k: usize, x: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("bf16 mma matmul: not a CUDA tensor".into()))?;
    let (m, xk) = x.dims2()?;
    if xk != k || !fits(w, n, k) {
        return Err(ModelError::Input(format!("bf16 mma matmul: x [{m}, {xk}] against W [{n}, {k}]")));
    }
    let y = alloc_f32(&dev, m * n)?;
    if m == 0 {
        return Ok(tensor(y, &dev, (m, n)));
    }
    let mut x = x.to_dtype(DType::F32)?.contiguous()?;
    if !x.layout().start_offset().is_multiple_of(4) {
        // float4 loads need rows on 16-byte boundaries: a compact copy starts at offset 0.
        x = x.force_contiguous()?;
    }
    let (mi, ni, ki) = (i32_of(m)?, i32_of(n)?, i32_of(k)?);
    let inputs = Inputs::new(&[&x])?;
    let xv = inputs.view::<f32>(0)?;
    if m < gemm_min_rows() {
        // Few rows: the GEMV splits the activations itself (16-row tiles beyond 8 rows).
        let nt = if m <= 8 { 8 } else { 16 };
        let stages = gemv_stages();
        let name = format!("tmv_bf16_{nt}_{stages}{}", suffix());
        let f = dev.kernel(&name, tandem_kernels::ptx(tandem_kernels::TMMA))?;
        let smem = (TV_WARPS * stages * TV_STAGE_BYTES) as u32;
        allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), &name, smem)?;
        let grid_x =
            u32::try_from(n.div_ceil(16)).map_err(|_| ModelError::Input("bf16 mma matmul: W too large".into()))?;
        let grid_y =
            u32::try_from(m.div_ceil(nt)).map_err(|_| ModelError::Input("bf16 mma matmul: x too large".into()))?;
        let mut b = f.builder();
        b.arg(&y).arg(&xv).arg(&w).arg(&mi).arg(&ni).arg(&ki);
        let cfg = LaunchConfig { grid_dim: (grid_x, grid_y, 1), block_dim: (256, 1, 1), shared_mem_bytes: smem };
        // SAFETY: arguments in tmv_bf16_*'s order; y holds m*n, x m*k f32 (rows of k, a multiple
        // of 32, from a 16-byte boundary), W n bf16 rows of k values (16-byte aligned: `fits`);
        // eight warps a block, `smem` bytes of dynamic shared memory (allowed above).
        unsafe { run(&mut b, cfg, &name)? };
        drop(b);
        drop(xv);
        drop(inputs);
        return Ok(tensor(y, &dev, (m, n)));
    }
    // More rows: the split once (every column block reads it), then the tiled kernel.
    let total = m * k;
    let lo = activations() == Bf16Activations::Split;
    // SAFETY: bf16_split_rows writes every element of xh and xl (m*k each), bf16_hi_rows every
    // element of xh.
    let xh = unsafe { dev.alloc::<u16>(total) }?;
    let xl = if lo { Some(unsafe { dev.alloc::<u16>(total) }?) } else { None };
    let split = if lo { "bf16_split_rows" } else { "bf16_hi_rows" };
    let f = dev.kernel(split, tandem_kernels::ptx(tandem_kernels::TMMA))?;
    let mut b = f.builder();
    let tl = total as i64;
    b.arg(&xh);
    if let Some(xl) = &xl {
        b.arg(xl);
    }
    b.arg(&xv).arg(&tl);
    let blocks =
        u32::try_from(total.div_ceil(256)).map_err(|_| ModelError::Input("bf16 mma matmul: x too large".into()))?;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in bf16_split_rows' order (xh, xl, x, total) or bf16_hi_rows' (xh, x,
    // total); one thread per element of x [m, k].
    unsafe { run(&mut b, cfg, split)? };
    drop(b);
    drop(xv);
    drop(inputs);
    if m <= split_rows() && n <= split_cols(m) {
        return split_gemm(&dev, y, &xh, xl.as_ref(), w, (m, n, k));
    }
    if super::cuda_tmma_wg::takes(&dev) {
        // Hopper: the same chain on wgmma (cuda_tmma_wg), the same bits.
        return super::cuda_tmma_wg::gemm(&dev, y, &xh, xl.as_ref(), w, (m, n, k));
    }
    let name = if lo { "tmmg_bf16" } else { "tmmg_bf16_h" };
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::TMMA))?;
    let grid_x =
        u32::try_from(m.div_ceil(128)).map_err(|_| ModelError::Input("bf16 mma matmul: x too large".into()))?;
    let grid_y = column_blocks(n)?;
    let mut b = f.builder();
    b.arg(&y).arg(&xh);
    if let Some(xl) = &xl {
        b.arg(xl);
    }
    b.arg(&w).arg(&mi).arg(&ni).arg(&ki);
    let cfg = LaunchConfig { grid_dim: (grid_x, grid_y, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in tmmg_bf16's order (y, xh, xl, w, m, n, k) or tmmg_bf16_h's (no xl);
    // y holds m*n, xh and xl m*k bf16, W n bf16 rows of k values (`fits`); eight warps a block,
    // static shared memory (40 KB, 24 KB for _h).
    unsafe { run(&mut b, cfg, name)? };
    drop(b);
    Ok(tensor(y, &dev, (m, n)))
}

/// The grid's y for the tiled kernels' blocks of 64 output columns (at most 65,535).
fn column_blocks(n: usize) -> Result<u32> {
    let g = u32::try_from(n.div_ceil(64)).ok().filter(|&g| g <= 65_535);
    g.ok_or_else(|| ModelError::Input(format!("bf16 mma matmul: {n} output columns")))
}

/// `tmmk_bf16` into eight partials, then `tmmk_sum` into `y` (see [`split_rows`]).
fn split_gemm(
    dev: &candle_core::CudaDevice,
    y: candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
    xh: &candle_core::cuda_backend::cudarc::driver::CudaSlice<u16>,
    xl: Option<&candle_core::cuda_backend::cudarc::driver::CudaSlice<u16>>,
    w: u64,
    (m, n, k): (usize, usize, usize),
) -> Result<Tensor> {
    let (mi, ni, ki) = (i32_of(m)?, i32_of(n)?, i32_of(k)?);
    let part = alloc_f32(dev, 8 * m * n)?;
    if super::cuda_tmma_wg::takes_batch(dev) {
        if super::cuda_tmma_wg::batch_partials(dev, &part, &y, xh, xl, w, (m, n, k))? {
            drop(part);
            return Ok(tensor(y, dev, (m, n)));
        }
        return sum_partitions(dev, y, part, (m, n));
    }
    let name = if xl.is_some() { "tmmk_bf16" } else { "tmmk_bf16_h" };
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::TMMA))?;
    let grid_x = u32::try_from(m.div_ceil(64)).map_err(|_| ModelError::Input("bf16 mma matmul: x too large".into()))?;
    let grid_y = column_blocks(n)?;
    let mut b = f.builder();
    b.arg(&part).arg(xh);
    if let Some(xl) = xl {
        b.arg(xl);
    }
    b.arg(&w).arg(&mi).arg(&ni).arg(&ki);
    let smem = tk_smem(if xl.is_some() { 2 } else { 1 });
    let cfg = LaunchConfig { grid_dim: (grid_x, grid_y, 8), block_dim: (256, 1, 1), shared_mem_bytes: smem };
    // SAFETY: arguments in tmmk_bf16's order (part, xh, xl, w, m, n, k) or tmmk_bf16_h's (no
    // xl); part holds 8*m*n, xh and xl m*k bf16, W n bf16 rows of k values (`fits`); eight warps
    // a block, `smem` bytes of dynamic shared memory (under the 48 KB default), one block per
    // partition in z.
    unsafe { run(&mut b, cfg, name)? };
    drop(b);
    sum_partitions(dev, y, part, (m, n))
}

/// `y` = the eight partitions' accumulators in `part` added in order (`tmmk_sum`).
fn sum_partitions(
    dev: &candle_core::CudaDevice,
    y: candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
    part: candle_core::cuda_backend::cudarc::driver::CudaSlice<f32>,
    (m, n): (usize, usize),
) -> Result<Tensor> {
    let f = dev.kernel("tmmk_sum", tandem_kernels::ptx(tandem_kernels::TMMA))?;
    let mn = (m * n) as i64;
    let blocks =
        u32::try_from((m * n).div_ceil(256)).map_err(|_| ModelError::Input("bf16 mma matmul: y too large".into()))?;
    let mut b = f.builder();
    b.arg(&y).arg(&part).arg(&mn);
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in tmmk_sum's order; y holds m*n, part 8*m*n; one thread an element.
    unsafe { run(&mut b, cfg, "tmmk_sum")? };
    drop(b);
    drop(part);
    Ok(tensor(y, dev, (m, n)))
}
