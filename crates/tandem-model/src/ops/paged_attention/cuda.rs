//! Launcher of the paged-attention CUDA kernel (`tandem-kernels/cuda/paged_attention.cu`): one
//! thread block per (KV head, 256-key segment, tile of query rows x the heads of its GQA
//! group), each key row read once for the tile; a row's bits never depend on how many rows
//! share the launch (decode, verify and prefill chunks agree exactly). f32, f16, bf16 pools and the
//! q8_0 / q4_0 byte rows (decoded in the kernel), and [`encode_rows`], which writes those
//! byte rows with the CPU encoder's exact arithmetic.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::PagedKv;
use crate::error::{ModelError, Result};
use crate::kv::KvDtype;
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, allow_dynamic_shared, cuda_device, i32_of, run, tensor, Inputs};

/// Whether the kernel takes pools in `kv` format with head dim `hd`.
pub fn supports(kv: KvDtype, hd: usize) -> bool {
    hd <= 256 && (!kv.is_quantized() || hd % 32 == 0)
}

/// Encodes `x: [n, hd]` f32 rows as q8_0 / q4_0 byte rows `[n, row_bytes]` on the device.
pub fn encode_rows(x: &Tensor, kv: KvDtype) -> Result<Tensor> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("KV encode: not a CUDA tensor".into()))?;
    let (n, hd) = x.dims2()?;
    let name = match kv {
        KvDtype::Q8_0 => "kv_encode_q8_0",
        KvDtype::Q4_0 => "kv_encode_q4_0",
        other => return Err(ModelError::Input(format!("KV encode: {other} rows are not byte-encoded"))),
    };
    kv.check_head_dim(hd)?;
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let inputs = Inputs::new(&[&x])?;
    let xv = inputs.view::<f32>(0)?;
    let blocks = n * hd / 32;
    let row_bytes = kv.row_elems(hd);
    // SAFETY: the kernel writes every byte of every block.
    let out = unsafe { dev.alloc::<u8>((n * row_bytes).max(1))? };
    let nb = i32_of(blocks)?;
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::KV_QUANT))?;
    let mut b = f.builder();
    b.arg(&out).arg(&xv).arg(&nb);
    let cfg = LaunchConfig {
        grid_dim: (blocks.div_ceil(128).max(1) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: out holds blocks * block bytes, x blocks * 32 values.
    unsafe { run(&mut b, cfg, name)? };
    drop(b);
    drop(xv);
    drop(inputs);
    Ok(tensor(out, &dev, (n, row_bytes)))
}

/// A paged-attention kernel and how to launch it for a call ([`kernel_and_tiles`]).
pub(super) struct AttnKernel {
    pub name: String,
    /// Thread blocks along the grid's x: tiles of the call's query rows x GQA heads.
    pub tiles: usize,
    pub threads: u32,
    /// Dynamic shared memory, bytes (0: none).
    pub smem: u32,
}

/// The kernel (`paged_attention_{format}_{d64|d128|d256}`, or `paged_attention_f16mma[_g4]_d{hd}`
/// on the tensor cores for f16 pools) for a `kv` cache in `pool` tensors and calls of up to `t`
/// query rows a sequence, with its tiles (each block holds U (query row, query head) units,
/// fixed by the kernel, as many heads of a GQA group as fit, then rows), threads and dynamic
/// shared memory.
pub(super) fn kernel_and_tiles(
    kv: KvDtype,
    pool: DType,
    nh: usize,
    nkv: usize,
    hd: usize,
    t: usize,
) -> Result<AttnKernel> {
    let format = match (kv, pool) {
        (KvDtype::Q8_0, DType::U8) => "q8_0",
        (KvDtype::Q4_0, DType::U8) => "q4_0",
        (_, DType::F32) => "f32",
        (_, DType::F16) => "f16",
        (_, DType::BF16) => "bf16",
        (f, other) => {
            return Err(ModelError::Input(format!("paged attention on CUDA: {other:?} pools for a {f} cache")))
        }
    };
    if nkv == 0 || nh % nkv != 0 || hd == 0 || hd > 256 {
        return Err(ModelError::Input(format!("paged attention on CUDA: {nh} heads over {nkv} KV heads of dim {hd}")));
    }
    let group = nh / nkv;
    if format == "f16" && matches!(hd, 64 | 128 | 256) && mma_enabled() {
        // Rows of one 8-unit group; with 256-dim heads, calls of at least two groups' rows
        // (verify and prefill chunks) take four groups a block, which share each key tile (the
        // same bits; 1.19-1.46x 9B prefill at depth, where 128-dim heads lost: see the kernel).
        let rows = MMA_UNITS / group.min(MMA_UNITS);
        let ug = if hd == 256 && t >= 2 * rows && mma_groups_enabled() { 4 } else { 1 };
        let tiles = t.div_ceil(rows * ug) * group.div_ceil(MMA_UNITS);
        let name = match ug {
            1 => format!("paged_attention_f16mma_d{hd}"),
            _ => format!("paged_attention_f16mma_g4_d{hd}"),
        };
        let threads = super::cuda_batch::THREADS * ug as u32;
        return Ok(AttnKernel { name, tiles, threads, smem: mma_shared_bytes(hd, ug) });
    }
    let (class, units) = match hd {
        0..=64 => ("d64", 16),
        // One query row (decode) and a GQA group of up to 4 heads fill 4 units only: the
        // 4-unit kernel gives them the same bits in 168 registers (three blocks an SM) where
        // the 8-unit one takes 231 (two). `TANDEM_ATTN_U4=0` keeps the 8-unit kernel.
        65..=128 if t == 1 && group <= 4 && u4_enabled() => ("d128u4", 4),
        65..=128 => ("d128", 8),
        _ => ("d256", 4),
    };
    let heads_per_block = group.min(units);
    let tiles = t.div_ceil(units / heads_per_block) * group.div_ceil(heads_per_block);
    Ok(AttnKernel {
        name: format!("paged_attention_{format}_{class}"),
        tiles,
        threads: super::cuda_batch::THREADS,
        smem: 0,
    })
}

/// Units (query row, query head) of one group of a tensor-core attention block (`MMA_U`).
const MMA_UNITS: usize = 8;

/// `MmaLayout<hd, ug>::BYTES` of `cuda/paged_attention_mma.cuh`: each group's queries (f16 hi
/// and lo) and two 16-key tiles of key and value rows for each of the four key phases, rows
/// padded by 8 halves.
pub(super) fn mma_shared_bytes(hd: usize, ug: usize) -> u32 {
    let rs = hd + 8;
    let stage = 2 * 16 * rs;
    ((ug * 2 * MMA_UNITS * rs + 4 * 2 * stage) * 2) as u32
}

/// Whether verify and prefill chunks with 256-dim heads take the four-group tensor-core kernel
/// (`_g4`, the default; the same bits as the one-group one); `TANDEM_ATTN_MMA_GROUPS=1` keeps
/// one group.
fn mma_groups_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_ATTN_MMA_GROUPS").map_or(true, |v| v != "1"))
}

/// Whether f16 caches with head dims 64, 128 or 256 take the tensor-core kernels (the
/// default); `TANDEM_ATTN_MMA=0` keeps the scalar ones (another chain: a process uses one).
fn mma_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_ATTN_MMA").map_or(true, |v| v != "0"))
}

/// Whether one-row calls with 128-dim heads take `paged_attention_*_d128u4` (the default).
fn u4_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_ATTN_U4").map_or(true, |v| v != "0"))
}

/// Keys per split-KV segment (`SPLIT` in `cuda/paged_attention.cu`).
const SPLIT: usize = 256;

/// `q: [nh, t, hd]` over the pools `[rows, nkv, hd]`; see [`super::paged_attention`].
pub fn paged_attention(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    kv: PagedKv<'_>,
    device_table: Option<&Tensor>,
    past: usize,
    scale: f64,
) -> Result<Tensor> {
    let dev = cuda_device(q).ok_or_else(|| ModelError::Input("paged attention: not a CUDA tensor".into()))?;
    let (nh, t, hd) = q.dims3()?;
    let (_, nkv, _) = k_pool.dims3()?;
    let AttnKernel { name, tiles, threads, smem } = kernel_and_tiles(kv.dtype, k_pool.dtype(), nh, nkv, hd, t)?;
    let need = (past + t).div_ceil(kv.block_size).min(kv.blocks.len());
    // An upload from pageable memory synchronises the stream: use the table the sequence
    // uploaded once for this step when there is one.
    let blocks = match device_table {
        Some(tab) if tab.device().same_device(q.device()) && tab.dim(0)? >= need => tab.clone(),
        _ => Tensor::from_slice(&kv.blocks[..need], need, q.device())?,
    };
    let q = q.to_dtype(DType::F32)?.contiguous()?;
    let (k_pool, v_pool) = (k_pool.contiguous()?, v_pool.contiguous()?);
    let inputs = Inputs::new(&[&q, &k_pool, &v_pool, &blocks])?;
    let out = alloc_f32(&dev, nh * t * hd)?;
    // Split-KV: segments of SPLIT keys (the kernel's), one block each; with more than one in
    // the call, per-segment partials go to `part` and a merge kernel combines each row's.
    let nsplit = (past + t).div_ceil(SPLIT).max(1);
    // SAFETY: with nsplit > 1 every block writes its segment's partial (an empty one too).
    let part = if nsplit > 1 { Some(unsafe { dev.alloc::<f32>(t * nh * nsplit * (hd + 2))? }) } else { None };
    let null = 0u64;
    let qv = inputs.view::<f32>(0)?;
    let bv = inputs.view::<u32>(3)?;
    let args = [i32_of(nh)?, i32_of(nkv)?, i32_of(t)?, i32_of(hd)?, i32_of(past)?, i32_of(kv.block_size)?];
    let scale = scale as f32;
    let window = i32_of(kv.window)?;
    let f = dev.kernel(&name, tandem_kernels::ptx(tandem_kernels::PAGED_ATTENTION))?;
    if smem > 0 {
        allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), &name, smem)?;
    }
    let cfg = LaunchConfig {
        grid_dim: (tiles as u32, nkv as u32, nsplit as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem,
    };
    macro_rules! go {
        ($T:ty) => {{
            let (kv_, vv) = (inputs.view::<$T>(1)?, inputs.view::<$T>(2)?);
            let mut b = f.builder();
            b.arg(&out);
            match &part {
                Some(p) => b.arg(p),
                None => b.arg(&null),
            };
            b.arg(&qv).arg(&kv_).arg(&vv).arg(&bv);
            for a in &args {
                b.arg(a);
            }
            b.arg(&scale).arg(&window);
            // SAFETY: arguments in the kernel's order; out holds nh*t*hd, part t*nh*nsplit*(hd+2);
            // the block table covers positions 0..past+t (checked by the caller against the
            // pool's rows).
            unsafe { run(&mut b, cfg, &name)? };
        }};
    }
    match k_pool.dtype() {
        DType::F32 => go!(f32),
        DType::F16 => go!(half::f16),
        DType::U8 => go!(u8),
        _ => go!(half::bf16),
    }
    if let Some(p) = &part {
        let merge = "paged_attention_merge";
        let f = dev.kernel(merge, tandem_kernels::ptx(tandem_kernels::PAGED_ATTENTION))?;
        let (nhi, ti, hdi, pi, nsi) = (i32_of(nh)?, i32_of(t)?, i32_of(hd)?, i32_of(past)?, i32_of(nsplit)?);
        let mut b = f.builder();
        b.arg(&out).arg(p).arg(&nhi).arg(&ti).arg(&hdi).arg(&pi).arg(&nsi);
        let cfg = LaunchConfig { grid_dim: (t as u32, nh as u32, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: paged_attention_merge(out, part, nh, t, hd, past, nsplit): the buffers above.
        unsafe { run(&mut b, cfg, merge)? };
    }
    drop(qv);
    drop(bv);
    drop(inputs);
    Ok(tensor(out, &dev, (nh, t, hd)))
}
