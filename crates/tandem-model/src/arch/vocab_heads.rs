//! A tensor-parallel model's untied LM head cut by vocabulary ([`VocabHeads`]): one slice of
//! `output.weight`'s rows a rank, the logits the slices' side by side (the gather), so no rank
//! holds the whole head. Each logit is the same dot product it is in the whole head, so the
//! logits are the whole head's, bit for bit.

use candle_core::Tensor;

use crate::error::Result;
use crate::loader::shard::{load_ranks, ShardSource, Split};
use crate::loader::{Linear, WeightSource};

/// The slices, in vocabulary order; empty where the model's head is its tied table.
#[derive(Default)]
pub struct VocabHeads(Vec<Linear>);

impl VocabHeads {
    /// `output.weight` of `ws` (`vocab x hidden`) cut `world` ways (one whole slice where the
    /// vocabulary does not divide), each slice's source wrapped by `wrap` (load-time
    /// quantisation); empty without an `output.weight`.
    pub fn load<'a>(
        ws: &'a dyn WeightSource,
        world: usize,
        (vocab, hidden): (usize, usize),
        wrap: &impl for<'b> Fn(&'b ShardSource<'a>) -> Box<dyn WeightSource + 'b>,
    ) -> Result<Self> {
        if !ws.has("output.weight") {
            return Ok(Self::default());
        }
        let ways = if world > 0 && vocab.is_multiple_of(world) { world } else { 1 };
        let slices = move |_: &str| Ok(Split::rows(vocab, ways));
        let heads = load_ranks(ws, ways, slices, wrap, |src| {
            src.linear("output.weight")?.expect("output.weight", &[vocab / ways], hidden)
        })?;
        Ok(Self(heads))
    }

    /// Whether there is no head here (the tied table serves).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Rows of each slice.
    pub fn rows(&self) -> Result<Vec<usize>> {
        self.0.iter().map(|h| Ok(h.weight.dims()?.0)).collect()
    }

    /// Logits `[rows, vocab]` of final-normed hidden rows (`None` when empty).
    pub fn logits(&self, hidden: &Tensor) -> Result<Option<Tensor>> {
        Ok(match self.0.as_slice() {
            [] => None,
            [head] => Some(head.forward(hidden)?),
            heads => {
                let parts = heads.iter().map(|h| h.forward(hidden)).collect::<Result<Vec<_>>>()?;
                Some(Tensor::cat(&parts, candle_core::D::Minus1)?)
            }
        })
    }

    /// Keeps the first `n` logits (a draft model limited to the target's vocabulary): whole
    /// slices while they fit, the first rows of the one that does not.
    pub fn limit(&mut self, n: usize) -> Result<()> {
        let mut left = n;
        let mut kept = Vec::new();
        for h in std::mem::take(&mut self.0) {
            if left == 0 {
                break;
            }
            let rows = h.weight.dims()?.0;
            if rows <= left {
                left -= rows;
                kept.push(h);
            } else {
                kept.push(h.first_rows(left)?);
                left = 0;
            }
        }
        self.0 = kept;
        Ok(())
    }
}
