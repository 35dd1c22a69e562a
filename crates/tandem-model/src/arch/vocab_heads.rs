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

/// A tensor-parallel model's ranks with the vocabulary they share: the LM head cut by
/// vocabulary (an untied one's slices, or a tied table's, the ranks' own heads) and each
/// rank's slice of the embedding table, or rank 0's whole table where the vocabulary does not
/// divide. What the families' `Tp*` models have in common; their layer loops are their own.
pub struct VocabRanks<M> {
    pub ranks: Vec<M>,
    heads: VocabHeads,
    vocab: usize,
    embed_ways: usize,
}

impl<M: crate::arch::CausalLm> VocabRanks<M> {
    /// `ranks` of a model of `vocab` tokens; `heads` its untied head cut by vocabulary (empty
    /// for a tied table, whose slices, each rank's `lm_head`, serve where the table is cut).
    pub fn new(ranks: Vec<M>, mut heads: VocabHeads, vocab: usize, lm_head: impl Fn(&M) -> Linear) -> Self {
        let embed_ways = vocab_ways(vocab, ranks.len());
        if heads.is_empty() && embed_ways > 1 {
            heads = VocabHeads::of_slices(ranks.iter().map(lm_head).collect());
        }
        Self { ranks, heads, vocab, embed_ways }
    }

    pub fn lead(&self) -> &M {
        &self.ranks[0]
    }

    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    /// The LM head's slices (empty where rank 0's whole table serves).
    pub fn heads(&self) -> &VocabHeads {
        &self.heads
    }

    /// The whole model's vocabulary.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Every rank's cache layers, one rank after another (rank r's layer l at `r * layers + l`).
    pub fn cache_spec(&self) -> Vec<crate::kv::LayerCacheSpec> {
        self.ranks.iter().flat_map(|m| m.cache_spec()).collect()
    }

    /// Keeps the first `n` logits (see [`VocabHeads::limit`]; rank 0's whole tied table where
    /// the head is not cut).
    pub fn limit_logits(&mut self, n: usize) -> Result<bool> {
        if self.heads.is_empty() {
            return self.ranks[0].limit_logits(n);
        }
        if n == 0 || n >= self.vocab {
            return Ok(false);
        }
        self.heads.limit(n)?;
        Ok(true)
    }

    /// Logits of final-normed rows: the cut head's, or `whole(normed)` (rank 0's head).
    pub fn logits(&self, normed: &Tensor, whole: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        match self.heads.logits(normed)? {
            Some(l) => Ok(l),
            None => whole(normed),
        }
    }

    /// Embedding rows of `ids`: rank 0's whole table, or the ranks' slices added
    /// ([`embed_by_vocab`]); `embed(rank, ids)` looks rows up in a rank's table. An id outside
    /// the vocabulary is an input error.
    pub fn embed(&self, ids: &[u32], device: &Device, embed: impl Fn(&M, &Tensor) -> Result<Tensor>) -> Result<Tensor> {
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(ModelError::Input(format!("token id {bad} is outside the vocabulary")));
        }
        if self.embed_ways == 1 {
            return embed(self.lead(), &Tensor::from_vec(ids.to_vec(), ids.len(), device)?);
        }
        embed_by_vocab(&self.ranks, ids, self.vocab / self.embed_ways, device, embed)
    }
}
