//! Cache contents as bytes, for the engine's disk tier: one KV block of every attention layer
//! of a [`PagedKvStore`] ([`PagedKvStore::read_block`] / [`PagedKvStore::write_block`], in the
//! store's own format, so a block read back has the bits it was written with; many blocks at
//! once by [`PagedKvStore::copy_blocks`], a copy on the store's device that another thread
//! reads back as the same bytes, [`BlockCopy::to_host`]) and a
//! [`RecurrentSnapshot`] ([`RecurrentSnapshot::to_bytes`] / [`RecurrentSnapshot::from_bytes`],
//! checked against the model's layer specs, restored on the host or on the model's device).
//! Nothing here trusts its input: a wrong length or layer shape is an error, never a panic.

use candle_core::{DType, Device, Tensor};

use super::{KvDtype, LayerCacheSpec, PagedKvStore, RecurrentSnapshot, RecurrentState, WindowRows};
use crate::error::{ModelError, Result};

/// `t`'s bytes, read back as [`host_vec`] reads a view.
pub(super) fn bytes_of(t: &Tensor) -> Result<Vec<u8>> {
    Ok(HostVec::read(t, Storage::View)?.le_bytes().into_owned())
}

/// Whether a tensor may be a view of a larger buffer or is known to own all of its storage.
#[derive(Clone, Copy)]
enum Storage {
    View,
    Own,
}

/// A tensor's elements read back to the host in their own type, so that their bytes can be
/// taken as they are ([`Self::le_bytes`]) instead of element by element.
enum HostVec {
    U8(Vec<u8>),
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
    F32(Vec<f32>),
}

impl HostVec {
    fn read(t: &Tensor, s: Storage) -> Result<Self> {
        Ok(match t.dtype() {
            DType::U8 => Self::U8(host_read(t, s)?),
            DType::F16 => Self::F16(host_read(t, s)?),
            DType::BF16 => Self::Bf16(host_read(t, s)?),
            DType::F32 => Self::F32(host_read(t, s)?),
            other => return Err(ModelError::Input(format!("no byte view of a {other:?} KV pool"))),
        })
    }

    /// The elements' little-endian bytes.
    fn le_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            Self::U8(v) => std::borrow::Cow::Borrowed(v),
            Self::F16(v) => le_bytes(v, |x| x.to_le_bytes()),
            Self::Bf16(v) => le_bytes(v, |x| x.to_le_bytes()),
            Self::F32(v) => le_bytes(v, |x| x.to_le_bytes()),
        }
    }
}

/// `v`'s little-endian bytes: its memory as it is on a little-endian host, else element by
/// element through `f`.
fn le_bytes<T: bytemuck::Pod, const N: usize>(v: &[T], f: fn(&T) -> [u8; N]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(v))
    } else {
        std::borrow::Cow::Owned(v.iter().flat_map(f).collect())
    }
}

/// `t`'s elements, flattened, on the host. Off the CPU a device copy of `t` alone comes first:
/// candle reads a view back by copying its whole buffer to the host (a KV block of a layer's
/// entire pool; one of a detached checkpoint's states, which share one buffer, of the whole
/// checkpoint: a 9B checkpoint's 48 states read 48 x 50 MB where 50 MB was asked for).
pub(super) fn host_vec<S: candle_core::WithDType>(t: &Tensor) -> Result<Vec<S>> {
    host_read(t, Storage::View)
}

fn host_read<S: candle_core::WithDType>(t: &Tensor, s: Storage) -> Result<Vec<S>> {
    let flat = t.flatten_all()?;
    let flat = match s {
        Storage::View if !flat.device().is_cpu() => flat.force_contiguous()?,
        _ => flat,
    };
    Ok(flat.to_vec1::<S>()?)
}

impl PagedKvStore {
    /// Bytes of one block over the paged attention layers (K then V per layer, in layer
    /// order; ring layers are not in blocks).
    pub fn block_len(&self) -> usize {
        self.paged_layers()
            .map(|l| {
                2 * self.block_size * l.k.dim(1).unwrap_or(0) * l.k.dim(2).unwrap_or(0) * l.k.dtype().size_in_bytes()
            })
            .sum()
    }

    /// Block `b` of every attention layer as bytes in the store's format, one transfer a pool:
    /// the plain reference the tests hold [`Self::copy_blocks`] to (and the `engine`
    /// read-back's path).
    pub fn read_block(&self, b: u32) -> Result<Vec<u8>> {
        self.check_block(b)?;
        let bs = self.block_size;
        let mut out = Vec::with_capacity(self.block_len());
        for l in self.paged_layers() {
            for pool in [&l.k, &l.v] {
                // bytes_of copies the block alone off the CPU before reading it back.
                out.extend(bytes_of(&pool.narrow(0, b as usize * bs, bs)?)?);
            }
        }
        Ok(out)
    }

    /// Blocks `blocks` of every attention layer copied on the store's device (one
    /// concatenation of the blocks' rows a pool, nothing read back yet), so that reading them
    /// back ([`BlockCopy::to_host`]) costs one transfer a pool instead of one a block and pool
    /// (16 transfers that each waited for the device a block of the 9B shape: a 9K-token
    /// prompt on an H100 took 3.0 s instead of 1.5). Later writes to the blocks do not change
    /// the copy. (A gather by row index, `index_select`, wrote wrong bytes on CUDA on
    /// 2026-12-07 when read back on the disk writer's thread; the concatenation of the blocks'
    /// own rows is what [`Self::read_block`] copies, block by block.)
    pub fn copy_blocks(&self, blocks: &[u32]) -> Result<BlockCopy> {
        for &b in blocks {
            self.check_block(b)?;
        }
        let bs = self.block_size;
        let mut parts = Vec::new();
        if !blocks.is_empty() {
            for l in self.paged_layers() {
                for pool in [&l.k, &l.v] {
                    let rows = blocks
                        .iter()
                        .map(|&b| pool.narrow(0, b as usize * bs, bs))
                        .collect::<candle_core::Result<Vec<_>>>()?;
                    // `cat` of one tensor returns it (a view of the pool): copy that one.
                    parts.push(if rows.len() == 1 { rows[0].force_contiguous()? } else { Tensor::cat(&rows, 0)? });
                }
            }
        }
        Ok(BlockCopy { parts, blocks: blocks.len() })
    }

    /// Writes `bytes` (as [`Self::read_block`] returns them) into block `b`.
    pub fn write_block(&self, b: u32, bytes: &[u8]) -> Result<()> {
        self.check_block(b)?;
        if bytes.len() != self.block_len() {
            return Err(ModelError::Input(format!(
                "a KV block of this cache has {} bytes, got {}",
                self.block_len(),
                bytes.len()
            )));
        }
        let bs = self.block_size;
        let mut off = 0;
        for l in self.paged_layers() {
            for pool in [&l.k, &l.v] {
                let (_, heads, row) = pool.dims3()?;
                let n = bs * heads * row * pool.dtype().size_in_bytes();
                let part =
                    Tensor::from_raw_buffer(&bytes[off..off + n], pool.dtype(), &[bs, heads, row], &Device::Cpu)?
                        .to_device(&self.device)?;
                pool.slice_set(&part, 0, b as usize * bs)?;
                off += n;
            }
        }
        Ok(())
    }
}

/// Some KV blocks of every attention layer, copied on the store's device
/// ([`PagedKvStore::copy_blocks`]). Dropped on any thread: the drop makes the device's context
/// current there first, as freeing device memory needs.
pub struct BlockCopy {
    /// Per paged layer K then V: `[blocks * block_size, heads, row]`.
    parts: Vec<Tensor>,
    blocks: usize,
}

impl Drop for BlockCopy {
    fn drop(&mut self) {
        if let Some(t) = self.parts.first() {
            crate::device::bind_thread(t.device());
        }
    }
}

impl BlockCopy {
    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks
    }

    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// Bytes the copy holds on its device.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(|t| t.elem_count() * t.dtype().size_in_bytes()).sum()
    }

    /// Each block's bytes as [`PagedKvStore::read_block`] gives them, in the order copied:
    /// one transfer a layer's pool. From a thread other than the engine's, hold
    /// [`crate::device::stream_share`] across this and the drop.
    pub fn to_host(&self) -> Result<Vec<Vec<u8>>> {
        if let Some(t) = self.parts.first() {
            crate::device::bind_thread(t.device());
        }
        // Each part is read back in its own type (it owns its buffer: copy_blocks made it) and
        // its bytes go straight into the blocks' buffers, sized up front: one host copy after
        // the transfer (on a GPU this runs on the engine's thread, ~290 MB for a 9K-token
        // prompt of the 9B shape).
        let per_block: usize =
            self.parts.iter().map(|p| p.elem_count() * p.dtype().size_in_bytes()).sum::<usize>() / self.blocks.max(1);
        let mut out: Vec<Vec<u8>> = (0..self.blocks).map(|_| Vec::with_capacity(per_block)).collect();
        for part in &self.parts {
            let host = HostVec::read(part, Storage::Own)?;
            let bytes = host.le_bytes();
            let n = bytes.len() / self.blocks.max(1);
            for (i, block) in out.iter_mut().enumerate() {
                block.extend_from_slice(&bytes[i * n..(i + 1) * n]);
            }
        }
        Ok(out)
    }
}

fn f32_bytes(v: &[f32], out: &mut Vec<u8>) {
    out.extend_from_slice(&le_bytes(v, |x| x.to_le_bytes()));
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if bytes.len() < n {
        return Err(ModelError::Input("a recurrent checkpoint ends early".into()));
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

fn take_u64(bytes: &mut &[u8]) -> Result<u64> {
    let b = take(bytes, 8)?;
    Ok(u64::from_le_bytes(b.try_into().map_err(|_| ModelError::Input("short read".into()))?))
}

fn take_f32s(bytes: &mut &[u8], n: usize) -> Result<Vec<f32>> {
    let b = take(bytes, n.checked_mul(4).ok_or_else(|| ModelError::Input("checkpoint length overflows".into()))?)?;
    Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

impl RecurrentSnapshot {
    /// The device a snapshot's tensors live on (`None`: host states, no windows).
    pub fn device(&self) -> Option<&Device> {
        let state = self.layers.iter().flatten().find_map(|s| match s {
            RecurrentState::Device { ssm, .. } => Some(ssm.device()),
            RecurrentState::Host { .. } => None,
        });
        state.or_else(|| self.windows.iter().flatten().next().map(|w| w.k.device()))
    }

    /// The snapshot as bytes: position, layer count, then per layer a tag (0: attention, 1:
    /// recurrent) and for recurrent layers the conv and SSM lengths and values (f32 LE); then
    /// the count of window entries and per entry a tag (0: none, 1: rows) and for rows their
    /// first position, row count and the K and V bytes in the KV format. Device states are
    /// copied to the host.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        out.extend((self.position as u64).to_le_bytes());
        out.extend((self.layers.len() as u64).to_le_bytes());
        for l in &self.layers {
            match l {
                None => out.push(0),
                Some(s) => {
                    out.push(1);
                    let (conv, ssm) = (s.conv_values()?, s.ssm_values()?);
                    out.extend((conv.len() as u64).to_le_bytes());
                    out.extend((ssm.len() as u64).to_le_bytes());
                    f32_bytes(&conv, &mut out);
                    f32_bytes(&ssm, &mut out);
                }
            }
        }
        out.extend((self.windows.len() as u64).to_le_bytes());
        for w in &self.windows {
            match w {
                None => out.push(0),
                Some(rows) => {
                    out.push(1);
                    out.extend((rows.start as u64).to_le_bytes());
                    out.extend((rows.len() as u64).to_le_bytes());
                    out.extend(bytes_of(&rows.k)?);
                    out.extend(bytes_of(&rows.v)?);
                }
            }
        }
        Ok(out)
    }

    /// Reads [`Self::to_bytes`]'s output for a model whose layers are `spec` with KV in format
    /// `dtype`, with states on `device` (host vectors on the CPU). Every length is checked
    /// against the spec.
    pub fn from_bytes(mut bytes: &[u8], spec: &[LayerCacheSpec], dtype: KvDtype, device: &Device) -> Result<Self> {
        let b = &mut bytes;
        let position = take_u64(b)? as usize;
        let n = take_u64(b)? as usize;
        if n != spec.len() {
            return Err(ModelError::Input(format!("a checkpoint of {n} layers for a model of {}", spec.len())));
        }
        let mut layers = Vec::with_capacity(n);
        for (i, s) in spec.iter().enumerate() {
            let tag = take(b, 1)?[0];
            match (tag, s) {
                (0, LayerCacheSpec::Attention { .. } | LayerCacheSpec::SlidingWindow { .. }) => layers.push(None),
                (1, LayerCacheSpec::Recurrent { conv_channels, conv_kernel, state_heads, key_dim, value_dim }) => {
                    let (cl, sl) = (take_u64(b)? as usize, take_u64(b)? as usize);
                    let want_c = conv_channels * conv_kernel.saturating_sub(1);
                    let want_s = state_heads * key_dim * value_dim;
                    if cl != want_c || sl != want_s {
                        return Err(ModelError::Input(format!(
                            "checkpoint layer {i}: {cl} + {sl} values, the model has {want_c} + {want_s}"
                        )));
                    }
                    let (conv, ssm) = (take_f32s(b, cl)?, take_f32s(b, sl)?);
                    layers.push(Some(if device.is_cpu() {
                        RecurrentState::Host { conv, ssm }
                    } else {
                        RecurrentState::Device {
                            conv: Tensor::from_vec(conv, (conv_kernel.saturating_sub(1), *conv_channels), device)?,
                            ssm: Tensor::from_vec(ssm, sl, device)?,
                        }
                    }));
                }
                _ => return Err(ModelError::Input(format!("checkpoint layer {i} does not match the model's layer"))),
            }
        }
        let nw = take_u64(b)? as usize;
        if nw != 0 && nw != spec.len() {
            return Err(ModelError::Input(format!("a checkpoint with {nw} window entries for {} layers", spec.len())));
        }
        let mut windows = Vec::with_capacity(nw);
        for (i, s) in spec.iter().enumerate().take(nw) {
            match (take(b, 1)?[0], s) {
                (0, _) => windows.push(None),
                (1, LayerCacheSpec::SlidingWindow { kv_heads, head_dim, window }) => {
                    let (start, n) = (take_u64(b)? as usize, take_u64(b)? as usize);
                    if n >= *window || start.checked_add(n) != Some(position) {
                        return Err(ModelError::Input(format!(
                            "checkpoint layer {i}: {n} window rows from {start} for a window of {window} at {position}"
                        )));
                    }
                    let st = dtype.storage_dtype();
                    let shape = [n, *kv_heads, dtype.row_elems(*head_dim)];
                    let len = n * kv_heads * dtype.row_elems(*head_dim) * st.size_in_bytes();
                    let k = Tensor::from_raw_buffer(take(b, len)?, st, &shape, &Device::Cpu)?.to_device(device)?;
                    let v = Tensor::from_raw_buffer(take(b, len)?, st, &shape, &Device::Cpu)?.to_device(device)?;
                    windows.push(Some(WindowRows { start, k, v }));
                }
                _ => return Err(ModelError::Input(format!("checkpoint window {i} does not match the model's layer"))),
            }
        }
        if !bytes.is_empty() {
            return Err(ModelError::Input("a recurrent checkpoint has trailing bytes".into()));
        }
        Ok(Self { position, layers, windows })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvDtype;

    #[test]
    fn blocks_and_snapshots_round_trip_and_reject_bad_bytes() {
        let spec = vec![
            LayerCacheSpec::Attention { kv_heads: 2, head_dim: 32 },
            LayerCacheSpec::Recurrent { conv_channels: 6, conv_kernel: 4, state_heads: 2, key_dim: 3, value_dim: 5 },
        ];
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
            let store = PagedKvStore::new(&spec, 4, 16, dtype, &Device::Cpu).unwrap();
            let k = Tensor::randn(0f32, 1.0, (2, 16, 32), &Device::Cpu).unwrap();
            let v = Tensor::randn(0f32, 1.0, (2, 16, 32), &Device::Cpu).unwrap();
            store.write(0, &[2], 0, &k, &v).unwrap();
            let bytes = store.read_block(2).unwrap();
            assert_eq!(bytes.len(), store.block_len());
            assert_eq!(bytes.len(), PagedKvStore::bytes_per_block(&spec, 16, dtype));
            store.write_block(1, &bytes).unwrap();
            assert_eq!(store.read_block(1).unwrap(), bytes, "{dtype}");
            // Many blocks at once: the same bytes as one by one, and a later write to a block
            // leaves the copy as it was.
            store.write(0, &[3], 0, &v, &k).unwrap();
            let copy = store.copy_blocks(&[3, 1, 2]).unwrap();
            let (b3, b1) = (store.read_block(3).unwrap(), store.read_block(1).unwrap());
            store.write(0, &[3], 0, &k, &v).unwrap();
            assert_eq!((copy.len(), copy.bytes()), (3, 3 * store.block_len()));
            assert_eq!(copy.to_host().unwrap(), vec![b3, b1, bytes.clone()], "{dtype}");
            assert!(store.copy_blocks(&[]).unwrap().to_host().unwrap().is_empty());
            assert!(store.copy_blocks(&[1, 4]).is_err());
            assert!(store.write_block(1, &bytes[1..]).is_err());
            assert!(store.write_block(9, &bytes).is_err());
        }
        let snap = RecurrentSnapshot {
            position: 48,
            layers: vec![
                None,
                Some(RecurrentState::Host { conv: (0..18).map(|i| i as f32).collect(), ssm: vec![0.5; 30] }),
            ],
            windows: Vec::new(),
        };
        let f32kv = KvDtype::F32;
        let bytes = snap.to_bytes().unwrap();
        assert_eq!(RecurrentSnapshot::from_bytes(&bytes, &spec, f32kv, &Device::Cpu).unwrap(), snap);
        assert!(RecurrentSnapshot::from_bytes(&bytes[..bytes.len() - 1], &spec, f32kv, &Device::Cpu).is_err());
        assert!(RecurrentSnapshot::from_bytes(&[bytes.clone(), vec![0]].concat(), &spec, f32kv, &Device::Cpu).is_err());
        assert!(RecurrentSnapshot::from_bytes(&bytes, &spec[..1], f32kv, &Device::Cpu).is_err());
        let other = vec![
            spec[0].clone(),
            LayerCacheSpec::Recurrent { conv_channels: 6, conv_kernel: 4, state_heads: 2, key_dim: 3, value_dim: 6 },
        ];
        assert!(RecurrentSnapshot::from_bytes(&bytes, &other, f32kv, &Device::Cpu).is_err());
    }

    #[test]
    fn views_read_back_as_their_own_elements() {
        // A view (a narrow from an offset, a transpose) reads back its elements alone, in its
        // own row-major order, whatever the buffer around it holds (off the CPU host_vec copies
        // it alone first; check-device and the GPU suite's disk tests run that branch).
        let t = Tensor::arange(0f32, 24., &Device::Cpu).unwrap().reshape((4, 6)).unwrap();
        let mid = t.narrow(0, 1, 2).unwrap();
        assert_eq!(host_vec::<f32>(&mid).unwrap(), (6..18).map(|x| x as f32).collect::<Vec<_>>());
        let cols = t.narrow(1, 2, 2).unwrap().t().unwrap();
        assert_eq!(host_vec::<f32>(&cols).unwrap(), vec![2., 8., 14., 20., 3., 9., 15., 21.]);
        let bytes = bytes_of(&cols).unwrap();
        assert_eq!(bytes.len(), 8 * 4);
        assert_eq!(&bytes[4..8], &8f32.to_le_bytes());
    }

    /// A checkpoint of a ring-layer model keeps its window rows bit for bit through bytes, in
    /// every KV format; rows that do not fit the window or the position are refused.
    #[test]
    fn window_rows_round_trip_through_bytes() {
        let spec = vec![
            LayerCacheSpec::SlidingWindow { kv_heads: 2, head_dim: 32, window: 8 },
            LayerCacheSpec::Attention { kv_heads: 2, head_dim: 32 },
        ];
        for dtype in [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
            let store = PagedKvStore::with_rings(&spec, 4, 2, 16, dtype, &Device::Cpu).unwrap();
            let k = Tensor::randn(0f32, 1.0, (2, 20, 32), &Device::Cpu).unwrap();
            store.write(0, &[0, 1], 0, &k, &(&k * 0.5).unwrap()).unwrap();
            // Ring layers are not part of a block's bytes.
            assert_eq!(store.block_len(), PagedKvStore::bytes_per_paged_block(&spec, 16, dtype));
            let rows = store.read_ring_rows(0, 0, 2, 13, 7).unwrap();
            let snap = RecurrentSnapshot { position: 20, layers: vec![None, None], windows: vec![Some(rows), None] };
            let bytes = snap.to_bytes().unwrap();
            let back = RecurrentSnapshot::from_bytes(&bytes, &spec, dtype, &Device::Cpu).unwrap();
            assert_eq!(back, snap, "{dtype}");
            assert_eq!(back.bytes(), snap.bytes());
            let moved = RecurrentSnapshot { position: 21, ..snap.clone() };
            assert!(RecurrentSnapshot::from_bytes(&moved.to_bytes().unwrap(), &spec, dtype, &Device::Cpu).is_err());
            let wide = vec![LayerCacheSpec::SlidingWindow { kv_heads: 2, head_dim: 32, window: 7 }, spec[1].clone()];
            assert!(RecurrentSnapshot::from_bytes(&bytes, &wide, dtype, &Device::Cpu).is_err());
        }
    }
}
