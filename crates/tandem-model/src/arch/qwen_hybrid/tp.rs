//! Tensor parallelism for the hybrid family (issue 21), in one process: the model cut into
//! `world` ranks by heads (attention heads and KV heads, GDN key and value heads with their
//! conv channels, gates and decay) and by FFN columns (the dense intermediate, each expert's and
//! the shared expert's), every rank a [`QwenHybrid`] of the smaller shape loaded through a
//! [`ShardSource`]. Per layer each rank runs the mixer on the same normed input and returns a
//! partial sum of the output projection; the partials are added in rank order (the all-reduce;
//! the same order for every row, so a row's bits never depend on the batch), then the residual
//! and norm run once; the FFN the same. An untied LM head is cut by vocabulary (the logits are
//! the ranks' slices side by side), and so is the embedding table where the vocabulary divides
//! (`arch::vocab_heads`: each rank looks up its tokens, zeros for the rest, the rows added in
//! rank order; a tied table's slices are the head's); norms and the router are whole on every
//! rank, rank 0's serving.
//!
//! A sequence's cache holds every rank's layers one rank after another ([`TpHybrid`]'s
//! `cache_spec`: rank r's layer l is cache layer `r * layers + l`), so the engine's paged KV,
//! prefix cache with recurrent checkpoints, verify mode and disk tier see one ordinary cache.
//! Today the ranks share one device and the sum is a device add: the sharding maths checked
//! against the unsharded model (tests below); ranks on their own GPUs with an NCCL all-reduce
//! in its place are the step after. Layouts sliced: HF Qwen3.5 (split `in_proj_qkv` / `_z` /
//! `_b` / `_a`, grouped V heads), llama.cpp's `qwen35` GGUFs (tiled V heads: one segment per
//! tile, so a rank's heads stay in its own tiled order; the stored blocks cut, then packed for
//! the CPU's kernels), Qwen3-Next's `in_proj_qkvz` / `in_proj_ba` grouped per key head (a
//! rank's key heads are one run of whole groups) and MoE experts (one by one, stacked as
//! transformers 5 saves them, or a GGUF's stacked tensors read one expert at a time). The MTP head runs whole on rank
//! 0's device (its KV the cache layer after all the ranks'), so MTP speculation works too.

use candle_core::{Device, Tensor};

use super::config::HybridConfig;
use super::mtp::MtpHead;
use super::QwenHybrid;
use crate::arch::vocab_heads::{vocab_ways, VocabHeads, VocabRanks};
use crate::arch::{rank_sum, CausalLm, MtpDraft};
use crate::batch::SeqChunk;
use crate::error::{ModelError, Result};
use crate::kv::{LayerCacheSpec, SequenceCache};
use crate::loader::shard::{kv_heads_per_rank, kv_ways, load_ranks, per_rank, ShardSource, Split};
use crate::loader::WeightSource;

/// The config of one rank of `world`: heads and FFN widths divided, the MTP head left out.
pub fn shard_config(cfg: &HybridConfig, world: usize) -> Result<HybridConfig> {
    if world == 0 {
        return Err(ModelError::Config("tensor parallelism of 0 ranks".into()));
    }
    let div = |what: &str, n: usize| per_rank(what, n, world);
    let dense = (0..cfg.num_layers()).any(|i| !cfg.is_moe_layer(i));
    let mut out = HybridConfig {
        num_heads: div("attention heads", cfg.num_heads)?,
        num_kv_heads: kv_heads_per_rank(cfg.num_kv_heads, world)?,
        linear_num_key_heads: div("GDN key heads", cfg.linear_num_key_heads)?,
        linear_num_value_heads: div("GDN value heads", cfg.linear_num_value_heads)?,
        intermediate_size: if dense { div("FFN columns", cfg.intermediate_size)? } else { cfg.intermediate_size },
        // The embedding table (and a tied head) cut by vocabulary where it divides.
        vocab_size: cfg.vocab_size / vocab_ways(cfg.vocab_size, world),
        mtp_layers: 0,
        ..cfg.clone()
    };
    if let Some(m) = out.moe.as_mut() {
        m.intermediate_size = div("expert FFN columns", m.intermediate_size)?;
        m.shared_intermediate_size = div("shared expert FFN columns", m.shared_intermediate_size)?;
    }
    Ok(out)
}

/// How tensor `name` of a model of config `cfg` (the whole model's) divides among `world`
/// ranks.
pub fn split_of(cfg: &HybridConfig, world: usize, name: &str) -> Result<Split> {
    // The MTP head runs whole; an untied LM head is cut by vocabulary outside the ranks
    // (`TpHybrid::heads`), so the ranks fall back to their (unused) tied table for theirs.
    if name.starts_with("mtp.") || name == "output.weight" {
        return Ok(Split::Absent);
    }
    if name == "token_embd.weight" {
        return Ok(Split::rows(cfg.vocab_size, vocab_ways(cfg.vocab_size, world)));
    }
    let Some(tail) = name.strip_prefix("blk.").and_then(|t| t.split_once('.')).map(|(_, t)| t) else {
        // output_norm.
        return Ok(Split::Whole);
    };
    let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
    let kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim;
    let (nk, nv) = (cfg.linear_num_key_heads, cfg.linear_num_value_heads);
    // V-indexed rows of `width` each from `base`: in grouped order one segment (a rank's key
    // heads' value heads are contiguous); in llama.cpp's tiled order (tiled head j * nk + g is
    // grouped head g * r + j) one segment per j, each cut by key heads, which gives a rank
    // its value heads in its own tiled order.
    let v_rows = |base: usize, width: usize| -> Vec<std::ops::Range<usize>> {
        if cfg.v_heads_tiled && nk != nv && nk > 0 {
            (0..nv / nk).map(|j| base + j * nk * width..base + (j + 1) * nk * width).collect()
        } else {
            vec![base..base + nv * width]
        }
    };
    let dv = cfg.linear_value_head_dim;
    let by_v = |width: usize| Split::Rows { segments: v_rows(0, width), ways: world };
    let qkv = || {
        let mut segments = vec![0..kd, kd..2 * kd];
        segments.extend(v_rows(2 * kd, dv));
        Split::Rows { segments, ways: world }
    };
    // Each rank's KV heads: its share, or (fewer heads than ranks) the one its queries use.
    let kv_ways = kv_ways(nkv, world);
    let ffn = |proj: &str, width: usize| match proj {
        "gate_proj.weight" | "up_proj.weight" => Ok(Split::rows(width, world)),
        "down_proj.weight" => Ok(Split::cols(width, world)),
        _ => Err(unsliced(name)),
    };
    Ok(match tail {
        "input_layernorm.weight" | "post_attention_layernorm.weight" => Split::Whole,
        // q_proj's rows are [query | gate] per head, so whole heads are whole pairs.
        "self_attn.q_proj.weight" => Split::rows(2 * nh * hd, world),
        "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => Split::rows(nkv * hd, kv_ways),
        "self_attn.o_proj.weight" => Split::cols(nh * hd, world),
        "self_attn.q_norm.weight" | "self_attn.k_norm.weight" => Split::Whole,
        "linear_attn.in_proj_qkv.weight" | "linear_attn.conv1d.weight" => qkv(),
        // Qwen3-Next's projections grouped per key head (`[q_g | k_g | v_g | z_g]` and
        // `[b_g | a_g]` for each key head g): a rank's key heads are one run of whole groups,
        // which its loader un-groups with its own head counts.
        "linear_attn.in_proj_qkvz.weight" => {
            let (dk, r) = (cfg.linear_key_head_dim, nv.checked_div(nk).unwrap_or(0));
            Split::rows(nk * (2 * dk + 2 * r * dv), world)
        }
        "linear_attn.in_proj_ba.weight" => Split::rows(2 * nv, world),
        "linear_attn.in_proj_z.weight" => by_v(dv),
        "linear_attn.in_proj_b.weight" | "linear_attn.in_proj_a.weight" => by_v(1),
        "linear_attn.A_log" | "linear_attn.dt_bias" => by_v(1),
        // The gated norm's weight is per value dimension, the same for every head.
        "linear_attn.norm.weight" => Split::Whole,
        "linear_attn.out_proj.weight" => Split::Cols { segments: v_rows(0, dv), ways: world },
        "mlp.gate.weight" | "mlp.shared_expert_gate.weight" => Split::Whole,
        // Experts stacked as transformers 5 saves them: gate_up `[E, 2I, H]` (gate rows
        // first), down `[E, H, I]`.
        "mlp.experts.gate_up_proj" => {
            let i = cfg.moe.as_ref().map_or(0, |m| m.intermediate_size);
            Split::Along { dim: 1, segments: vec![0..i, i..2 * i], ways: world }
        }
        "mlp.experts.down_proj" => {
            let i = cfg.moe.as_ref().map_or(0, |m| m.intermediate_size);
            Split::Along { dim: 2, segments: vec![0..i], ways: world }
        }
        t => {
            if let Some(p) = t.strip_prefix("mlp.shared_expert.") {
                ffn(p, cfg.moe.as_ref().map_or(0, |m| m.shared_intermediate_size))?
            } else if let Some(p) = t.strip_prefix("mlp.experts.").and_then(|e| e.split_once('.')).map(|(_, p)| p) {
                ffn(p, cfg.moe.as_ref().map_or(0, |m| m.intermediate_size))?
            } else if let Some(p) = t.strip_prefix("mlp.") {
                ffn(p, cfg.intermediate_size)?
            } else {
                return Err(unsliced(name));
            }
        }
    })
}

fn unsliced(name: &str) -> ModelError {
    ModelError::Unsupported(format!("tensor parallelism: no rule to slice {name}"))
}

/// A hybrid model cut into ranks (module docs).
pub struct TpHybrid {
    /// The ranks with the vocabulary they share (the LM head and the embedding table cut).
    r: VocabRanks<QwenHybrid>,
    /// The MTP head, whole (one attention layer and FFN a drafted token), on rank 0's device;
    /// its KV is the cache layer after every rank's.
    mtp: Option<MtpHead>,
    /// Attention KV heads of the whole model (the MTP head's cache layer).
    kv_heads: usize,
}

impl TpHybrid {
    /// Loads `world` ranks of the model `cfg` describes from `ws`.
    pub fn load(cfg: &HybridConfig, ws: &dyn WeightSource, world: usize) -> Result<Self> {
        let plain = crate::loader::LoadOptions::default();
        Self::load_with(cfg, ws, world, |s| plain.source(s))
    }

    /// [`Self::load`] with each rank's source wrapped by `wrap` after the cut (load-time
    /// quantisation of the slices).
    pub fn load_with<'a>(
        cfg: &HybridConfig,
        ws: &'a dyn WeightSource,
        world: usize,
        wrap: impl for<'b> Fn(&'b ShardSource<'a>) -> Box<dyn WeightSource + 'b>,
    ) -> Result<Self> {
        let rank_cfg = shard_config(cfg, world)?;
        let mtp = if ws.has("mtp.fc.weight") {
            let whole = ShardSource::new(ws, 0, 1, |_| Ok(Split::Whole))?;
            let src = wrap(&whole);
            Some(MtpHead::load(cfg, &*src)?)
        } else {
            None
        };
        let heads = if !cfg.tie_word_embeddings && ws.has("output.weight") {
            VocabHeads::load(ws, world, (cfg.vocab_size, cfg.hidden_size), &wrap)?
        } else {
            VocabHeads::default()
        };
        let whole = cfg.clone();
        let split = move |n: &str| split_of(&whole, world, n);
        let ranks = load_ranks(ws, world, split, &wrap, |src| QwenHybrid::load(&rank_cfg, src))?;
        let r = VocabRanks::new(ranks, heads, cfg.vocab_size, |m| m.lm_head.clone());
        Ok(Self { r, mtp, kv_heads: cfg.num_kv_heads })
    }

    /// `(x, h)`: the tokens' embeddings (from the ranks' slices of the table where it is cut)
    /// and their norm before layer 0.
    fn embed_normed(&self, ids: Vec<u32>) -> Result<(Tensor, Tensor)> {
        let lead = self.lead();
        let x = self.embed(&ids)?;
        let h = lead.rms(&x, lead.norm_before(0))?;
        Ok((x, h))
    }

    /// Embedding rows of `ids`, `[ids.len(), hidden]`.
    fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        self.r.embed(ids, &self.lead().device, |m, ids| m.embed_tokens(ids))
    }

    pub fn world(&self) -> usize {
        self.r.world()
    }

    fn lead(&self) -> &QwenHybrid {
        self.r.lead()
    }

    /// Logits `[rows, vocab]` of final-normed hidden rows.
    fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.r.logits(hidden, |h| self.lead().lm_head.forward(h))
    }

    /// [`QwenHybrid::forward_hidden`] over the ranks.
    pub fn forward_hidden(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Tensor> {
        let lead = self.lead();
        let layers = lead.cfg.num_layers();
        let (ids, positions) = lead.batch_inputs(chunks, layers * self.world(), self.r.vocab())?;
        let tables = lead.rope.tables(&positions, &lead.device)?;
        let (mut x, mut h) = self.embed_normed(ids)?;
        for li in 0..layers {
            let mixed = rank_sum(&self.r.ranks, |r, m| m.mixer_out(li, r * layers + li, &h, &tables, chunks))?;
            let (x1, h1) = lead.add_rms(&x, &mixed, &lead.layers[li].post_norm)?;
            let ffn = rank_sum(&self.r.ranks, |_, m| m.ffn_out(li, &h1))?;
            (x, h) = lead.add_rms(&x1, &ffn, lead.norm_before(li + 1))?;
        }
        for c in chunks.iter_mut() {
            c.cache.advance(c.tokens.len());
        }
        Ok(h)
    }
}

impl CausalLm for TpHybrid {
    fn cache_spec(&self) -> Vec<LayerCacheSpec> {
        let mut spec = self.r.cache_spec();
        if self.mtp.is_some() {
            spec.push(LayerCacheSpec::Attention { kv_heads: self.kv_heads, head_dim: self.lead().cfg.head_dim });
        }
        spec
    }
    fn vocab_size(&self) -> usize {
        self.r.vocab()
    }
    fn context_length(&self) -> usize {
        self.lead().context_length()
    }
    fn device(&self) -> &Device {
        &self.lead().device
    }
    fn forward(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        let hidden = self.forward_hidden(chunks)?;
        crate::batch::logits_for_chunks(&hidden, chunks, |sel| self.logits(sel))
    }
    fn forward_with_hidden(&self, chunks: &mut [SeqChunk<'_>]) -> Result<(Vec<Option<Tensor>>, Option<Tensor>)> {
        let hidden = self.forward_hidden(chunks)?;
        let logits = crate::batch::logits_for_chunks(&hidden, chunks, |sel| self.logits(sel))?;
        Ok((logits, Some(hidden)))
    }
    fn mtp(&self) -> Option<&dyn MtpDraft> {
        self.mtp.is_some().then_some(self as &dyn MtpDraft)
    }
}

impl MtpDraft for TpHybrid {
    fn mtp_forward(
        &self,
        hidden: &Tensor,
        next_tokens: &[u32],
        cache: &mut SequenceCache,
        past: usize,
    ) -> Result<Tensor> {
        let head = self.mtp.as_ref().ok_or_else(|| ModelError::Input("this model has no MTP head".into()))?;
        // The head's KV is the layer after every rank's (see `cache_spec`).
        let e = self.embed(next_tokens)?;
        let layer = self.world() * self.lead().cfg.num_layers();
        head.forward_embedded(self.lead(), &e, hidden, cache.layer_kv_at(layer, past)?, past)
    }
    fn mtp_logits(&self, y: &Tensor) -> Result<Tensor> {
        self.logits(y)
    }
}

#[cfg(test)]
mod tests;
