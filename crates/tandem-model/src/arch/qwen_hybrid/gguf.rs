//! llama.cpp GGUF files of the hybrid family: architectures `qwen3next`, `qwen35` (dense) and
//! `qwen35moe` (shared spec §9.3).
//!
//! [`HybridGgufSource`] wraps the generic [`GgufSource`] and serves the Hugging Face-style names
//! [`QwenHybrid::load`] asks for (`blk.N.linear_attn.in_proj_qkv.weight`, `mtp.fc.weight`, ...)
//! from the GGUF tensors, undoing the converter's value transforms on the small tensors:
//! zero-centred norms carry a baked-in +1 (all but `ssm_norm`), `ssm_a` holds −exp(A_log),
//! `ssm_conv1d` is squeezed to `[channels, K]`. Linear weights are handed out as stored, so
//! quantised files stay quantised; stacked experts (`ffn_{gate,up,down}_exps`, or
//! `ffn_gate_up_exps`) are served per expert as byte slices of the stacked tensor. The MTP
//! block of `qwen35*` files is block `L` (`blk.L.nextn.*` plus ordinary layer tensors) with
//! `block_count = L + nextn_predict_layers`. The V-head reordering of `qwen35*` files is undone
//! by the GDN layer ([`super::HybridConfig::v_heads_tiled`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, TensorInfo, Value};
use candle_core::{Device, Tensor};

use super::config::{HybridConfig, LayerKind, MoeConfig};
use super::QwenHybrid;
use crate::error::{ModelError, Result};
use crate::loader::gguf::GgufSource;
use crate::loader::{Embedding, LinearWeight, LoadedModel, ModelSummary, StackedExperts, WeightSource};
use crate::tokenizer::Tokenizer;

/// GGUF architecture strings of the family.
pub const ARCHS: [&str; 3] = ["qwen3next", "qwen35", "qwen35moe"];

/// The `general.architecture` of a GGUF file (reads the header only).
pub fn gguf_arch(path: &Path) -> Option<String> {
    let file = File::open(path).ok()?;
    // SAFETY: read-only mapping of a model file nobody writes while we read it.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.ok()?;
    // A header that fails the checks is not the family's; the plain GGUF loader reports why.
    crate::loader::gguf_check::check(&mmap[..]).ok()?;
    let mut r = BufReader::new(std::io::Cursor::new(&mmap[..]));
    let content = crate::loader::contain(move || Content::read(&mut r)).ok()?.ok()?;
    match content.metadata.get("general.architecture")? {
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// Whether `path` is a GGUF file of the hybrid family.
pub fn is_hybrid_gguf(path: &Path) -> bool {
    path.is_file() && gguf_arch(path).is_some_and(|a| ARCHS.contains(&a.as_str()))
}

fn as_u64(v: &Value) -> Option<u64> {
    Some(match v {
        Value::U8(x) => *x as u64,
        Value::I8(x) => u64::try_from(*x).ok()?,
        Value::U16(x) => *x as u64,
        Value::I16(x) => u64::try_from(*x).ok()?,
        Value::U32(x) => *x as u64,
        Value::I32(x) => u64::try_from(*x).ok()?,
        Value::U64(x) => *x,
        Value::I64(x) => u64::try_from(*x).ok()?,
        Value::Bool(b) => *b as u64,
        _ => return None,
    })
}

/// Metadata of one architecture (`{arch}.key`).
struct Meta<'a> {
    md: &'a HashMap<String, Value>,
    arch: &'a str,
}

impl Meta<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.md.get(&format!("{}.{key}", self.arch))
    }
    /// An integer key; a per-layer array gives its largest entry.
    fn opt_u(&self, key: &str) -> Option<usize> {
        match self.get(key)? {
            Value::Array(a) => a.iter().filter_map(as_u64).max().map(|x| x as usize),
            v => as_u64(v).map(|x| x as usize),
        }
    }
    fn u(&self, key: &str) -> Result<usize> {
        self.opt_u(key).ok_or_else(|| ModelError::Config(format!("GGUF: missing integer `{}.{key}`", self.arch)))
    }
    fn f(&self, key: &str) -> Option<f64> {
        match self.get(key)? {
            Value::F32(x) => Some(*x as f64),
            Value::F64(x) => Some(*x),
            v => as_u64(v).map(|x| x as f64),
        }
    }
}

/// Builds the config from GGUF metadata and tensor infos (the vocabulary size is the row count
/// of `token_embd.weight`; a missing `output.weight` means tied embeddings).
pub fn config_from_gguf(content: &Content) -> Result<HybridConfig> {
    let arch = match content.metadata.get("general.architecture") {
        Some(Value::String(s)) if ARCHS.contains(&s.as_str()) => s.as_str(),
        other => {
            return Err(ModelError::Unsupported(format!("GGUF architecture {other:?} is not a Qwen hybrid model")))
        }
    };
    let m = Meta { md: &content.metadata, arch };
    let block_count = m.u("block_count")?;
    crate::config::limits::check("block_count", block_count, crate::config::limits::LAYERS)?;
    let nextn = m.opt_u("nextn_predict_layers").unwrap_or(0);
    if nextn >= block_count {
        return Err(ModelError::Config(format!("GGUF: {nextn} MTP layers of {block_count} blocks")));
    }
    let layers = block_count - nextn;
    let hidden_size = m.u("embedding_length")?;
    let num_heads = m.u("attention.head_count")?;
    let head_dim = m.opt_u("attention.key_length").unwrap_or(hidden_size / num_heads.max(1));
    let recurrent: Option<Vec<bool>> = match m.get("attention.recurrent_layers") {
        Some(Value::Array(a)) => Some(a.iter().map(|v| as_u64(v).unwrap_or(0) != 0).collect()),
        Some(v) => as_u64(v).map(|x| vec![x != 0; layers]),
        None => None,
    };
    let layer_kinds: Vec<LayerKind> = match recurrent {
        Some(r) if r.len() >= layers => {
            r[..layers].iter().map(|&rec| if rec { LayerKind::Linear } else { LayerKind::Full }).collect()
        }
        Some(r) => {
            return Err(ModelError::Config(format!("GGUF: {} recurrent-layer flags for {layers} layers", r.len())))
        }
        None => {
            let every = m.opt_u("full_attention_interval").unwrap_or(4).max(1);
            (0..layers).map(|i| if (i + 1) % every == 0 { LayerKind::Full } else { LayerKind::Linear }).collect()
        }
    };
    let embd = content
        .tensor_infos
        .get("token_embd.weight")
        .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
    let nv = m.u("ssm.time_step_rank")?;
    let moe = match m.opt_u("expert_count") {
        Some(n) if n > 0 => Some(MoeConfig {
            num_experts: n,
            top_k: m.u("expert_used_count")?,
            intermediate_size: m.u("expert_feed_forward_length")?,
            shared_intermediate_size: m.opt_u("expert_shared_feed_forward_length").unwrap_or(0),
            norm_topk_prob: m.get("expert_weights_norm").and_then(as_u64).is_none_or(|x| x != 0),
        }),
        _ => None,
    };
    let cfg = HybridConfig {
        model_type: match arch {
            "qwen3next" => "qwen3_next",
            "qwen35" => "qwen3_5_text",
            _ => "qwen3_5_moe_text",
        }
        .into(),
        grouped_projections: arch == "qwen3next",
        vocab_size: embd.shape.dims()[0],
        hidden_size,
        layer_kinds,
        num_heads,
        num_kv_heads: m.opt_u("attention.head_count_kv").unwrap_or(num_heads),
        head_dim,
        rotary_dim: m.opt_u("rope.dimension_count").unwrap_or(head_dim / 4) & !1,
        rope_theta: m.f("rope.freq_base").unwrap_or(10_000_000.0),
        rms_norm_eps: m.f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        max_position_embeddings: m.opt_u("context_length").unwrap_or(262_144),
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        linear_num_key_heads: m.u("ssm.group_count")?,
        linear_num_value_heads: nv,
        linear_key_head_dim: m.u("ssm.state_size")?,
        linear_value_head_dim: m.u("ssm.inner_size")? / nv.max(1),
        conv_kernel: m.opt_u("ssm.conv_kernel").unwrap_or(4),
        intermediate_size: m.opt_u("feed_forward_length").unwrap_or(0),
        moe,
        decoder_sparse_step: 1,
        // A layer without a router is dense (Qwen3-Next's `mlp_only_layers`).
        mlp_only_layers: (0..layers)
            .filter(|i| !content.tensor_infos.contains_key(&format!("blk.{i}.ffn_gate_inp.weight")))
            .collect(),
        mtp_layers: nextn,
        // The converter reorders V heads for qwen35* only (and only when nk != nv).
        v_heads_tiled: arch != "qwen3next",
    };
    cfg.validate()?;
    Ok(cfg)
}

/// How a GGUF tensor's values differ from the HF tensor the model asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fix {
    None,
    /// Zero-centred norm stored as 1 + w.
    MinusOne,
    /// `ssm_a` = −exp(A_log).
    ALog,
}

/// A [`GgufSource`] answering to the hybrid model's Hugging Face-style tensor names.
pub struct HybridGgufSource {
    pub inner: GgufSource,
    pub config: HybridConfig,
    /// Tensor types and parameter count of the file (before the per-expert views are added).
    stats: (std::collections::BTreeMap<String, usize>, u64),
}

/// Name of the per-expert view of stacked tensor `stacked` (`blk.N.ffn_gate_exps.weight`).
fn expert_view(stacked: &str, e: usize) -> String {
    format!("{stacked}@{e}")
}

impl HybridGgufSource {
    pub fn open(path: &Path, device: &Device) -> Result<Self> {
        let mut inner = GgufSource::open(path, device)?;
        let config = config_from_gguf(&inner.content)?;
        let stats = inner.tensor_types();
        add_expert_views(&mut inner.content)?;
        Ok(Self { inner, config, stats })
    }

    /// Block index of the MTP layer (`blk.L.nextn.*`), if the file has one.
    fn mtp_block(&self) -> Option<usize> {
        (self.config.mtp_layers > 0).then(|| self.config.num_layers())
    }

    /// The GGUF tensor behind a model-side name.
    fn map(&self, name: &str) -> Option<(String, Fix)> {
        match name {
            "token_embd.weight" | "output.weight" => return Some((name.into(), Fix::None)),
            "output_norm.weight" => return Some((name.into(), Fix::MinusOne)),
            _ => {}
        }
        if let Some(rest) = name.strip_prefix("mtp.") {
            let l = self.mtp_block()?;
            let nextn = |t: &str, fix| Some((format!("blk.{l}.nextn.{t}.weight"), fix));
            return match rest {
                "fc.weight" => nextn("eh_proj", Fix::None),
                "pre_fc_norm_embedding.weight" => nextn("enorm", Fix::MinusOne),
                "pre_fc_norm_hidden.weight" => nextn("hnorm", Fix::MinusOne),
                "norm.weight" => nextn("shared_head_norm", Fix::MinusOne),
                _ => {
                    let (i, tail) = rest.strip_prefix("layers.")?.split_once('.')?;
                    let i: usize = i.parse().ok()?;
                    (i < self.config.mtp_layers).then_some(())?;
                    map_tail(l + i, tail)
                }
            };
        }
        let (layer, tail) = name.strip_prefix("blk.")?.split_once('.')?;
        map_tail(layer.parse().ok()?, tail)
    }

    fn mapped(&self, name: &str) -> Result<(String, Fix)> {
        self.map(name).filter(|(g, _)| self.inner.has(g)).ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    pub fn summary(&self, path: &Path) -> ModelSummary {
        let cfg = &self.config;
        let md = self.inner.metadata();
        let chat_template = md.get("tokenizer.chat_template").and_then(|v| v.to_string().ok()).cloned();
        let arch = md.get("general.architecture").and_then(|v| v.to_string().ok()).cloned().unwrap_or_default();
        ModelSummary {
            path: path.display().to_string(),
            format: "gguf".into(),
            architecture: super::describe(&arch, cfg, self.has("mtp.fc.weight")),
            parameters: self.stats.1,
            file_bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
            tensor_types: self.stats.0.clone(),
            chat_template,
            ..super::summary_fields(cfg)
        }
    }
}

/// Maps the HF tail of a decoder layer (`linear_attn.A_log`, `mlp.gate.weight`, ...) in block `l`.
fn map_tail(l: usize, tail: &str) -> Option<(String, Fix)> {
    let name = |g: &str, fix| Some((format!("blk.{l}.{g}"), fix));
    match tail {
        "linear_attn.A_log" => return name("ssm_a", Fix::ALog),
        "linear_attn.dt_bias" => return name("ssm_dt.bias", Fix::None),
        _ => {}
    }
    if let Some(rest) = tail.strip_prefix("mlp.experts.") {
        let (e, w) = rest.split_once('.')?;
        let e: usize = e.parse().ok()?;
        let stacked = match w {
            "gate_proj.weight" => "ffn_gate_exps",
            "up_proj.weight" => "ffn_up_exps",
            "down_proj.weight" => "ffn_down_exps",
            _ => return None,
        };
        return Some((expert_view(&format!("blk.{l}.{stacked}.weight"), e), Fix::None));
    }
    let (stem, suffix) = tail.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let (g, fix) = match stem {
        "input_layernorm" => ("attn_norm", Fix::MinusOne),
        "post_attention_layernorm" => ("post_attention_norm", Fix::MinusOne),
        "self_attn.q_proj" => ("attn_q", Fix::None),
        "self_attn.k_proj" => ("attn_k", Fix::None),
        "self_attn.v_proj" => ("attn_v", Fix::None),
        "self_attn.o_proj" => ("attn_output", Fix::None),
        "self_attn.q_norm" => ("attn_q_norm", Fix::MinusOne),
        "self_attn.k_norm" => ("attn_k_norm", Fix::MinusOne),
        "linear_attn.in_proj_qkvz" => ("ssm_in", Fix::None),
        "linear_attn.in_proj_qkv" => ("attn_qkv", Fix::None),
        "linear_attn.in_proj_z" => ("attn_gate", Fix::None),
        "linear_attn.in_proj_ba" => ("ssm_ba", Fix::None),
        "linear_attn.in_proj_b" => ("ssm_beta", Fix::None),
        "linear_attn.in_proj_a" => ("ssm_alpha", Fix::None),
        "linear_attn.conv1d" => ("ssm_conv1d", Fix::None),
        "linear_attn.norm" => ("ssm_norm", Fix::None),
        "linear_attn.out_proj" => ("ssm_out", Fix::None),
        "mlp.gate_proj" => ("ffn_gate", Fix::None),
        "mlp.up_proj" => ("ffn_up", Fix::None),
        "mlp.down_proj" => ("ffn_down", Fix::None),
        "mlp.gate" => ("ffn_gate_inp", Fix::None),
        "mlp.shared_expert.gate_proj" => ("ffn_gate_shexp", Fix::None),
        "mlp.shared_expert.up_proj" => ("ffn_up_shexp", Fix::None),
        "mlp.shared_expert.down_proj" => ("ffn_down_shexp", Fix::None),
        "mlp.shared_expert_gate" => ("ffn_gate_inp_shexp", Fix::None),
        _ => return None,
    };
    name(&format!("{g}.{suffix}"), fix)
}

/// Registers every expert of the stacked expert tensors (`[E, rows, cols]` in PyTorch order) as
/// a 2-D view `stacked@e` at its byte offset, so the generic source reads (and keeps
/// quantised) one expert at a time. `ffn_gate_up_exps` (`[E, 2I, H]`, gate rows first) gives
/// `ffn_gate_exps.weight@e` and `ffn_up_exps.weight@e`.
fn add_expert_views(content: &mut Content) -> Result<()> {
    let mut views = Vec::new();
    for (name, info) in &content.tensor_infos {
        let Some(block) = name.strip_prefix("blk.") else { continue };
        let Some((l, tail)) = block.split_once('.') else { continue };
        let parts: &[(&str, usize)] = match tail {
            "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_down_exps.weight" => &[("", 0)],
            "ffn_gate_up_exps.weight" => &[("ffn_gate_exps", 0), ("ffn_up_exps", 1)],
            _ => continue,
        };
        let &[e_count, rows, cols] = info.shape.dims() else {
            return Err(ModelError::Config(format!("GGUF: `{name}` is not 3-D: {:?}", info.shape.dims())));
        };
        let (bs, ts) = (info.ggml_dtype.block_size(), info.ggml_dtype.type_size());
        if cols % bs != 0 || rows % parts.len() != 0 {
            return Err(ModelError::Config(format!("GGUF: `{name}` rows of {cols} do not split into blocks of {bs}")));
        }
        let row_bytes = (cols / bs * ts) as u64;
        let part_rows = rows / parts.len();
        for &(stem, p) in parts {
            let base = if stem.is_empty() { name.clone() } else { format!("blk.{l}.{stem}.weight") };
            for e in 0..e_count {
                let offset = info.offset + ((e * rows + p * part_rows) as u64) * row_bytes;
                let view = TensorInfo { ggml_dtype: info.ggml_dtype, shape: (part_rows, cols).into(), offset };
                views.push((expert_view(&base, e), view));
            }
        }
    }
    content.tensor_infos.extend(views);
    Ok(())
}

impl WeightSource for HybridGgufSource {
    fn has(&self, name: &str) -> bool {
        self.map(name).is_some_and(|(g, _)| self.inner.has(&g))
    }
    fn qmatmul(&self, name: &str) -> Result<LinearWeight> {
        let (g, _) = self.mapped(name)?;
        self.inner.qmatmul(&g)
    }
    fn stored_matrix(&self, name: &str) -> Result<Option<candle_core::quantized::QTensor>> {
        let (g, _) = self.mapped(name)?;
        self.inner.stored_matrix(&g)
    }
    fn stored_slice(
        &self,
        name: &str,
        dim: usize,
        ranges: &crate::loader::SliceRanges<'_>,
    ) -> Result<Option<candle_core::quantized::QTensor>> {
        let (g, _) = self.mapped(name)?;
        self.inner.stored_slice(&g, dim, ranges)
    }
    fn tensor_f32(&self, name: &str) -> Result<Tensor> {
        let (g, fix) = self.mapped(name)?;
        let t = self.inner.tensor_f32(&g)?;
        Ok(match fix {
            Fix::None => t,
            Fix::MinusOne => t.affine(1.0, -1.0)?,
            Fix::ALog => t.neg()?.log()?,
        })
    }
    fn embedding(&self, name: &str) -> Result<Embedding> {
        let (g, _) = self.mapped(name)?;
        self.inner.embedding(&g)
    }
    fn device(&self) -> &Device {
        self.inner.device()
    }
    fn stacked_experts(&self, prefix: &str, proj: &str) -> Result<Option<StackedExperts>> {
        // The per-expert view of expert 0 names the stacked tensor: `blk.L.ffn_gate_exps.weight@0`.
        let Some((view, _)) = self.map(&format!("{prefix}experts.0.{proj}.weight")) else { return Ok(None) };
        let Some(stacked) = view.strip_suffix("@0") else { return Ok(None) };
        let infos = &self.inner.content.tensor_infos;
        if let Some(info) = infos.get(stacked) {
            if let &[e, rows, _] = info.shape.dims() {
                return Ok(Some(StackedExperts {
                    storage: stacked.into(),
                    experts: e,
                    rows_per_expert: rows,
                    row0: 0,
                }));
            }
        }
        let fused = stacked.replace("ffn_gate_exps", "ffn_gate_up_exps").replace("ffn_up_exps", "ffn_gate_up_exps");
        match infos.get(&fused).map(|i| i.shape.dims()) {
            Some(&[e, rows, _]) if fused != stacked && rows % 2 == 0 => {
                let row0 = if stacked.contains("ffn_up_exps") { rows / 2 } else { 0 };
                Ok(Some(StackedExperts { storage: fused, experts: e, rows_per_expert: rows, row0 }))
            }
            _ => Ok(None),
        }
    }
    fn stacked_data(&self, storage: &str) -> Result<crate::ops::moe::StackData> {
        Ok(crate::ops::moe::StackData::Quant(std::sync::Arc::new(self.inner.qtensor(storage)?)))
    }
}

/// Loads a hybrid GGUF: model (with its MTP head when present), tokenizer, chat template.
pub fn load_gguf(path: &Path, device: &Device, opts: &crate::loader::LoadOptions) -> Result<LoadedModel> {
    let src = HybridGgufSource::open(path, device)?;
    let tokenizer = Tokenizer::from_gguf(&src.inner.content)?;
    let donor = opts.mtp_donor(&src.config, device)?;
    let mut slot = None;
    let model: Box<dyn crate::arch::CausalLm> = if opts.tensor_parallel > 1 {
        // Each rank's slices are cut from the stored blocks first, quantised after (--quantize).
        let plain = crate::loader::LoadOptions { quantize: None, ..opts.clone() };
        let base = plain.hybrid_source(&src, &donor, &mut slot);
        Box::new(super::tp::TpHybrid::load_with(&src.config, &*base, opts.tensor_parallel, |s| opts.source(s))?)
    } else {
        Box::new(QwenHybrid::load(&src.config, &*opts.hybrid_source(&src, &donor, &mut slot))?)
    };
    let summary = src.summary(path);
    Ok(LoadedModel { model, tokenizer, chat_template: summary.chat_template.clone(), summary })
}

/// Describes a hybrid GGUF from its metadata (no weights are read).
pub fn summarize(path: &Path) -> Result<ModelSummary> {
    Ok(HybridGgufSource::open(path, &Device::Cpu)?.summary(path))
}
