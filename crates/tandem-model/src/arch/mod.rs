//! Model architectures behind one trait, [`CausalLm`]: the engine drives every model the same
//! way and allocates caches from [`CausalLm::cache_spec`], never by architecture name.

#[cfg(feature = "cuda")]
pub mod decode_graph;
pub mod gemma3;
pub mod llama;
pub mod llama_to_gguf;
pub mod qwen_hybrid;
pub mod random_llama;
pub mod vocab_heads;

use candle_core::{Device, Tensor};

use crate::batch::SeqChunk;
use crate::error::Result;
use crate::kv::{LayerCacheSpec, SequenceCache};

/// The ranks' partial sums of one projection, added in rank order (the all-reduce: one order
/// for every row, whatever the batch).
pub(crate) fn rank_sum<M>(ranks: &[M], mut part: impl FnMut(usize, &M) -> Result<Tensor>) -> Result<Tensor> {
    let mut sum: Option<Tensor> = None;
    for (r, m) in ranks.iter().enumerate() {
        let p = part(r, m)?;
        sum = Some(match sum {
            None => p,
            Some(s) => (s + p)?,
        });
    }
    sum.ok_or_else(|| crate::error::ModelError::Config("tensor parallelism without ranks".into()))
}

/// A decoder's layer in the pieces that tensor parallelism runs per rank or once (the Llama
/// family and Gemma 3): the attention through its output projection and the MLP through its
/// down projection are partial sums under tensor parallelism; what comes after each runs on
/// their sum.
pub(crate) trait RankLayers {
    /// The RoPE tables of a batch's positions.
    type Tables;
    fn layer_count(&self) -> usize;
    /// Layer `li`'s attention on the normed `h` through its output projection; attention
    /// itself left to `attend(q, k, v, scale)`.
    fn attn_out(
        &self,
        li: usize,
        h: &Tensor,
        tables: &Self::Tables,
        attend: impl FnOnce(&Tensor, &Tensor, &Tensor, f64) -> Result<Tensor>,
    ) -> Result<Tensor>;
    /// `(x1, h1)`: after layer `li`'s (summed) attention output, the residual add and the
    /// MLP's norm.
    fn post_attn(&self, li: usize, x: &Tensor, att: &Tensor) -> Result<(Tensor, Tensor)>;
    /// Layer `li`'s MLP on the normed `h1` through its down projection.
    fn ffn_out(&self, li: usize, h1: &Tensor) -> Result<Tensor>;
    /// `(x, h)` after layer `li`'s (summed) MLP output: the residual add and the next layer's
    /// norm (the last layer: the add alone, `h` = `x`).
    fn layer_end(&self, li: usize, x1: &Tensor, down: &Tensor) -> Result<(Tensor, Tensor)>;
}

/// The decoder layers of `ranks` (one rank: the whole model) from the embeddings `x` and their
/// norm `h`: per layer every rank's attention and MLP partial sums added in rank order, the
/// rest on rank 0. `attend(cache_layer, q, k, v, scale)` runs attention with rank r's layer l
/// at cache layer `r * layers + l`. Returns the last layer's output.
pub(crate) fn rank_layers<M: RankLayers>(
    ranks: &[M],
    (mut x, mut h): (Tensor, Tensor),
    tables: &M::Tables,
    mut attend: impl FnMut(usize, &Tensor, &Tensor, &Tensor, f64) -> Result<Tensor>,
) -> Result<Tensor> {
    let lead =
        ranks.first().ok_or_else(|| crate::error::ModelError::Config("tensor parallelism without ranks".into()))?;
    let layers = lead.layer_count();
    for li in 0..layers {
        let att = rank_sum(ranks, |r, m| m.attn_out(li, &h, tables, |q, k, v, s| attend(r * layers + li, q, k, v, s)))?;
        let (x1, h1) = lead.post_attn(li, &x, &att)?;
        let down = rank_sum(ranks, |_, m| m.ffn_out(li, &h1))?;
        (x, h) = lead.layer_end(li, &x1, &down)?;
    }
    Ok(x)
}

/// The token ids of a batch's chunks one after another and each token's position, after
/// checking that no chunk is empty and every id is inside the vocabulary.
pub(crate) fn batch_tokens(chunks: &[SeqChunk<'_>], vocab_size: usize) -> Result<(Vec<u32>, Vec<usize>)> {
    let mut ids = Vec::new();
    let mut positions = Vec::new();
    for c in chunks {
        if c.tokens.is_empty() {
            return Err(crate::error::ModelError::Input("empty chunk in forward batch".into()));
        }
        if let Some(&bad) = c.tokens.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(crate::error::ModelError::Input(format!("token id {bad} is outside the vocabulary")));
        }
        ids.extend_from_slice(c.tokens);
        let start = c.cache.position();
        positions.extend(start..start + c.tokens.len());
    }
    Ok((ids, positions))
}

/// Attention of layer `li` for a batch: `q [nh, total, hd]`, `k`, `v [nkv, total, hd]` hold
/// every chunk's rows one after another; each chunk's new keys and values are written to its
/// cache and its queries attend over its own positions. One launch for the batch where the
/// device has it ([`crate::kv::attend_batch`]), else chunk by chunk. Returns `[nh, total, hd]`.
pub(crate) fn attend_chunks(
    chunks: &mut [SeqChunk<'_>],
    li: usize,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
) -> Result<Tensor> {
    let lens: Vec<usize> = chunks.iter().map(|c| c.tokens.len()).collect();
    let batched = {
        let kvs = chunks.iter_mut().map(|c| c.cache.layer_kv(li)).collect::<Result<Vec<_>>>()?;
        let refs: Vec<&crate::kv::LayerKv<'_>> = kvs.iter().collect();
        crate::kv::attend_batch(&refs, &lens, &q.contiguous()?, &k.contiguous()?, &v.contiguous()?, scale)?
    };
    if let Some(att) = batched {
        return Ok(att);
    }
    if let [c] = chunks {
        return c.cache.layer_kv(li)?.attend(q, k, v, scale);
    }
    let mut outs = Vec::with_capacity(chunks.len());
    let mut off = 0;
    for c in chunks.iter_mut() {
        let t = c.tokens.len();
        let rows = |x: &Tensor| x.narrow(1, off, t).and_then(|x| x.contiguous());
        outs.push(c.cache.layer_kv(li)?.attend(&rows(q)?, &rows(k)?, &rows(v)?, scale)?);
        off += t;
    }
    Ok(Tensor::cat(&outs, 1)?)
}

/// A decoder-only language model.
pub trait CausalLm: Send + Sync {
    /// One entry per layer that keeps per-sequence state.
    fn cache_spec(&self) -> Vec<LayerCacheSpec>;
    fn vocab_size(&self) -> usize;
    /// Longest sequence the model supports.
    fn context_length(&self) -> usize;
    fn device(&self) -> &Device;
    /// Runs one ragged batch. Each chunk continues its sequence at `cache.position()` and
    /// advances it. Returns, per chunk, f32 logits `[rows, vocab]` for the rows it asked for.
    fn forward(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>>;

    /// [`CausalLm::forward`] with every launch queued from the host: no CUDA graphs (the
    /// reference the decode graphs are checked against; the same as `forward` elsewhere).
    fn forward_eager(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        self.forward(chunks)
    }

    /// Decode steps run as CUDA graphs so far.
    fn graph_launches(&self) -> usize {
        0
    }

    /// [`CausalLm::forward`] that also returns the final-normed hidden state of every token,
    /// `[total_tokens, hidden]`, where the model has a use for it (an MTP head); `None` otherwise.
    fn forward_with_hidden(&self, chunks: &mut [SeqChunk<'_>]) -> Result<(Vec<Option<Tensor>>, Option<Tensor>)> {
        Ok((self.forward(chunks)?, None))
    }

    /// From now on, computes logits for the first `n` token ids only (rows `[.., n]`): a draft
    /// model whose drafts never need rarer tokens skips most of its LM head. Returns whether
    /// the model supports it (otherwise nothing changes).
    fn limit_logits(&mut self, _n: usize) -> Result<bool> {
        Ok(false)
    }

    /// The model's built-in multi-token-prediction head, if it has one.
    fn mtp(&self) -> Option<&dyn MtpDraft> {
        None
    }
}

/// A multi-token-prediction head drafting for speculative decoding. Its KV is the last layer of
/// the model's [`CausalLm::cache_spec`] and is indexed by main-model positions.
pub trait MtpDraft: Send + Sync {
    /// Runs the head over main positions `past .. past + n`, given the main model's final-normed
    /// hidden states there (`hidden: [n, H]`) and the token after each; writes the head's KV
    /// at those positions. Returns the head's output rows `y: [n, H]`; [`Self::mtp_logits`] of
    /// the last one drafts the token after the last of `next_tokens`, and the row is fed back as
    /// `hidden` to draft further.
    fn mtp_forward(
        &self,
        hidden: &Tensor,
        next_tokens: &[u32],
        cache: &mut SequenceCache,
        past: usize,
    ) -> Result<Tensor>;

    /// Logits `[rows, vocab]` of head output rows (the shared LM head).
    fn mtp_logits(&self, y: &Tensor) -> Result<Tensor>;
}
