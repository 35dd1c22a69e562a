//! Architecture configuration of the Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5,
//! Qwen3 dense), parsed from a Hugging Face `config.json` or from GGUF metadata.
//!
//! One struct with switches covers the family: qkv bias (Qwen2), q/k RMSNorm (Qwen3), tied
//! embeddings, RoPE pairing (GGUF `llama` checkpoints have permuted q/k rows and use the
//! interleaved pairing; everything else pairs dimension i with i + d/2) and RoPE scaling.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;

use crate::error::{ModelError, Result};

/// How rotary dimensions are paired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (i, i + d/2): HF `rotate_half`, GGUF qwen2/qwen3 ("NeoX").
    Half,
    /// Pairs (2i, 2i+1): GGUF `llama` checkpoints, whose q/k rows were permuted on conversion.
    Interleaved,
}

/// RoPE frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Llama 3.x: low frequencies scaled by `factor`, smooth ramp in between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position: usize,
    },
    /// YaRN (used by Qwen2.5 for long contexts).
    Yarn {
        factor: f64,
        original_max_position: usize,
        beta_fast: f64,
        beta_slow: f64,
    },
}

/// Configuration of one Llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Architecture string as found in the checkpoint (`llama`, `qwen2`, `qwen3`, `mistral`, ...).
    pub arch: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub rope_style: RopeStyle,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on the q/k/v projections (Qwen2).
    pub attention_bias: bool,
    /// RMSNorm over each head of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
}

/// Upper bounds on the sizes a config may claim, far above every real model (the largest
/// have ~130 layers, hidden sizes of 16K-25K and vocabularies of 262K) and far below what
/// would make the loader allocate absurd amounts before the tensors are even checked.
pub mod limits {
    use crate::error::{ModelError, Result};

    pub const LAYERS: usize = 1024;
    pub const HEADS: usize = 1024;
    pub const HEAD_DIM: usize = 4096;
    pub const HIDDEN: usize = 1 << 17;
    pub const INTERMEDIATE: usize = 1 << 20;
    pub const VOCAB: usize = 1 << 22;
    pub const CONTEXT: usize = 1 << 24;
    pub const EXPERTS: usize = 4096;

    /// `value` of config field `what` is at most `max`.
    pub fn check(what: &str, value: usize, max: usize) -> Result<()> {
        if value > max {
            return Err(ModelError::Config(format!("{what} = {value} is beyond what tandem accepts ({max})")));
        }
        Ok(())
    }
}

impl LlamaConfig {
    /// Checks the invariants the forward pass relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ModelError::Config(m));
        limits::check("num_hidden_layers", self.num_layers, limits::LAYERS)?;
        limits::check("num_attention_heads", self.num_heads, limits::HEADS)?;
        limits::check("num_key_value_heads", self.num_kv_heads, limits::HEADS)?;
        limits::check("head_dim", self.head_dim, limits::HEAD_DIM)?;
        limits::check("hidden_size", self.hidden_size, limits::HIDDEN)?;
        limits::check("intermediate_size", self.intermediate_size, limits::INTERMEDIATE)?;
        limits::check("vocab_size", self.vocab_size, limits::VOCAB)?;
        limits::check("max_position_embeddings", self.max_position_embeddings, limits::CONTEXT)?;
        if self.num_heads == 0 || self.num_kv_heads == 0 || self.head_dim == 0 || self.num_layers == 0 {
            return bad(format!("zero-sized dimension in {self:?}"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.intermediate_size == 0 {
            return bad("vocab_size, hidden_size and intermediate_size must be positive".into());
        }
        Ok(())
    }

    /// Parses a Hugging Face `config.json`.
    pub fn from_hf_json(v: &Json) -> Result<Self> {
        let arch = v.get("model_type").and_then(Json::as_str).unwrap_or("llama").to_string();
        match arch.as_str() {
            "llama" | "mistral" | "qwen2" | "qwen3" => {}
            other => {
                return Err(ModelError::Unsupported(format!(
                    "model_type `{other}` (supported: llama, mistral, qwen2, qwen3)"
                )))
            }
        }
        let u = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(Json::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| ModelError::Config(format!("config.json: missing integer `{k}`")))
        };
        let hidden_size = u("hidden_size")?;
        let num_heads = u("num_attention_heads")?;
        let num_kv_heads = v.get("num_key_value_heads").and_then(Json::as_u64).map(|x| x as usize).unwrap_or(num_heads);
        let head_dim = match v.get("head_dim").and_then(Json::as_u64) {
            Some(h) => h as usize,
            None => hidden_size / num_heads.max(1),
        };
        // transformers >= 5 writes `rope_parameters`; older versions `rope_theta` + `rope_scaling`.
        let rope_params = v.get("rope_parameters").filter(|p| p.is_object());
        let rope_theta = rope_params
            .and_then(|p| p.get("rope_theta"))
            .or_else(|| v.get("rope_theta"))
            .and_then(Json::as_f64)
            .unwrap_or(10000.0);
        let scaling_obj = v.get("rope_scaling").filter(|s| s.is_object()).or(rope_params);
        let max_position_embeddings = u("max_position_embeddings").unwrap_or(4096);
        let rope_scaling = match scaling_obj {
            Some(s) => hf_rope_scaling(s, max_position_embeddings)?,
            None => RopeScaling::None,
        };
        let cfg = LlamaConfig {
            vocab_size: u("vocab_size")?,
            hidden_size,
            intermediate_size: u("intermediate_size")?,
            num_layers: u("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: v.get("rms_norm_eps").and_then(Json::as_f64).unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            rope_style: RopeStyle::Half,
            max_position_embeddings,
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Json::as_bool).unwrap_or(false),
            attention_bias: v.get("attention_bias").and_then(Json::as_bool).unwrap_or(arch == "qwen2"),
            qk_norm: arch == "qwen3",
            arch,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses GGUF metadata (`general.architecture` and `{arch}.*` keys). `has_output` tells
    /// whether the file has a separate `output.weight` (otherwise embeddings are tied), and
    /// `has_bias` whether `blk.0.attn_q.bias` exists.
    pub fn from_gguf(md: &HashMap<String, Value>, has_output: bool, has_bias: bool, has_qk_norm: bool) -> Result<Self> {
        let arch = md
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .ok_or_else(|| ModelError::Config("GGUF: missing general.architecture".into()))?;
        let rope_style = match arch.as_str() {
            "llama" => RopeStyle::Interleaved,
            "qwen2" | "qwen3" => RopeStyle::Half,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "GGUF architecture `{other}` (supported: llama, qwen2, qwen3)"
                )))
            }
        };
        let key = |k: &str| format!("{arch}.{k}");
        let get_u = |k: &str| -> Option<usize> { md.get(&key(k)).and_then(gguf_usize) };
        let need = |k: &str| -> Result<usize> {
            get_u(k).ok_or_else(|| ModelError::Config(format!("GGUF: missing `{}`", key(k))))
        };
        let get_f = |k: &str| -> Option<f64> { md.get(&key(k)).and_then(gguf_f64) };
        let hidden_size = need("embedding_length")?;
        let num_heads = need("attention.head_count")?;
        let num_kv_heads = get_u("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = get_u("attention.key_length")
            .or_else(|| get_u("rope.dimension_count"))
            .unwrap_or(hidden_size / num_heads.max(1));
        let vocab_size = match get_u("vocab_size") {
            Some(v) => v,
            None => md
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok())
                .map(|v| v.len())
                .ok_or_else(|| ModelError::Config("GGUF: cannot determine the vocabulary size".into()))?,
        };
        let max_pos = get_u("context_length").unwrap_or(4096);
        let scaling_type = md
            .get(&key("rope.scaling.type"))
            .and_then(|v| v.to_string().ok())
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default();
        let factor = get_f("rope.scaling.factor").unwrap_or(1.0);
        let orig = get_u("rope.scaling.original_context_length").unwrap_or(max_pos);
        let rope_scaling = match scaling_type.as_str() {
            "linear" if factor != 1.0 => RopeScaling::Linear { factor },
            "yarn" if factor > 1.0 => {
                RopeScaling::Yarn { factor, original_max_position: orig, beta_fast: 32.0, beta_slow: 1.0 }
            }
            // Llama 3 GGUFs carry precomputed factors in the `rope_freqs.weight` tensor instead.
            _ => RopeScaling::None,
        };
        let cfg = LlamaConfig {
            vocab_size,
            hidden_size,
            intermediate_size: need("feed_forward_length")?,
            num_layers: need("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: get_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
            rope_theta: get_f("rope.freq_base").unwrap_or(10000.0),
            rope_scaling,
            rope_style,
            max_position_embeddings: max_pos,
            tie_word_embeddings: !has_output,
            attention_bias: has_bias,
            qk_norm: has_qk_norm,
            arch,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

pub(crate) fn hf_rope_scaling(s: &Json, max_pos: usize) -> Result<RopeScaling> {
    let ty = s.get("rope_type").or_else(|| s.get("type")).and_then(Json::as_str).unwrap_or("default");
    let f = |k: &str, d: f64| s.get(k).and_then(Json::as_f64).unwrap_or(d);
    let orig = s.get("original_max_position_embeddings").and_then(Json::as_u64).map(|x| x as usize).unwrap_or(max_pos);
    Ok(match ty {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: f("factor", 1.0) },
        "llama3" => RopeScaling::Llama3 {
            factor: f("factor", 8.0),
            low_freq_factor: f("low_freq_factor", 1.0),
            high_freq_factor: f("high_freq_factor", 4.0),
            original_max_position: orig,
        },
        "yarn" => RopeScaling::Yarn {
            factor: f("factor", 1.0),
            original_max_position: orig,
            beta_fast: f("beta_fast", 32.0),
            beta_slow: f("beta_slow", 1.0),
        },
        other => return Err(ModelError::Unsupported(format!("rope scaling type `{other}`"))),
    })
}

/// Reads any integer-typed GGUF value as usize.
pub fn gguf_usize(v: &Value) -> Option<usize> {
    match v {
        Value::U8(x) => Some(*x as usize),
        Value::U16(x) => Some(*x as usize),
        Value::U32(x) => Some(*x as usize),
        Value::U64(x) => Some(*x as usize),
        Value::I8(x) if *x >= 0 => Some(*x as usize),
        Value::I16(x) if *x >= 0 => Some(*x as usize),
        Value::I32(x) if *x >= 0 => Some(*x as usize),
        Value::I64(x) if *x >= 0 => Some(*x as usize),
        _ => None,
    }
}

/// Reads any numeric GGUF value as f64.
pub fn gguf_f64(v: &Value) -> Option<f64> {
    match v {
        Value::F32(x) => Some(*x as f64),
        Value::F64(x) => Some(*x),
        other => gguf_usize(other).map(|x| x as f64),
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    /// Configs that claim absurd sizes are refused before anything is allocated from them.
    #[test]
    fn absurd_sizes_are_config_errors() {
        let base = serde_json::json!({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6});
        assert!(LlamaConfig::from_hf_json(&base).is_ok());
        for (k, v) in [
            ("num_hidden_layers", 1u64 << 40),
            ("head_dim", 1 << 40),
            ("vocab_size", 1 << 40),
            ("hidden_size", 1 << 30),
            ("max_position_embeddings", 1 << 40),
        ] {
            let mut c = base.clone();
            c[k] = serde_json::json!(v);
            let e = LlamaConfig::from_hf_json(&c).expect_err(k).to_string();
            assert!(
                e.contains("beyond what tandem accepts") || e.contains("not a multiple") || e.contains("even"),
                "{k}: {e}"
            );
        }
        let hybrid = serde_json::json!({"model_type": "qwen3_5_text", "hidden_size": 64, "intermediate_size": 48,
            "num_hidden_layers": 1u64 << 30, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 100,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6});
        let e =
            crate::arch::qwen_hybrid::config::HybridConfig::from_hf_json(&hybrid).expect_err("2^30 layers").to_string();
        assert!(e.contains("beyond what tandem accepts"), "{e}");
    }
}
