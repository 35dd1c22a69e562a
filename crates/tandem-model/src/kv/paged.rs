//! Paged KV storage: one pool of fixed-size blocks per attention layer, shared by every
//! sequence, and [`LayerKv`], the view of one layer of one sequence the attention call sites
//! use whether its KV is paged or contiguous.
//!
//! Each attention layer keeps two pool tensors `[num_blocks * block_size, kv_heads,
//! row_elems]` in the store's [`KvDtype`] (f32, f16, or the bytes of q8_0 / q4_0 rows); block
//! `b` is rows `b * block_size ..`. A position's keys and values are converted to that format
//! once, when they are written. Which blocks a sequence owns is decided
//! outside the model (the engine's block pool and tables); the model only writes new
//! positions into the blocks it is given and attends over them with
//! [`crate::ops::paged_attention`]. Writes go through candle's in-place `slice_set` (on a
//! GPU, one scatter launch for all of a chunk's rows), so the store is shared behind `&` (one
//! engine thread drives it).
//!
//! Sliding-window layers may instead keep a *ring* per sequence ([`PagedKvStore::with_rings`]):
//! their pool is `ring_blocks` blocks that the engine deals out in fixed runs (one per running
//! sequence), and a sequence's logical block `i` of such a layer lives in block
//! `base + i % len` of its run ([`ring_table`]). A ring of `len` blocks holds the last
//! `len * block_size` positions, so such a layer's memory per sequence is bounded by its
//! window (plus one chunk), however long the sequence grows; the attention kernels never read
//! a key older than the window, so the overwritten blocks are never seen.

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};
use crate::kv::{KvBuffer, KvDtype, LayerCacheSpec};
use crate::ops::attention::causal_attention;
use crate::ops::paged_attention::{gather_kv, paged_attention_with_table, PagedKv};

/// Largest score matrix (bytes) attention may materialise for one layer and chunk (on the CPU:
/// the largest gathered keys + values, the query-block kernel materialising no scores).
pub const MATERIALISE_LIMIT: usize = 64 << 20;

/// Chunks of at most this many queries always take the tiled kernel, which gives every query
/// row the same bits as decoding it alone: speculative verify chunks (k + 1 <= 17 positions)
/// then choose exactly the tokens plain decoding would, even at near-ties.
pub const SMALL_CHUNK: usize = 17;

fn force_tiled() -> bool {
    static TILED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TILED.get_or_init(|| std::env::var("TANDEM_ATTENTION").is_ok_and(|v| v == "tiled"))
}

pub(super) struct PoolLayer {
    pub(super) k: Tensor,
    pub(super) v: Tensor,
    head_dim: usize,
    /// Sliding window (0: none).
    window: usize,
    /// Blocks in this layer's pool.
    blocks: usize,
    /// The layer keeps per-sequence rings (indexed by ring tables, not the block table).
    pub(super) ring: bool,
}

/// The ring table of a sequence whose ring is blocks `base .. base + len`: logical block `i`
/// (positions `i * block_size ..`) of its sliding-window layers lives in `base + i % len`.
pub fn ring_table(base: u32, len: u32, logical_blocks: usize) -> Vec<u32> {
    (0..logical_blocks).map(|i| base + (i as u32) % len.max(1)).collect()
}

/// The KV pools of every attention layer of a model.
pub struct PagedKvStore {
    pub(super) block_size: usize,
    num_blocks: usize,
    dtype: KvDtype,
    pub(super) layers: Vec<Option<PoolLayer>>,
    pub(super) device: Device,
}

impl std::fmt::Debug for PagedKvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagedKvStore")
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks)
            .field("dtype", &self.dtype)
            .finish()
    }
}

/// A zero pool tensor whose pages the OS commits only when written. candle's CPU `zeros`
/// gets that for f32 and u8 (a zeroed allocation) but fills f16 / bf16 element by element,
/// which touched a whole default pool (gigabytes) at start; those come from a zeroed `u16`
/// allocation instead.
fn zeroed_pool(shape: (usize, usize, usize), dt: DType, device: &Device) -> Result<Tensor> {
    fn lazy<T: candle_core::WithDType>(n: usize, shape: (usize, usize, usize)) -> Result<Tensor> {
        const { assert!(std::mem::size_of::<T>() == 2 && std::mem::align_of::<T>() == 2) };
        let mut raw = std::mem::ManuallyDrop::new(vec![0u16; n]);
        let (ptr, len, cap) = (raw.as_mut_ptr(), raw.len(), raw.capacity());
        // SAFETY: T is a 2-byte, 2-aligned plain value type (f16 / bf16) whose all-zero bit
        // pattern is +0.0; the allocation keeps its layout (same size and alignment per
        // element), ownership moves to the new Vec.
        let v = unsafe { Vec::from_raw_parts(ptr.cast::<T>(), len, cap) };
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }
    let n = shape.0 * shape.1 * shape.2;
    match (device.is_cpu(), dt) {
        (true, DType::F16) => lazy::<half::f16>(n, shape),
        (true, DType::BF16) => lazy::<half::bf16>(n, shape),
        _ => Ok(Tensor::zeros(shape, dt, device)?),
    }
}

impl PagedKvStore {
    /// Pools of `num_blocks` blocks of `block_size` positions in format `dtype` for every
    /// attention layer of `spec`. The memory is zeroed lazily by the OS, so a large pool costs
    /// only what is used. The quantised formats need head dimensions that are multiples of 32
    /// and the CPU.
    pub fn new(
        spec: &[LayerCacheSpec],
        num_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        Self::with_rings(spec, num_blocks, 0, block_size, dtype, device)
    }

    /// [`Self::new`], with the sliding-window layers of `spec` in a pool of `ring_blocks`
    /// blocks dealt out as per-sequence rings (see the module doc; `ring_blocks` 0: they are
    /// paged like every other attention layer).
    pub fn with_rings(
        spec: &[LayerCacheSpec],
        num_blocks: usize,
        ring_blocks: usize,
        block_size: usize,
        dtype: KvDtype,
        device: &Device,
    ) -> Result<Self> {
        if block_size == 0 {
            return Err(ModelError::Input("KV block size must be positive".into()));
        }
        if dtype.is_quantized() && !(device.is_cpu() || (cfg!(feature = "cuda") && device.is_cuda())) {
            return Err(ModelError::Input(format!(
                "a {dtype} KV cache runs on the CPU and CUDA only for now; use --kv-cache-dtype f16 on {device:?}"
            )));
        }
        let layers = spec
            .iter()
            .map(|s| match s.attention() {
                Some((kv_heads, head_dim, window)) => {
                    dtype.check_head_dim(head_dim)?;
                    let ring = window > 0 && ring_blocks > 0;
                    let blocks = if ring { ring_blocks } else { num_blocks };
                    let shape = (blocks * block_size, kv_heads, dtype.row_elems(head_dim));
                    Ok(Some(PoolLayer {
                        k: zeroed_pool(shape, dtype.storage_dtype(), device)?,
                        v: zeroed_pool(shape, dtype.storage_dtype(), device)?,
                        head_dim,
                        window,
                        blocks,
                        ring,
                    }))
                }
                None => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { block_size, num_blocks, dtype, layers, device: device.clone() })
    }

    /// Bytes one block takes over all attention layers of `spec` in format `dtype`.
    pub fn bytes_per_block(spec: &[LayerCacheSpec], block_size: usize, dtype: KvDtype) -> usize {
        spec.iter().map(|s| s.bytes_per_token(dtype)).sum::<usize>() * block_size
    }

    /// Bytes one block takes over the layers of `spec` that are paged by the block table when
    /// the sliding-window layers keep rings (every attention layer without a window).
    pub fn bytes_per_paged_block(spec: &[LayerCacheSpec], block_size: usize, dtype: KvDtype) -> usize {
        spec.iter().filter(|s| s.window() == 0).map(|s| s.bytes_per_token(dtype)).sum::<usize>() * block_size
    }

    /// Bytes one ring block takes over the sliding-window layers of `spec`.
    pub fn bytes_per_ring_block(spec: &[LayerCacheSpec], block_size: usize, dtype: KvDtype) -> usize {
        spec.iter().filter(|s| s.window() > 0).map(|s| s.bytes_per_token(dtype)).sum::<usize>() * block_size
    }

    /// Whether layer `li` keeps per-sequence rings.
    pub fn is_ring(&self, li: usize) -> bool {
        self.layers.get(li).and_then(Option::as_ref).is_some_and(|l| l.ring)
    }

    /// Layer `li`'s sliding window (0: none, or no such layer).
    pub fn window_of(&self, li: usize) -> usize {
        self.layers.get(li).and_then(Option::as_ref).map_or(0, |l| l.window)
    }

    /// Whether any layer keeps rings.
    pub fn has_rings(&self) -> bool {
        self.layers.iter().flatten().any(|l| l.ring)
    }

    /// The largest window of the ring layers (0: none).
    pub fn ring_window(&self) -> usize {
        self.layers.iter().flatten().filter(|l| l.ring).map(|l| l.window).max().unwrap_or(0)
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Where the pools live (and where sequences keep their recurrent state).
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn paged<'a>(&self, blocks: &'a [u32], window: usize) -> PagedKv<'a> {
        PagedKv { blocks, block_size: self.block_size, dtype: self.dtype, window }
    }

    /// `x: [kv_heads, t, head_dim]` as `t` pool rows `[t, kv_heads, row_elems]` in the store's
    /// format.
    fn encode(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.transpose(0, 1)?;
        if !self.dtype.is_quantized() {
            return Ok(rows.to_dtype(self.dtype.storage_dtype())?.contiguous()?);
        }
        let (t, kv_heads, hd) = rows.dims3()?;
        // On the GPU rows are encoded there, with the CPU encoder's bytes (check-device's
        // `kv_encode` compares them).
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let flat = rows.contiguous()?.reshape((t * kv_heads, hd))?;
            let enc = crate::ops::paged_attention::cuda::encode_rows(&flat, self.dtype)?;
            return Ok(enc.reshape((t, kv_heads, self.dtype.row_elems(hd)))?);
        }
        let values = rows.to_dtype(DType::F32)?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let bytes = self.dtype.quantize_rows(&values, hd)?;
        Ok(Tensor::from_vec(bytes, (t, kv_heads, self.dtype.row_elems(hd)), x.device())?)
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn layer(&self, li: usize) -> Result<&PoolLayer> {
        self.layers
            .get(li)
            .and_then(Option::as_ref)
            .ok_or_else(|| ModelError::Input(format!("layer {li} has no paged KV")))
    }

    pub(super) fn check_block(&self, b: u32) -> Result<()> {
        if (b as usize) < self.num_blocks {
            Ok(())
        } else {
            Err(ModelError::Input(format!("KV block {b} is outside a pool of {} blocks", self.num_blocks)))
        }
    }

    fn check_layer_block(l: &PoolLayer, b: u32) -> Result<()> {
        if (b as usize) < l.blocks {
            Ok(())
        } else {
            Err(ModelError::Input(format!("KV block {b} is outside a pool of {} blocks", l.blocks)))
        }
    }

    /// The layers whose blocks the block table names (every layer but the rings).
    pub(super) fn paged_layers(&self) -> impl Iterator<Item = &PoolLayer> {
        self.layers.iter().flatten().filter(|l| !l.ring)
    }

    /// Copies block `src` into block `dst` in every paged layer (copy-on-write; rings are
    /// private to their sequence and never shared).
    pub fn copy_block(&self, src: u32, dst: u32) -> Result<()> {
        self.check_block(src)?;
        self.check_block(dst)?;
        let bs = self.block_size;
        for l in self.paged_layers() {
            for pool in [&l.k, &l.v] {
                // `force_contiguous`, not `copy`: candle's copy clones the whole pool buffer.
                let block = pool.narrow(0, src as usize * bs, bs)?.force_contiguous()?;
                pool.slice_set(&block, 0, dst as usize * bs)?;
            }
        }
        Ok(())
    }

    /// Writes `k`, `v: [kv_heads, t, head_dim]` as positions `start..start + t` of the
    /// sequence whose blocks are `blocks`.
    pub fn write(&self, li: usize, blocks: &[u32], start: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let l = self.layer(li)?;
        let t = k.dim(1)?;
        let bs = self.block_size;
        if (start + t).div_ceil(bs) > blocks.len() {
            return Err(ModelError::Input(format!(
                "block table of {} blocks cannot hold positions {start}..{}",
                blocks.len(),
                start + t
            )));
        }
        // On a GPU every row of both pools goes in one or two launches (the batched path's
        // store, the same bits), where a copy per block run took 2 x t / block_size launches:
        // 4,096 of them in a 4K-token prefill of 8 attention layers.
        // A table naming one block twice in the written range (never a real sequence's; the
        // conformance checks build such tables) keeps the ordered copies: the last write wins
        // there, where one launch would race.
        #[cfg(feature = "cuda")]
        if self.device.is_cuda() && !l.ring && t > 0 && !repeats(&blocks[start / bs..(start + t).div_ceil(bs)]) {
            use crate::ops::paged_attention::cuda_batch::{scatter_rows, store_rows, BatchTables, SeqRows};
            let bt = BatchTables::new(&[SeqRows { blocks, past: start, t }], bs, l.blocks, &self.device)?;
            if !self.dtype.is_quantized() && k.dtype() == DType::F32 && v.dtype() == DType::F32 {
                store_rows(&l.k, &l.v, k, v, &bt)?;
            } else {
                scatter_rows(&l.k, &self.encode(k)?, &bt)?;
                scatter_rows(&l.v, &self.encode(v)?, &bt)?;
            }
            return Ok(());
        }
        for (pool, new) in [(&l.k, k), (&l.v, v)] {
            let rows = self.encode(new)?;
            let mut i = 0;
            while i < t {
                let p = start + i;
                let b = blocks[p / bs];
                Self::check_layer_block(l, b)?;
                let run = (bs - p % bs).min(t - i);
                pool.slice_set(&rows.narrow(0, i, run)?, 0, b as usize * bs + p % bs)?;
                i += run;
            }
        }
        Ok(())
    }

    /// Attention of `q: [n_heads, t, head_dim]` at positions `past..past + t` over positions
    /// `0..past + t` of the sequence whose blocks are `blocks`.
    ///
    /// Prefill chunks (more than [`SMALL_CHUNK`] queries) gather their KV and use
    /// [`causal_attention`] (GEMMs; on the CPU by query blocks, no score matrix) where the
    /// gathered KV (CPU) or the scores (other devices) fit [`MATERIALISE_LIMIT`]; everything
    /// else — decode, verify chunks, and longer contexts — runs the tiled online-softmax
    /// kernel, so memory never grows with the square of the length.
    /// `TANDEM_ATTENTION=tiled` forces the kernel.
    pub fn attend(&self, li: usize, blocks: &[u32], past: usize, q: &Tensor, scale: f64) -> Result<Tensor> {
        self.attend_with_table(li, blocks, None, past, q, scale)
    }

    /// [`Self::attend`] with the block table also on the pools' device (see
    /// [`SequenceCache::set_block_table`](crate::kv::SequenceCache::set_block_table)). On CUDA
    /// every chunk takes the kernel.
    pub fn attend_with_table(
        &self,
        li: usize,
        blocks: &[u32],
        device_table: Option<&Tensor>,
        past: usize,
        q: &Tensor,
        scale: f64,
    ) -> Result<Tensor> {
        let l = self.layer(li)?;
        let kv = self.paged(blocks, l.window);
        let (n_heads, t, _) = q.dims3()?;
        let len = past + t;
        // On CUDA every chunk takes the kernel: as fast as gathering for cuBLAS (measured on
        // the H200, docs/PERFORMANCE.md) and row-invariant, so chunked prefill is exact there.
        let kernel_only = self.device.is_cuda();
        // A windowed layer gathers from the block of its first query's first key on (a ring
        // holds nothing older); the queries stay the last `t` of the keys gathered.
        let g0 = if l.window > 0 { (past + 1).saturating_sub(l.window) / self.block_size } else { 0 };
        let span = len - g0 * self.block_size;
        // The CPU's query-block kernel holds no score matrix, only the gathered keys and
        // values: it takes any chunk whose K + V fit the limit (SmolLM2 pp256 at 8K of
        // context: 113.8 tok/s against the tiled kernel's 104-106). Elsewhere the scores are
        // materialised, so their size decides.
        let gathered = 2 * span * l.k.dim(1)? * l.head_dim * 4;
        let fits = if self.device.is_cpu() {
            gathered <= MATERIALISE_LIMIT
        } else {
            n_heads * t * span * 4 <= MATERIALISE_LIMIT
        };
        if t > SMALL_CHUNK && fits && !force_tiled() && !kernel_only {
            let blocks_from = blocks.get(g0..).unwrap_or(&[]);
            let kv = self.paged(blocks_from, l.window);
            let (k, v) = (gather_kv(&l.k, kv, span, l.head_dim)?, gather_kv(&l.v, kv, span, l.head_dim)?);
            return causal_attention(&q.contiguous()?, &k, &v, scale, l.window);
        }
        paged_attention_with_table(q, &l.k, &l.v, kv, device_table, past, scale)
    }

    /// Every sequence's new rows `k`, `v` `[kv_heads, total, head_dim]` written and `q`
    /// `[n_heads, total, head_dim]` attended over each one's own blocks, in a few launches for
    /// the batch (see [`crate::kv::attend_batch`]). `None` when the layer's format or head dim
    /// has no batched kernel (nothing written then).
    #[cfg(feature = "cuda")]
    pub fn attend_batch(
        &self,
        li: usize,
        seqs: &[crate::ops::paged_attention::cuda_batch::SeqRows<'_>],
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scale: f64,
    ) -> Result<Option<Tensor>> {
        use crate::ops::paged_attention::{cuda, cuda_batch};
        let l = self.layer(li)?;
        if !self.device.is_cuda() || !cuda::supports(self.dtype, l.head_dim) {
            return Ok(None);
        }
        let bt = cuda_batch::BatchTables::new(seqs, self.block_size, l.blocks, &self.device)?;
        self.attend_tables(li, &bt, q, k, v, scale).map(Some)
    }

    /// [`Self::attend_batch`] with the batch's tables already on the device (a CUDA graph's
    /// decode step); the layer must support the batched kernels ([`Self::batches`]).
    #[cfg(feature = "cuda")]
    pub fn attend_tables(
        &self,
        li: usize,
        bt: &crate::ops::paged_attention::cuda_batch::BatchTables,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scale: f64,
    ) -> Result<Tensor> {
        use crate::ops::paged_attention::cuda_batch;
        let l = self.layer(li)?;
        if !self.dtype.is_quantized() && k.dtype() == DType::F32 && v.dtype() == DType::F32 {
            // Plain pools: rounding, transpose and scatter of both in one launch.
            cuda_batch::store_rows(&l.k, &l.v, k, v, bt)?;
        } else {
            cuda_batch::scatter_rows(&l.k, &self.encode(k)?, bt)?;
            cuda_batch::scatter_rows(&l.v, &self.encode(v)?, bt)?;
        }
        cuda_batch::attention(q, &l.k, &l.v, self.dtype, bt, self.block_size, l.window, scale)
    }

    /// Whether layer `li`'s attention has the batched CUDA kernels (format and head dim).
    #[cfg(feature = "cuda")]
    pub fn batches(&self, li: usize) -> bool {
        self.layer(li)
            .is_ok_and(|l| self.device.is_cuda() && crate::ops::paged_attention::cuda::supports(self.dtype, l.head_dim))
    }

    /// Positions `0..len` of layer `li` as contiguous f32 `[kv_heads, len, head_dim]` K and V
    /// (decoded from the store's format).
    pub fn read(&self, li: usize, blocks: &[u32], len: usize) -> Result<(Tensor, Tensor)> {
        let l = self.layer(li)?;
        let kv = self.paged(blocks, 0);
        Ok((gather_kv(&l.k, kv, len, l.head_dim)?, gather_kv(&l.v, kv, len, l.head_dim)?))
    }
}

/// One attention layer's KV of one sequence, as the attention call sites see it.
pub enum LayerKv<'a> {
    /// A growable per-sequence buffer.
    Contiguous(&'a mut KvBuffer),
    /// Blocks of a shared pool; `past` positions are already written.
    Paged { store: &'a PagedKvStore, layer: usize, blocks: &'a [u32], past: usize },
    /// Paged, with the block table also uploaded to the pools' device for this step.
    PagedOnDevice { store: &'a PagedKvStore, layer: usize, blocks: &'a [u32], table: &'a Tensor, past: usize },
}

impl LayerKv<'_> {
    /// Appends `k_new`, `v_new: [kv_heads, t, head_dim]` and returns the causal attention of
    /// `q: [n_heads, t, head_dim]` (those same `t` positions) over all positions so far.
    pub fn attend(&mut self, q: &Tensor, k_new: &Tensor, v_new: &Tensor, scale: f64) -> Result<Tensor> {
        match self {
            LayerKv::Contiguous(buf) => {
                let (k, v) = buf.append(k_new, v_new)?;
                causal_attention(q, &k, &v, scale, buf.window())
            }
            LayerKv::Paged { store, layer, blocks, past } => {
                store.write(*layer, blocks, *past, k_new, v_new)?;
                store.attend(*layer, blocks, *past, q, scale)
            }
            LayerKv::PagedOnDevice { store, layer, blocks, table, past } => {
                store.write(*layer, blocks, *past, k_new, v_new)?;
                store.attend_with_table(*layer, blocks, Some(table), *past, q, scale)
            }
        }
    }
}

/// Whether `blocks` names some block more than once.
#[cfg(feature = "cuda")]
fn repeats(blocks: &[u32]) -> bool {
    let mut sorted = blocks.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).any(|w| w[0] == w[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(shape: (usize, usize, usize), seed: f32) -> Tensor {
        let n = shape.0 * shape.1 * shape.2;
        Tensor::from_vec((0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect::<Vec<_>>(), shape, &Device::Cpu)
            .unwrap()
    }

    /// Appending chunk by chunk through the paged store equals the contiguous buffer, across
    /// block boundaries and after a copy-on-write.
    #[test]
    fn paged_layer_equals_contiguous_buffer() -> Result<()> {
        let spec = [
            LayerCacheSpec::Attention { kv_heads: 2, head_dim: 8 },
            LayerCacheSpec::Recurrent { conv_channels: 4, conv_kernel: 4, state_heads: 1, key_dim: 2, value_dim: 2 },
        ];
        assert_eq!(PagedKvStore::bytes_per_block(&spec, 4, KvDtype::F32), 2 * 2 * 8 * 4 * 4);
        assert_eq!(PagedKvStore::bytes_per_block(&spec, 4, KvDtype::F16), 2 * 2 * 8 * 2 * 4);
        let store = PagedKvStore::new(&spec, 8, 4, KvDtype::F32, &Device::Cpu)?;
        let blocks = [5u32, 2, 7];
        let mut buf = KvBuffer::new(2, 8);
        let mut past = 0;
        for (i, t) in [3usize, 1, 6, 1].into_iter().enumerate() {
            let q = ramp((4, t, 8), i as f32);
            let (k, v) = (ramp((2, t, 8), 10.0 + i as f32), ramp((2, t, 8), 20.0 + i as f32));
            let want = LayerKv::Contiguous(&mut buf).attend(&q, &k, &v, 0.3)?;
            let got = LayerKv::Paged { store: &store, layer: 0, blocks: &blocks, past }.attend(&q, &k, &v, 0.3)?;
            let diff = (got - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(diff < 1e-5, "chunk {i}: {diff}");
            past += t;
        }
        // Copy-on-write: the copy of block 2 holds the same positions.
        store.copy_block(2, 0)?;
        let (k1, _) = store.read(0, &[5, 2], 8)?;
        let (k2, _) = store.read(0, &[5, 0], 8)?;
        assert_eq!((k1 - k2)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0);
        assert!(store.read(1, &blocks, 4).is_err(), "recurrent layers have no pool");
        assert!(store.copy_block(8, 0).is_err());
        assert!(store.write(0, &[1], 2, &ramp((2, 3, 8), 0.0), &ramp((2, 3, 8), 0.0)).is_err());
        Ok(())
    }

    /// A 1 GiB f16 pool costs no resident memory until written (the OS commits pages lazily),
    /// reads as zeros, and a written block commits only its pages.
    #[cfg(target_os = "linux")]
    #[test]
    fn an_f16_pool_takes_memory_only_where_written() -> Result<()> {
        fn resident_bytes() -> u64 {
            let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
            statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
        }
        let spec = [LayerCacheSpec::Attention { kv_heads: 8, head_dim: 128 }];
        let blocks = (1usize << 30) / PagedKvStore::bytes_per_block(&spec, 16, KvDtype::F16);
        let before = resident_bytes();
        let store = PagedKvStore::new(&spec, blocks, 16, KvDtype::F16, &Device::Cpu)?;
        let grown = resident_bytes().saturating_sub(before);
        assert!(grown < 200 << 20, "a 1 GiB pool made {} MiB resident", grown >> 20);
        let (k, _) = store.read(0, &[blocks as u32 - 1], 16)?;
        assert_eq!(k.abs()?.to_dtype(DType::F32)?.max_all()?.to_scalar::<f32>()?, 0.0);
        let x = ramp((8, 16, 128), 1.0);
        store.write(0, &[3], 0, &x, &x)?;
        let (k, _) = store.read(0, &[3], 16)?;
        let diff = (k.to_dtype(DType::F32)? - x)?.abs()?.max_all()?.to_scalar::<f32>()?;
        assert!(diff < 1e-2, "{diff}");
        Ok(())
    }
}
