//! The input of one forward pass: a ragged batch of token chunks, one per sequence.
//!
//! Each chunk continues its sequence at the cache's current position, so a chunk can be a
//! whole prompt, a piece of one (chunked prefill), or a single decode token. Linear layers run
//! over all chunks' tokens at once; attention runs per sequence over its own KV.

use crate::kv::SequenceCache;

/// Which logits a chunk needs back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// The last position only (decode, end of prefill).
    Last,
    /// Every position of the chunk (scoring, perplexity, speculative verification).
    All,
}

/// One sequence's tokens in a forward pass.
pub struct SeqChunk<'a> {
    pub tokens: &'a [u32],
    pub cache: &'a mut SequenceCache,
    pub logits: LogitsWanted,
}

impl SeqChunk<'_> {
    pub fn logit_rows(&self) -> usize {
        match self.logits {
            LogitsWanted::None => 0,
            LogitsWanted::Last => 1,
            LogitsWanted::All => self.tokens.len(),
        }
    }
}

/// Runs `head` (final norm + LM head) on only the rows of `hidden: [total_tokens, hidden]` the
/// chunks asked for and splits the result per chunk: `[rows, vocab]` or `None`.
pub fn logits_for_chunks(
    hidden: &candle_core::Tensor,
    chunks: &[SeqChunk<'_>],
    head: impl FnOnce(&candle_core::Tensor) -> crate::Result<candle_core::Tensor>,
) -> crate::Result<Vec<Option<candle_core::Tensor>>> {
    let mut rows = Vec::new();
    let mut off = 0u32;
    for c in chunks {
        let t = c.tokens.len() as u32;
        match c.logits {
            LogitsWanted::None => {}
            LogitsWanted::Last => rows.push(off + t - 1),
            LogitsWanted::All => rows.extend(off..off + t),
        }
        off += t;
    }
    if rows.is_empty() {
        return Ok(vec![None; chunks.len()]);
    }
    let n_rows = rows.len();
    let idx = candle_core::Tensor::from_vec(rows, n_rows, hidden.device())?;
    // CUDA's gather needs a contiguous source (`contiguous` is the tensor itself when it is).
    let logits = head(&hidden.contiguous()?.index_select(&idx, 0)?)?;
    let mut result = Vec::with_capacity(chunks.len());
    let mut off = 0;
    for c in chunks {
        let r = c.logit_rows();
        result.push(if r == 0 { None } else { Some(logits.narrow(0, off, r)?) });
        off += r;
    }
    Ok(result)
}
