//! Per-layer cache description and the per-sequence store the architectures write into.
//!
//! A model describes what each layer needs ([`LayerCacheSpec`]); the engine allocates from
//! that description without knowing the architecture. A [`SequenceCache`] keeps its attention
//! KV either in contiguous, growable per-sequence buffers ([`SequenceCache::new`]: tests,
//! tools) or in blocks of a shared [`PagedKvStore`] listed by its block table
//! ([`SequenceCache::new_paged`]: the engine); architectures reach either through
//! [`SequenceCache::layer_kv`].
//!
//! Recurrent layers (Gated DeltaNet) keep a fixed-size [`RecurrentState`] instead of KV: the
//! last `K - 1` pre-conv inputs and the f32 SSM state. It cannot be truncated; callers take a
//! [`RecurrentSnapshot`] and restore it instead.

use std::sync::Arc;

use candle_core::{Device, Tensor};

use crate::error::{ModelError, Result};

mod batch;
mod buffer;
pub mod dtype;
pub mod paged;
mod persist;
mod recurrent;
mod window;
pub use batch::attend_batch;
pub use buffer::KvBuffer;
pub use dtype::KvDtype;
pub use paged::{ring_table, LayerKv, PagedKvStore};
pub use persist::BlockCopy;
pub use recurrent::{RecurrentSnapshot, RecurrentState};
pub use window::WindowRows;

/// What one layer keeps per sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerCacheSpec {
    /// Attention keys and values: `kv_heads * head_dim` floats each per token.
    Attention { kv_heads: usize, head_dim: usize },
    /// Sliding-window attention (Gemma 3's local layers): keys and values like
    /// [`Self::Attention`], but a query at position `p` sees only positions
    /// `p + 1 - window ..= p`.
    SlidingWindow { kv_heads: usize, head_dim: usize, window: usize },
    /// A recurrent (Gated DeltaNet) layer: a conv state of `conv_kernel - 1` inputs of
    /// `conv_channels` each, and `state_heads` f32 matrices of `key_dim x value_dim`.
    Recurrent { conv_channels: usize, conv_kernel: usize, state_heads: usize, key_dim: usize, value_dim: usize },
}

impl LayerCacheSpec {
    /// `(kv_heads, head_dim, window)` of an attention layer (window 0: every position).
    pub fn attention(&self) -> Option<(usize, usize, usize)> {
        match *self {
            LayerCacheSpec::Attention { kv_heads, head_dim } => Some((kv_heads, head_dim, 0)),
            LayerCacheSpec::SlidingWindow { kv_heads, head_dim, window } => Some((kv_heads, head_dim, window)),
            LayerCacheSpec::Recurrent { .. } => None,
        }
    }

    /// The layer's sliding window (0: an attention layer that sees every position, or a
    /// recurrent layer).
    pub fn window(&self) -> usize {
        self.attention().map_or(0, |a| a.2)
    }

    /// Bytes one token occupies in this layer (K and V stored as `dtype`).
    pub fn bytes_per_token(&self, dtype: KvDtype) -> usize {
        match self.attention() {
            Some((kv_heads, head_dim, _)) => 2 * kv_heads * dtype.row_bytes(head_dim),
            None => 0,
        }
    }

    /// Bytes the layer holds per sequence whatever its length (recurrent state).
    pub fn fixed_bytes(&self) -> usize {
        match self {
            LayerCacheSpec::Attention { .. } | LayerCacheSpec::SlidingWindow { .. } => 0,
            LayerCacheSpec::Recurrent { conv_channels, conv_kernel, state_heads, key_dim, value_dim } => {
                4 * (conv_channels * conv_kernel.saturating_sub(1) + state_heads * key_dim * value_dim)
            }
        }
    }
}

/// Everything one sequence keeps between forward passes, one entry per layer.
#[derive(Debug)]
pub struct SequenceCache {
    /// Attention KV per layer (empty and unused for recurrent layers).
    pub layers: Vec<KvBuffer>,
    /// Recurrent state per layer (`Some` exactly for recurrent layers).
    pub recurrent: Vec<Option<RecurrentState>>,
    /// Verify mode: when set, recurrent layers record their state after each position of the
    /// next forward pass here (per layer), so that any prefix can be committed.
    pub verify: Option<Vec<Vec<RecurrentState>>>,
    /// Tokens already processed (the position of the next token).
    pos: usize,
    /// Paged mode: attention KV lives in `store`'s blocks listed by `blocks`.
    paged: Option<PagedSeq>,
}

#[derive(Debug)]
struct PagedSeq {
    store: Arc<PagedKvStore>,
    blocks: Vec<u32>,
    /// GPU pools: the same table on the device, uploaded once per change of the table.
    device_table: Option<Tensor>,
    /// The ring (`base`, `len` blocks) of the store's ring layers this sequence owns, and its
    /// ring table (as long as `blocks`) with its device copy.
    ring: Option<(u32, u32)>,
    ring_blocks: Vec<u32>,
    ring_device_table: Option<Tensor>,
}

impl SequenceCache {
    /// A contiguous cache; recurrent state lives on `device`.
    pub fn new(spec: &[LayerCacheSpec], device: &Device) -> Self {
        let layers = spec
            .iter()
            .map(|s| match s.attention() {
                Some((kv_heads, head_dim, window)) => KvBuffer::with_window(kv_heads, head_dim, window),
                None => KvBuffer::new(0, 0),
            })
            .collect();
        let recurrent = spec
            .iter()
            .map(|s| match s {
                LayerCacheSpec::Attention { .. } | LayerCacheSpec::SlidingWindow { .. } => None,
                LayerCacheSpec::Recurrent { conv_channels, conv_kernel, state_heads, key_dim, value_dim } => {
                    let len = state_heads * key_dim * value_dim;
                    Some(
                        RecurrentState::zeros_on(*conv_channels, *conv_kernel, len, device)
                            .unwrap_or_else(|_| RecurrentState::zeros(*conv_channels, *conv_kernel, len)),
                    )
                }
            })
            .collect();
        Self { layers, recurrent, verify: None, pos: 0, paged: None }
    }

    /// A cache whose attention KV lives in `store`'s blocks; the owner keeps the block table
    /// current with [`Self::set_block_table`] before each forward pass.
    pub fn new_paged(spec: &[LayerCacheSpec], store: Arc<PagedKvStore>) -> Self {
        let mut c = Self::new(spec, store.device());
        c.paged = Some(PagedSeq {
            store,
            blocks: Vec::new(),
            device_table: None,
            ring: None,
            ring_blocks: Vec::new(),
            ring_device_table: None,
        });
        c
    }

    /// Paged mode with ring layers: the sequence's ring is blocks `base .. base + len` of
    /// their pools (the engine deals one run out per running sequence). Set before the first
    /// forward pass and before [`Self::resume`].
    pub fn set_ring(&mut self, base: u32, len: u32) {
        if let Some(p) = &mut self.paged {
            if p.store.has_rings() {
                p.ring = Some((base, len.max(1)));
                p.ring_blocks.clear();
                p.ring_device_table = None;
            }
        }
    }

    /// Whether the store has ring layers (sliding-window layers whose memory is bounded by
    /// their window).
    pub fn has_rings(&self) -> bool {
        self.paged.as_ref().is_some_and(|p| p.store.has_rings())
    }

    /// Positions a cache with rings can go back (truncate, restore) from its position: what
    /// its ring holds beyond the window (`usize::MAX` without rings).
    pub fn ring_slack(&self) -> usize {
        match &self.paged {
            Some(p) if p.store.has_rings() => match p.ring {
                Some((_, len)) => {
                    (len as usize * p.store.block_size()).saturating_sub(p.store.ring_window().saturating_sub(1))
                }
                None => 0,
            },
            _ => usize::MAX,
        }
    }

    pub fn is_paged(&self) -> bool {
        self.paged.is_some()
    }

    /// Paged mode: the store holding this sequence's attention KV.
    pub fn paged_store(&self) -> Option<&Arc<PagedKvStore>> {
        self.paged.as_ref().map(|p| &p.store)
    }

    /// Paged mode: the blocks holding this sequence's positions, in order.
    ///
    /// On a GPU the table is also uploaded (once per change, not per layer: an upload from
    /// pageable host memory stalls the device's queue).
    pub fn set_block_table(&mut self, blocks: &[u32]) {
        if let Some(p) = &mut self.paged {
            if p.blocks == blocks && (p.device_table.is_some() || p.store.device().is_cpu()) {
                return;
            }
            p.blocks.clear();
            p.blocks.extend_from_slice(blocks);
            p.device_table = None;
            let dev = p.store.device();
            if !dev.is_cpu() && !blocks.is_empty() {
                p.device_table = Tensor::from_slice(blocks, blocks.len(), dev).ok();
            }
            if let Some((base, len)) = p.ring {
                if p.ring_blocks.len() != blocks.len() || p.ring_device_table.is_none() {
                    p.ring_blocks = paged::ring_table(base, len, blocks.len());
                    p.ring_device_table = None;
                    if !dev.is_cpu() && !blocks.is_empty() {
                        p.ring_device_table = Tensor::from_slice(&p.ring_blocks, blocks.len(), dev).ok();
                    }
                }
            }
        }
    }

    /// The table of layer `li` (the ring table for ring layers) and its device copy.
    fn table_of(p: &PagedSeq, li: usize) -> Result<(&[u32], Option<&Tensor>)> {
        if p.store.is_ring(li) {
            if p.ring.is_none() {
                return Err(ModelError::Input(format!("layer {li} keeps a ring but the sequence has none")));
            }
            return Ok((&p.ring_blocks, p.ring_device_table.as_ref()));
        }
        Ok((&p.blocks, p.device_table.as_ref()))
    }

    pub fn block_table(&self) -> &[u32] {
        self.paged.as_ref().map(|p| p.blocks.as_slice()).unwrap_or(&[])
    }

    /// Layer `li`'s attention KV for the next forward pass.
    pub fn layer_kv(&mut self, li: usize) -> Result<LayerKv<'_>> {
        let past = self.pos;
        match &self.paged {
            Some(p) => {
                let (blocks, device_table) = Self::table_of(p, li)?;
                Ok(match device_table {
                    Some(table) => LayerKv::PagedOnDevice { store: &p.store, layer: li, blocks, table, past },
                    None => LayerKv::Paged { store: &p.store, layer: li, blocks, past },
                })
            }
            None => self
                .layers
                .get_mut(li)
                .map(LayerKv::Contiguous)
                .ok_or_else(|| ModelError::Input("sequence cache has fewer layers than the model".into())),
        }
    }

    /// Layer `li`'s attention KV continuing at `past` instead of the main position: a layer
    /// that runs behind or ahead of the model (the MTP head's own layer). Positions from
    /// `past` on are overwritten by the next attend.
    pub fn layer_kv_at(&mut self, li: usize, past: usize) -> Result<LayerKv<'_>> {
        match &self.paged {
            Some(p) => {
                let bs = p.store.block_size();
                if past > p.blocks.len() * bs {
                    return Err(ModelError::Input(format!("layer {li}: position {past} is past the block table")));
                }
                let (blocks, device_table) = Self::table_of(p, li)?;
                Ok(match device_table {
                    Some(table) => LayerKv::PagedOnDevice { store: &p.store, layer: li, blocks, table, past },
                    None => LayerKv::Paged { store: &p.store, layer: li, blocks, past },
                })
            }
            None => {
                let buf = self
                    .layers
                    .get_mut(li)
                    .ok_or_else(|| ModelError::Input("sequence cache has fewer layers than the model".into()))?;
                if past > buf.len() {
                    return Err(ModelError::Input(format!("layer {li} holds {} positions, not {past}", buf.len())));
                }
                buf.truncate(past);
                Ok(LayerKv::Contiguous(buf))
            }
        }
    }

    /// Starts a fresh paged cache at `position` (a prefix-cache hit): the KV of positions
    /// before it is already in the block table's blocks, and recurrent layers take
    /// `snapshot`'s state, which must be taken at `position`.
    pub fn resume(&mut self, position: usize, snapshot: Option<&RecurrentSnapshot>) -> Result<()> {
        if self.pos != 0 || (position > 0 && !self.is_paged()) {
            return Err(ModelError::Input("only a fresh paged cache can resume from a prefix".into()));
        }
        match snapshot {
            Some(s) if s.position == position && s.layers.len() == self.recurrent.len() => {
                if self.has_rings() && position > 0 {
                    self.write_windows(s)?;
                }
                self.recurrent = s.layers.clone();
            }
            Some(s) => {
                return Err(ModelError::Input(format!(
                    "snapshot at position {} with {} layers cannot resume position {position} of {} layers",
                    s.position,
                    s.layers.len(),
                    self.recurrent.len()
                )))
            }
            None if (self.has_recurrent() || self.has_rings()) && position > 0 => {
                return Err(ModelError::Input(
                    "resuming a model with recurrent or ring layers needs a checkpoint".into(),
                ))
            }
            None => {}
        }
        self.pos = position;
        Ok(())
    }

    /// Writes a checkpoint's window rows into this sequence's ring (see [`Self::resume`]).
    fn write_windows(&mut self, s: &RecurrentSnapshot) -> Result<()> {
        let Some(p) = &self.paged else { return Ok(()) };
        let Some((base, len)) = p.ring else {
            return Err(ModelError::Input("a cache with ring layers resumes only after set_ring".into()));
        };
        for li in 0..self.layers.len() {
            if !p.store.is_ring(li) {
                continue;
            }
            let want = s.position.min(p.store.window_of(li).saturating_sub(1));
            match s.windows.get(li).and_then(Option::as_ref) {
                Some(rows) if rows.len() == want && rows.start + want == s.position => {
                    p.store.write_ring_rows(li, base, len, rows)?;
                }
                _ => {
                    return Err(ModelError::Input(format!(
                        "the checkpoint at position {} lacks layer {li}'s last {want} positions",
                        s.position
                    )))
                }
            }
        }
        Ok(())
    }

    /// The last `window - 1` positions before `position` of every ring layer (one entry per
    /// layer, `Some` for ring layers; empty without rings). `position` may lie behind the
    /// cache's position by at most [`Self::ring_slack`].
    pub fn window_rows(&self, position: usize) -> Result<Vec<Option<WindowRows>>> {
        let Some(p) = self.paged.as_ref().filter(|p| p.store.has_rings()) else { return Ok(Vec::new()) };
        let Some((base, len)) = p.ring else {
            return Err(ModelError::Input("the sequence holds no ring".into()));
        };
        if position > self.pos || self.pos - position > self.ring_slack() {
            return Err(ModelError::Input(format!(
                "the ring at position {} no longer holds the window before position {position}",
                self.pos
            )));
        }
        (0..self.layers.len())
            .map(|li| {
                if !p.store.is_ring(li) {
                    return Ok(None);
                }
                let n = position.min(p.store.window_of(li).saturating_sub(1));
                p.store.read_ring_rows(li, base, len, position - n, n).map(Some)
            })
            .collect()
    }

    /// A checkpoint at the current position: the recurrent state (owned copies) and, with ring
    /// layers, their window rows, enough for [`Self::resume`] in another sequence.
    pub fn checkpoint(&self) -> Result<RecurrentSnapshot> {
        let mut snap = self.snapshot().detached()?;
        snap.windows = self.window_rows(self.pos)?;
        Ok(snap)
    }

    /// Going back from the current position to `len` loses no window a ring layer needs.
    fn check_ring_rollback(&self, len: usize) -> Result<()> {
        if len < self.pos && self.pos - len > self.ring_slack() {
            return Err(ModelError::Input(format!(
                "cannot go back from position {} to {len}: the sliding-window ring holds {} positions beyond its window",
                self.pos,
                self.ring_slack()
            )));
        }
        Ok(())
    }

    /// Layer `li`'s recurrent state and, in verify mode, its per-position record.
    pub fn recurrent_layer_mut(
        &mut self,
        li: usize,
    ) -> Result<(&mut RecurrentState, Option<&mut Vec<RecurrentState>>)> {
        let state = self
            .recurrent
            .get_mut(li)
            .and_then(Option::as_mut)
            .ok_or_else(|| ModelError::Input(format!("sequence cache has no recurrent state for layer {li}")))?;
        let lane = match &mut self.verify {
            Some(lanes) => lanes.get_mut(li),
            None => None,
        };
        Ok((state, lane))
    }

    /// Whether any layer keeps recurrent state (such a cache cannot be truncated).
    pub fn has_recurrent(&self) -> bool {
        self.recurrent.iter().any(Option::is_some)
    }

    /// The recurrent part of the state at the current position.
    pub fn snapshot(&self) -> RecurrentSnapshot {
        RecurrentSnapshot { position: self.pos, layers: self.recurrent.clone(), windows: Vec::new() }
    }

    /// Goes back to `snap`: recurrent layers take its state, attention KV is cut to its position.
    pub fn restore(&mut self, snap: &RecurrentSnapshot) -> Result<()> {
        if snap.layers.len() != self.recurrent.len() || snap.position > self.pos {
            return Err(ModelError::Input(format!(
                "snapshot at position {} with {} layers does not fit a cache at position {} with {} layers",
                snap.position,
                snap.layers.len(),
                self.pos,
                self.recurrent.len()
            )));
        }
        self.check_ring_rollback(snap.position)?;
        self.recurrent = snap.layers.clone();
        for l in &mut self.layers {
            l.truncate(snap.position);
        }
        self.pos = snap.position;
        self.verify = None;
        Ok(())
    }

    /// Starts verify mode: the next forward pass records every position's recurrent state.
    pub fn begin_verify(&mut self) {
        self.verify = Some(vec![Vec::new(); self.recurrent.len()]);
    }

    /// Ends verify mode after a forward of `t` tokens that started at `position() - t`: keeps
    /// the first `keep` of them (1 <= keep <= t). Recurrent layers take the state recorded
    /// after token `keep - 1`; attention KV is cut; no recomputation.
    pub fn commit_verified(&mut self, keep: usize) -> Result<()> {
        let lanes = self.verify.take().ok_or_else(|| ModelError::Input("commit without verify mode".into()))?;
        let t = lanes.iter().map(Vec::len).max().unwrap_or(0);
        if keep == 0 || keep > t || t > self.pos {
            return Err(ModelError::Input(format!("cannot commit {keep} of {t} verified positions")));
        }
        // Lanes are views of one buffer per layer (or per step): keep a copy of the chosen
        // states, not the whole buffers; every layer's copy goes into one buffer.
        let mut kept = Vec::new();
        for (slot, lane) in self.recurrent.iter().zip(&lanes) {
            if slot.is_some() {
                kept.push(lane.get(keep - 1).ok_or_else(|| ModelError::Input("verify lane too short".into()))?);
            }
        }
        let mut copies = RecurrentState::detach_all(&kept)?.into_iter();
        for state in self.recurrent.iter_mut().flatten() {
            *state = copies.next().ok_or_else(|| ModelError::Input("verify lanes missing".into()))?;
        }
        let len = self.pos - t + keep;
        for l in &mut self.layers {
            l.truncate(len);
        }
        self.pos = len;
        Ok(())
    }

    /// Ends a speculative verification forward of `fed` tokens: keeps the first `keep` of them
    /// (1 <= keep <= fed). Recurrent layers take the state recorded in verify mode (which must
    /// have been started with [`Self::begin_verify`]); attention KV is cut.
    pub fn commit_speculative(&mut self, fed: usize, keep: usize) -> Result<()> {
        if keep == 0 || keep > fed || fed > self.pos {
            return Err(ModelError::Input(format!("cannot keep {keep} of {fed} verified positions")));
        }
        if self.has_recurrent() {
            return self.commit_verified(keep);
        }
        self.verify = None;
        self.truncate(self.pos - fed + keep)
    }

    /// Number of tokens already in the cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Called by the model after a forward pass has written `t` new tokens to every layer.
    pub fn advance(&mut self, t: usize) {
        self.pos += t;
    }

    /// Forgets everything from `len` on. Refused (an error, nothing changed) when that would
    /// cut into recurrent state, which cannot be truncated: use [`Self::restore`].
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len < self.pos && self.has_recurrent() {
            return Err(ModelError::Input(format!(
                "cannot truncate recurrent state from position {} to {len}; restore a snapshot instead",
                self.pos
            )));
        }
        self.check_ring_rollback(len)?;
        for l in &mut self.layers {
            l.truncate(len);
        }
        self.pos = self.pos.min(len);
        Ok(())
    }

    pub fn allocated_bytes(&self) -> usize {
        self.layers.iter().map(KvBuffer::allocated_bytes).sum::<usize>()
            + self.recurrent.iter().flatten().map(RecurrentState::bytes).sum::<usize>()
    }
}
