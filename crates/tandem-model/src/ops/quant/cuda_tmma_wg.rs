//! The bf16 GEMM on Hopper's wgmma (`tandem-kernels/cuda/tmma_wg.cu`) takes the calls
//! [`super::cuda_tmma`] would give `tmmg_bf16` / `tmmg_bf16_h` (prefill, wide batches) on a
//! device of compute capability 9.0 with a build for it (`CUDA_COMPUTE_CAP=90`, the default:
//! the module is built for sm_90a there and empty for any other GPU): calls of up to
//! [`TW2_ROWS`] rows (a server's 512-token prefill chunks) on `tmmw2_bf16` / `tmmw2_bf16_h`
//! (128 x 128 tiles whose partitions alternate between two accumulators), longer ones on
//! `tmmw_bf16` (split activations, 128 x 128 tiles) / `tmmw_bf16_h` (bf16 activations, 128 x
//! 256), whose partitions fold through shared memory. And `tmmk_bf16`'s batch calls (17-128
//! rows) go to `tmmw2k_bf16_*`, one chain partition a block on a ring of TMA stages. The
//! chain is tmma.cu's, so every row has the bits it has in every other call size
//! (check-device's `dense_matmul rows` rows; `lab/gemm_tma_lab.cu` compares the kernels with
//! tmmg and tmmk bit for bit).
//!
//! Both operands are read by TMA tensor maps that this module encodes per call (a host-side
//! function of the driver, no device work): W as loaded, the activations' halves as
//! `bf16_split_rows` / `bf16_hi_rows` write them, boxes of one 32-value step x the tile's rows
//! in the 64-byte swizzle. `TANDEM_BF16_WGMMA=0` keeps the prefill calls on `tmmg_bf16`, `=1`
//! sends all of them to `tmmw_bf16`, `=2` all to `tmmw2_bf16`, for comparisons;
//! `TANDEM_BF16_WGMMA_GRID=sms` runs a block per SM walking the tiles (persistent) instead of a
//! block per tile. `TANDEM_BF16_WGMMA_BATCH=0` keeps the batch calls on `tmmk_bf16`, as
//! `TANDEM_BF16_WGMMA=0` does with every call.

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDevice;
use candle_core::Tensor;

use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{
    allow_dynamic_shared, compute_capability, i32_of, max_shared_optin, run, sm_count, tensor,
};

/// Weight columns a block (tmma_wg.cu's `TW_BC`).
const BC: usize = 128;

/// A kernel: its name, activation rows a tile and dynamic shared memory (tmma_wg.cu's
/// `TwShape`: stages of one step's boxes, the total where it lives there, the mbarriers).
struct Tile {
    name: &'static str,
    rows: usize,
    smem: u32,
}
/// The two-accumulator kernels (calls of up to [`TW2_ROWS`] rows): 128 x 128 tiles, the
/// total in registers.
const SPLIT2: Tile = Tile { name: "tmmw2_bf16", rows: 128, smem: (9 * (128 * 64 + 2 * 128 * 64) + 2 * 9 * 8) as u32 };
const HI2: Tile = Tile { name: "tmmw2_bf16_h", rows: 128, smem: (14 * (128 * 64 + 128 * 64) + 2 * 14 * 8) as u32 };
/// The one-accumulator kernels (longer calls): the total in shared memory.
const SPLIT: Tile =
    Tile { name: "tmmw_bf16", rows: 128, smem: (6 * (128 * 64 + 2 * 128 * 64) + 128 * 128 * 4 + 2 * 6 * 8) as u32 };
const HI: Tile =
    Tile { name: "tmmw_bf16_h", rows: 256, smem: (4 * (128 * 64 + 256 * 64) + 256 * 128 * 4 + 2 * 4 * 8) as u32 };

/// The longest call the two-accumulator kernels take by default. Measured on an H100
/// (2026-12-07, PERFORMANCE.md): at 512 rows they are 1.19x (split) / 1.36x (bf16
/// activations) the one-accumulator kernels on the 9B gate+up matrix, at 4,096 rows 0.98x /
/// 0.96x in a whole prefill; 513-4,095 rows are not measured.
pub(crate) const TW2_ROWS: usize = 512;

/// `TANDEM_BF16_WGMMA`: 0 (off: tmmg), 1 (the one-accumulator kernels for every call), 2 (the
/// two-accumulator ones for every call); unset (3) by the call's rows ([`TW2_ROWS`]).
fn mode() -> u8 {
    static MODE: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("TANDEM_BF16_WGMMA").as_deref() {
        Ok("0") => 0,
        Ok("1") => 1,
        Ok("2") => 2,
        _ => 3,
    })
}

/// A CUDA tensor map (the driver's `CUtensorMap`: 128 opaque bytes), passed by value to the
/// kernels' `__grid_constant__ CUtensorMap` parameters.
#[repr(C, align(128))]
#[derive(Clone, Copy)]
struct TensorMap([u64; 16]);
// SAFETY: plain bytes the driver encoded, the layout of the kernel parameter they fill.
unsafe impl DeviceRepr for TensorMap {}

/// Whether the calls `tmmg_bf16` would take go to the wgmma kernels on `dev`: a build for
/// sm_90 on a device of capability 9.0 that lets a block opt in to the kernels' shared memory,
/// unless `TANDEM_BF16_WGMMA=0`.
pub(crate) fn takes(dev: &CudaDevice) -> bool {
    mode() != 0
        && tandem_kernels::CUBIN_CAP == 90
        && compute_capability(dev) == (9, 0)
        && max_shared_optin(dev) >= MOST_SMEM as usize
}

/// The most dynamic shared memory any of the kernels asks for (the batch kernels' is less).
const MOST_SMEM: u32 = max_u32(max_u32(SPLIT.smem, HI.smem), max_u32(SPLIT2.smem, HI2.smem));
const fn max_u32(a: u32, b: u32) -> u32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Whether the grid is a block per SM (`TANDEM_BF16_WGMMA_GRID=sms`) rather than per tile.
fn persistent() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_BF16_WGMMA_GRID").as_deref() == Ok("sms"))
}

/// The tensor map of a bf16 `[rows, k]` matrix at device address `addr` (16-byte aligned, `k`
/// a multiple of 8): boxes of 32 values x `box_rows` rows in the 64-byte swizzle, rows past
/// the matrix read as zeros.
fn tensor_map(addr: u64, rows: usize, k: usize, box_rows: usize) -> Result<TensorMap> {
    let mut map = TensorMap([0; 16]);
    let dims = [k as u64, rows as u64];
    let strides = [k as u64 * 2];
    let boxd = [32u32, box_rows as u32];
    let estr = [1u32, 1];
    // SAFETY: `map` is 128 writable bytes aligned to 128 (the driver asks for 64); the arrays
    // hold rank 2 dimensions, box sizes and element strides and rank - 1 strides; the driver
    // only encodes the address (the kernels read it while the caller holds the matrix).
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            (&mut map as *mut TensorMap).cast::<sys::CUtensorMap>(),
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxd.as_ptr(),
            estr.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(ModelError::Input(format!(
            "bf16 wgmma matmul: cannot encode a tensor map of [{rows}, {k}] at {addr:#x} ({r:?})"
        )));
    }
    Ok(map)
}

/// `y` `[m, n]` = the activations' halves `xh` (and `xl`: split mode) `[m, k]` times W `[n, k]`
/// bf16 at device address `w` (kept alive by the caller; `cuda_tmma::fits`), transposed.
pub(crate) fn gemm(
    dev: &CudaDevice,
    y: CudaSlice<f32>,
    xh: &CudaSlice<u16>,
    xl: Option<&CudaSlice<u16>>,
    w: u64,
    (m, n, k): (usize, usize, usize),
) -> Result<Tensor> {
    let two = match mode() {
        1 => false,
        2 => true,
        _ => m <= TW2_ROWS,
    };
    let tile = match (xl.is_some(), two) {
        (true, true) => &SPLIT2,
        (false, true) => &HI2,
        (true, false) => &SPLIT,
        (false, false) => &HI,
    };
    let stream = dev.cuda_stream();
    let tw = tensor_map(w, n, k, BC)?;
    let th = tensor_map(xh.device_ptr(&stream).0, m, k, tile.rows)?;
    let tl = match xl {
        Some(xl) => Some(tensor_map(xl.device_ptr(&stream).0, m, k, tile.rows)?),
        None => None,
    };
    let name = tile.name;
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::TMMA_WG))?;
    allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), name, tile.smem)?;
    let tiles = m.div_ceil(tile.rows) * n.div_ceil(BC);
    let blocks = if persistent() { tiles.min(sm_count(dev)) } else { tiles };
    let grid = u32::try_from(blocks).map_err(|_| ModelError::Input(format!("bf16 wgmma matmul: {tiles} tiles")))?;
    let (mi, ni, ki) = (i32_of(m)?, i32_of(n)?, i32_of(k)?);
    let mut b = f.builder();
    b.arg(&y).arg(&tw).arg(&th);
    if let Some(tl) = &tl {
        b.arg(tl);
    }
    b.arg(&mi).arg(&ni).arg(&ki);
    let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (384, 1, 1), shared_mem_bytes: tile.smem };
    // SAFETY: arguments in tmmw(2)_bf16's order (y, tw, th, tl, m, n, k) or the _h kernels' (no tl);
    // y holds m*n f32; the maps cover W (n rows of k bf16) and xh / xl (m rows of k bf16), all
    // alive for the launch (the caller holds W, xh and xl until after it is queued on this
    // stream); 384 threads a block, `tile.smem` bytes of dynamic shared memory (allowed above).
    unsafe { run(&mut b, cfg, name)? };
    drop(b);
    Ok(tensor(y, dev, (m, n)))
}

/// `TANDEM_BF16_WGMMA_BATCH`: the batch calls ([`super::cuda_tmma`]'s split GEMM, 17-128 rows)
/// on `tmmw2k_bf16_2` (unset or 2: two blocks an SM, six TMA stages each, eight with bf16
/// activations) or `tmmw2k_bf16_1` (=1: one block an SM, twelve stages, sixteen) in place of
/// `tmmk_bf16` (=0). On an H100 (2026-12-07)
/// 9B batch 64 at 1K context went from 3,147 to 4,176 tok/s (`_1`), batch 32 and 128 2,712 /
/// 5,214 (`_1`) and 2,742 / 5,337 (`_2`).
fn batch_mode() -> u8 {
    static MODE: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("TANDEM_BF16_WGMMA_BATCH").as_deref() {
        Ok("0") => 0,
        Ok("1") => 1,
        _ => 2,
    })
}

/// Whether the split GEMM's partitions go to the `tmmw2k` kernels on `dev`.
pub(crate) fn takes_batch(dev: &CudaDevice) -> bool {
    batch_mode() != 0 && takes(dev)
}

/// The batch kernels' dynamic shared memory: ST stages of 128 weight rows and 64 activation
/// rows (twice in split mode) of 64 bytes, the mbarriers and the arrival count (tmma_wg.cu's
/// `TWK_*`, `TwShape`).
fn batch_smem(lo: bool, mode: u8) -> u32 {
    let st: usize = match (lo, mode) {
        (true, 1) => 12,
        (true, _) => 6,
        (false, 1) => 16,
        (false, _) => 8,
    };
    let stage = BC * 64 + if lo { 2 } else { 1 } * 64 * 64;
    (st * stage + 2 * st * 8 + 16) as u32
}

/// `TANDEM_BF16_BATCH_SUM=kernel`: the batch kernels' eight partials added by each tile's last
/// block to finish instead of by `tmmk_sum` in a launch of its own (the default, `launch`).
/// Both add them in the same order: the same bits. Opt-in until it has run on a GPU: written
/// 2026-12-08 against a batch-64 step's 128 `tmmk_sum` launches (1.3 ms of 15.9 on an H100,
/// docs/PERFORMANCE.md), then no device machine could be started to check and time it.
fn sum_in_kernel() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_BF16_BATCH_SUM").as_deref() == Ok("kernel"))
}

/// Tile counters a device keeps for the batch kernels' in-kernel sum: a batch call of at most
/// 128 rows has 2 ceil(n / 128) tiles, so calls on matrices of up to 262,144 columns (the
/// split GEMM takes at most 32,768 by default) sum in the kernel; wider ones in `tmmk_sum`.
const TILE_COUNTERS: usize = 4096;

/// The device address of `dev`'s tile counters, all zero between calls (a call's last block
/// per tile sets its counter back). Allocated (16 KB) on the device's first batch call and
/// kept for the process, since captured step graphs hold the address: the first call never
/// runs inside a capture ([`crate::ops::cuda_graph::capture`] runs the body once first), and
/// calls on one device queue on its one stream, one after another.
fn tile_counters(dev: &CudaDevice) -> Result<u64> {
    type Held = Vec<(candle_core::cuda_backend::DeviceId, CudaSlice<u32>)>;
    static HELD: std::sync::Mutex<Held> = std::sync::Mutex::new(Vec::new());
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    let stream = dev.cuda_stream();
    if let Some((_, c)) = held.iter().find(|(id, _)| *id == dev.id()) {
        return Ok(c.device_ptr(&stream).0);
    }
    let c = dev.alloc_zeros::<u32>(TILE_COUNTERS).map_err(crate::ops::cuda_util::err("bf16 batch tile counters"))?;
    let at = c.device_ptr(&stream).0;
    held.push((dev.id(), c));
    Ok(at)
}

/// Partition z of the chain for every 64-row x 128-column tile into `part` + z m n (`part`
/// holds 8 m n): what `tmmk_bf16` leaves there. Where the tiles fit [`TILE_COUNTERS`] (and
/// [`sum_in_kernel`]), each tile's last block also adds the eight into `y` (m n) and this
/// returns true; otherwise `y` is untouched and the caller adds them with `tmmk_sum`.
pub(crate) fn batch_partials(
    dev: &CudaDevice,
    part: &CudaSlice<f32>,
    y: &CudaSlice<f32>,
    xh: &CudaSlice<u16>,
    xl: Option<&CudaSlice<u16>>,
    w: u64,
    (m, n, k): (usize, usize, usize),
) -> Result<bool> {
    let mode = batch_mode();
    let stream = dev.cuda_stream();
    let tw = tensor_map(w, n, k, BC)?;
    let th = tensor_map(xh.device_ptr(&stream).0, m, k, 64)?;
    let tl = match xl {
        Some(xl) => Some(tensor_map(xl.device_ptr(&stream).0, m, k, 64)?),
        None => None,
    };
    let name = match (xl.is_some(), mode) {
        (true, 1) => "tmmw2k_bf16_1",
        (true, _) => "tmmw2k_bf16_2",
        (false, 1) => "tmmw2k_bf16_h_1",
        (false, _) => "tmmw2k_bf16_h_2",
    };
    let smem = batch_smem(xl.is_some(), mode);
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::TMMA_WG))?;
    allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), name, smem)?;
    let tiles = m.div_ceil(64) * n.div_ceil(BC);
    let grid = u32::try_from(tiles).map_err(|_| ModelError::Input(format!("bf16 wgmma batch: {tiles} tiles")))?;
    let cnt: u64 = if sum_in_kernel() && tiles <= TILE_COUNTERS { tile_counters(dev)? } else { 0 };
    let (mi, ni, ki) = (i32_of(m)?, i32_of(n)?, i32_of(k)?);
    let mut b = f.builder();
    b.arg(part).arg(y).arg(&cnt).arg(&tw).arg(&th);
    if let Some(tl) = &tl {
        b.arg(tl);
    }
    b.arg(&mi).arg(&ni).arg(&ki);
    let cfg = LaunchConfig { grid_dim: (grid, 8, 1), block_dim: (384, 1, 1), shared_mem_bytes: smem };
    // SAFETY: arguments in tmmw2k_bf16_*'s order (part, y, cnt, tw, th, tl, m, n, k) or the _h
    // kernels' (no tl); part holds 8*m*n f32 and y m*n; cnt is null or TILE_COUNTERS u32 of
    // this device, all zero, for grid x (`tiles`) of them; the maps cover W (n rows of k bf16)
    // and xh / xl (m rows of k bf16), alive for the launch (the caller holds them until it is
    // queued on this stream); 384 threads a block, `smem` bytes of dynamic shared memory
    // (allowed above), one block per tile and partition (grid y).
    unsafe { run(&mut b, cfg, name)? };
    drop(b);
    Ok(cnt != 0)
}
