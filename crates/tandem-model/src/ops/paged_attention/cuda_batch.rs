//! One attention layer's work for a whole batch of sequences in a few launches (CUDA): the new
//! keys and values of every sequence written into the pools by one launch (`kv_store_rows_*`,
//! plain pools) or one scatter each (`kv_scatter_rows`, rows already encoded), and attention over every sequence's own blocks by one launch of the
//! `*_batch` kernels of `paged_attention.cu` (plus one merge when some sequence's context
//! spans several segments), instead of those launches and the slicing around them once per
//! sequence. Each sequence runs exactly the thread blocks it would alone (its own tiles and
//! segment count), so its rows get the same bits: check-device compares the two.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::kv::KvDtype;
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{
    alloc_f32, allow_dynamic_shared, cuda_device, device_address, i32_of, run, tensor, Inputs,
};

/// Keys per split-KV segment (`SPLIT` in `cuda/paged_attention.cu`).
pub(crate) const SPLIT: usize = 256;
/// Threads of an attention block (`WARPS * 32` in `cuda/paged_attention.cu`).
pub(crate) const THREADS: u32 = 128;

/// One sequence of a batch: its block table, positions already written, new rows.
pub struct SeqRows<'a> {
    pub blocks: &'a [u32],
    pub past: usize,
    pub t: usize,
}

/// A batch's layout on the device, built once and used by every attention layer of a step:
/// one buffer of `[meta (off, t, past, table offset) per sequence | pool row of each new token
/// | the block tables]`.
pub struct BatchTables {
    buf: Tensor,
    nseq: usize,
    total: usize,
    t_max: usize,
    nsplit_max: usize,
    slots_at: usize,
    tables_at: usize,
    /// Whether some sequence's context spans more than one segment (a merge is needed).
    split: bool,
}

/// The shape of a batch's layout ([`BatchTables::layout`]).
pub struct BatchShape {
    pub nseq: usize,
    /// Rows (new tokens) over all sequences.
    pub total: usize,
    /// The longest sequence's new rows.
    pub t_max: usize,
    /// The most 256-key segments a sequence's context spans.
    pub nsplit: usize,
}

impl BatchTables {
    /// Checks every sequence's table against its positions and the pool of `num_blocks`
    /// blocks of `block_size`, and uploads the batch's layout to `dev`.
    pub fn new(seqs: &[SeqRows<'_>], block_size: usize, num_blocks: usize, dev: &Device) -> Result<Self> {
        let (all, s) = Self::layout(seqs, block_size, num_blocks)?;
        let n = all.len();
        Ok(Self::in_buffer(Tensor::from_vec(all, n, dev)?, s.nseq, s.total, s.t_max, s.nsplit))
    }

    /// The batch's layout as it goes to the device, `[meta (off, t, past, table offset) per
    /// sequence | pool row of each new token | the block tables]`, and its shape; the tables
    /// checked as in [`Self::new`].
    pub fn layout(seqs: &[SeqRows<'_>], block_size: usize, num_blocks: usize) -> Result<(Vec<u32>, BatchShape)> {
        let nseq = seqs.len();
        let total: usize = seqs.iter().map(|s| s.t).sum();
        let mut meta = Vec::with_capacity(4 * nseq);
        let mut slots = Vec::with_capacity(total);
        let mut tables = Vec::new();
        let (mut off, mut t_max, mut nsplit_max) = (0usize, 0usize, 1usize);
        for s in seqs {
            let len = s.past + s.t;
            let need = len.div_ceil(block_size);
            if s.t == 0 || need > s.blocks.len() {
                return Err(ModelError::Input(format!(
                    "block table of {} blocks cannot hold positions {}..{len}",
                    s.blocks.len(),
                    s.past
                )));
            }
            if let Some(&b) = s.blocks[..need].iter().find(|&&b| b as usize >= num_blocks) {
                return Err(ModelError::Input(format!("KV block {b} is outside a pool of {num_blocks} blocks")));
            }
            let as_u32 = |x: usize| u32::try_from(x).map_err(|_| ModelError::Input(format!("batch too large: {x}")));
            meta.extend([as_u32(off)?, as_u32(s.t)?, as_u32(s.past)?, as_u32(tables.len())?]);
            for p in s.past..len {
                slots.push(as_u32(s.blocks[p / block_size] as usize * block_size + p % block_size)?);
            }
            tables.extend_from_slice(&s.blocks[..need]);
            off += s.t;
            t_max = t_max.max(s.t);
            nsplit_max = nsplit_max.max(len.div_ceil(SPLIT));
        }
        let mut all = meta;
        all.extend(slots);
        all.extend(tables);
        Ok((all, BatchShape { nseq, total, t_max, nsplit: nsplit_max }))
    }

    /// Tables already on the device in `buf` as [`Self::layout`] lays them out (a CUDA graph's
    /// input buffer, rewritten before every launch): `nsplit` is the most segments any sequence
    /// may span. The kernels then run `nsplit` segments' blocks per sequence (those past a
    /// sequence's own count return at once) and the merge whenever `nsplit > 1` (it skips a
    /// sequence of one segment, which the attention kernel wrote directly), so every row gets
    /// the bits of [`Self::new`]'s exact count.
    pub fn in_buffer(buf: Tensor, nseq: usize, total: usize, t_max: usize, nsplit: usize) -> Self {
        let nsplit = nsplit.max(1);
        Self {
            buf,
            nseq,
            total,
            t_max,
            nsplit_max: nsplit,
            slots_at: 4 * nseq,
            tables_at: 4 * nseq + total,
            split: nsplit > 1,
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

/// Writes `rows` `[total, ...]` (the pool's dtype and row layout, contiguous) into `pool`'s rows
/// at the batch's slots, in place.
pub fn scatter_rows(pool: &Tensor, rows: &Tensor, bt: &BatchTables) -> Result<()> {
    let dev = cuda_device(pool).ok_or_else(|| ModelError::Input("KV scatter: not a CUDA tensor".into()))?;
    if rows.dtype() != pool.dtype()
        || rows.dim(0)? != bt.total
        || rows.elem_count() / bt.total.max(1) != pool.elem_count() / pool.dim(0)?.max(1)
    {
        return Err(ModelError::Input(format!("KV scatter: rows {:?} into a pool {:?}", rows.dims(), pool.dims())));
    }
    let row_bytes = (rows.elem_count() / bt.total.max(1) * rows.dtype().size_in_bytes()) as i64;
    let rows = rows.contiguous()?;
    let (dst, src) = (device_address(pool)?, device_address(&rows)?);
    let inputs = Inputs::new(&[&bt.buf])?;
    let slots = inputs.view::<u32>(0)?.slice(bt.slots_at..bt.slots_at + bt.total);
    let n = i32_of(bt.total)?;
    let f = dev.kernel("kv_scatter_rows", tandem_kernels::ptx(tandem_kernels::PAGED_ATTENTION))?;
    let mut b = f.builder();
    b.arg(&dst).arg(&src).arg(&slots).arg(&n).arg(&row_bytes);
    let cfg =
        LaunchConfig { grid_dim: (bt.total.div_ceil(8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: kv_scatter_rows(pool, src, slots, n, row_bytes): src holds n rows of row_bytes,
    // every slot was checked against the pool's blocks in `BatchTables::new`.
    unsafe { run(&mut b, cfg, "kv_scatter_rows")? };
    drop(b);
    drop(slots);
    drop(inputs);
    drop(rows);
    Ok(())
}

/// Writes the batch's new keys and values `k`, `v` `[nkv, total, hd]` f32 into plain (f32 or
/// f16) pools `[rows, nkv, hd]` at the batch's slots in one launch (`kv_store_rows_*`): the
/// transpose, the rounding to the pool's dtype and the scatter of both, which otherwise take
/// a cast and a [`scatter_rows`] each. The pools get the bits of that path.
pub fn store_rows(k_pool: &Tensor, v_pool: &Tensor, k: &Tensor, v: &Tensor, bt: &BatchTables) -> Result<()> {
    let dev = cuda_device(k_pool).ok_or_else(|| ModelError::Input("KV store: not a CUDA tensor".into()))?;
    let (nkv, total, hd) = k.dims3()?;
    let name = match k_pool.dtype() {
        DType::F32 => "kv_store_rows_f32",
        DType::F16 => "kv_store_rows_f16",
        other => return Err(ModelError::Input(format!("KV store: {other:?} pools take scatter_rows"))),
    };
    let pool_row = nkv * hd;
    if k.dtype() != DType::F32
        || v.dims3()? != (nkv, total, hd)
        || v.dtype() != DType::F32
        || total != bt.total
        || v_pool.dtype() != k_pool.dtype()
        || k_pool.elem_count() / k_pool.dim(0)?.max(1) != pool_row
        || v_pool.elem_count() != k_pool.elem_count()
    {
        return Err(ModelError::Input(format!(
            "KV store: rows {:?} / {:?} into pools {:?}",
            k.dims(),
            v.dims(),
            k_pool.dims()
        )));
    }
    let (k, v) = (k.contiguous()?, v.contiguous()?);
    let (kd, vd) = (device_address(k_pool)?, device_address(v_pool)?);
    let inputs = Inputs::new(&[&bt.buf, &k, &v])?;
    let slots = inputs.view::<u32>(0)?.slice(bt.slots_at..bt.slots_at + bt.total);
    let (kv_, vv) = (inputs.view::<f32>(1)?, inputs.view::<f32>(2)?);
    let (ti, nkvi, hdi) = (i32_of(total)?, i32_of(nkv)?, i32_of(hd)?);
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::PAGED_ATTENTION))?;
    let mut b = f.builder();
    b.arg(&kd).arg(&vd).arg(&kv_).arg(&vv).arg(&slots).arg(&ti).arg(&nkvi).arg(&hdi);
    let warps = total * nkv;
    let cfg =
        LaunchConfig { grid_dim: (warps.div_ceil(8).max(1) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: kv_store_rows_*(kpool, vpool, k, v, slots, total, nkv, hd): k and v hold
    // nkv * total * hd f32, the pools rows of nkv * hd elements of their dtype, and every slot
    // was checked against the pool's blocks in `BatchTables::new`.
    unsafe { run(&mut b, cfg, name)? };
    drop(b);
    drop((slots, kv_, vv));
    drop(inputs);
    Ok(())
}

/// Attention of `q` `[nh, total, hd]` (the batch's rows, sequence after sequence) over each
/// sequence's own blocks of the pools `[rows, nkv, hd]` (their new rows already written);
/// `[nh, total, hd]` f32.
pub fn attention(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    dtype: KvDtype,
    bt: &BatchTables,
    block_size: usize,
    window: usize,
    scale: f64,
) -> Result<Tensor> {
    let dev = cuda_device(q).ok_or_else(|| ModelError::Input("paged attention: not a CUDA tensor".into()))?;
    let (nh, total, hd) = q.dims3()?;
    let (_, nkv, _) = k_pool.dims3()?;
    if total != bt.total {
        return Err(ModelError::Input(format!("batched paged attention: q {:?} for {} rows", q.dims(), bt.total)));
    }
    let super::cuda::AttnKernel { name: base, tiles, threads, smem } =
        super::cuda::kernel_and_tiles(dtype, k_pool.dtype(), nh, nkv, hd, bt.t_max)?;
    let name = format!("{base}_batch");
    let q = q.to_dtype(DType::F32)?.contiguous()?;
    let (k_pool, v_pool) = (k_pool.contiguous()?, v_pool.contiguous()?);
    let inputs = Inputs::new(&[&q, &k_pool, &v_pool, &bt.buf])?;
    let out = alloc_f32(&dev, nh * total * hd)?;
    let pstride = bt.nsplit_max;
    // SAFETY: every (row, head, segment) a sequence uses is written by its blocks (an empty
    // segment too); the merge reads only those.
    let part = if bt.split { Some(unsafe { dev.alloc::<f32>(total * nh * pstride * (hd + 2))? }) } else { None };
    let null = 0u64;
    let qv = inputs.view::<f32>(0)?;
    let all = inputs.view::<u32>(3)?;
    let tables = all.slice(bt.tables_at..);
    let meta = all.slice(0..4 * bt.nseq);
    let args = [i32_of(nh)?, i32_of(nkv)?, i32_of(hd)?, i32_of(block_size)?, i32_of(total)?, i32_of(pstride)?];
    let scale = scale as f32;
    let window = i32_of(window)?;
    let grid_z = u32::try_from(pstride * bt.nseq).ok().filter(|&z| z <= 65_535);
    let grid_z = grid_z.ok_or_else(|| ModelError::Input("batched paged attention: too many segments".into()))?;
    let f = dev.kernel(&name, tandem_kernels::ptx(tandem_kernels::PAGED_ATTENTION))?;
    if smem > 0 {
        allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), &name, smem)?;
    }
    let cfg = LaunchConfig {
        grid_dim: (tiles as u32, nkv as u32, grid_z),
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
            b.arg(&qv).arg(&kv_).arg(&vv).arg(&tables).arg(&meta);
            for a in &args[..5] {
                b.arg(a);
            }
            b.arg(&args[5]).arg(&scale).arg(&window);
            // SAFETY: arguments in the *_batch kernel's order (out, part, q, k, v, tables, meta,
            // nh, nkv, hd, bs, total, pstride, scale, window); out holds nh*total*hd, part
            // total*nh*pstride*(hd+2); the tables cover every sequence's positions (checked).
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
        let merge = "paged_attention_merge_batch";
        let f = dev.kernel(merge, tandem_kernels::ptx(tandem_kernels::PAGED_ATTENTION))?;
        let mut b = f.builder();
        b.arg(&out).arg(p).arg(&meta).arg(&args[0]).arg(&args[2]).arg(&args[4]).arg(&args[5]);
        let cfg = LaunchConfig {
            grid_dim: (bt.t_max as u32, nh as u32, bt.nseq as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: paged_attention_merge_batch(out, part, meta, nh, hd, total, pstride).
        unsafe { run(&mut b, cfg, merge)? };
    }
    drop(tables);
    drop(meta);
    drop(all);
    drop(qv);
    drop(inputs);
    Ok(tensor(out, &dev, (nh, total, hd)))
}
