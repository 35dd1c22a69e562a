//! Writes a random-weight preset ([`super::random`]) as a llama.cpp-style GGUF (`qwen35`,
//! `qwen35moe`, `qwen3next`), so that tandem and llama.cpp can be measured on the same weights
//! (`tandem bench --random-hybrid 9b --random-dtype q8_0 --save-gguf FILE`).
//!
//! The tensors are the ones [`super::random::random_model`] builds in memory (the same values:
//! the generator is seeded by tensor name), passed under their Hugging Face names through the
//! HF → GGUF converter of [`super::to_gguf`] (V-head reordering, `1 + w` norms, `ssm_a`, the MTP
//! head as `nextn` blocks), one tensor at a time, so peak memory is the quantised file plus one
//! f32 tensor. The tokenizer is a byte-level BPE vocabulary (256 byte tokens, an end-of-text
//! token, padding up to the preset's vocabulary size): enough for llama.cpp and tandem to load
//! and run the model on any token ids.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::Device;

use super::config::HybridConfig;
use super::random::RandomSource;
use super::to_gguf::{canonical, gguf_arch_of, metadata, quantise_all, write_file, Converter, ExportOptions};
use crate::error::Result;

/// What [`export_random`] wrote.
#[derive(Debug, Clone)]
pub struct ExportReport {
    pub tensors: usize,
    pub bytes: u64,
    pub architecture: &'static str,
}

/// The Hugging Face name of an in-memory tensor name (`blk.N.…`, `token_embd.weight`, …).
fn hf_name(name: &str) -> String {
    match name {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        _ => match name.strip_prefix("blk.") {
            Some(rest) => format!("model.layers.{rest}"),
            None => name.to_string(),
        },
    }
}

/// GPT-2's byte-to-character map: the printable form of each byte in a byte-level vocabulary.
fn byte_char(b: u8) -> char {
    let printable = |c: u8| (b'!'..=b'~').contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// Byte-level BPE metadata for `vocab_size` tokens: the 256 bytes, `<|endoftext|>` (the end
/// of sequence), one merge (two spaces), then `[PADn]` as normal tokens (no merge makes them,
/// so text never encodes to them, but a random model samples them and every server prints
/// them: llama.cpp prints nothing for unused ones, which left its streamed answers empty and
/// its time to first token unmeasurable).
pub fn byte_tokenizer_metadata(vocab_size: usize) -> Vec<(String, Value)> {
    let space = byte_char(b' ');
    let mut tokens: Vec<Value> = (0..=255u8).map(|b| Value::String(byte_char(b).to_string())).collect();
    let mut types = vec![Value::I32(1); 256];
    tokens.push(Value::String("<|endoftext|>".into()));
    types.push(Value::I32(3));
    tokens.push(Value::String(format!("{space}{space}")));
    types.push(Value::I32(1));
    for i in tokens.len()..vocab_size {
        tokens.push(Value::String(format!("[PAD{i}]")));
        types.push(Value::I32(1));
    }
    vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("qwen2".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(vec![Value::String(format!("{space} {space}"))])),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(256)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ]
}

/// Writes the random model of `cfg` with weight matrices in `dtype` (f32 for everything else,
/// as llama.cpp's converter does) to `out`. `progress` is called after each tensor with
/// (done, total).
pub fn export_random(
    cfg: &HybridConfig,
    dtype: GgmlDType,
    out: &Path,
    mut progress: impl FnMut(usize, usize),
) -> Result<ExportReport> {
    let arch = gguf_arch_of(&cfg.model_type)?;
    let opts = ExportOptions {
        quantize: (dtype != GgmlDType::F32).then_some(dtype),
        qwen3next_mtp: true,
        ..Default::default()
    };
    let src = RandomSource::new(cfg, GgmlDType::F32, &Device::Cpu);
    let layers = cfg.num_layers();
    let mut conv = Converter::new(cfg, arch, &opts);
    let mut qtensors = Vec::new();
    let names = src.names();
    for (i, name) in names.iter().enumerate() {
        let Some(c) = canonical(&hf_name(name), layers, true) else { continue };
        let t = src.make_on(name, &Device::Cpu)?;
        conv.tensor(&c, t)?;
        qtensors.extend(quantise_all(conv.take(), opts.quantize)?);
        progress(i + 1, names.len());
    }
    conv.finish_experts()?;
    qtensors.extend(quantise_all(conv.take(), opts.quantize)?);
    let mut md = metadata(cfg, &serde_json::json!({}), arch, layers, cfg.mtp_layers, &opts)?;
    for (k, v) in md.iter_mut() {
        if k == "general.name" {
            *v = Value::String(format!("tandem random {}", cfg.model_type));
        }
    }
    md.extend(byte_tokenizer_metadata(cfg.vocab_size));
    write_file(out, &md, &qtensors)?;
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(ExportReport { tensors: qtensors.len(), bytes, architecture: arch })
}
