//! Per-layer cache description and the per-sequence KV store the architectures write into.
//!
//! A model describes what each layer needs ([`LayerCacheSpec`]); the engine allocates from
//! that description without knowing the architecture. This contiguous, growable store is
//! the first implementation; a paged store (block tables over a shared pool) replaces it
//! behind the same calls.

use candle_core::{DType, Device, Tensor};

use crate::error::{ModelError, Result};

/// What one layer keeps per sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerCacheSpec {
    /// Attention keys and values: `kv_heads * head_dim` floats each per token.
    Attention { kv_heads: usize, head_dim: usize },
}

impl LayerCacheSpec {
    /// Bytes one token occupies in this layer (f32 K and V).
    pub fn bytes_per_token(&self) -> usize {
        match self {
            LayerCacheSpec::Attention { kv_heads, head_dim } => 2 * kv_heads * head_dim * 4,
        }
    }
}

/// Keys and values of one attention layer for one sequence, `[kv_heads, capacity, head_dim]`.
#[derive(Debug)]
pub struct KvBuffer {
    k: Option<Tensor>,
    v: Option<Tensor>,
    len: usize,
    cap: usize,
    kv_heads: usize,
    head_dim: usize,
}

const GROW_STEP: usize = 256;

impl KvBuffer {
    pub fn new(kv_heads: usize, head_dim: usize) -> Self {
        Self { k: None, v: None, len: 0, cap: 0, kv_heads, head_dim }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> usize {
        2 * self.cap * self.kv_heads * self.head_dim * 4
    }

    /// Appends `k_new`, `v_new: [kv_heads, t, head_dim]` and returns views of all keys and
    /// values so far, `[kv_heads, len, head_dim]`.
    pub fn append(&mut self, k_new: &Tensor, v_new: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k_new.dim(1)?;
        let need = self.len + t;
        if need > self.cap {
            let new_cap = (need.max(self.cap * 2)).div_ceil(GROW_STEP) * GROW_STEP;
            let dev = k_new.device().clone();
            let k = Tensor::zeros((self.kv_heads, new_cap, self.head_dim), DType::F32, &dev)?;
            let v = Tensor::zeros((self.kv_heads, new_cap, self.head_dim), DType::F32, &dev)?;
            if let (Some(ok), Some(ov)) = (&self.k, &self.v) {
                if self.len > 0 {
                    k.slice_set(&ok.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                    v.slice_set(&ov.narrow(1, 0, self.len)?.contiguous()?, 1, 0)?;
                }
            }
            self.k = Some(k);
            self.v = Some(v);
            self.cap = new_cap;
        }
        let (k, v) = match (&self.k, &self.v) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(ModelError::Input("KV buffer not allocated".into())),
        };
        k.slice_set(&k_new.to_dtype(DType::F32)?.contiguous()?, 1, self.len)?;
        v.slice_set(&v_new.to_dtype(DType::F32)?.contiguous()?, 1, self.len)?;
        self.len = need;
        Ok((k.narrow(1, 0, self.len)?, v.narrow(1, 0, self.len)?))
    }

    /// Drops every position at or after `len` (speculative rollback, preemption).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// Everything one sequence keeps between forward passes, one entry per layer.
#[derive(Debug)]
pub struct SequenceCache {
    pub layers: Vec<KvBuffer>,
    /// Tokens already processed (the position of the next token).
    pos: usize,
}

impl SequenceCache {
    pub fn new(spec: &[LayerCacheSpec], _device: &Device) -> Self {
        let layers = spec
            .iter()
            .map(|s| match s {
                LayerCacheSpec::Attention { kv_heads, head_dim } => KvBuffer::new(*kv_heads, *head_dim),
            })
            .collect();
        Self { layers, pos: 0 }
    }

    /// Number of tokens already in the cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Called by the model after a forward pass has written `t` new tokens to every layer.
    pub fn advance(&mut self, t: usize) {
        self.pos += t;
    }

    /// Forgets everything from `len` on.
    pub fn truncate(&mut self, len: usize) {
        for l in &mut self.layers {
            l.truncate(len);
        }
        self.pos = self.pos.min(len);
    }

    pub fn allocated_bytes(&self) -> usize {
        self.layers.iter().map(KvBuffer::allocated_bytes).sum()
    }
}
