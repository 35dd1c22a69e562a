//! A tensor-parallel model's vocabulary cut among its ranks: the LM head ([`VocabHeads`]: one
//! slice of `output.weight`'s rows a rank, or of a tied table's; the logits the slices' side by
//! side, the gather) and the token embedding table ([`embed_by_vocab`]: each rank looks up the
//! tokens in its slice and gives zero rows for the rest; the ranks' rows added in rank order,
//! the all-reduce), so no rank holds the whole vocabulary. Each logit is the same dot product
//! it is in the whole head and each embedding row the same row (x + 0 = x), so both are the
//! whole table's, bit for bit (up to the sign of a zero).

use candle_core::{Device, Tensor};

use crate::error::{ModelError, Result};
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
        let ways = vocab_ways(vocab, world);
        let slices = move |_: &str| Ok(Split::rows(vocab, ways));
        let heads = load_ranks(ws, ways, slices, wrap, |src| {
            src.linear("output.weight")?.expect("output.weight", &[vocab / ways], hidden)
        })?;
        Ok(Self(heads))
    }

    /// A head of the slices `slices` (in vocabulary order): a tied table's, cut with the
    /// embedding.
    pub fn of_slices(slices: Vec<Linear>) -> Self {
        Self(slices)
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

/// Ways a vocabulary of `vocab` tokens is cut among `world` ranks: all of them where it divides,
/// else none (one whole table, on rank 0).
pub fn vocab_ways(vocab: usize, world: usize) -> usize {
    if world > 0 && vocab.is_multiple_of(world) {
        world
    } else {
        1
    }
}

/// Embedding rows `[ids.len(), hidden]` of a table cut by vocabulary over `ranks` (rank `r`
/// holds rows `r * rows ..` of it; `embed(rank, local_ids)` looks rows up in a rank's slice):
/// each rank gives the rows of its tokens and zeros for the others, and the ranks' rows are
/// added in rank order (the all-reduce of tensor parallelism). `vocab` bounds the ids.
pub fn embed_by_vocab<M>(
    ranks: &[M],
    ids: &[u32],
    rows: usize,
    device: &Device,
    embed: impl Fn(&M, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let vocab = rows * ranks.len();
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ModelError::Input(format!("token id {bad} is outside the vocabulary")));
    }
    let n = ids.len();
    crate::arch::rank_sum(ranks, |r, m| {
        let lo = r * rows;
        let mine = |t: u32| (lo..lo + rows).contains(&(t as usize));
        let local: Vec<u32> = ids.iter().map(|&t| if mine(t) { t - lo as u32 } else { 0 }).collect();
        let e = embed(m, &Tensor::from_vec(local, n, device)?)?;
        if ids.iter().all(|&t| mine(t)) {
            return Ok(e);
        }
        let keep: Vec<f32> = ids.iter().map(|&t| if mine(t) { 1.0 } else { 0.0 }).collect();
        let keep = Tensor::from_vec(keep, (n, 1), device)?.to_dtype(e.dtype())?;
        Ok(e.broadcast_mul(&keep)?)
    })
}
