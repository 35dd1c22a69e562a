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
//! Other devices gather the sequence's KV into contiguous tensors and run the plain
//! [`causal_attention`], which is also the reference the tests compare the kernel against.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor};

use crate::error::{ModelError, Result};
use crate::ops::attention::causal_attention;

/// Where a sequence's KV lives in a pool.
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a> {
    /// Block ids in position order: position `p` is pool row `blocks[p / block_size] *
    /// block_size + p % block_size`.
    pub blocks: &'a [u32],
    pub block_size: usize,
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

/// Gathers positions `0..len` of a pool `[rows, n_kv, hd]` into `[n_kv, len, hd]`.
pub fn gather_kv(pool: &Tensor, kv: PagedKv<'_>, len: usize) -> Result<Tensor> {
    let slots = kv.slots(len)?;
    let idx = Tensor::from_vec(slots, len, pool.device())?;
    Ok(pool.index_select(&idx, 0)?.transpose(0, 1)?.contiguous()?)
}

/// Attention of `q: [n_heads, t, hd]` (the last `t` of `past + t` positions) over the
/// sequence's keys and values in `k_pool`, `v_pool: [rows, n_kv, hd]` (f32). Query `i` sees
/// positions `0..=past + i`. Returns `[n_heads, t, hd]`.
pub fn paged_attention(
    q: &Tensor,
    k_pool: &Tensor,
    v_pool: &Tensor,
    kv: PagedKv<'_>,
    past: usize,
    scale: f64,
) -> Result<Tensor> {
    let (n_heads, t, hd) = q.dims3()?;
    let (rows, n_kv, khd) = k_pool.dims3()?;
    if khd != hd || v_pool.dims3()? != (rows, n_kv, hd) || n_kv == 0 || n_heads % n_kv != 0 {
        return Err(ModelError::Input(format!(
            "paged attention: q {:?}, k pool {:?}, v pool {:?} do not fit",
            q.dims(),
            k_pool.dims(),
            v_pool.dims()
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
    if !q.device().is_cpu() {
        let k = gather_kv(k_pool, kv, len)?;
        let v = gather_kv(v_pool, kv, len)?;
        return causal_attention(&q.contiguous()?, &k, &v, scale);
    }
    let op = PagedAttentionOp { blocks: kv.blocks.to_vec(), block_size: kv.block_size, past, scale: scale as f32 };
    let q = q.to_dtype(DType::F32)?.contiguous()?;
    Ok(q.apply_op3_no_bwd(k_pool, v_pool, &op)?)
}

struct PagedAttentionOp {
    blocks: Vec<u32>,
    block_size: usize,
    past: usize,
    scale: f32,
}

fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else {
        candle_core::bail!("paged attention: {what} must be f32, got {:?}", s.dtype());
    };
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
        let (q, k, v) = (f32_slice(s1, l1, "q")?, f32_slice(s2, l2, "k pool")?, f32_slice(s3, l3, "v pool")?);
        let (n_heads, t, hd) = l1.shape().dims3()?;
        let (_, n_kv, _) = l2.shape().dims3()?;
        let dims = Dims { n_heads, n_kv, t, hd, past: self.past, block_size: self.block_size };
        let out = paged_attention_cpu(q, k, v, &self.blocks, dims, self.scale);
        Ok((CpuStorage::F32(out), Shape::from((n_heads, t, hd))))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
mod kernel;
#[cfg(test)]
mod reference;
mod segment;
mod vec_ops;
pub use kernel::{paged_attention_cpu, Dims};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_kernel;
