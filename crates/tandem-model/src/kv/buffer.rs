//! [`KvBuffer`]: one attention layer's keys and values for one sequence in contiguous,
//! growable tensors (the non-paged cache of tests and tools).

use candle_core::{DType, Tensor};

use crate::error::{ModelError, Result};

/// Keys and values of one attention layer for one sequence, `[kv_heads, capacity, head_dim]`.
#[derive(Debug)]
pub struct KvBuffer {
    k: Option<Tensor>,
    v: Option<Tensor>,
    len: usize,
    cap: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Sliding window of the layer (0: none).
    window: usize,
}

const GROW_STEP: usize = 256;

impl KvBuffer {
    pub fn new(kv_heads: usize, head_dim: usize) -> Self {
        Self::with_window(kv_heads, head_dim, 0)
    }

    /// A buffer for a sliding-window layer (`window` 0: none).
    pub fn with_window(kv_heads: usize, head_dim: usize, window: usize) -> Self {
        Self { k: None, v: None, len: 0, cap: 0, kv_heads, head_dim, window }
    }

    /// The layer's sliding window (0: none).
    pub fn window(&self) -> usize {
        self.window
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
