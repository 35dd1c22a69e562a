//! Q4_K / Q5_K / Q6_K matmuls with 8-bit activations on CUDA (`tandem-kernels/cuda/kqmma.cu`),
//! the K-quant counterpart of [`super::cuda_qmma`]: the activations are quantised per 256-value
//! superblock as the CPU's K-quant kernels quantise them (`q8k_quantize_rows`: candle's Q8K
//! codes and scale, and each 32-value sub-block's code sum), each superblock's dot product with
//! the weight codes, weighted by the sub-blocks' integer scales and mins, is an exact integer
//! (`__dp4a` in the warp-per-column GEMV for one row, int8 `mma.sync` for more: `kqskinny.cu`
//! for 2-8 rows, a shared-memory tiled GEMM beyond, `kqgemm.cu` from 64), and one float term a
//! superblock is added in a chain fixed by `k` alone (the kernel's header), so decode, verify
//! chunks, batches and prefill give a row the same bits. Against [`super::cuda_quant`]'s exact-weight f32 kernels this trades
//! the activations' last bits (as llama.cpp's CUDA build and the CPU's K-quant kernels do) for
//! coalesced weight reads in decode and the tensor cores in prefill. `TANDEM_KQ_MMA=0` sends
//! K-quants back to the f32 kernels, for comparisons.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::cuda_quant::WeightFormat;
use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, allow_dynamic_shared, cuda_device, i32_of, run, tensor, Inputs};

fn ptx() -> tandem_kernels::Module {
    tandem_kernels::ptx(tandem_kernels::KQMMA)
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

/// Rows from which calls take `qkgemm64_*` / `qkgemm128_*`.
const BIG_ROWS: usize = 64;

/// Whether calls of 64+ rows take the prefill GEMM (`kqgemm.cu`; `TANDEM_KQ_GEMM64=0` keeps
/// them on `qkgemm_*_32`, for comparisons: the same bits).
fn big_gemm() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_KQ_GEMM64").map_or(true, |v| v != "0"))
}

/// `TANDEM_KQ_GEMM128`: `0` keeps every call on the 64 x 64 tile, `force` sends every call of
/// 128+ rows to the 128 x 128 one, `noq6` keeps Q6_K on 64; unset, [`big_tile`] chooses.
/// For comparisons: every choice gives the same bits.
fn tile128_mode() -> &'static str {
    static M: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    M.get_or_init(|| std::env::var("TANDEM_KQ_GEMM128").unwrap_or_default())
}

/// How much more a 128 x 128 block gets through than the four 64 x 64 blocks of its outputs
/// on one SM (`qkgemm128_*`: 1,169 SASS instructions a superblock for 64 int8 mma against
/// `qkgemm64_*`'s 735 for 32, a warp; q4_k).
const TILE128_GAIN: f64 = 1.2;

/// The tile (64 or 128 columns and rows a block) of the prefill GEMM for an m x n call on a
/// card of `sms` SMs: 128 where its grid, one block an SM, finishes sooner than the 64 tile's
/// four times as many blocks two to an SM (a 128 tile serves twice the rows a decoded
/// superblock and a fragment read, but leaves SMs idle on narrow calls: n = 1,024 at 512
/// rows is 32 blocks), and where the card lets a block have its shared memory (`max_smem`).
/// Depends on m, n and the card, never on the values: the same bits either way.
fn big_tile(suffix: &str, m: usize, n: usize, sms: usize, max_smem: usize) -> usize {
    // A card whose blocks cannot have the 128 tile's shared memory keeps the 64 tile.
    if (big_smem_bytes(suffix, 128) as usize) > max_smem {
        return 64;
    }
    if let Some(t) = super::gemm_tile::tile_override() {
        return t;
    }
    let mode = tile128_mode();
    if m < 128 || mode == "0" || (mode == "noq6" && suffix == "q6_k") {
        return 64;
    }
    if mode == "force" {
        return 128;
    }
    if super::gemm_tile::tile128_wins(m, n, sms, TILE128_GAIN) {
        128
    } else {
        64
    }
}

/// `KbLayout<KT, BT>::BYTES` of `kqgemm.cu` for a tile of `bt` columns and rows: two stages of
/// raw superblocks (bt columns, each the 16-byte aligned window around its superblock: 224
/// bytes for Q6_K) and of bt activation rows (272 bytes of codes, 32 of code sums and dx
/// each), the decoded codes (bt x 272), the integer scales (bt x 9 int2), d and dmin (bt
/// float2) and the mins as bytes (bt x 8).
fn big_smem_bytes(suffix: &str, bt: usize) -> u32 {
    let st = match suffix {
        "q4_k" => 144,
        "q5_k" => 176,
        _ => 224,
    };
    let raw = bt * st + 16;
    let bytes = 2 * raw + 2 * bt * 272 + 2 * bt * 32 + bt * 272 + bt * 9 * 8 + 2 * bt * 8;
    bytes as u32
}

/// Rows up to which calls not taken by `qkmvm_*` (see [`skinny_min_rows`]: with
/// `TANDEM_KQ_SKINNY=0`, all of them) take `qkmv_*` (a warp per output column) rather than `qkgemm_*`;
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

/// Output columns of a `qkmvm_*` block (`KS_COLS`).
const SKINNY_COLS: usize = 16;

/// `ks_smem_bytes<KT, R>(m)` of `kqskinny.cu` (R = [`skinny_group`]): four warps x [`skinny_stages`] of the 16 columns'
/// superblock windows (Q6_K: 224 bytes each) and the m rows' codes (272 bytes) and code sums
/// and dx (32), then the superblock terms of two groups of `skinny_group()` rounds (4 KiB a
/// round).
fn skinny_smem_bytes(suffix: &str, m: usize) -> u32 {
    let st = match suffix {
        "q4_k" => 144,
        "q5_k" => 176,
        _ => 224,
    };
    (4 * skinny_stages() * (SKINNY_COLS * st + m * (272 + 32)) + 4096 * skinny_group()) as u32
}

/// Rounds a `qkmvm_*` warp keeps in flight (`KS_STAGES` of `kqskinny.cu`, 2 as built), for an
/// A/B of that module's PTX compiled with `-DKS_STAGES=N` through `TANDEM_PTX_DIR`:
/// `TANDEM_KQ_SKINNY_STAGES=N` (2..6) sizes each call's shared memory for N. More than the
/// kernel's own only reserves more shared memory (fewer blocks an SM); fewer is never asked.
fn skinny_stages() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("TANDEM_KQ_SKINNY_STAGES").ok().and_then(|v| v.parse().ok()).map_or(2, |n: usize| n.clamp(2, 6))
    })
}

/// Rounds of superblocks whose terms a `qkmvm_*` block adds per barrier: 4 (`qkmvm_<t>_g4`, the
/// default), 2 (`_g2`) or 1 (`qkmvm_<t>`), `TANDEM_KQ_SKINNY_GROUP=1|2|4`: the same terms added
/// in the same order, so the same bits (check-device's quantised rows pass with 4); fewer
/// barriers for 4 KiB more shared memory a block per round. H100, 9B Q4_K, one A/B: verify
/// K = 2 / 4 / 8 at 189.0 / 168.6 / 141.5 steps/s with 4 against 185.7 / 164.2 / 138.0 with 1.
fn skinny_group() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| match std::env::var("TANDEM_KQ_SKINNY_GROUP").as_deref() {
        Ok("1") => 1,
        Ok("2") => 2,
        _ => 4,
    })
}

/// The smallest call (in rows, up to eight) that takes `qkmvm_*` (`kqskinny.cu`: the mma's
/// B operand holds eight rows, so 2..8 rows cost about what two do) rather than `qkmv_*` /
/// `qkgemm_*`; `TANDEM_KQ_SKINNY=N` moves it (0: never), for comparisons. The same bits.
/// Measured on the H200 (9B Q4_K, verify steps in decode steps, same run): 4 / 5 / 8 rows
/// 1.7-1.8 / 1.9-2.0 / 2.0-2.1 against 2.46 / 2.35 / 2.49 without; one-row calls stay on
/// `qkmv_1` (decode 256 tok/s against 209 on this kernel).
fn skinny_min_rows() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let n = std::env::var("TANDEM_KQ_SKINNY").ok().and_then(|v| v.parse().ok()).unwrap_or(2usize);
        if n == 0 {
            usize::MAX
        } else {
            n
        }
    })
}

/// `x · Wᵀ` for `x` `[m, k]` and W `n` rows of `k` values in `fmt` at device address `w`
/// (checked by [`takes`], kept alive by the caller); `[m, n]` f32.
pub(crate) fn matmul(fmt: WeightFormat, w: u64, n: usize, k: usize, x: &Tensor) -> Result<Tensor> {
    matmul_of(fmt, w, n, k, x, None)
}

/// The matmul of `x`, or with `gated` (the addresses and row strides of g and u from
/// `cuda_util::gated_rows`, `x` being g) of `silu(g) ⊙ u`, a gated MLP's down projection: the
/// activations formed as they are quantised (`q8k_quantize_rows_gated`: the codes, scales and
/// sums `silu_mul` then `q8k_quantize_rows` give, one launch fewer).
pub(crate) fn matmul_of(
    fmt: WeightFormat,
    w: u64,
    n: usize,
    k: usize,
    x: &Tensor,
    gated: Option<[(u64, i64); 2]>,
) -> Result<Tensor> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("k-quant matmul: not a CUDA tensor".into()))?;
    let (m, xk) = x.dims2()?;
    if xk != k || !takes(fmt, w, k) {
        return Err(ModelError::Input(format!("k-quant matmul: x [{m}, {xk}] against W [{n}, {k}] ({})", fmt.suffix)));
    }
    let y = alloc_f32(&dev, m * n)?;
    if m == 0 || n == 0 {
        return Ok(tensor(y, &dev, (m, n)));
    }
    let x = if gated.is_some() { x.clone() } else { x.to_dtype(DType::F32)?.contiguous()? };
    let (mi, ni, ki) = (i32_of(m)?, i32_of(n)?, i32_of(k)?);
    let (nb, sbs) = (k / 32, k / 256);
    // SAFETY: q8k_quantize_rows writes every code (m*k), scale (m*sbs: a superblock's dx) and
    // code sum (m*nb: a sub-block's, int16).
    let xq = unsafe { dev.alloc::<i8>(m * k) }?;
    let dx = alloc_f32(&dev, m * sbs)?;
    let xs = unsafe { dev.alloc::<i16>(m * nb) }?;
    // Gated calls read g and u in place by address (the tensors live through the call).
    let inputs = if gated.is_some() { Inputs::new(&[])? } else { Inputs::new(&[&x])? };
    let xv = if gated.is_some() { None } else { Some(inputs.view::<f32>(0)?) };
    let blocks =
        u32::try_from((m * sbs).div_ceil(8)).map_err(|_| ModelError::Input("k-quant matmul: x too large".into()))?;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    if let Some([(ga, ldg), (ua, ldu)]) = &gated {
        let name = "q8k_quantize_rows_gated";
        let f = dev.kernel(name, ptx())?;
        let mut b = f.builder();
        b.arg(&xq).arg(&dx).arg(&xs).arg(ga).arg(ldg).arg(ua).arg(ldu).arg(&mi).arg(&ki);
        // SAFETY: arguments in the kernel's order; g and u are live f32 views of m rows of k
        // values, ldg / ldu values apart (gated_rows); one warp per 256-value superblock.
        unsafe { run(&mut b, cfg, name)? };
    } else if let Some(xv) = &xv {
        let f = dev.kernel("q8k_quantize_rows", ptx())?;
        let mut b = f.builder();
        b.arg(&xq).arg(&dx).arg(&xs).arg(xv).arg(&mi).arg(&ki);
        // SAFETY: arguments in q8k_quantize_rows' order; one warp per 256-value superblock of x [m, k].
        unsafe { run(&mut b, cfg, "q8k_quantize_rows")? };
    } else {
        return Err(ModelError::Input("k-quant matmul: no activations".into()));
    }

    // Blocks over the output columns: grid.x takes up to 2^31 - 1, grid.y 65,535.
    let cols = |per: usize, limit: u32| {
        u32::try_from(n.div_ceil(per))
            .ok()
            .filter(|&g| g <= limit)
            .ok_or_else(|| ModelError::Input(format!("k-quant matmul: {n} output columns")))
    };
    let (gx, gy) = (i32::MAX as u32, 65_535);
    // The kernel for this call: (its module, name, launch, the dynamic shared memory it
    // may ask for at most).
    let (code, name, cfg, smem_max) = if m >= BIG_ROWS && big_gemm() {
        // Many rows: the prefill GEMM (kqgemm.cu), bt x bt tiles decoded once a block; 4 bt
        // threads, KbLayout's dynamic shared memory (the kernel traps on less).
        use crate::ops::cuda_util::{max_shared_optin, sm_count};
        let bt = big_tile(fmt.suffix, m, n, sm_count(&dev), max_shared_optin(&dev));
        let smem = big_smem_bytes(fmt.suffix, bt);
        let grid_x =
            u32::try_from(m.div_ceil(bt)).map_err(|_| ModelError::Input("k-quant matmul: x too large".into()))?;
        let threads = 4 * bt as u32;
        let cfg =
            LaunchConfig { grid_dim: (grid_x, cols(bt, gy)?, 1), block_dim: (threads, 1, 1), shared_mem_bytes: smem };
        let code = tandem_kernels::ptx(tandem_kernels::KQGEMM);
        (code, format!("qkgemm{bt}_{}", fmt.suffix), cfg, smem)
    } else if m <= 8 && m >= skinny_min_rows() {
        // A few rows: one int8 mma per sub-block of 16 columns takes all of them (kqskinny.cu);
        // four warps, ks_smem_bytes for m rows of dynamic shared memory (it traps on less).
        let smem = skinny_smem_bytes(fmt.suffix, m);
        let cfg =
            LaunchConfig { grid_dim: (cols(SKINNY_COLS, gx)?, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: smem };
        let code = tandem_kernels::ptx(tandem_kernels::KQSKINNY);
        let name = match skinny_group() {
            1 => format!("qkmvm_{}", fmt.suffix),
            g => format!("qkmvm_{}_g{g}", fmt.suffix),
        };
        (code, name, cfg, skinny_smem_bytes(fmt.suffix, 8))
    } else if m <= gemv_max_rows() {
        // qkmv: 4 warps a block, a warp per column; static shared memory.
        let cfg = LaunchConfig { grid_dim: (cols(4, gx)?, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        (ptx(), format!("qkmv_{}_{}", fmt.suffix, m.next_power_of_two()), cfg, 0)
    } else {
        // qkgemm: 8 warps, 64 columns x nt rows a block; static shared memory.
        let nt = if m <= 16 { 16 } else { 32 };
        let cfg = LaunchConfig {
            grid_dim: (m.div_ceil(nt) as u32, cols(GEMM_COLS, gy)?, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        (ptx(), format!("qkgemm_{}_{nt}", fmt.suffix), cfg, 0)
    };
    let f = dev.kernel(&name, code)?;
    if smem_max > 0 {
        allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), &name, smem_max)?;
    }
    let mut b = f.builder();
    b.arg(&y).arg(&xq).arg(&dx).arg(&xs).arg(&w).arg(&mi).arg(&ni).arg(&ki);
    // SAFETY: every kernel here takes (y, xq, dx, xs, W, m, n, k): y holds m*n, xq m*k, dx
    // m*k/256 f32, xs m*k/32 i16, W n rows of k/256 superblocks (16-byte aligned: checked by `takes`); each
    // launch's blocks, threads and shared memory are the ones its kernel is written for (above).
    unsafe { run(&mut b, cfg, &name)? };
    drop(b);
    drop(xv);
    drop(inputs);
    Ok(tensor(y, &dev, (m, n)))
}
