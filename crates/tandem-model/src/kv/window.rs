//! The part of a checkpoint that sliding-window layers need: the last `window - 1` positions'
//! keys and values of every ring layer ([`WindowRows`]), copied out of the sequence's ring when
//! the checkpoint is taken and written back into a fresh ring when a prefix hit resumes there.
//! Rows stay in the store's format, so a resumed sequence sees exactly the bits it wrote.

use candle_core::Tensor;

use super::paged::ring_table;
use super::PagedKvStore;
use crate::error::{ModelError, Result};

/// Positions `start .. start + n` of one ring layer: K and V rows `[n, kv_heads, row_elems]`
/// in the store's format.
#[derive(Debug, Clone)]
pub struct WindowRows {
    pub start: usize,
    pub k: Tensor,
    pub v: Tensor,
}

impl WindowRows {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.k.dim(0).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> usize {
        (self.k.elem_count() + self.v.elem_count()) * self.k.dtype().size_in_bytes()
    }
}

impl PartialEq for WindowRows {
    fn eq(&self, other: &Self) -> bool {
        let bits = |t: &Tensor| super::persist::bytes_of(t).ok();
        self.start == other.start
            && self.k.shape() == other.k.shape()
            && self.v.shape() == other.v.shape()
            && bits(&self.k) == bits(&other.k)
            && bits(&self.v) == bits(&other.v)
    }
}

impl PagedKvStore {
    /// Positions `start .. start + n` of ring layer `li` from the ring `base .. base + len`
    /// (copies, so the ring may be overwritten afterwards).
    pub fn read_ring_rows(&self, li: usize, base: u32, len: u32, start: usize, n: usize) -> Result<WindowRows> {
        let l = self.ring_layer(li)?;
        let bs = self.block_size;
        let table = ring_table(base, len, (start + n).div_ceil(bs));
        let mut parts = (Vec::new(), Vec::new());
        let mut p = start;
        while p < start + n {
            let run = (bs - p % bs).min(start + n - p);
            let row = table[p / bs] as usize * bs + p % bs;
            if row + run > l.k.dim(0)? {
                return Err(ModelError::Input(format!("ring block {} is outside layer {li}'s pool", table[p / bs])));
            }
            parts.0.push(l.k.narrow(0, row, run)?.force_contiguous()?);
            parts.1.push(l.v.narrow(0, row, run)?.force_contiguous()?);
            p += run;
        }
        if parts.0.is_empty() {
            let (_, heads, elems) = l.k.dims3()?;
            let empty = Tensor::zeros((0, heads, elems), l.k.dtype(), l.k.device())?;
            return Ok(WindowRows { start, k: empty.clone(), v: empty });
        }
        Ok(WindowRows { start, k: Tensor::cat(&parts.0, 0)?, v: Tensor::cat(&parts.1, 0)? })
    }

    /// Writes `rows` back into ring layer `li`'s ring `base .. base + len` at their positions.
    pub fn write_ring_rows(&self, li: usize, base: u32, len: u32, rows: &WindowRows) -> Result<()> {
        let l = self.ring_layer(li)?;
        let (n, bs) = (rows.len(), self.block_size);
        let (_, heads, elems) = l.k.dims3()?;
        for t in [&rows.k, &rows.v] {
            if t.dims() != [n, heads, elems] || t.dtype() != l.k.dtype() {
                return Err(ModelError::Input(format!(
                    "window rows {:?} {:?} do not fit layer {li} ({heads} x {elems} {:?})",
                    t.dims(),
                    t.dtype(),
                    l.k.dtype()
                )));
            }
        }
        if len as usize * bs < n {
            return Err(ModelError::Input(format!("{n} window rows do not fit a ring of {len} blocks")));
        }
        let table = ring_table(base, len, (rows.start + n).div_ceil(bs));
        let mut i = 0;
        while i < n {
            let p = rows.start + i;
            let run = (bs - p % bs).min(n - i);
            let row = table[p / bs] as usize * bs + p % bs;
            if row + run > l.k.dim(0)? {
                return Err(ModelError::Input(format!("ring block {} is outside layer {li}'s pool", table[p / bs])));
            }
            let (k, v) = (rows.k.to_device(&self.device)?, rows.v.to_device(&self.device)?);
            l.k.slice_set(&k.narrow(0, i, run)?.contiguous()?, 0, row)?;
            l.v.slice_set(&v.narrow(0, i, run)?.contiguous()?, 0, row)?;
            i += run;
        }
        Ok(())
    }

    fn ring_layer(&self, li: usize) -> Result<&super::paged::PoolLayer> {
        match self.layers.get(li).and_then(Option::as_ref) {
            Some(l) if l.ring => Ok(l),
            _ => Err(ModelError::Input(format!("layer {li} keeps no ring"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;
    use crate::kv::{KvDtype, LayerCacheSpec};

    /// Rows read out of a ring that wrapped come back with the bits written, and written into
    /// another sequence's ring they read back the same; a layer without a ring is refused.
    #[test]
    fn ring_rows_round_trip_across_the_wrap() -> Result<()> {
        let spec = [
            LayerCacheSpec::SlidingWindow { kv_heads: 2, head_dim: 32, window: 6 },
            LayerCacheSpec::Attention { kv_heads: 2, head_dim: 32 },
        ];
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0] {
            let store = PagedKvStore::with_rings(&spec, 4, 6, 4, dtype, &Device::Cpu)?;
            assert!(store.is_ring(0) && !store.is_ring(1) && store.ring_window() == 6);
            // Sequence A's ring: blocks 0..3; 20 positions wrap it (12 positions) once and more.
            let table = ring_table(0, 3, 5);
            assert_eq!(table, [0, 1, 2, 0, 1]);
            for p in 0..20 {
                let k = Tensor::full(p as f32, (2, 1, 32), &Device::Cpu)?;
                store.write(0, &table, p, &k, &(k.clone() * -1.0)?)?;
            }
            let rows = store.read_ring_rows(0, 0, 3, 15, 5)?;
            assert_eq!((rows.start, rows.len()), (15, 5));
            // Into sequence B's ring (blocks 3..6), then read back from there.
            store.write_ring_rows(0, 3, 3, &rows)?;
            let back = store.read_ring_rows(0, 3, 3, 15, 5)?;
            assert_eq!(back, rows, "{dtype}");
            let first = crate::ops::paged_attention::gather_kv(
                &store.layers[0].as_ref().unwrap().k,
                crate::ops::paged_attention::PagedKv { blocks: &ring_table(3, 3, 5), block_size: 4, dtype, window: 0 },
                20,
                32,
            )?;
            let v = first.narrow(1, 15, 5)?.to_vec3::<f32>()?;
            for (i, row) in v[0].iter().enumerate() {
                assert!((row[0] - (15 + i) as f32).abs() < 0.2, "{dtype}: position {} reads {}", 15 + i, row[0]);
            }
            assert!(store.read_ring_rows(1, 0, 3, 0, 4).is_err());
            let too_many = store.read_ring_rows(0, 0, 3, 0, 12)?;
            assert!(store.write_ring_rows(0, 3, 2, &too_many).is_err());
        }
        Ok(())
    }
}
