//! Tensor parallelism for the Llama family (issue 21), the same scheme as the hybrids'
//! ([`crate::arch::qwen_hybrid::tp`]): N ranks, each a [`Llama`] of the smaller shape loaded
//! through a [`ShardSource`] (query heads, KV heads (held whole by several ranks where they are
//! fewer than the ranks), the SwiGLU columns; o_proj and down_proj by input columns), their
//! partial sums added in rank order per layer, the residual adds and norms once; the LM head
//! and the embedding table cut by vocabulary where it divides ([`VocabHeads`],
//! [`embed_by_vocab`]), the norms whole on every rank, rank 0's serving. A sequence's cache holds rank r's layer l at `r * layers + l`. Every rank runs on
//! the one device so far.

use candle_core::{Device, Tensor};

use super::Llama;
use crate::arch::vocab_heads::{vocab_ways, VocabHeads, VocabRanks};
use crate::arch::{rank_layers, CausalLm};
use crate::batch::SeqChunk;
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::kv::LayerCacheSpec;
use crate::loader::shard::{kv_heads_per_rank, kv_ways, load_ranks, per_rank, ShardSource, Split};
use crate::loader::WeightSource;

/// The config of one rank of `world`.
pub fn shard_config(cfg: &LlamaConfig, world: usize) -> Result<LlamaConfig> {
    Ok(LlamaConfig {
        num_heads: per_rank("attention heads", cfg.num_heads, world)?,
        num_kv_heads: kv_heads_per_rank(cfg.num_kv_heads, world)?,
        intermediate_size: per_rank("FFN columns", cfg.intermediate_size, world)?,
        // The embedding table (and a tied head) cut by vocabulary where it divides.
        vocab_size: cfg.vocab_size / vocab_ways(cfg.vocab_size, world),
        ..cfg.clone()
    })
}

/// How tensor `name` (GGUF-style names, as the Llama loaders serve them) divides among
/// `world` ranks.
pub fn split_of(cfg: &LlamaConfig, world: usize, name: &str) -> Result<Split> {
    if name == "output.weight" {
        // Cut by vocabulary outside the ranks (`TpLlama::heads`); the ranks fall back to
        // their tied table for theirs, which costs nothing.
        return Ok(Split::Absent);
    }
    if name == "token_embd.weight" {
        return Ok(Split::rows(cfg.vocab_size, vocab_ways(cfg.vocab_size, world)));
    }
    let Some(tail) = name.strip_prefix("blk.").and_then(|t| t.split_once('.')).map(|(_, t)| t) else {
        // output_norm, rope_freqs.
        return Ok(Split::Whole);
    };
    let (nh, nkv, hd, ff) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size);
    let kv_ways = kv_ways(nkv, world);
    Ok(match tail {
        "attn_norm.weight" | "ffn_norm.weight" | "attn_q_norm.weight" | "attn_k_norm.weight" => Split::Whole,
        "attn_q.weight" | "attn_q.bias" => Split::rows(nh * hd, world),
        "attn_k.weight" | "attn_k.bias" | "attn_v.weight" | "attn_v.bias" => Split::rows(nkv * hd, kv_ways),
        "attn_output.weight" => Split::cols(nh * hd, world),
        "ffn_gate.weight" | "ffn_up.weight" => Split::rows(ff, world),
        "ffn_down.weight" => Split::cols(ff, world),
        // A row-parallel projection's bias would be added once per rank.
        _ => return Err(ModelError::Unsupported(format!("tensor parallelism: no rule to slice {name}"))),
    })
}

/// A Llama-family model cut into ranks (module docs).
pub struct TpLlama(VocabRanks<Llama>);

/// A Llama-family model from `ws` as `opts` asks: whole, or cut into `--tensor-parallel` ranks
/// (each rank's slices quantised after the cut where `--quantize` asks).
pub fn load(cfg: &LlamaConfig, ws: &dyn WeightSource, opts: &crate::loader::LoadOptions) -> Result<Box<dyn CausalLm>> {
    Ok(if opts.tensor_parallel > 1 {
        Box::new(TpLlama::load_with(cfg, ws, opts.tensor_parallel, |s| opts.source(s))?)
    } else {
        Box::new(Llama::load(cfg, &*opts.source(ws))?)
    })
}

impl TpLlama {
    /// Loads `world` ranks of `cfg`'s model from `ws`, each rank's source wrapped by `wrap`
    /// after the cut (load-time quantisation of the slices).
    pub fn load_with<'a>(
        cfg: &LlamaConfig,
        ws: &'a dyn WeightSource,
        world: usize,
        wrap: impl for<'b> Fn(&'b ShardSource<'a>) -> Box<dyn WeightSource + 'b>,
    ) -> Result<Self> {
        let rank_cfg = shard_config(cfg, world)?;
        let heads = VocabHeads::load(ws, world, (cfg.vocab_size, cfg.hidden_size), &wrap)?;
        let whole = cfg.clone();
        let split = move |n: &str| split_of(&whole, world, n);
        let ranks = load_ranks(ws, world, split, &wrap, |src| Llama::load(&rank_cfg, src))?;
        Ok(Self(VocabRanks::new(ranks, heads, cfg.vocab_size, |r| r.lm_head.clone())))
    }

    pub fn world(&self) -> usize {
        self.0.world()
    }
}

impl CausalLm for TpLlama {
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
        let tables = lead.rope.tables(&positions, &lead.device)?;
        // Each rank's slice of the table gives its tokens' rows where it is cut (module docs).
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
