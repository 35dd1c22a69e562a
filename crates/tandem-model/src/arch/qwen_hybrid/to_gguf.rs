//! Converts a Hugging Face hybrid checkpoint (`qwen3_next`, `qwen3_5`, `qwen3_5_moe`) to a
//! llama.cpp-style GGUF (`qwen3next`, `qwen35`, `qwen35moe`), applying the transforms of
//! llama.cpp's converter (`conversion/qwen.py`: `Qwen3NextModel`,
//! `_LinearAttentionVReorderBase`, `_Qwen35MtpMixin`; shared spec §9.3):
//!
//! - names: `attn_norm`, `post_attention_norm`, `attn_{q,k,v,output}`, `attn_{q,k}_norm`,
//!   `attn_qkv`, `attn_gate`, `ssm_{ba,beta,alpha,conv1d,a,dt.bias,norm,out}`, `ffn_*`;
//! - +1 baked into every `*norm.weight` except `linear_attn.norm`; `ssm_a` = −exp(A_log);
//!   the conv weight squeezed to `[channels, K]`;
//! - Qwen3-Next: `in_proj_qkvz` de-interleaved into `attn_qkv` + `attn_gate` (V heads stay in
//!   HF order), `in_proj_ba` kept grouped as `ssm_ba`; per-expert weights stacked into
//!   `ffn_{gate,up,down}_exps`; the MTP head dropped (as llama.cpp does) unless asked for;
//! - Qwen3.5: V heads reordered from grouped (g·r + j) to tiled (j·nk + g) order in the V rows
//!   of `attn_qkv`, the rows of `attn_gate`, `ssm_beta`, `ssm_alpha`, in `ssm_a`, `ssm_dt`, the
//!   V channels of `ssm_conv1d` and the input columns of `ssm_out`; the fused `gate_up_proj`
//!   split into `ffn_gate_exps` / `ffn_up_exps`; MTP as block L (`blk.L.nextn.*`) with
//!   `block_count = L + mtp layers`;
//! - the tokenizer as `gpt2` byte-level BPE metadata from `tokenizer.json`.
//!
//! Beyond llama.cpp, the layer pattern is also written as `{arch}.attention.recurrent_layers`
//! (llama.cpp reads it before `full_attention_interval`), so patterns that are not
//! "every 4th layer is attention" survive. Used by the tests and for making GGUFs of small
//! checkpoints; optional quantisation of the weight matrices exercises the quantised path.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use serde_json::Value as Json;

use super::config::{HybridConfig, LayerKind};
use crate::error::{ModelError, Result};

/// Choices beyond llama.cpp's defaults.
#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Quantise weight matrices (2-D, and stacked 3-D experts) whose rows split into blocks of
    /// this type; norms, conv, `ssm_a`, `ssm_dt` and the routers stay f32 (as in llama.cpp).
    pub quantize: Option<GgmlDType>,
    /// Qwen3.5-MoE: one `ffn_gate_up_exps` per layer instead of `ffn_gate_exps` + `ffn_up_exps`.
    pub fused_gate_up: bool,
    /// Qwen3-Next: keep the MTP head as `nextn` blocks (llama.cpp drops it).
    pub qwen3next_mtp: bool,
    /// Qwen3-Next: write the grouped `in_proj_qkvz` as `ssm_in`, as legacy converters did.
    pub legacy_ssm_in: bool,
}

/// The GGUF architecture string of an HF `model_type`.
pub fn gguf_arch_of(model_type: &str) -> Result<&'static str> {
    Ok(match model_type {
        "qwen3_next" => "qwen3next",
        "qwen3_5" | "qwen3_5_text" => "qwen35",
        "qwen3_5_moe" | "qwen3_5_moe_text" => "qwen35moe",
        other => return Err(ModelError::Unsupported(format!("no GGUF architecture for `{other}`"))),
    })
}

fn read_json(path: &Path) -> Result<Json> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))
}

/// Every tensor of the checkpoint as f32, by HF name (an MLX checkpoint dequantised and put
/// back into the HF layout: `loader::mlx_to_hf`).
fn load_tensors(dir: &Path) -> Result<BTreeMap<String, Tensor>> {
    if crate::loader::mlx_to_hf::is_mlx_dir(dir) {
        return crate::loader::mlx_to_hf::hf_tensors(dir);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    let mut out = BTreeMap::new();
    for f in files {
        for (name, t) in candle_core::safetensors::load(&f, &Device::Cpu)? {
            out.insert(name, t.to_dtype(DType::F32)?);
        }
    }
    Ok(out)
}

/// Views `dim` as `[nk, r, hd]` and swaps the first two: grouped → tiled V-head order
/// (llama.cpp `_reorder_v_heads`).
fn reorder_v_heads(t: &Tensor, dim: usize, nk: usize, r: usize, hd: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let mut split = dims[..dim].to_vec();
    split.extend([nk, r, hd]);
    split.extend_from_slice(&dims[dim + 1..]);
    Ok(t.reshape(split)?.transpose(dim, dim + 1)?.contiguous()?.reshape(dims)?)
}

/// Name of `hf` after llama.cpp's filtering (`model.layers.N.…`, MTP moved to layer L + i),
/// or `None` for tensors the GGUF does not carry.
pub(crate) fn canonical(hf: &str, layers: usize, keep_mtp: bool) -> Option<String> {
    if let Some(rest) = hf.strip_prefix("mtp.") {
        if !keep_mtp {
            return None;
        }
        if let Some((i, tail)) = rest.strip_prefix("layers.").and_then(|r| r.split_once('.')) {
            return Some(format!("model.layers.{}.{tail}", layers + i.parse::<usize>().ok()?));
        }
        let (stem, suffix) = rest.split_once('.')?;
        let new = match stem {
            "fc" => "eh_proj",
            "pre_fc_norm_embedding" => "enorm",
            "pre_fc_norm_hidden" => "hnorm",
            "norm" => "shared_head.norm",
            _ => return None,
        };
        return Some(format!("model.layers.{layers}.{new}.{suffix}"));
    }
    if hf == "lm_head.weight" {
        return Some(hf.into());
    }
    let rest = hf.strip_prefix("model.language_model.").or_else(|| hf.strip_prefix("model."))?;
    (!rest.starts_with("visual.")).then(|| format!("model.{rest}"))
}

/// The GGUF name of a canonical name.
fn gguf_name(name: &str) -> Option<String> {
    match name {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let (n, tail) = name.strip_prefix("model.layers.")?.split_once('.')?;
    if tail == "linear_attn.A_log" {
        return Some(format!("blk.{n}.ssm_a"));
    }
    let (stem, suffix) = tail.rsplit_once('.')?;
    let g = match stem {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "post_attention_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "linear_attn.in_proj_qkvz" => "ssm_in",
        "linear_attn.in_proj_qkv" => "attn_qkv",
        "linear_attn.in_proj_z" => "attn_gate",
        "linear_attn.in_proj_ba" => "ssm_ba",
        "linear_attn.in_proj_b" => "ssm_beta",
        "linear_attn.in_proj_a" => "ssm_alpha",
        "linear_attn.conv1d" => "ssm_conv1d",
        "linear_attn.dt_proj" => "ssm_dt",
        "linear_attn.norm" => "ssm_norm",
        "linear_attn.out_proj" => "ssm_out",
        "mlp.gate" => "ffn_gate_inp",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "mlp.experts.gate_proj" => "ffn_gate_exps",
        "mlp.experts.up_proj" => "ffn_up_exps",
        "mlp.experts.down_proj" => "ffn_down_exps",
        "mlp.experts.gate_up_proj" => "ffn_gate_up_exps",
        "mlp.shared_expert.gate_proj" => "ffn_gate_shexp",
        "mlp.shared_expert.up_proj" => "ffn_up_shexp",
        "mlp.shared_expert.down_proj" => "ffn_down_shexp",
        "mlp.shared_expert_gate" => "ffn_gate_inp_shexp",
        "eh_proj" => "nextn.eh_proj",
        "enorm" => "nextn.enorm",
        "hnorm" => "nextn.hnorm",
        "shared_head.norm" => "nextn.shared_head_norm",
        _ => return None,
    };
    Some(format!("blk.{n}.{g}.{suffix}"))
}

pub(crate) struct Converter<'a> {
    cfg: &'a HybridConfig,
    arch: &'static str,
    opts: &'a ExportOptions,
    out: Vec<(String, Tensor)>,
    /// Qwen3-Next per-expert weights, stacked when complete: (layer, proj) → expert → weight.
    experts: BTreeMap<(String, String), BTreeMap<usize, Tensor>>,
}

impl<'a> Converter<'a> {
    pub(crate) fn new(cfg: &'a HybridConfig, arch: &'static str, opts: &'a ExportOptions) -> Self {
        Converter { cfg, arch, opts, out: Vec::new(), experts: BTreeMap::new() }
    }

    /// The GGUF tensors finished so far (taken out, so they can be quantised and the f32
    /// values dropped one tensor at a time).
    pub(crate) fn take(&mut self) -> Vec<(String, Tensor)> {
        std::mem::take(&mut self.out)
    }

    fn emit(&mut self, name: &str, t: Tensor) -> Result<()> {
        let g = gguf_name(name).ok_or_else(|| ModelError::Unsupported(format!("no GGUF name for `{name}`")))?;
        self.out.push((g, t));
        Ok(())
    }

    /// One canonical tensor, transformed as llama.cpp's `modify_tensors` chain does.
    pub(crate) fn tensor(&mut self, name: &str, mut t: Tensor) -> Result<()> {
        let c = self.cfg;
        let (nk, nv, dk, dv) =
            (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim);
        let r = nv / nk;
        let mut name = name.to_string();
        // _LinearAttentionVReorderBase (qwen35*): grouped → tiled V heads.
        if self.arch != "qwen3next" && nk != nv && name.contains("linear_attn.") {
            let kd = 2 * nk * dk;
            if name.contains(".in_proj_qkv.") {
                let v = reorder_v_heads(&t.narrow(0, kd, nv * dv)?, 0, nk, r, dv)?;
                t = Tensor::cat(&[&t.narrow(0, 0, kd)?, &v], 0)?;
            } else if name.contains(".in_proj_z.") {
                t = reorder_v_heads(&t, 0, nk, r, dv)?;
            } else if name.contains(".in_proj_b.") || name.contains(".in_proj_a.") {
                t = reorder_v_heads(&t, 0, nk, r, 1)?;
            } else if name.ends_with(".A_log") || name.ends_with(".dt_bias") {
                t = reorder_v_heads(&t.unsqueeze(1)?, 0, nk, r, 1)?.squeeze(1)?;
            } else if name.contains(".conv1d") {
                let w = t.squeeze(1)?;
                let v = reorder_v_heads(&w.narrow(0, kd, nv * dv)?, 0, nk, r, dv)?;
                t = Tensor::cat(&[&w.narrow(0, 0, kd)?, &v], 0)?;
            } else if name.contains(".out_proj.") {
                t = reorder_v_heads(&t, 1, nk, r, dv)?;
            }
        }
        // Qwen3NextModel.modify_tensors.
        if name.ends_with(".A_log") {
            t = t.exp()?.neg()?;
        } else if let Some(p) = name.strip_suffix(".dt_bias") {
            name = format!("{p}.dt_proj.bias");
        } else if name.contains("conv1d") {
            if t.rank() == 3 {
                t = t.squeeze(1)?;
            }
        } else if name.ends_with("norm.weight") && !name.ends_with("linear_attn.norm.weight") {
            t = t.affine(1.0, 1.0)?;
        }
        if name.contains("in_proj_qkvz.weight") && !self.opts.legacy_ssm_in {
            // [nk][q dk | k dk | v r·dv | z r·dv] rows → [Q | K | V] and Z.
            let group = 2 * dk + 2 * r * dv;
            let h = t.dim(1)?;
            let g = t.reshape((nk, group, h))?;
            let part =
                |off: usize, len: usize| -> Result<Tensor> { Ok(g.narrow(1, off, len)?.reshape((nk * len, h))?) };
            let qkv = Tensor::cat(&[part(0, dk)?, part(dk, dk)?, part(2 * dk, r * dv)?], 0)?;
            let p = name.trim_end_matches("in_proj_qkvz.weight");
            self.emit(&format!("{p}in_proj_qkv.weight"), qkv)?;
            return self.emit(&format!("{p}in_proj_z.weight"), part(2 * dk + r * dv, r * dv)?);
        }
        // Qwen2MoeModel.modify_tensors: fused and per-expert weights.
        if name.ends_with("mlp.experts.down_proj") {
            return self.emit(&format!("{name}.weight"), t);
        }
        if name.ends_with("mlp.experts.gate_up_proj") {
            if self.opts.fused_gate_up {
                return self.emit(&format!("{name}.weight"), t);
            }
            let i = t.dim(1)? / 2;
            let base = name.trim_end_matches(".gate_up_proj");
            self.emit(&format!("{base}.gate_proj.weight"), t.narrow(1, 0, i)?.contiguous()?)?;
            return self.emit(&format!("{base}.up_proj.weight"), t.narrow(1, i, i)?.contiguous()?);
        }
        if let Some((base, rest)) = name.split_once(".mlp.experts.") {
            let (e, proj) =
                rest.split_once('.').ok_or_else(|| ModelError::Config(format!("odd expert name `{name}`")))?;
            let e: usize = e.parse().map_err(|_| ModelError::Config(format!("odd expert name `{name}`")))?;
            let proj = proj.trim_end_matches(".weight").to_string();
            self.experts.entry((base.to_string(), proj)).or_default().insert(e, t);
            return Ok(());
        }
        self.emit(&name, t)
    }

    pub(crate) fn finish_experts(&mut self) -> Result<()> {
        let n = self.cfg.moe.as_ref().map_or(0, |m| m.num_experts);
        for ((base, proj), ws) in std::mem::take(&mut self.experts) {
            if ws.len() != n || ws.keys().enumerate().any(|(i, &e)| i != e) {
                return Err(ModelError::Config(format!("{base}: {} of {n} experts for {proj}", ws.len())));
            }
            let stacked = Tensor::stack(&ws.into_values().collect::<Vec<_>>(), 0)?;
            self.emit(&format!("{base}.mlp.experts.{proj}.weight"), stacked)?;
        }
        Ok(())
    }
}

/// Whether the exporter quantises GGUF tensor `name` of shape `dims` to `dt`.
pub(crate) fn quantisable(name: &str, dims: &[usize], dt: GgmlDType) -> bool {
    dims.len() >= 2
        && dims.last().is_some_and(|&k| k % dt.block_size() == 0)
        && !name.contains("ssm_conv1d")
        && !name.contains("ffn_gate_inp")
}

/// Converts the HF directory `dir` into the GGUF file `out`.
pub fn export_hf_dir(dir: &Path, out: &Path, opts: &ExportOptions) -> Result<()> {
    let root = read_json(&dir.join("config.json"))?;
    let cfg = HybridConfig::from_hf_json(&root)?;
    let arch = gguf_arch_of(&cfg.model_type)?;
    let tensors = load_tensors(dir)?;
    let layers = cfg.num_layers();
    let keep_mtp = arch != "qwen3next" || opts.qwen3next_mtp;
    let mtp = if keep_mtp && tensors.keys().any(|k| k.starts_with("mtp.")) { cfg.mtp_layers.max(1) } else { 0 };
    let mut conv = Converter::new(&cfg, arch, opts);
    let mut qtensors = Vec::new();
    for (name, t) in tensors {
        if let Some(c) = canonical(&name, layers, keep_mtp) {
            conv.tensor(&c, t)?;
            qtensors.extend(quantise_all(conv.take(), opts.quantize)?);
        }
    }
    conv.finish_experts()?;
    qtensors.extend(quantise_all(conv.take(), opts.quantize)?);
    let mut md = metadata(&cfg, &root, arch, layers, mtp, opts)?;
    md.extend(tokenizer_metadata(dir, cfg.vocab_size)?);
    write_file(out, &md, &qtensors)
}

/// Each tensor in `dt` where [`quantisable`], else f32.
pub(crate) fn quantise_all(ts: Vec<(String, Tensor)>, dt: Option<GgmlDType>) -> Result<Vec<(String, QTensor)>> {
    ts.into_iter()
        .map(|(name, t)| {
            let dt = match dt {
                Some(dt) if quantisable(&name, t.dims(), dt) => dt,
                _ => GgmlDType::F32,
            };
            Ok((name, quantise_parallel(&t, dt, 1 << 22)?))
        })
        .collect()
}

/// `QTensor::quantize` over pieces of about `piece` values (whole rows) on all cores: the
/// formats quantise each row's blocks on their own, so the bytes are the same as in one call
/// (a 9B model's Q4_K would take minutes on one core).
pub(crate) fn quantise_parallel(t: &Tensor, dt: GgmlDType, piece: usize) -> Result<QTensor> {
    quantise_onto(t, dt, piece, &Device::Cpu)
}

/// [`quantise_parallel`] of a host tensor, the result placed on `dev`.
pub(crate) fn quantise_onto(t: &Tensor, dt: GgmlDType, piece: usize, dev: &Device) -> Result<QTensor> {
    use rayon::prelude::*;
    let dims = t.dims().to_vec();
    let k = dims.last().copied().unwrap_or(1).max(1);
    let rows = t.elem_count() / k;
    let per = (piece / k).max(1);
    if dt == GgmlDType::F32 || rows <= per || dims.len() < 2 {
        let q = QTensor::quantize(t, dt)?;
        if dev.is_cpu() {
            return Ok(q);
        }
        return Ok(candle_core::quantized::ggml_file::qtensor_from_ggml(dt, &q.data()?, dims, dev)?);
    }
    let flat = t.reshape((rows, k))?;
    let parts = (0..rows)
        .step_by(per)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|r| -> Result<Vec<u8>> {
            // A piece of its own: candle's quantiser reads a view's storage from the start.
            let q = QTensor::quantize(&flat.narrow(0, r, per.min(rows - r))?.force_contiguous()?, dt)?;
            Ok(q.data()?.into_owned())
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = parts.concat();
    Ok(candle_core::quantized::ggml_file::qtensor_from_ggml(dt, &bytes, dims, dev)?)
}

/// Writes metadata and tensors as one GGUF file.
pub(crate) fn write_file(out: &Path, md: &[(String, Value)], qtensors: &[(String, QTensor)]) -> Result<()> {
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = qtensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let file = std::fs::File::create(out).map_err(|e| ModelError::io(out, e))?;
    let mut w = std::io::BufWriter::new(file);
    gguf_file::write(&mut w, &md_refs, &t_refs)?;
    std::io::Write::flush(&mut w).map_err(|e| ModelError::io(out, e))?;
    Ok(())
}

pub(crate) fn metadata(
    cfg: &HybridConfig,
    root: &Json,
    arch: &str,
    layers: usize,
    mtp: usize,
    opts: &ExportOptions,
) -> Result<Vec<(String, Value)>> {
    let hp = root.get("text_config").filter(|t| t.is_object()).unwrap_or(root);
    let u = |x: usize| Value::U32(x as u32);
    let k = |s: &str| format!("{arch}.{s}");
    // llama.cpp's `llama_ftype` (informational: the tensors carry their own types).
    let file_type = match opts.quantize {
        Some(GgmlDType::Q8_0) => 7,
        Some(GgmlDType::F16) => 1,
        Some(GgmlDType::Q4_0) => 2,
        Some(GgmlDType::Q4K) => 14,
        Some(GgmlDType::Q6K) => 18,
        Some(GgmlDType::BF16) => 32,
        _ => 0,
    };
    let mut md = vec![
        ("general.architecture".to_string(), Value::String(arch.into())),
        ("general.name".into(), Value::String(cfg.model_type.clone())),
        ("general.file_type".into(), Value::U32(file_type)),
        ("general.quantization_version".into(), Value::U32(2)),
        (k("block_count"), u(layers + mtp)),
        (k("context_length"), u(cfg.max_position_embeddings)),
        (k("embedding_length"), u(cfg.hidden_size)),
        (k("attention.head_count"), u(cfg.num_heads)),
        (k("attention.head_count_kv"), u(cfg.num_kv_heads)),
        (k("attention.key_length"), u(cfg.head_dim)),
        (k("attention.value_length"), u(cfg.head_dim)),
        (k("rope.freq_base"), Value::F32(cfg.rope_theta as f32)),
        (k("rope.dimension_count"), u(cfg.rotary_dim)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(cfg.rms_norm_eps as f32)),
        (k("ssm.conv_kernel"), u(cfg.conv_kernel)),
        (k("ssm.state_size"), u(cfg.linear_key_head_dim)),
        (k("ssm.group_count"), u(cfg.linear_num_key_heads)),
        (k("ssm.time_step_rank"), u(cfg.linear_num_value_heads)),
        (k("ssm.inner_size"), u(cfg.linear_num_value_heads * cfg.linear_value_head_dim)),
        (
            k("full_attention_interval"),
            u(hp.get("full_attention_interval").and_then(Json::as_u64).unwrap_or(4) as usize),
        ),
    ];
    let recurrent =
        (0..layers + mtp).map(|i| Value::Bool(i < layers && cfg.layer_kinds[i] == LayerKind::Linear)).collect();
    md.push((k("attention.recurrent_layers"), Value::Array(recurrent)));
    if cfg.intermediate_size > 0 {
        md.push((k("feed_forward_length"), u(cfg.intermediate_size)));
    }
    if let Some(m) = &cfg.moe {
        md.push((k("expert_count"), u(m.num_experts)));
        md.push((k("expert_used_count"), u(m.top_k)));
        md.push((k("expert_feed_forward_length"), u(m.intermediate_size)));
        if m.shared_intermediate_size > 0 {
            md.push((k("expert_shared_feed_forward_length"), u(m.shared_intermediate_size)));
        }
        if let Some(b) = hp.get("norm_topk_prob").and_then(Json::as_bool) {
            md.push((k("expert_weights_norm"), Value::Bool(b)));
        }
    }
    if arch != "qwen3next" {
        let sections: Vec<i32> = hp
            .get("rope_parameters")
            .and_then(|p| p.get("mrope_section"))
            .and_then(Json::as_array)
            .map(|a| a.iter().filter_map(Json::as_i64).map(|x| x as i32).collect())
            .unwrap_or_else(|| vec![11, 11, 10]);
        let mut s: Vec<Value> = sections.into_iter().map(Value::I32).collect();
        s.resize(4, Value::I32(0));
        md.push((k("rope.dimension_sections"), Value::Array(s)));
    }
    if mtp > 0 {
        md.push((k("nextn_predict_layers"), u(mtp)));
    }
    Ok(md)
}

/// `gpt2` BPE metadata from `tokenizer.json` (+ `tokenizer_config.json` for the special tokens
/// and the chat template), padded to `vocab_size` with `[PADn]` tokens like llama.cpp.
pub fn tokenizer_metadata(dir: &Path, vocab_size: usize) -> Result<Vec<(String, Value)>> {
    let tok = read_json(&dir.join("tokenizer.json"))?;
    let bad = |m: &str| ModelError::Tokenizer(format!("{}: {m}", dir.join("tokenizer.json").display()));
    let model = tok.get("model").ok_or_else(|| bad("no model"))?;
    if model.get("type").and_then(Json::as_str) != Some("BPE") {
        return Err(bad("only byte-level BPE tokenizers are exported"));
    }
    let mut by_id: BTreeMap<usize, (String, i32)> = BTreeMap::new();
    for (t, id) in model.get("vocab").and_then(Json::as_object).ok_or_else(|| bad("no vocab"))? {
        let id = id.as_u64().ok_or_else(|| bad("non-integer id"))? as usize;
        by_id.insert(id, (t.clone(), 1));
    }
    for a in tok.get("added_tokens").and_then(Json::as_array).into_iter().flatten() {
        let (Some(id), Some(content)) = (a.get("id").and_then(Json::as_u64), a.get("content").and_then(Json::as_str))
        else {
            continue;
        };
        let special = a.get("special").and_then(Json::as_bool).unwrap_or(false);
        by_id.insert(id as usize, (content.to_string(), if special { 3 } else { 4 }));
    }
    let n = vocab_size.max(by_id.keys().next_back().map_or(0, |&m| m + 1));
    let (mut tokens, mut types) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let (t, ty) = by_id.remove(&i).unwrap_or_else(|| (format!("[PAD{i}]"), 5));
        tokens.push(Value::String(t));
        types.push(Value::I32(ty));
    }
    let merges = model
        .get("merges")
        .and_then(Json::as_array)
        .ok_or_else(|| bad("no merges"))?
        .iter()
        .map(|m| match m {
            Json::String(s) => Ok(Value::String(s.clone())),
            Json::Array(p) if p.len() == 2 => {
                Ok(Value::String(format!("{} {}", p[0].as_str().unwrap_or(""), p[1].as_str().unwrap_or(""))))
            }
            _ => Err(bad("odd merge entry")),
        })
        .collect::<Result<Vec<_>>>()?;
    // llama.cpp identifies the split rules by hashing the tokenizer's output; we read the regex.
    let pre_json = tok.get("pre_tokenizer").map(|p| p.to_string()).unwrap_or_default();
    let pre = if pre_json.contains(r"\\p{M}") {
        "qwen35"
    } else if pre_json.contains(r"\\p{N}{1,3}") {
        // Llama 3's split rules (digits in threes).
        "llama-bpe"
    } else if pre_json.contains("\"Digits\"") && pre_json.contains("\"individual_digits\":true") {
        // SmolLM2 / StarCoder: digits one by one, then the GPT-2 rules.
        "smollm"
    } else if pre_json.contains(r"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}") {
        "qwen2"
    } else if pre_json.contains("\"ByteLevel\"") && pre_json.contains("\"use_regex\":true") {
        "default"
    } else {
        return Err(bad("unrecognised pre-tokenizer"));
    };
    let mut md = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.clone())),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
    ];
    let tc = read_json(&dir.join("tokenizer_config.json")).unwrap_or(Json::Null);
    let id_of = |key: &str| -> Option<u32> {
        let v = tc.get(key)?;
        let s = v.as_str().or_else(|| v.get("content").and_then(Json::as_str))?;
        tokens.iter().position(|t| matches!(t, Value::String(x) if x == s)).map(|i| i as u32)
    };
    for (key, gguf) in [("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("pad_token", "padding_token_id")]
    {
        if let Some(id) = id_of(key) {
            md.push((format!("tokenizer.ggml.{gguf}"), Value::U32(id)));
        }
    }
    if let Some(b) = tc.get("add_bos_token").and_then(Json::as_bool) {
        md.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(b)));
    }
    let template = std::fs::read_to_string(dir.join("chat_template.jinja"))
        .ok()
        .or_else(|| tc.get("chat_template").and_then(Json::as_str).map(String::from));
    if let Some(t) = template {
        md.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_quantisation_gives_the_same_bytes() {
        let t = Tensor::randn(0f32, 1.0, (37, 512), &Device::Cpu).unwrap();
        for dt in [GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K, GgmlDType::F16, GgmlDType::BF16] {
            let one = QTensor::quantize(&t, dt).unwrap();
            let par = quantise_parallel(&t, dt, 3 * 512).unwrap();
            assert_eq!(par.dtype(), dt);
            assert_eq!(par.shape().dims(), [37, 512]);
            assert!(one.data().unwrap() == par.data().unwrap(), "{dt:?}: the bytes differ");
        }
        let t3 = Tensor::randn(0f32, 1.0, (3, 5, 256), &Device::Cpu).unwrap();
        let one = QTensor::quantize(&t3, GgmlDType::Q4K).unwrap();
        let par = quantise_parallel(&t3, GgmlDType::Q4K, 512).unwrap();
        assert_eq!(par.shape().dims(), [3, 5, 256]);
        assert!(one.data().unwrap() == par.data().unwrap(), "3-D Q4_K: the bytes differ");
    }
}
