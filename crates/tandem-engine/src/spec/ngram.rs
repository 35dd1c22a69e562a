//! Prompt-lookup drafting: find the most recent earlier occurrence of the sequence's last `n`
//! tokens (trying the longest `n` first) and propose the tokens that followed it. Costs no
//! model call; pays off when the output copies its context (code edits, quoting, tool output).

use candle_core::Tensor;
use tandem_model::arch::CausalLm;

use super::{Proposer, ProposerView};

/// The prompt-lookup proposer: no state beyond the sequence's tokens.
pub struct NgramProposer {
    pub min_n: usize,
    pub max_n: usize,
}

impl Proposer for NgramProposer {
    fn propose(&mut self, _model: &dyn CausalLm, seqs: &mut [(ProposerView<'_>, usize)]) -> Result<(), String> {
        for (seq, k) in seqs.iter_mut() {
            let drafts = propose(seq.tokens(), self.min_n, self.max_n, *k);
            seq.spec.drafts = drafts;
        }
        Ok(())
    }

    fn catch_up(
        &mut self,
        _model: &dyn CausalLm,
        _seqs: &mut [(ProposerView<'_>, Option<Tensor>)],
    ) -> Result<(), String> {
        Ok(())
    }
}

/// Proposes up to `k` tokens that followed the latest earlier match of `tokens`' suffix of
/// length `n`, for `n` from `max_n` down to `min_n`. Empty when nothing matches.
pub fn propose(tokens: &[u32], min_n: usize, max_n: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || min_n == 0 {
        return Vec::new();
    }
    for n in (min_n..=max_n).rev() {
        if n >= len {
            continue;
        }
        let suffix = &tokens[len - n..];
        // Latest match first: recent context predicts best. The match must end before the
        // suffix itself starts so that at least one token follows it.
        let mut start = len - n;
        while start > 0 {
            start -= 1;
            if &tokens[start..start + n] == suffix {
                let from = start + n;
                let to = (from + k).min(len);
                return tokens[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::propose;

    #[test]
    fn proposes_what_followed_the_latest_match() {
        // ... 1 2 3 4 5 ... 1 2 3 9 ... 1 2 3 -> the latest match (1 2 3 9) wins.
        let t = [7, 1, 2, 3, 4, 5, 8, 1, 2, 3, 9, 6, 1, 2, 3];
        assert_eq!(propose(&t, 1, 3, 2), vec![9, 6]);
        assert_eq!(propose(&t, 1, 3, 10), vec![9, 6, 1, 2, 3]);
    }

    #[test]
    fn longer_ngrams_take_precedence() {
        // Suffix "5 3": the 2-gram matches at index 1, the 1-gram "3" matches later at index 5.
        let t = [5, 3, 10, 11, 0, 3, 20, 5, 3];
        assert_eq!(propose(&t, 1, 2, 2), vec![10, 11]);
        assert_eq!(propose(&t, 1, 1, 2), vec![20, 5]);
    }

    #[test]
    fn nothing_to_propose() {
        assert!(propose(&[1, 2, 3, 4], 1, 3, 4).is_empty());
        assert!(propose(&[], 1, 3, 4).is_empty());
        assert!(propose(&[1, 1], 1, 3, 0).is_empty());
        assert_eq!(propose(&[1, 1], 1, 3, 4), vec![1]);
    }
}
