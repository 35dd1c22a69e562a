//! The Qwen hybrid family (Qwen3-Next, Qwen3.5 dense, Qwen3.5/3.6 MoE): pre-norm decoder layers
//! whose token mixer is either a Gated DeltaNet ([`gdn`], recurrent state) or gated full
//! attention ([`attention`]), followed by a dense SwiGLU or sparse MoE block ([`ffn`]); all
//! norms except the GDN output norm are zero-centred (stored here as 1 + w). Exact maths:
//! the shared `qwen-hybrid-architecture.md`.
//!
//! Per sequence the cache holds attention KV for full-attention layers and a
//! [`crate::kv::RecurrentState`] (conv + f32 SSM state) for GDN layers. Multi-token chunks run
//! the chunked GDN form, single tokens the recurrent form, and a cache in verify mode keeps the
//! recurrent state after every position. The MTP head lives in [`mtp`].

pub mod attention;
pub mod config;
pub mod ffn;
pub mod gdn;
pub mod gguf;
#[cfg(feature = "cuda")]
mod graph;
pub mod mtp;
pub mod random;
pub mod random_gguf;
pub mod to_gguf;
pub mod tp;

use std::path::Path;

use candle_core::{Device, Tensor};

use crate::arch::CausalLm;
use crate::batch::{LogitsWanted, SeqChunk};
use crate::config::{RopeScaling, RopeStyle};
use crate::error::{ModelError, Result};
use crate::kv::{LayerCacheSpec, SequenceCache};
use crate::loader::safetensors::SafetensorsSource;
use crate::loader::{layer_progress, Embedding, Linear, LoadOptions, LoadedModel, ModelSummary, WeightSource};
use crate::ops::Rope;
use crate::tokenizer::Tokenizer;

use attention::{norm_1p, AttnPart, GatedAttention};
pub use config::{HybridConfig, LayerKind};
use ffn::{Ffn, Mlp, Moe};
use gdn::{GdnLayer, GdnPart};

enum Mixer {
    Gdn(GdnLayer),
    Attn(GatedAttention),
}

struct Layer {
    in_norm: Tensor,
    mixer: Mixer,
    post_norm: Tensor,
    ffn: Ffn,
}

/// A loaded hybrid model.
pub struct QwenHybrid {
    cfg: HybridConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope: Rope,
    mtp: Option<mtp::MtpHead>,
    device: Device,
    /// Decode steps captured as CUDA graphs ([`crate::arch::decode_graph`], [`graph`]).
    #[cfg(feature = "cuda")]
    graphs: crate::arch::decode_graph::DecodeGraphs,
}

impl QwenHybrid {
    /// Loads from tensors named `token_embd.weight`, `output_norm.weight`, `output.weight` and
    /// `blk.N.<HF tail>` (e.g. `blk.0.linear_attn.in_proj_qkv.weight`), plus `mtp.*` if present.
    pub fn load(cfg: &HybridConfig, ws: &dyn WeightSource) -> Result<Self> {
        cfg.validate()?;
        let embed = ws.embedding("token_embd.weight")?.expect("token_embd.weight", cfg.vocab_size, cfg.hidden_size)?;
        let eps = cfg.rms_norm_eps;
        let pb = layer_progress(cfg.num_layers(), "loading");
        let mut layers = Vec::with_capacity(cfg.num_layers());
        for (i, kind) in cfg.layer_kinds.iter().enumerate() {
            let p = format!("blk.{i}.");
            let mixer = match kind {
                LayerKind::Linear => Mixer::Gdn(GdnLayer::load(cfg, ws, &p)?),
                LayerKind::Full => {
                    Mixer::Attn(GatedAttention::load(ws, &p, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, eps)?)
                }
            };
            layers.push(Layer {
                in_norm: norm_1p(ws, &format!("{p}input_layernorm.weight"))?,
                mixer,
                post_norm: norm_1p(ws, &format!("{p}post_attention_layernorm.weight"))?,
                ffn: load_ffn(cfg, ws, &format!("{p}mlp."), cfg.is_moe_layer(i))?,
            });
            pb.inc(1);
        }
        pb.finish_and_clear();
        let norm = norm_1p(ws, "output_norm.weight")?;
        let lm_head = if !cfg.tie_word_embeddings && ws.has("output.weight") {
            ws.linear("output.weight")?.expect("output.weight", &[cfg.vocab_size], cfg.hidden_size)?
        } else {
            embed.as_linear()?
        };
        let rope = Rope::new(cfg.rotary_dim, cfg.rope_theta, &RopeScaling::None, RopeStyle::Half, None);
        let mtp = if ws.has("mtp.fc.weight") { Some(mtp::MtpHead::load(cfg, ws)?) } else { None };
        Ok(Self {
            cfg: cfg.clone(),
            embed,
            layers,
            norm,
            lm_head,
            rope,
            mtp,
            device: ws.device().clone(),
            #[cfg(feature = "cuda")]
            graphs: Default::default(),
        })
    }

    pub fn config(&self) -> &HybridConfig {
        &self.cfg
    }

    /// The MTP head, when the checkpoint has one.
    pub fn mtp(&self) -> Option<&mtp::MtpHead> {
        self.mtp.as_ref()
    }

    fn rms(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        crate::ops::norm::rms_norm(x, w, self.cfg.rms_norm_eps as f32)
    }

    /// `(x + d, rms(x + d) * w)`: a residual add and the norm after it (one launch on CUDA).
    fn add_rms(&self, x: &Tensor, d: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
        crate::ops::norm::add_rms_norm(x, d, w, self.cfg.rms_norm_eps as f32)
    }

    /// The norm before layer `li`'s mixer, or the final norm after the last layer.
    fn norm_before(&self, li: usize) -> &Tensor {
        self.layers.get(li).map_or(&self.norm, |l| &l.in_norm)
    }

    /// Runs the decoder over the batch and advances every cache. Returns the final-normed
    /// hidden states of all tokens, `[tokens, hidden]` (the MTP head's input).
    pub fn forward_hidden(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Tensor> {
        let (ids, positions) = self.batch_inputs(chunks, self.cfg.num_layers(), self.cfg.vocab_size)?;
        // One upload of every token's RoPE table (not one per sequence).
        let tables = self.rope.tables(&positions, &self.device)?;
        let (mut x, mut h) = self.embed_normed(ids)?;
        for li in 0..self.layers.len() {
            let mixed = self.mixer_out(li, li, &h, &tables, chunks)?;
            let (x1, h1) = self.add_rms(&x, &mixed, &self.layers[li].post_norm)?;
            (x, h) = self.add_rms(&x1, &self.ffn_out(li, &h1)?, self.norm_before(li + 1))?;
        }
        for c in chunks.iter_mut() {
            c.cache.advance(c.tokens.len());
        }
        Ok(h)
    }

    /// The batch's token ids and positions, after checking every chunk against a model whose
    /// caches hold `cache_layers` layers and whose vocabulary holds `vocab` tokens.
    fn batch_inputs(
        &self,
        chunks: &[SeqChunk<'_>],
        cache_layers: usize,
        vocab: usize,
    ) -> Result<(Vec<u32>, Vec<usize>)> {
        let batch = crate::arch::batch_tokens(chunks, vocab)?;
        for c in chunks.iter() {
            if c.cache.layers.len() < cache_layers || c.cache.recurrent.len() < cache_layers {
                return Err(ModelError::Input("sequence cache has fewer layers than the model".into()));
            }
            if c.cache.verify.is_some() && c.logits == LogitsWanted::None {
                return Err(ModelError::Input("a verify chunk must ask for logits".into()));
            }
        }
        Ok(batch)
    }

    /// `(x, h)`: the tokens' embeddings and their norm before layer 0.
    fn embed_normed(&self, ids: Vec<u32>) -> Result<(Tensor, Tensor)> {
        let total = ids.len();
        let x = self.embed.forward(&Tensor::from_vec(ids, total, &self.device)?)?;
        // Each residual add is fused with the norm after it: `h` is always the normed `x`.
        let h = self.rms(&x, self.norm_before(0))?;
        Ok((x, h))
    }

    /// Layer `li`'s token mixer on the normed `h`, with its state in cache layer `cache_li` of
    /// each chunk's sequence: `[tokens, hidden]`, before the residual add (under tensor
    /// parallelism, this rank's partial sum).
    fn mixer_out(
        &self,
        li: usize,
        cache_li: usize,
        h: &Tensor,
        tables: &(Tensor, Tensor),
        chunks: &mut [SeqChunk<'_>],
    ) -> Result<Tensor> {
        match &self.layers[li].mixer {
            Mixer::Gdn(g) => {
                let mut parts = chunks
                    .iter_mut()
                    .map(|c| {
                        let len = c.tokens.len();
                        let (state, lane) = c.cache.recurrent_layer_mut(cache_li)?;
                        Ok(GdnPart { len, state, lane })
                    })
                    .collect::<Result<Vec<_>>>()?;
                g.forward(h, &mut parts)
            }
            Mixer::Attn(a) => {
                let mut parts = chunks
                    .iter_mut()
                    .map(|c| Ok(AttnPart { len: c.tokens.len(), kv: c.cache.layer_kv(cache_li)? }))
                    .collect::<Result<Vec<_>>>()?;
                a.forward(h, &self.rope, tables, &mut parts)
            }
        }
    }

    /// Layer `li`'s FFN on the normed `h1`, before the residual add.
    fn ffn_out(&self, li: usize, h1: &Tensor) -> Result<Tensor> {
        self.layers[li].ffn.forward(h1)
    }

    /// [`CausalLm::forward`] without CUDA graphs: every launch queued from the host (the
    /// reference the decode graphs are checked against).
    fn eager_forward(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        let hidden = self.forward_hidden(chunks)?;
        crate::batch::logits_for_chunks(&hidden, chunks, |sel| self.lm_head.forward(sel))
    }

    /// Logits of final-normed hidden rows.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        self.lm_head.forward(hidden)
    }

    pub(crate) fn embed_tokens(&self, ids: &Tensor) -> Result<Tensor> {
        self.embed.forward(ids)
    }
}

fn load_ffn(cfg: &HybridConfig, ws: &dyn WeightSource, p: &str, moe: bool) -> Result<Ffn> {
    Ok(if moe { Ffn::Moe(Box::new(Moe::load(cfg, ws, p)?)) } else { Ffn::Dense(Mlp::load(ws, p)?) })
}

impl CausalLm for QwenHybrid {
    fn cache_spec(&self) -> Vec<LayerCacheSpec> {
        let c = &self.cfg;
        let mut spec: Vec<LayerCacheSpec> = c
            .layer_kinds
            .iter()
            .map(|k| match k {
                LayerKind::Full => LayerCacheSpec::Attention { kv_heads: c.num_kv_heads, head_dim: c.head_dim },
                LayerKind::Linear => LayerCacheSpec::Recurrent {
                    conv_channels: c.conv_channels(),
                    conv_kernel: c.conv_kernel,
                    state_heads: c.linear_num_value_heads,
                    key_dim: c.linear_key_head_dim,
                    value_dim: c.linear_value_head_dim,
                },
            })
            .collect();
        if self.mtp.is_some() {
            // The MTP head's own attention KV, after the main layers.
            spec.push(LayerCacheSpec::Attention { kv_heads: c.num_kv_heads, head_dim: c.head_dim });
        }
        spec
    }
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
    fn context_length(&self) -> usize {
        self.cfg.max_position_embeddings
    }
    fn device(&self) -> &Device {
        &self.device
    }

    fn forward(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        #[cfg(feature = "cuda")]
        if let Some((logits, _)) = self.decode_graph(chunks)? {
            return Ok(logits);
        }
        self.eager_forward(chunks)
    }

    fn forward_eager(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        self.eager_forward(chunks)
    }

    #[cfg(feature = "cuda")]
    fn graph_launches(&self) -> usize {
        self.graphs.launches()
    }

    fn forward_with_hidden(&self, chunks: &mut [SeqChunk<'_>]) -> Result<(Vec<Option<Tensor>>, Option<Tensor>)> {
        // Decode and verify steps of a model with an MTP head keep the hidden states in their
        // graphs.
        #[cfg(feature = "cuda")]
        if self.mtp.is_some() {
            // (Such graphs always keep them: `hidden` is `Some`.)
            if let Some((logits, hidden)) = self.decode_graph(chunks)? {
                return Ok((logits, hidden));
            }
        }
        let hidden = self.forward_hidden(chunks)?;
        let logits = crate::batch::logits_for_chunks(&hidden, chunks, |sel| self.lm_head.forward(sel))?;
        Ok((logits, Some(hidden)))
    }

    fn mtp(&self) -> Option<&dyn super::MtpDraft> {
        self.mtp.is_some().then_some(self as &dyn super::MtpDraft)
    }
}

impl super::MtpDraft for QwenHybrid {
    fn mtp_forward(
        &self,
        hidden: &Tensor,
        next_tokens: &[u32],
        cache: &mut SequenceCache,
        past: usize,
    ) -> Result<Tensor> {
        let head = self.mtp.as_ref().ok_or_else(|| ModelError::Input("this model has no MTP head".into()))?;
        // The head's KV is the layer after the main ones (see `cache_spec`).
        head.forward_in(self, hidden, next_tokens, cache, self.cfg.num_layers(), past)
    }

    fn mtp_logits(&self, y: &Tensor) -> Result<Tensor> {
        self.logits(y)
    }
}

/// Whether `dir/config.json` describes a hybrid model.
pub fn is_hybrid_dir(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|v| config::is_hybrid(&v))
}

pub fn read_config(dir: &Path) -> Result<HybridConfig> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
    HybridConfig::from_hf_json(&v)
}

/// Loads a Hugging Face directory of a hybrid model (vision weights, if any, are not read).
pub fn load_hf_dir(dir: &Path, device: &Device, opts: &crate::loader::LoadOptions) -> Result<LoadedModel> {
    let cfg = read_config(dir)?;
    let src = SafetensorsSource::open(dir, device)?;
    let tokenizer = Tokenizer::from_hf_dir(dir)?;
    let donor = opts.mtp_donor(&cfg, device)?;
    let mut slot = None;
    let model: Box<dyn CausalLm> = if opts.tensor_parallel > 1 {
        // Each rank's slices are cut first and quantised after (--quantize), so the repacked
        // weights never need cutting.
        let plain = LoadOptions { quantize: None, ..opts.clone() };
        let base = plain.hybrid_source(&src, &donor, &mut slot);
        Box::new(tp::TpHybrid::load_with(&cfg, &*base, opts.tensor_parallel, |s| opts.source(s))?)
    } else {
        Box::new(QwenHybrid::load(&cfg, &*opts.hybrid_source(&src, &donor, &mut slot))?)
    };
    let summary = summary_of(&cfg, &src, dir)?;
    Ok(LoadedModel { model, tokenizer, chat_template: summary.chat_template.clone(), summary })
}

/// Describes a hybrid Hugging Face directory from its config and safetensors headers.
pub fn summarize(dir: &Path) -> Result<ModelSummary> {
    let cfg = read_config(dir)?;
    let src = SafetensorsSource::open(dir, &Device::Cpu)?;
    summary_of(&cfg, &src, dir)
}

fn summary_of(cfg: &HybridConfig, src: &SafetensorsSource, dir: &Path) -> Result<ModelSummary> {
    let (tensor_types, parameters) = src.tensor_types();
    let file_bytes = std::fs::read_dir(dir)
        .map_err(|e| ModelError::io(dir, e))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    Ok(ModelSummary {
        path: dir.display().to_string(),
        format: src.format(),
        architecture: describe(&cfg.model_type, cfg, src.has("mtp.fc.weight")),
        parameters,
        file_bytes,
        tensor_types,
        chat_template: crate::chat_template::hf_chat_template(dir)?,
        ..summary_fields(cfg)
    })
}

/// `qwen3_5_text (layers GGAG: G = Gated DeltaNet, A = gated attention; MTP head: yes)`; the
/// head is `dropped` when the config declares one and the weights are missing.
pub(crate) fn describe(name: &str, cfg: &HybridConfig, mtp: bool) -> String {
    let kinds: String = cfg.layer_kinds.iter().map(|k| if *k == LayerKind::Full { 'A' } else { 'G' }).collect();
    format!(
        "{name} (layers {kinds}: G = Gated DeltaNet, A = gated attention; MTP head: {})",
        match (mtp, cfg.mtp_layers > 0) {
            (true, _) => "yes",
            // The config has one, the weights are gone (mlx-lm's converter drops `mtp.*`).
            (false, true) => "dropped",
            (false, false) => "no",
        }
    )
}

/// The summary fields that come from the config.
pub(crate) fn summary_fields(cfg: &HybridConfig) -> ModelSummary {
    ModelSummary {
        context_length: cfg.max_position_embeddings,
        vocab_size: cfg.vocab_size,
        hidden_size: cfg.hidden_size,
        num_layers: cfg.num_layers(),
        num_heads: cfg.num_heads,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        tie_word_embeddings: cfg.tie_word_embeddings,
        rope: format!("theta {}, partial rotary {} of {} dims", cfg.rope_theta, cfg.rotary_dim, cfg.head_dim),
        ..Default::default()
    }
}
