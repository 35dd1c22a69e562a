//! Llama-family Hugging Face checkpoints (Llama 2/3, Mistral, SmolLM2, Qwen2/2.5, Qwen3) written
//! as GGUF the way llama.cpp's converter writes them (`tandem convert` on a non-hybrid input):
//! the `llama` / `qwen2` / `qwen3` architecture keys, tensors under GGUF names, Llama's q / k
//! rows permuted from Hugging Face's rotate-half order to the interleaved pairs llama.cpp's
//! `llama` RoPE takes (`permute`), Llama 3's RoPE scaling as the `rope_freqs.weight` factors,
//! and the byte-level BPE tokenizer (`to_gguf::tokenizer_metadata`). Matrices are quantised
//! when asked, like the hybrid exporter.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};

use super::qwen_hybrid::to_gguf::{quantise_all, tokenizer_metadata, write_file};
use crate::config::{LlamaConfig, RopeScaling};
use crate::error::{ModelError, Result};

/// The GGUF architecture of a Llama-family `model_type`.
fn gguf_arch(cfg: &LlamaConfig) -> Result<&'static str> {
    Ok(match cfg.arch.as_str() {
        "llama" | "mistral" => "llama",
        "qwen2" => "qwen2",
        "qwen3" => "qwen3",
        other => return Err(ModelError::Unsupported(format!("no GGUF export for `{other}` checkpoints"))),
    })
}

/// The GGUF name of a Hugging Face tensor name (`None`: not carried, e.g. RoPE buffers).
fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let (n, tail) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let (stem, suffix) = tail.rsplit_once('.')?;
    let (g, _) = crate::loader::safetensors::LLAMA_LAYER_NAMES.iter().find(|(_, h)| *h == stem)?;
    Some(format!("blk.{n}.{g}.{suffix}"))
}

/// llama.cpp's `permute`: each head's rows `[2, d / 2]` (rotate-half pairs i, i + d/2) become
/// `[d / 2, 2]` (adjacent pairs), for `heads` heads of `t`'s first axis.
pub fn permute(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        return Err(ModelError::Config(format!("q/k permutation: {rows} rows in {heads} heads")));
    }
    let mut split = vec![heads, 2, rows / heads / 2];
    split.extend_from_slice(&dims[1..]);
    Ok(t.reshape(split)?.transpose(1, 2)?.contiguous()?.reshape(dims)?)
}

/// llama.cpp's Llama 3 RoPE factors (`rope_freqs.weight`): per frequency pair, 1 for short
/// wavelengths, `factor` for long ones, the smooth blend between.
fn llama3_factors(cfg: &LlamaConfig) -> Option<Vec<f32>> {
    let RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } = cfg.rope_scaling
    else {
        return None;
    };
    let old = original_max_position as f64;
    let (low_wl, high_wl) = (old / low_freq_factor, old / high_freq_factor);
    let d = cfg.head_dim;
    Some(
        (0..d / 2)
            .map(|i| {
                let freq = 1.0 / cfg.rope_theta.powf((2 * i) as f64 / d as f64);
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let f = if wavelen < high_wl {
                    1.0
                } else if wavelen > low_wl {
                    factor
                } else {
                    let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                };
                f as f32
            })
            .collect(),
    )
}

fn metadata(cfg: &LlamaConfig, arch: &str, quantize: Option<GgmlDType>) -> Vec<(String, Value)> {
    let u = |x: usize| Value::U32(x as u32);
    let k = |s: &str| format!("{arch}.{s}");
    let file_type = match quantize {
        Some(GgmlDType::Q8_0) => 7,
        Some(GgmlDType::Q4_0) => 2,
        Some(GgmlDType::Q4K) => 14,
        Some(GgmlDType::Q6K) => 18,
        _ => 0,
    };
    let mut md = vec![
        ("general.architecture".to_string(), Value::String(arch.into())),
        ("general.name".into(), Value::String(cfg.arch.clone())),
        ("general.file_type".into(), Value::U32(file_type)),
        ("general.quantization_version".into(), Value::U32(2)),
        (k("block_count"), u(cfg.num_layers)),
        (k("context_length"), u(cfg.max_position_embeddings)),
        (k("embedding_length"), u(cfg.hidden_size)),
        (k("feed_forward_length"), u(cfg.intermediate_size)),
        (k("attention.head_count"), u(cfg.num_heads)),
        (k("attention.head_count_kv"), u(cfg.num_kv_heads)),
        (k("attention.key_length"), u(cfg.head_dim)),
        (k("attention.value_length"), u(cfg.head_dim)),
        (k("rope.dimension_count"), u(cfg.head_dim)),
        (k("rope.freq_base"), Value::F32(cfg.rope_theta as f32)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(cfg.rms_norm_eps as f32)),
        (k("vocab_size"), u(cfg.vocab_size)),
    ];
    match cfg.rope_scaling {
        RopeScaling::Linear { factor } => {
            md.push((k("rope.scaling.type"), Value::String("linear".into())));
            md.push((k("rope.scaling.factor"), Value::F32(factor as f32)));
        }
        RopeScaling::Yarn { factor, original_max_position, .. } => {
            md.push((k("rope.scaling.type"), Value::String("yarn".into())));
            md.push((k("rope.scaling.factor"), Value::F32(factor as f32)));
            md.push((k("rope.scaling.original_context_length"), u(original_max_position)));
        }
        _ => {}
    }
    md
}

/// Converts the Llama-family HF directory `dir` into the GGUF file `out`.
pub fn export_llama_dir(dir: &Path, out: &Path, quantize: Option<GgmlDType>) -> Result<()> {
    let cfg = crate::loader::safetensors::read_config(dir)?;
    let arch = gguf_arch(&cfg)?;
    if matches!(cfg.rope_scaling, RopeScaling::Yarn { .. }) && arch == "llama" {
        return Err(ModelError::Unsupported("YaRN RoPE scaling on a `llama` GGUF".into()));
    }
    let files = crate::loader::safetensors::shard_files(dir)?;
    // SAFETY: read-only mapping of files tandem does not modify.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }
        .map_err(|e| ModelError::Config(format!("cannot read safetensors in {}: {e}", dir.display())))?;
    let mut names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
    names.sort();
    let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
    for hf in names {
        if hf == "lm_head.weight" && cfg.tie_word_embeddings {
            continue;
        }
        let Some(name) = gguf_name(&hf) else {
            if hf.ends_with("rotary_emb.inv_freq") {
                continue;
            }
            return Err(ModelError::Unsupported(format!("{hf}: no GGUF name for this tensor")));
        };
        let mut t = st.load(&hf, &Device::Cpu)?.to_dtype(DType::F32)?;
        if arch == "llama" && (name.contains(".attn_q.") || name.contains(".attn_k.")) {
            let heads = if name.contains(".attn_q.") { cfg.num_heads } else { cfg.num_kv_heads };
            t = permute(&t, heads)?;
        }
        tensors.insert(name, t);
    }
    if let Some(f) = llama3_factors(&cfg) {
        let n = f.len();
        tensors.insert("rope_freqs.weight".into(), Tensor::from_vec(f, n, &Device::Cpu)?);
    }
    let ts: Vec<(String, Tensor)> = tensors.into_iter().collect();
    // Norms and RoPE factors stay f32 (1-D: never quantised).
    let qtensors = quantise_all(ts, quantize)?;
    let mut md = metadata(&cfg, arch, quantize);
    md.extend(tokenizer_metadata(dir, cfg.vocab_size)?);
    write_file(out, &md, &qtensors)
}
