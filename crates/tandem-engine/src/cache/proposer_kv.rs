//! Which proposers' KV each block holds.
//!
//! A block's target KV is written by whichever sequence fills it, but the proposers' own KV in
//! the same block ids (a draft model's, in its second store; the MTP head's, one more attention
//! layer of the target's store) only by sequences that run that proposer. A prefix-cache hit
//! must know how far that KV goes: a draft model recomputes from there (it needs only the
//! tokens); the MTP head needs the target's hidden states of every position it reads, so an
//! MTP request resumes no later than its head's KV goes and recomputes the rest with the target.

/// The draft model's KV.
pub const DRAFT: u8 = 1;
/// The MTP head's KV.
pub const MTP: u8 = 2;

/// Per block id, a bit per proposer whose KV the block holds.
pub(crate) struct ProposerKv {
    bits: Vec<u8>,
}

impl ProposerKv {
    /// Tracks `num_blocks` blocks, none holding proposer KV (or nothing, when no proposer with
    /// its own KV exists).
    pub fn new(num_blocks: usize, tracked: bool) -> Self {
        Self { bits: if tracked { vec![0; num_blocks] } else { Vec::new() } }
    }

    /// These blocks are about to be (re)written: their proposer KV is unknown until marked.
    pub fn clear(&mut self, blocks: &[u32]) {
        for &b in blocks {
            if let Some(x) = self.bits.get_mut(b as usize) {
                *x = 0;
            }
        }
    }

    /// These blocks hold `what`'s KV for every position.
    pub fn mark(&mut self, blocks: &[u32], what: u8) {
        for &b in blocks {
            if let Some(x) = self.bits.get_mut(b as usize) {
                *x |= what;
            }
        }
    }

    /// Whether block `new` holds every proposer KV `old` holds, and more.
    pub fn richer(&self, new: u32, old: u32) -> bool {
        let get = |b: u32| self.bits.get(b as usize).copied().unwrap_or(0);
        let (n, o) = (get(new), get(old));
        n != o && n & o == o
    }

    /// How many leading blocks of `blocks` hold `what`'s KV.
    pub fn leading(&self, blocks: &[u32], what: u8) -> usize {
        blocks.iter().take_while(|&&b| self.bits.get(b as usize).is_some_and(|x| x & what != 0)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_clear_and_leading_runs() {
        let mut p = ProposerKv::new(8, true);
        p.mark(&[3, 5, 1], DRAFT);
        p.mark(&[3, 5], MTP);
        assert_eq!(p.leading(&[3, 5, 1, 2], DRAFT), 3);
        assert_eq!(p.leading(&[3, 5, 1, 2], MTP), 2);
        p.clear(&[5]);
        assert_eq!(p.leading(&[3, 5, 1], DRAFT), 1);
        assert_eq!(p.leading(&[3, 9], MTP), 1, "unknown blocks hold nothing");
        assert!(p.richer(3, 5) && !p.richer(5, 3) && !p.richer(3, 3));
        p.mark(&[6], MTP);
        assert!(!p.richer(6, 1), "different proposers: neither is richer");
        let none = ProposerKv::new(8, false);
        assert_eq!(none.leading(&[0, 1], DRAFT), 0);
    }
}
