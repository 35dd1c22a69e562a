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
