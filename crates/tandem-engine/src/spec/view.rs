//! [`ProposerView`]: the part of a sequence a proposer may see and touch. Proposers read its
//! tokens and write only their own state (`spec`: drafts, the draft model's cache, counters) and
//! the MTP head's positions in the target's cache; the block table, prefix-tree place, sampler
//! and stop rules stay out of their reach.

use tandem_model::kv::SequenceCache;

use super::SeqSpec;

pub(crate) struct ProposerView<'a> {
    tokens: &'a [u32],
    prompt_len: usize,
    /// The target's cache: its position, and the MTP head's KV in its blocks.
    pub cache: &'a mut SequenceCache,
    pub spec: &'a mut SeqSpec,
}

impl<'a> ProposerView<'a> {
    pub fn new(tokens: &'a [u32], prompt_len: usize, cache: &'a mut SequenceCache, spec: &'a mut SeqSpec) -> Self {
        Self { tokens, prompt_len, cache, spec }
    }

    /// Prompt followed by the generated tokens; the last is the pending one.
    pub fn tokens(&self) -> &[u32] {
        self.tokens
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Tokens the draft model has not seen yet, up to position `end` (at most every token, the
    /// pending one included), and its cache. `None` without a draft model or nothing to feed.
    pub fn draft_catch_up_input(&mut self, end: usize) -> Option<(&[u32], &mut SequenceCache)> {
        let cache = self.spec.draft_cache.as_mut()?;
        let start = cache.position();
        let end = end.min(self.tokens.len());
        if start >= end {
            return None;
        }
        Some((&self.tokens[start..end], cache))
    }
}
