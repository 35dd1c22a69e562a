//! Attention for a whole batch of sequences at once, where the device allows it (CUDA, every
//! sequence paged in one store): the new rows of all sequences written by one scatter per
//! pool and attended by one launch ([`crate::ops::paged_attention::cuda_batch`]), with the
//! bits each sequence gets alone. Elsewhere the callers go sequence by sequence
//! ([`LayerKv::attend`]). On by default (checked bit for bit against the per-sequence path by
//! `check-device`'s `attention batch` rows and the GPU suite on the H200); `TANDEM_ATTN_BATCH=0`
//! turns it off.

use candle_core::Tensor;

use super::LayerKv;
use crate::error::Result;

/// Appends every part's new keys and values and returns the causal attention of all of them:
/// `q` `[n_heads, total, head_dim]`, `k`, `v` `[kv_heads, total, head_dim]` hold the parts'
/// rows one after another (`lens`). `None` (nothing written) when the parts cannot go
/// together; the caller then attends part by part.
pub fn attend_batch(
    kvs: &[&LayerKv<'_>],
    lens: &[usize],
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    {
        use crate::ops::paged_attention::cuda_batch::SeqRows;
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var("TANDEM_ATTN_BATCH").map_or(true, |v| v != "0"));
        if !on || kvs.len() < 2 || kvs.len() != lens.len() || !q.device().is_cuda() {
            return Ok(None);
        }
        let mut store: Option<(&super::PagedKvStore, usize)> = None;
        let mut seqs = Vec::with_capacity(kvs.len());
        for (kv, &t) in kvs.iter().zip(lens) {
            let (s, li, blocks, past) = match kv {
                LayerKv::Paged { store, layer, blocks, past } => (*store, *layer, *blocks, *past),
                LayerKv::PagedOnDevice { store, layer, blocks, past, .. } => (*store, *layer, *blocks, *past),
                LayerKv::Contiguous(_) => return Ok(None),
            };
            match store {
                Some((s0, l0)) if !std::ptr::eq(s0, s) || l0 != li => return Ok(None),
                _ => store = Some((s, li)),
            }
            seqs.push(SeqRows { blocks, past, t });
        }
        let Some((store, li)) = store else { return Ok(None) };
        return store.attend_batch(li, &seqs, q, k, v, scale);
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (kvs, lens, q, k, v, scale);
        Ok(None)
    }
}
