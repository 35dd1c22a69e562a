//! Gemma 3 (text): decoder layers of grouped-query attention with q/k RMSNorm, sandwiched
//! between four RMSNorms per layer (before and after attention, before and after the MLP), a
//! GeGLU MLP (tanh GELU), embeddings scaled by sqrt(hidden), tied LM head. Five of every six
//! layers are local: sliding-window attention over the last `sliding_window` positions with
//! their own RoPE base; the others are global, with the model's RoPE base and scaling.
//!
//! The window lives in the cache description ([`LayerCacheSpec::SlidingWindow`]): the KV
//! store's attention applies it, so the engine needs no knowledge of Gemma.
//!
//! Gemma's RMSNorm multiplies by `1 + w`; llama.cpp's GGUF converter stores `1 + w` already,
//! Hugging Face checkpoints store `w` (the loader adds one).

pub mod config;
pub mod tp;

use std::path::Path;

use candle_core::{Device, Tensor};

pub use config::Gemma3Config;

use crate::arch::CausalLm;
use crate::batch::SeqChunk;
use crate::error::{ModelError, Result};
use crate::kv::LayerCacheSpec;
use crate::loader::{layer_progress, Embedding, Linear, LinearSet, LoadedModel, ModelSummary, WeightSource};
use crate::ops::Rope;
use crate::tokenizer::Tokenizer;

/// Where the checkpoint came from: the norm tensors' names and whether they hold `w` or `1 + w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// GGUF names (`blk.N.post_attention_norm.weight`), norms stored as `1 + w`.
    Gguf,
    /// Hugging Face names (through the safetensors source's mapping), norms stored as `w`.
    Hf,
}

impl Naming {
    /// (GGUF, Hugging Face) stems of the norms whose names differ from the Llama family's.
    fn norm(self, gguf: &'static str, hf: &'static str) -> &'static str {
        match self {
            Naming::Gguf => gguf,
            Naming::Hf => hf,
        }
    }
}

struct Layer {
    attn_norm: Tensor,
    /// attn_q, attn_k, attn_v (one matmul on CUDA).
    qkv: LinearSet,
    q_norm: Tensor,
    k_norm: Tensor,
    o: Linear,
    post_attn_norm: Tensor,
    pre_ffn_norm: Tensor,
    /// ffn_gate, ffn_up (one matmul on CUDA).
    gate_up: LinearSet,
    down: Linear,
    post_ffn_norm: Tensor,
    /// Local (sliding-window) layer.
    sliding: bool,
}

/// A loaded Gemma 3 text model.
pub struct Gemma3 {
    cfg: Gemma3Config,
    embed: Embedding,
    /// sqrt(hidden) (f32, as transformers and llama.cpp compute it).
    embed_scale: f64,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope_global: Rope,
    rope_local: Rope,
    device: Device,
}

impl Gemma3 {
    pub fn load(cfg: &Gemma3Config, ws: &dyn WeightSource, naming: Naming) -> Result<Self> {
        cfg.validate()?;
        let c = &cfg.base;
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (qd, kvd, ff) = (c.num_heads * hd, c.num_kv_heads * hd, c.intermediate_size);
        let norm = |name: &str| -> Result<Tensor> {
            let w = ws.tensor_f32(name)?;
            Ok(match naming {
                Naming::Gguf => w,
                Naming::Hf => w.affine(1.0, 1.0)?,
            })
        };
        let embed = ws.embedding("token_embd.weight")?.expect("token_embd.weight", c.vocab_size, h)?;
        let pb = layer_progress(c.num_layers, "loading");
        let mut layers = Vec::with_capacity(c.num_layers);
        for (i, &sliding) in cfg.sliding.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            let lin = |s: &str, rows: usize, cols: usize| ws.linear(&n(s))?.expect(&n(s), &[rows], cols);
            layers.push(Layer {
                attn_norm: norm(&n("attn_norm.weight"))?,
                qkv: LinearSet::new(vec![
                    lin("attn_q.weight", qd, h)?,
                    lin("attn_k.weight", kvd, h)?,
                    lin("attn_v.weight", kvd, h)?,
                ])?,
                q_norm: norm(&n("attn_q_norm.weight"))?,
                k_norm: norm(&n("attn_k_norm.weight"))?,
                o: lin("attn_output.weight", h, qd)?,
                post_attn_norm: norm(&n(naming.norm("post_attention_norm.weight", "post_attention_layernorm.weight")))?,
                pre_ffn_norm: norm(&n(naming.norm("ffn_norm.weight", "pre_feedforward_layernorm.weight")))?,
                gate_up: LinearSet::new(vec![lin("ffn_gate.weight", ff, h)?, lin("ffn_up.weight", ff, h)?])?,
                down: lin("ffn_down.weight", h, ff)?,
                post_ffn_norm: norm(&n(naming.norm("post_ffw_norm.weight", "post_feedforward_layernorm.weight")))?,
                sliding,
            });
            pb.inc(1);
        }
        pb.finish_and_clear();
        let lm_head = if ws.has("output.weight") {
            ws.linear("output.weight")?.expect("output.weight", &[c.vocab_size], h)?
        } else {
            embed.as_linear()?
        };
        let rope_global = Rope::new(hd, c.rope_theta, &c.rope_scaling, c.rope_style, None);
        let rope_local = Rope::new(hd, cfg.rope_local_theta, &crate::config::RopeScaling::None, c.rope_style, None);
        Ok(Self {
            cfg: cfg.clone(),
            embed,
            embed_scale: (h as f32).sqrt() as f64,
            layers,
            norm: norm("output_norm.weight")?,
            lm_head,
            rope_global,
            rope_local,
            device: ws.device().clone(),
        })
    }

    pub fn config(&self) -> &Gemma3Config {
        &self.cfg
    }

    fn rms(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        crate::ops::norm::rms_norm(x, w, self.cfg.base.rms_norm_eps as f32)
    }
}

impl CausalLm for Gemma3 {
    fn cache_spec(&self) -> Vec<LayerCacheSpec> {
        let c = &self.cfg.base;
        self.layers
            .iter()
            .map(|l| match l.sliding {
                true => LayerCacheSpec::SlidingWindow {
                    kv_heads: c.num_kv_heads,
                    head_dim: c.head_dim,
                    window: self.cfg.sliding_window,
                },
                false => LayerCacheSpec::Attention { kv_heads: c.num_kv_heads, head_dim: c.head_dim },
            })
            .collect()
    }
    fn vocab_size(&self) -> usize {
        self.cfg.base.vocab_size
    }
    fn context_length(&self) -> usize {
        self.cfg.base.max_position_embeddings
    }
    fn device(&self) -> &Device {
        &self.device
    }

    fn limit_logits(&mut self, n: usize) -> Result<bool> {
        if n == 0 || n >= self.cfg.base.vocab_size {
            return Ok(false);
        }
        self.lm_head = self.lm_head.first_rows(n)?;
        Ok(true)
    }

    fn forward(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        let (ids, positions) = crate::arch::batch_tokens(chunks, self.cfg.base.vocab_size)?;
        let tables = self.tables(&positions)?;
        let total = ids.len();
        let xh = self.input_normed(self.embed.forward(&Tensor::from_vec(ids, total, &self.device)?)?)?;
        let x = crate::arch::rank_layers(std::slice::from_ref(self), xh, &tables, |li, q, k, v, scale| {
            crate::arch::attend_chunks(chunks, li, q, k, v, scale)
        })?;
        for c in chunks.iter_mut() {
            c.cache.advance(c.tokens.len());
        }
        crate::batch::logits_for_chunks(&x, chunks, |sel| self.lm_head.forward(&self.rms(sel, &self.norm)?))
    }
}

/// The global and the local layers' RoPE tables for a batch's positions.
type Tables = ((Tensor, Tensor), (Tensor, Tensor));

impl Gemma3 {
    fn tables(&self, positions: &[usize]) -> Result<Tables> {
        Ok((self.rope_global.tables(positions, &self.device)?, self.rope_local.tables(positions, &self.device)?))
    }

    /// `(x, h)`: embedding rows scaled by sqrt(hidden), and their norm before layer 0.
    fn input_normed(&self, rows: Tensor) -> Result<(Tensor, Tensor)> {
        let x = rows.affine(self.embed_scale, 0.0)?;
        let h = match self.layers.first() {
            Some(l) => self.rms(&x, &l.attn_norm)?,
            None => x.clone(),
        };
        Ok((x, h))
    }
}

impl crate::arch::RankLayers for Gemma3 {
    type Tables = Tables;

    fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Layer `li`'s attention on the normed `h` through o_proj, before the post-attention norm
    /// (under tensor parallelism this rank's partial sum, which the ranks add first);
    /// attention itself left to `attend(q, k, v, scale)`.
    fn attn_out(
        &self,
        li: usize,
        h: &Tensor,
        (global, local): &Self::Tables,
        attend: impl FnOnce(&Tensor, &Tensor, &Tensor, f64) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let c = &self.cfg.base;
        let (nh, nkv, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let layer = &self.layers[li];
        let total = h.dim(0)?;
        let [q, k, v] = layer.qkv.forward_array(h)?;
        let q = self.rms(&q.reshape((total, nh, hd))?.contiguous()?, &layer.q_norm)?;
        let k = self.rms(&k.reshape((total, nkv, hd))?.contiguous()?, &layer.k_norm)?;
        let (rope, (cos, sin)) = if layer.sliding { (&self.rope_local, local) } else { (&self.rope_global, global) };
        // [heads, tokens, head_dim]
        let q = rope.apply(&q.transpose(0, 1)?.unsqueeze(0)?, cos, sin)?.squeeze(0)?;
        let k = rope.apply(&k.transpose(0, 1)?.unsqueeze(0)?, cos, sin)?.squeeze(0)?;
        let v = v.reshape((total, nkv, hd))?.transpose(0, 1)?;
        let att = attend(&q, &k, &v, self.cfg.query_pre_attn_scalar.powf(-0.5))?;
        layer.o.forward(&att.transpose(0, 1)?.reshape((total, nh * hd))?)
    }

    /// `(x1, h1)`: layer `li`'s post-attention norm of the (summed) attention output, the
    /// residual add and the pre-FFN norm.
    fn post_attn(&self, li: usize, x: &Tensor, att: &Tensor) -> Result<(Tensor, Tensor)> {
        let layer = &self.layers[li];
        let att = self.rms(att, &layer.post_attn_norm)?;
        crate::ops::norm::add_rms_norm(x, &att, &layer.pre_ffn_norm, self.cfg.base.rms_norm_eps as f32)
    }

    /// Layer `li`'s GeGLU MLP on the normed `h1` through down_proj, before the post-FFN norm
    /// (a partial sum under tensor parallelism).
    fn ffn_out(&self, li: usize, h1: &Tensor) -> Result<Tensor> {
        let layer = &self.layers[li];
        let [g, u] = layer.gate_up.forward_array(h1)?;
        layer.down.forward(&crate::ops::act::gelu_mul(&g, &u)?)
    }

    /// `(x, h)` after layer `li`: the post-FFN norm of the (summed) MLP output, the residual add
    /// and the next layer's norm (the last layer: the add alone, `h` = `x`; the final norm runs
    /// on the rows whose logits are asked for).
    fn layer_end(&self, li: usize, x1: &Tensor, down: &Tensor) -> Result<(Tensor, Tensor)> {
        let ffn = self.rms(down, &self.layers[li].post_ffn_norm)?;
        match self.layers.get(li + 1) {
            Some(next) => crate::ops::norm::add_rms_norm(x1, &ffn, &next.attn_norm, self.cfg.base.rms_norm_eps as f32),
            None => {
                let x = (x1 + ffn)?;
                Ok((x.clone(), x))
            }
        }
    }
}

/// Whether `path` is a Gemma 3 GGUF file.
pub fn is_gemma3_gguf(path: &Path) -> bool {
    path.is_file() && crate::arch::qwen_hybrid::gguf::gguf_arch(path).is_some_and(|a| a == "gemma3")
}

/// Whether `dir` holds a Gemma 3 Hugging Face checkpoint (`model_type` `gemma3_text` or `gemma3`).
pub fn is_gemma3_dir(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v.get("model_type").and_then(|m| m.as_str()).map(|m| matches!(m, "gemma3" | "gemma3_text")))
        .unwrap_or(false)
}

/// The checkpoint's summary with Gemma's details; a checkpoint without a chat template gets
/// Gemma's ([`crate::chat_template::GEMMA_TEMPLATE`]), not ChatML.
fn summary(cfg: &Gemma3Config, base: ModelSummary) -> ModelSummary {
    let local = cfg.sliding.iter().filter(|&&s| s).count();
    let chat_template = base.chat_template.clone().or_else(|| Some(crate::chat_template::GEMMA_TEMPLATE.to_string()));
    ModelSummary {
        chat_template,
        architecture: format!(
            "gemma3 ({local} sliding-window layers of {} positions, {} global)",
            cfg.sliding_window,
            cfg.sliding.len() - local
        ),
        rope: format!(
            "global theta {} scaling {:?}, local theta {}",
            cfg.base.rope_theta, cfg.base.rope_scaling, cfg.rope_local_theta
        ),
        ..base
    }
}

/// Loads a Gemma 3 GGUF file.
pub fn load_gguf(path: &Path, device: &Device, opts: &crate::loader::LoadOptions) -> Result<LoadedModel> {
    let src = crate::loader::gguf::GgufSource::open(path, device)?;
    let cfg = Gemma3Config::from_gguf(src.metadata())?;
    let tokenizer = Tokenizer::from_gguf(&src.content)?;
    let model = tp::load(&cfg, &src, Naming::Gguf, opts)?;
    let summary = summary(&cfg, crate::loader::gguf::summary_of(&src, &cfg.base, path));
    Ok(LoadedModel { model, tokenizer, chat_template: summary.chat_template.clone(), summary })
}

/// Loads a Gemma 3 Hugging Face directory.
pub fn load_hf_dir(dir: &Path, device: &Device, opts: &crate::loader::LoadOptions) -> Result<LoadedModel> {
    let cfg = read_hf_config(dir)?;
    let src = crate::loader::safetensors::SafetensorsSource::open(dir, device)?;
    let tokenizer = Tokenizer::from_hf_dir(dir)?;
    let model = tp::load(&cfg, &src, Naming::Hf, opts)?;
    let summary = summary(&cfg, crate::loader::safetensors::summary_of(&src, &cfg.base, dir)?);
    Ok(LoadedModel { model, tokenizer, chat_template: summary.chat_template.clone(), summary })
}

/// Describes a Gemma 3 GGUF file or Hugging Face directory without loading its weights.
pub fn summarize(path: &Path) -> Result<ModelSummary> {
    if path.is_dir() {
        let cfg = read_hf_config(path)?;
        let src = crate::loader::safetensors::SafetensorsSource::open(path, &Device::Cpu)?;
        Ok(summary(&cfg, crate::loader::safetensors::summary_of(&src, &cfg.base, path)?))
    } else {
        let src = crate::loader::gguf::GgufSource::open(path, &Device::Cpu)?;
        let cfg = Gemma3Config::from_gguf(src.metadata())?;
        Ok(summary(&cfg, crate::loader::gguf::summary_of(&src, &cfg.base, path)))
    }
}

fn read_hf_config(dir: &Path) -> Result<Gemma3Config> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
    Gemma3Config::from_hf_json(&v)
}
