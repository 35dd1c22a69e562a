//! Tensor parallelism for Gemma 3 (issue 21), the Llama family's scheme
//! ([`crate::arch::llama::tp`]) with Gemma's sandwich norms: N ranks, each a [`Gemma3`] of the
//! smaller shape loaded through a [`ShardSource`] (query heads, KV heads (held whole by several
//! ranks where they are fewer than the ranks), the GeGLU columns; o_proj and down_proj by input
//! columns). The post-attention and post-FFN norms act on the whole projection output, so the
//! ranks' partial sums are added (in rank order, the all-reduce) before them; the q / k norms
//! are per head and run on every rank. The vocabulary is cut as for the other families
//! ([`VocabHeads`], [`embed_by_vocab`]; Gemma's tied table is the head), rows scaled by
//! sqrt(hidden) after the sum. Rank r's layer l is cache layer `r * layers + l`, local layers
//! keeping their sliding window.

use candle_core::{Device, Tensor};

use super::{Gemma3, Gemma3Config, Naming};
use crate::arch::vocab_heads::{VocabHeads, VocabRanks};
use crate::arch::{rank_layers, CausalLm};
use crate::batch::SeqChunk;
use crate::error::Result;
use crate::kv::LayerCacheSpec;
use crate::loader::shard::{load_ranks, ShardSource, Split};
use crate::loader::WeightSource;

/// The config of one rank of `world`: heads, GeGLU columns and (where it divides) the
/// vocabulary cut as the Llama family's.
pub fn shard_config(cfg: &Gemma3Config, world: usize) -> Result<Gemma3Config> {
    Ok(Gemma3Config { base: crate::arch::llama::tp::shard_config(&cfg.base, world)?, ..cfg.clone() })
}

/// How tensor `name` divides among `world` ranks: the Llama family's rule for the projections
/// and the table; every norm (Gemma's four a layer, under either naming) whole.
pub fn split_of(cfg: &Gemma3Config, world: usize, name: &str) -> Result<Split> {
    if name.ends_with("norm.weight") {
        return Ok(Split::Whole);
    }
    crate::arch::llama::tp::split_of(&cfg.base, world, name)
}

/// A Gemma 3 model cut into ranks (module docs).
pub struct TpGemma3(VocabRanks<Gemma3>);

impl TpGemma3 {
    /// Loads `world` ranks of `cfg`'s model from `ws` (norms named as `naming` says), each rank's
    /// source wrapped by `wrap` after the cut (load-time quantisation of the slices).
    pub fn load_with<'a>(
        cfg: &Gemma3Config,
        ws: &'a dyn WeightSource,
        naming: Naming,
        world: usize,
        wrap: impl for<'b> Fn(&'b ShardSource<'a>) -> Box<dyn WeightSource + 'b>,
    ) -> Result<Self> {
        let rank_cfg = shard_config(cfg, world)?;
        let c = &cfg.base;
        let heads = VocabHeads::load(ws, world, (c.vocab_size, c.hidden_size), &wrap)?;
        let whole = cfg.clone();
        let split = move |n: &str| split_of(&whole, world, n);
        let ranks = load_ranks(ws, world, split, &wrap, |src| Gemma3::load(&rank_cfg, src, naming))?;
        Ok(Self(VocabRanks::new(ranks, heads, c.vocab_size, |r| r.lm_head.clone())))
    }

    pub fn world(&self) -> usize {
        self.0.world()
    }
}

impl CausalLm for TpGemma3 {
    fn cache_spec(&self) -> Vec<LayerCacheSpec> {
        self.0.cache_spec()
    }
    fn vocab_size(&self) -> usize {
        self.0.vocab()
    }
    fn context_length(&self) -> usize {
        self.0.lead().context_length()
    }
    fn device(&self) -> &Device {
        self.0.lead().device()
    }
    fn limit_logits(&mut self, n: usize) -> Result<bool> {
        self.0.limit_logits(n)
    }
    fn forward(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        let lead = self.0.lead();
        let (ids, positions) = crate::arch::batch_tokens(chunks, self.0.vocab())?;
        let tables = lead.tables(&positions)?;
        let xh = lead.input_normed(self.0.embed(&ids, &lead.device, |m, ids| m.embed.forward(ids))?)?;
        let x = rank_layers(&self.0.ranks, xh, &tables, |layer, q, k, v, scale| {
            crate::arch::attend_chunks(chunks, layer, q, k, v, scale)
        })?;
        for c in chunks.iter_mut() {
            c.cache.advance(c.tokens.len());
        }
        crate::batch::logits_for_chunks(&x, chunks, |sel| {
            self.0.logits(&lead.rms(sel, &lead.norm)?, |normed| lead.lm_head.forward(normed))
        })
    }
}

/// A Gemma 3 model from `ws` as `opts` asks: whole, or cut into `--tensor-parallel` ranks.
pub fn load(
    cfg: &Gemma3Config,
    ws: &dyn WeightSource,
    naming: Naming,
    opts: &crate::loader::LoadOptions,
) -> Result<Box<dyn CausalLm>> {
    Ok(if opts.tensor_parallel > 1 {
        Box::new(TpGemma3::load_with(cfg, ws, naming, opts.tensor_parallel, |s| opts.source(s))?)
    } else {
        Box::new(Gemma3::load(cfg, &*opts.source(ws), naming)?)
    })
}
