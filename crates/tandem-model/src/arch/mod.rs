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
