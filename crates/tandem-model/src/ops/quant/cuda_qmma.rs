//! Q8_0 matmuls on the tensor cores (`tandem-kernels/cuda/qmma.cu`): the activations are
//! quantised to 8 bits per 32-value block (`q8_quantize_rows`), each block's dot product with
//! the weights is an exact integer (an int8 `mma.sync`; for one row, decode, `__dp4a` on a warp
//! per output column, which spreads a matrix over more warps; for two to eight rows of 2,048+
//! values, verify steps and small batches, `qmvm_q8_0`'s streamed mma tile), and
//! the blocks' scaled products
//! are added in a chain fixed by `k` alone, so every call size (decode, verify chunks,
//! batches, prefill) gives a row the same bits. Against [`super::cuda_quant`]'s CUDA-core
//! kernels (f32 activations) this trades the activations' last bits (the CPU's Q8_0 kernels
//! quantise them the same way) for the tensor cores' throughput: batches and prefill stop
//! being bound by f32 multiply-adds. Calls of 64+ rows (prefill) take `q8gemm.cu`'s 64 x 64
//! tiles on the same chain. `TANDEM_Q8_MMA=0` sends Q8_0 back to the CUDA-core kernels, for
//! comparisons.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, allow_dynamic_shared, cuda_device, i32_of, run, tensor, Inputs};

/// Columns and rows of a `qgemm64_q8_0` block (`QG_BN`, `QG_BM`), and the calls (in rows) that
/// take it.
const GEMM_TILE: usize = 64;
/// `QgLayout<BT>::QG_BYTES` of `q8gemm.cu` for a tile of `bt` columns and rows: two stages of
/// the bt columns' 288-byte windows (+ 16) and of the bt rows' codes (272 bytes) and scales
/// (12 floats), the unpacked codes (bt x 272) and scales (bt x 9 floats).
const fn gemm_smem(bt: usize) -> u32 {
    (2 * (bt * 288 + 16) + 2 * bt * 272 + 2 * bt * 12 * 4 + bt * 272 + bt * 9 * 4) as u32
}

/// How much more a `qgemm128_q8_0` block would get through than the four 64 x 64 blocks of its
/// outputs, for [`super::gemm_tile::tile128_wins`].
const TILE128_GAIN: f64 = 1.1;

/// The tile of `q8gemm.cu` for an m x n call: 128 x 128 (`qgemm128_q8_0`, sixteen warps, one
/// block an SM) where [`super::gemm_tile::tile128_wins`], else 64. Both give the same bits.
/// Since its finished partials' sum moved from registers into y (2026-12-07: 196 bytes of spill
/// down to 32) the 128 tile prefills the 9B Q8_0 2.7% faster (pp512 7,506-7,525 -> 7,721-7,726
/// tok/s on an H100); before, it spilled and ran 2-6% slower. `TANDEM_Q8_GEMM128=0` keeps every
/// call on 64, `force` takes 128 for every call of 128+ rows (check-device forces both tiles
/// and compares them).
fn gemm_tile(m: usize, n: usize, sms: usize, max_smem: usize) -> usize {
    if gemm_smem(128) as usize > max_smem {
        return GEMM_TILE;
    }
    static MODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let mode = MODE.get_or_init(|| std::env::var("TANDEM_Q8_GEMM128").unwrap_or_default());
    if let Some(t) = super::gemm_tile::tile_override() {
        return t;
    }
    let wins = match mode.as_str() {
        "force" => m >= 128,
        "0" => false,
        _ => super::gemm_tile::tile128_wins(m, n, sms, TILE128_GAIN),
    };
    if wins {
        128
    } else {
        GEMM_TILE
    }
}

/// Whether calls of 64+ rows take `qgemm64_q8_0` (`TANDEM_Q8_GEMM64=0` keeps them on
/// `qmma_q8_0_64`, for comparisons: the same bits).
fn gemm64_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_Q8_GEMM64").map_or(true, |v| v != "0"))
}

/// Whether Q8_0 weights take the tensor-core kernels (the default).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_Q8_MMA").map_or(true, |v| v != "0"))
}

/// Rows up to which calls take `qmv_q8_0_*` (a warp per output column, the weights staged by
/// cp.async) rather than `qmvm_q8_0` (or the mma tile); `TANDEM_Q8_GEMV=0` sends them there and
/// `TANDEM_Q8_GEMV_ROWS=N` moves the limit (1..8), for comparisons. All give the same bits.
/// Measured on an H100 (9B Q8_0, 2026-12-06): one row 221 tok/s against `qmvm_q8_0`'s 219; two
/// rows (a K = 2 verify) 1.24 decode steps on `qmv_q8_0_2` against 1.12 on `qmvm_q8_0`. Where
/// `qmvm_q8_0` cannot take the matrix (rows under 2,048 values) the limit is at least 2.
fn gemv_max_rows() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TANDEM_Q8_GEMV_ROWS").ok().and_then(|v| v.parse().ok()).map_or(1, |n: usize| n.clamp(1, 8))
    })
}

/// `QS_SMEM` of qmma.cu's `qmvm_q8_0`: eight warps x two stages of a segment's 16 weight
/// windows (4,352 bytes each).
const SKINNY_SMEM: u32 = 8 * 2 * 4352;

/// Whether calls of 2..8 rows (past `gemv_max_rows`) of 2,048+ values take `qmvm_q8_0` (the
/// default); `TANDEM_Q8_SKINNY=0` restores the split from before it (two rows on `qmv_q8_0_2`,
/// three to eight on the `qmma_q8_0_8` tile), for comparisons: the same bits.
fn skinny_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_Q8_SKINNY").as_deref() != Ok("0"))
}

fn gemv_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_Q8_GEMV").as_deref() != Ok("0"))
}

/// Whether `qmv_q8_0_*` can take W: rows of a multiple of 256 values (so the staged rounds are
/// whole 16-byte pieces) starting 16-byte aligned.
fn gemv_fits(w: u64, k: usize, rb: usize) -> bool {
    k.is_multiple_of(256) && rb.is_multiple_of(16) && w.is_multiple_of(16)
}

/// `x · Wᵀ` for `x` `[m, k]` (f32, contiguous) and W `n` Q8_0 rows of `k` values at device
/// address `w` (rows `rb` bytes apart, kept alive by the caller); `[m, n]` f32.
pub(crate) fn matmul_q8_0(w: u64, n: usize, k: usize, rb: usize, x: &Tensor) -> Result<Tensor> {
    matmul_q8_0_of(w, n, k, rb, x, None)
}

/// The matmul of `x`, or with `gated` (the addresses and row strides of g and u from
/// `cuda_util::gated_rows`, `x` being g) of `silu(g) ⊙ u`, a gated MLP's down projection: the
/// activations formed as they are quantised (`q8_quantize_rows_gated`: the codes `silu_mul`
/// then `q8_quantize_rows` give, one launch fewer).
pub(crate) fn matmul_q8_0_of(
    w: u64,
    n: usize,
    k: usize,
    rb: usize,
    x: &Tensor,
    gated: Option<[(u64, i64); 2]>,
) -> Result<Tensor> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("q8_0 mma matmul: not a CUDA tensor".into()))?;
    let (m, xk) = x.dims2()?;
    if xk != k || k == 0 || !k.is_multiple_of(32) {
        return Err(ModelError::Input(format!("q8_0 mma matmul: x [{m}, {xk}] against W [{n}, {k}]")));
    }
    let y = alloc_f32(&dev, m * n)?;
    if m == 0 || n == 0 {
        return Ok(tensor(y, &dev, (m, n)));
    }
    let x = if gated.is_some() { x.clone() } else { x.to_dtype(DType::F32)?.contiguous()? };
    let grid_y = u32::try_from(n.div_ceil(16)).ok().filter(|&g| g <= 65_535);
    let grid_y = grid_y.ok_or_else(|| ModelError::Input(format!("q8_0 mma matmul: {n} output columns")))?;
    let (mi, ni, ki, rbl) = (i32_of(m)?, i32_of(n)?, i32_of(k)?, rb as i64);
    let nb = k / 32;
    // SAFETY: q8_quantize_rows writes every byte of xq (m*k) and every scale (m*nb).
    let xq = unsafe { dev.alloc::<i8>(m * k) }?;
    let dx = alloc_f32(&dev, m * nb)?;
    // Gated calls read g and u in place by address (the tensors live through the call).
    let inputs = if gated.is_some() { Inputs::new(&[])? } else { Inputs::new(&[&x])? };
    let xv = if gated.is_some() { None } else { Some(inputs.view::<f32>(0)?) };
    let blocks = (m * nb).div_ceil(8);
    let cfg = LaunchConfig {
        grid_dim: (u32::try_from(blocks).map_err(|_| ModelError::Input("q8_0 mma matmul: x too large".into()))?, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let ptx = tandem_kernels::ptx(tandem_kernels::QMMA);
    if let Some([(ga, ldg), (ua, ldu)]) = &gated {
        let name = "q8_quantize_rows_gated";
        let f = dev.kernel(name, ptx)?;
        let mut b = f.builder();
        b.arg(&xq).arg(&dx).arg(ga).arg(ldg).arg(ua).arg(ldu).arg(&mi).arg(&ki);
        // SAFETY: arguments in the kernel's order; g and u are live f32 views of m rows of k
        // values, ldg / ldu values apart (gated_rows); one warp per 32-value block.
        unsafe { run(&mut b, cfg, name)? };
    } else if let Some(xv) = &xv {
        let f = dev.kernel("q8_quantize_rows", ptx)?;
        let mut b = f.builder();
        b.arg(&xq).arg(&dx).arg(xv).arg(&mi).arg(&ki);
        // SAFETY: arguments in q8_quantize_rows' order; one warp per 32-value block of x [m, k].
        unsafe { run(&mut b, cfg, "q8_quantize_rows")? };
    } else {
        return Err(ModelError::Input("q8_0 mma matmul: no activations".into()));
    }

    // qmvm_q8_0 takes rows of 2,048+ values; shorter ones (small models) keep their two-row
    // calls on qmv_q8_0_2, the split from before qmvm (on the 9B, K = 2 read 1.24 decode steps
    // there against 1.43 on the tile).
    let skinny = skinny_enabled() && k >= 2048 && gemv_fits(w, k, rb);
    let gemv_rows = if skinny { gemv_max_rows() } else { gemv_max_rows().max(2) };
    if m <= gemv_rows && gemv_enabled() && gemv_fits(w, k, rb) {
        let r = m.next_power_of_two();
        let name = format!("qmv_q8_0_{r}");
        let f = dev.kernel(&name, tandem_kernels::ptx(tandem_kernels::QMMA))?;
        let mut b = f.builder();
        b.arg(&y).arg(&xq).arg(&dx).arg(&w).arg(&mi).arg(&ni).arg(&ki).arg(&rbl);
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(4) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: arguments in qmv_q8_0_*'s order; y holds m*n, xq m*k, dx m*k/32, W n rows of
        // rb bytes (16-byte aligned, k a multiple of 256: checked by gemv_fits); 4 warps a block
        // (QV_WARPS), static shared memory.
        unsafe { run(&mut b, cfg, &name)? };
        drop(b);
        drop(xv);
        drop(inputs);
        return Ok(tensor(y, &dev, (m, n)));
    }
    if m <= 8 && skinny {
        // 2..8 rows: 16 columns a block, eight warps streaming their segments by cp.async
        // (QS_SMEM bytes of dynamic shared memory: the kernel traps on less).
        let name = "qmvm_q8_0";
        let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::QMMA))?;
        allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), name, SKINNY_SMEM)?;
        let mut b = f.builder();
        b.arg(&y).arg(&xq).arg(&dx).arg(&w).arg(&mi).arg(&ni).arg(&ki).arg(&rbl);
        let cfg = LaunchConfig { grid_dim: (grid_y, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: SKINNY_SMEM };
        // SAFETY: arguments in qmvm_q8_0's order; y holds m*n, xq m*k, dx m*k/32, W n rows of
        // rb bytes (16-byte aligned, k a multiple of 256 and at least 2048: checked above);
        // 256 threads and the shared memory the kernel is written for.
        unsafe { run(&mut b, cfg, name)? };
        drop(b);
        drop(xv);
        drop(inputs);
        return Ok(tensor(y, &dev, (m, n)));
    }
    if m >= GEMM_TILE && gemm64_enabled() && gemv_fits(w, k, rb) {
        // Many rows: bt x bt tiles, segment by segment (q8gemm.cu); 4 bt threads, QG_BYTES of
        // dynamic shared memory (the kernel traps on less). Same alignment needs as qmv.
        use crate::ops::cuda_module::LoadKernel as _;
        use crate::ops::cuda_util::{max_shared_optin, sm_count};
        let bt = gemm_tile(m, n, sm_count(&dev), max_shared_optin(&dev));
        let name = if bt == 128 { "qgemm128_q8_0" } else { "qgemm64_q8_0" };
        let smem = gemm_smem(bt);
        let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::Q8GEMM))?;
        allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), name, smem)?;
        let grid_y = u32::try_from(n.div_ceil(bt)).ok().filter(|&g| g <= 65_535);
        let grid_y = grid_y.ok_or_else(|| ModelError::Input(format!("q8_0 gemm: {n} output columns")))?;
        let grid_x = u32::try_from(m.div_ceil(bt)).map_err(|_| ModelError::Input("q8_0 gemm: x too large".into()))?;
        let mut b = f.builder();
        b.arg(&y).arg(&xq).arg(&dx).arg(&w).arg(&mi).arg(&ni).arg(&ki).arg(&rbl);
        let cfg =
            LaunchConfig { grid_dim: (grid_x, grid_y, 1), block_dim: (4 * bt as u32, 1, 1), shared_mem_bytes: smem };
        // SAFETY: arguments in the kernel's order; y holds m*n, xq m*k, dx m*k/32, W n rows of
        // rb bytes (16-byte aligned, k a multiple of 256: checked by gemv_fits); 4 bt threads
        // and QG_BYTES of dynamic shared memory, as the kernel is written for.
        unsafe { run(&mut b, cfg, name)? };
        drop(b);
        drop(xv);
        drop(inputs);
        return Ok(tensor(y, &dev, (m, n)));
    }
    let nt = match m {
        0..=8 => 8,
        9..=16 => 16,
        17..=32 => 32,
        _ => 64,
    };
    let name = format!("qmma_q8_0_{nt}");
    let f = dev.kernel(&name, tandem_kernels::ptx(tandem_kernels::QMMA))?;
    let mut b = f.builder();
    b.arg(&y).arg(&xq).arg(&dx).arg(&w).arg(&mi).arg(&ni).arg(&ki).arg(&rbl);
    let cfg =
        LaunchConfig { grid_dim: (m.div_ceil(nt) as u32, grid_y, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in qmma_q8_0_*'s order; y holds m*n, xq m*k, dx m*k/32, W n rows of rb
    // bytes (Q8_0 blocks); the kernel's shared memory is static.
    unsafe { run(&mut b, cfg, &name)? };
    drop(b);
    drop(xv);
    drop(inputs);
    Ok(tensor(y, &dev, (m, n)))
}
