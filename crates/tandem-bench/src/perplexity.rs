//! Perplexity of a text under a model: the text is fed in windows (chunked prefill over one
//! growing cache) and every position's next-token log-probability is taken in f64.
//! `data/perplexity.txt` is the text the sweep ships with (public domain).

use std::sync::Arc;

use anyhow::Context;
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::{KvDtype, PagedKvStore, SequenceCache};

/// The text the sweep scores: the United States Declaration of Independence (1776), public domain.
pub const SHIPPED_TEXT: &str = include_str!("../data/perplexity.txt");

/// `exp(mean negative log-likelihood)` of `ids[1..]` given their prefixes, scoring `window`
/// tokens per forward pass with the KV cache stored as `kv` (f32: contiguous buffers; the
/// other formats: the engine's paged store in that format); `None` for fewer than two tokens.
pub fn perplexity(model: &dyn CausalLm, ids: &[u32], window: usize, kv: KvDtype) -> anyhow::Result<Option<f64>> {
    if ids.len() < 2 {
        return Ok(None);
    }
    let window = window.max(1);
    let spec = model.cache_spec();
    let mut cache = if kv == KvDtype::F32 {
        SequenceCache::new(&spec, model.device())
    } else {
        const BLOCK: usize = 16;
        let blocks = ids.len().div_ceil(BLOCK);
        let store = PagedKvStore::new(&spec, blocks, BLOCK, kv, model.device())?;
        let mut cache = SequenceCache::new_paged(&spec, Arc::new(store));
        cache.set_block_table(&(0..blocks as u32).collect::<Vec<_>>());
        cache
    };
    let mut nll = 0.0f64;
    let mut scored = 0usize;
    let mut pos = 0usize;
    for piece in ids.chunks(window) {
        let mut chunks = [SeqChunk { tokens: piece, cache: &mut cache, logits: LogitsWanted::All }];
        let out = model.forward(&mut chunks)?;
        let logits = out.into_iter().next().flatten().context("the model returned no logits")?;
        let rows = logits.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
        for (j, row) in rows.iter().enumerate() {
            let Some(&next) = ids.get(pos + j + 1) else { break };
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            let lp = row.get(next as usize).copied().context("token outside the logits")? as f64 - lse;
            nll -= lp;
            scored += 1;
        }
        pos += piece.len();
    }
    Ok(Some((nll / scored as f64).exp()))
}
