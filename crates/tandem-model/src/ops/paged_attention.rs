//! Causal grouped-query attention over a paged KV pool: the keys and values of a sequence live
//! in fixed-size blocks scattered over one pool tensor per layer, listed in order by the
//! sequence's block table.
//!
//! The CPU kernel is tiled like flash attention: the query heads that share a KV head and a
//! tile of query positions walk a segment of the sequence's keys together, computing a
//! maximum, normaliser and weighted sum per query row, and the segments' states are merged
//! (online softmax, split over key positions like flash-decoding), so memory never grows with
//! the square of the length and every key and value row is read once per tile, not once per
//! query head. A query row's arithmetic
//! depends only on its own query, the keys it sees and their block order, never on the tile
//! or chunk it arrives in, so chunked prefill and decode give bit-identical rows.
//!
//! Pools hold f32, f16, q8_0 or q4_0 rows ([`KvDtype`]); the kernel decodes the rows of a
//! work item to f32 once and shares them across the item's query rows (`format`), so the
//! format changes the values attention sees, never its arithmetic.
//!
//! On CUDA a kernel of the same design runs ([`cuda`]: one thread block per query row and
//! head, row-invariant); other devices gather the sequence's KV into contiguous tensors and
//! run the plain [`causal_attention`] (the portable path), which is also the reference the
//! tests compare the kernels against.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};

use crate::error::{ModelError, Result};
use crate::kv::KvDtype;
use crate::ops::attention::causal_attention;

/// Where a sequence's KV lives in a pool.
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a> {
    /// Block ids in position order: position `p` is pool row `blocks[p / block_size] *
    /// block_size + p % block_size`.
    pub blocks: &'a [u32],
    pub block_size: usize,
    /// The format of the pool rows.
    pub dtype: KvDtype,
    /// Sliding window: a query at position `p` sees keys `p + 1 - window ..= p` (0: all).
    pub window: usize,
}

impl PagedKv<'_> {
    /// Pool rows of positions `0..len`.
    pub fn slots(&self, len: usize) -> Result<Vec<u32>> {
        if len > self.blocks.len() * self.block_size {
            return Err(ModelError::Input(format!(
                "block table of {} blocks cannot hold {len} positions",
                self.blocks.len()
            )));
        }
        Ok((0..len)
            .map(|p| self.blocks[p / self.block_size] * self.block_size as u32 + (p % self.block_size) as u32)
            .collect())
    }
}

/// Gathers positions `0..len` of a pool `[rows, n_kv, row_elems]` into f32 `[n_kv, len,
/// hd]`, decoding the rows of the quantised formats (`hd` is the model's head dimension).
pub fn gather_kv(pool: &Tensor, kv: PagedKv<'_>, len: usize, hd: usize) -> Result<Tensor> {
    let slots = kv.slots(len)?;
    let idx = Tensor::from_vec(slots, len, pool.device())?;
    let rows = pool.index_select(&idx, 0)?;
    let rows = if kv.dtype.is_quantized() {
        let (_, n_kv, elems) = rows.dims3()?;
        let bytes = rows.flatten_all()?.to_vec1::<u8>()?;
        let mut out = vec![0f32; len * n_kv * hd];
        for (src, dst) in bytes.chunks_exact(elems).zip(out.chunks_exact_mut(hd)) {
            kv.dtype.dequantize_row(src, dst);
        }
        Tensor::from_vec(out, (len, n_kv, hd), pool.device())?
    } else {
        rows.to_dtype(DType::F32)?
    };
    Ok(rows.transpose(0, 1)?.contiguous()?)
}

/// Attention of `q: [n_heads, t, hd]` (the last `t` of `past + t` positions) over the
/// sequence's keys and values in `k_pool`, `v_pool: [rows, n_kv, row_elems]` (rows in format
/// `kv.dtype`). Query `i` sees positions `0..=past + i` (the last `kv.window` of them with a
/// sliding window). Returns `[n_heads, t, hd]` (f32).
pub fn paged_attention(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    kv: PagedKv<'_>,
    past: usize,
    scale: f64,
) -> Result<Tensor> {
    paged_attention_with_table(q, k_pool, v_pool, kv, None, past, scale)
}

/// [`paged_attention`] with the block table already on the pools' device (`device_table`, the
/// same ids as `kv.blocks`; GPU kernels read it there instead of uploading it per call).
pub fn paged_attention_with_table(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    kv: PagedKv<'_>,
    device_table: Option<&Tensor>,
    past: usize,
    scale: f64,
) -> Result<Tensor> {
    let (n_heads, t, hd) = q.dims3()?;
    let (rows, n_kv, elems) = k_pool.dims3()?;
    if elems != kv.dtype.row_elems(hd)
        || v_pool.dims3()? != (rows, n_kv, elems)
        || n_kv == 0
        || n_heads % n_kv != 0
        || k_pool.dtype() != kv.dtype.storage_dtype()
        || v_pool.dtype() != kv.dtype.storage_dtype()
    {
        return Err(ModelError::Input(format!(
            "paged attention: q {:?}, k pool {:?} {:?}, v pool {:?} {:?} do not fit a {} cache",
            q.dims(),
            k_pool.dims(),
            k_pool.dtype(),
            v_pool.dims(),
            v_pool.dtype(),
            kv.dtype
        )));
    }
    let len = past + t;
    if kv.blocks.iter().any(|&b| (b as usize + 1) * kv.block_size > rows) {
        return Err(ModelError::Input(format!("block table {:?} points outside a pool of {rows} rows", kv.blocks)));
    }
    if kv.blocks.len() * kv.block_size < len {
        return Err(ModelError::Input(format!(
            "block table of {} blocks cannot hold {len} positions",
            kv.blocks.len()
        )));
    }
    #[cfg(not(feature = "cuda"))]
    let _ = device_table;
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() && cuda::supports(kv.dtype, hd) {
        return cuda::paged_attention(q, k_pool, v_pool, kv, device_table, past, scale);
    }
    if !q.device().is_cpu() {
        // The portable path: any device, any format (gathered and decoded), materialised.
        let k = gather_kv(k_pool, kv, len, hd)?;
        let v = gather_kv(v_pool, kv, len, hd)?;
        return causal_attention(&q.contiguous()?, &k, &v, scale, kv.window);
    }
    let op = PagedAttentionOp {
        blocks: kv.blocks.to_vec(),
        block_size: kv.block_size,
        dtype: kv.dtype,
        window: kv.window,
        past,
        scale: scale as f32,
    };
    let q = q.to_dtype(DType::F32)?.contiguous()?;
    Ok(q.apply_op3_no_bwd(k_pool, v_pool, &op)?)
}

struct PagedAttentionOp {
    blocks: Vec<u32>,
    block_size: usize,
    dtype: KvDtype,
    window: usize,
    past: usize,
    scale: f32,
}

fn contiguous<'a, T>(data: &'a [T], l: &Layout, what: &str) -> candle_core::Result<&'a [T]> {
    let Some((start, end)) = l.contiguous_offsets() else {
        candle_core::bail!("paged attention: {what} must be contiguous");
    };
    Ok(&data[start..end])
}

impl CustomOp3 for PagedAttentionOp {
    fn name(&self) -> &'static str {
        "paged-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(q) = s1 else {
            candle_core::bail!("paged attention: q must be f32, got {:?}", s1.dtype());
        };
        let q = contiguous(q, l1, "q")?;
        let (n_heads, t, hd) = l1.shape().dims3()?;
        let (_, n_kv, _) = l2.shape().dims3()?;
        let d = Dims { n_heads, n_kv, t, hd, past: self.past, block_size: self.block_size, window: self.window };
        let (blocks, scale, simd) = (&self.blocks[..], self.scale, kernel::has_avx2_fma());
        let out = match (self.dtype, s2, s3) {
            (KvDtype::F32, CpuStorage::F32(k), CpuStorage::F32(v)) => {
                let (k, v) = (contiguous(k, l2, "k pool")?, contiguous(v, l3, "v pool")?);
                kernel::run::<format::F32Rows>(q, k, v, blocks, d, scale, simd)
            }
            (KvDtype::F16, CpuStorage::F16(k), CpuStorage::F16(v)) => {
                let (k, v) = (contiguous(k, l2, "k pool")?, contiguous(v, l3, "v pool")?);
                kernel::run::<format::F16Rows>(q, k, v, blocks, d, scale, simd)
            }
            (KvDtype::Q8_0, CpuStorage::U8(k), CpuStorage::U8(v)) => {
                let (k, v) = (contiguous(k, l2, "k pool")?, contiguous(v, l3, "v pool")?);
                kernel::run::<format::Q8Rows>(q, k, v, blocks, d, scale, simd)
            }
            (KvDtype::Q4_0, CpuStorage::U8(k), CpuStorage::U8(v)) => {
                let (k, v) = (contiguous(k, l2, "k pool")?, contiguous(v, l3, "v pool")?);
                kernel::run::<format::Q4Rows>(q, k, v, blocks, d, scale, simd)
            }
            (dt, k, _) => candle_core::bail!("paged attention: a {dt} cache cannot hold {:?} pools", k.dtype()),
        };
        Ok((CpuStorage::F32(out), Shape::from((n_heads, t, hd))))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_batch;
mod format;
mod kernel;
#[cfg(test)]
mod reference;
mod segment;
mod vec_ops;
pub use kernel::{paged_attention_cpu, Dims};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_format;
#[cfg(test)]
mod tests_kernel;
