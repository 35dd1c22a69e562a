//! Gemma 3 text configuration from a Hugging Face `config.json` (`gemma3_text`, or the
//! `text_config` of a multimodal `gemma3` checkpoint) or from GGUF metadata (`gemma3.*`).
//!
//! The Llama-family fields live in [`LlamaConfig`] (global layers' RoPE base and scaling
//! there); Gemma adds which layers slide, the window, the local layers' RoPE base and the
//! attention scale (`query_pre_attn_scalar`).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use serde_json::Value as Json;

use crate::config::{gguf_f64, gguf_usize, hf_rope_scaling, LlamaConfig, RopeScaling, RopeStyle};
use crate::error::{ModelError, Result};

/// Gemma 3's local layers per global layer when the checkpoint does not list them (five
/// sliding-window layers, then a global one).
pub const DEFAULT_PATTERN: usize = 6;

/// Configuration of one Gemma 3 text model.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma3Config {
    /// Sizes, norms' epsilon, and the global layers' RoPE (`rope_theta`, `rope_scaling`).
    pub base: LlamaConfig,
    /// Per layer: whether it is a sliding-window (local) layer.
    pub sliding: Vec<bool>,
    /// Positions a local layer's query sees (itself included).
    pub sliding_window: usize,
    /// RoPE base of the local layers (no scaling).
    pub rope_local_theta: f64,
    /// Attention scores are scaled by `query_pre_attn_scalar ^ -0.5`.
    pub query_pre_attn_scalar: f64,
}

impl Gemma3Config {
    pub fn validate(&self) -> Result<()> {
        self.base.validate()?;
        if self.sliding.len() != self.base.num_layers {
            return Err(ModelError::Config(format!(
                "{} layer types for {} layers",
                self.sliding.len(),
                self.base.num_layers
            )));
        }
        if self.sliding.iter().any(|&s| s) && self.sliding_window == 0 {
            return Err(ModelError::Config("sliding-window layers with a window of 0".into()));
        }
        if !(self.query_pre_attn_scalar > 0.0 && self.query_pre_attn_scalar.is_finite()) {
            return Err(ModelError::Config(format!(
                "query_pre_attn_scalar {} must be positive",
                self.query_pre_attn_scalar
            )));
        }
        Ok(())
    }

    /// Layer `i` slides when `(i + 1) % pattern != 0` (pattern 0 or 1: no layer slides).
    pub fn pattern(num_layers: usize, pattern: usize) -> Vec<bool> {
        (0..num_layers).map(|i| pattern > 1 && (i + 1) % pattern != 0).collect()
    }

    /// Parses a Hugging Face `config.json` (`gemma3_text`, or `gemma3` with `text_config`).
    pub fn from_hf_json(v: &Json) -> Result<Self> {
        let ty = v.get("model_type").and_then(Json::as_str).unwrap_or("");
        let t = match ty {
            "gemma3_text" => v,
            "gemma3" => v.get("text_config").ok_or_else(|| ModelError::Config("gemma3: no text_config".into()))?,
            other => return Err(ModelError::Unsupported(format!("model_type `{other}` is not Gemma 3"))),
        };
        for cap in ["final_logit_softcapping", "attn_logit_softcapping"] {
            if t.get(cap).is_some_and(|c| !c.is_null()) {
                return Err(ModelError::Unsupported(format!("Gemma 3 with `{cap}` (Gemma 2's soft-capping)")));
            }
        }
        if let Some(act) = t.get("hidden_activation").and_then(Json::as_str) {
            if act != "gelu_pytorch_tanh" {
                return Err(ModelError::Unsupported(format!("Gemma 3 with hidden_activation `{act}`")));
            }
        }
        let u = |k: &str| -> Result<usize> {
            t.get(k)
                .and_then(Json::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| ModelError::Config(format!("config.json: missing integer `{k}`")))
        };
        let opt_u = |k: &str| t.get(k).and_then(Json::as_u64).map(|x| x as usize);
        let hidden_size = u("hidden_size")?;
        let num_heads = u("num_attention_heads")?;
        let num_layers = u("num_hidden_layers")?;
        let head_dim = opt_u("head_dim").unwrap_or(256);
        let max_pos = opt_u("max_position_embeddings").unwrap_or(131_072);
        // transformers >= 5: `rope_parameters` per layer type; before: rope_theta,
        // rope_local_base_freq and rope_scaling (global layers only).
        let params = t.get("rope_parameters").filter(|p| p.is_object());
        let (global, local) = match params.and_then(|p| p.get("full_attention")) {
            Some(full) => (Some(full), params.and_then(|p| p.get("sliding_attention"))),
            None => (params.or_else(|| t.get("rope_scaling").filter(|s| s.is_object())), None),
        };
        let theta = |o: Option<&Json>, key: &str, d: f64| {
            o.and_then(|o| o.get("rope_theta")).or_else(|| t.get(key)).and_then(Json::as_f64).unwrap_or(d)
        };
        let rope_theta = theta(global, "rope_theta", 1_000_000.0);
        let rope_local_theta = theta(local, "rope_local_base_freq", 10_000.0);
        let rope_scaling = match global {
            Some(g) => hf_rope_scaling(g, max_pos)?,
            None => RopeScaling::None,
        };
        let sliding = match t.get("layer_types").and_then(Json::as_array) {
            Some(types) => types
                .iter()
                .map(|x| match x.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    other => Err(ModelError::Config(format!("layer_types: unknown layer type {other:?}"))),
                })
                .collect::<Result<Vec<_>>>()?,
            None => Self::pattern(num_layers, opt_u("sliding_window_pattern").unwrap_or(DEFAULT_PATTERN)),
        };
        let cfg = Gemma3Config {
            base: LlamaConfig {
                arch: "gemma3".into(),
                vocab_size: u("vocab_size")?,
                hidden_size,
                intermediate_size: u("intermediate_size")?,
                num_layers,
                num_heads,
                num_kv_heads: opt_u("num_key_value_heads").unwrap_or(num_heads),
                head_dim,
                rms_norm_eps: t.get("rms_norm_eps").and_then(Json::as_f64).unwrap_or(1e-6),
                rope_theta,
                rope_scaling,
                rope_style: RopeStyle::Half,
                max_position_embeddings: max_pos,
                tie_word_embeddings: true,
                attention_bias: t.get("attention_bias").and_then(Json::as_bool).unwrap_or(false),
                qk_norm: true,
            },
            sliding,
            sliding_window: opt_u("sliding_window").unwrap_or(4096),
            rope_local_theta,
            query_pre_attn_scalar: t.get("query_pre_attn_scalar").and_then(Json::as_f64).unwrap_or(head_dim as f64),
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses GGUF metadata of `general.architecture = gemma3`. llama.cpp's converter keeps
    /// neither the local RoPE base (10000) nor the layer pattern (6) nor
    /// `query_pre_attn_scalar` (the head dim, except Gemma 3 27B's hidden / heads): its
    /// defaults are ours.
    pub fn from_gguf(md: &HashMap<String, Value>) -> Result<Self> {
        let key = |k: &str| format!("gemma3.{k}");
        let get_u = |k: &str| md.get(&key(k)).and_then(gguf_usize);
        let need = |k: &str| get_u(k).ok_or_else(|| ModelError::Config(format!("GGUF: missing `{}`", key(k))));
        let get_f = |k: &str| md.get(&key(k)).and_then(gguf_f64);
        let hidden_size = need("embedding_length")?;
        let num_heads = need("attention.head_count")?;
        let num_layers = need("block_count")?;
        let head_dim = get_u("attention.key_length").unwrap_or(256);
        let vocab_size = match get_u("vocab_size") {
            Some(v) => v,
            None => md
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok())
                .map(|v| v.len())
                .ok_or_else(|| ModelError::Config("GGUF: cannot determine the vocabulary size".into()))?,
        };
        let scaling_type = md
            .get(&key("rope.scaling.type"))
            .and_then(|v| v.to_string().ok())
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default();
        let factor = get_f("rope.scaling.factor").unwrap_or(1.0);
        let rope_scaling =
            if scaling_type == "linear" && factor != 1.0 { RopeScaling::Linear { factor } } else { RopeScaling::None };
        let pattern = get_u("attention.sliding_window_pattern").unwrap_or(DEFAULT_PATTERN);
        let query_pre_attn_scalar =
            if num_layers == 62 { (hidden_size / num_heads.max(1)) as f64 } else { head_dim as f64 };
        let cfg = Gemma3Config {
            base: LlamaConfig {
                arch: "gemma3".into(),
                vocab_size,
                hidden_size,
                intermediate_size: need("feed_forward_length")?,
                num_layers,
                num_heads,
                num_kv_heads: get_u("attention.head_count_kv").unwrap_or(num_heads),
                head_dim,
                rms_norm_eps: get_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
                rope_theta: get_f("rope.freq_base").unwrap_or(1_000_000.0),
                rope_scaling,
                rope_style: RopeStyle::Half,
                max_position_embeddings: get_u("context_length").unwrap_or(131_072),
                tie_word_embeddings: true,
                attention_bias: false,
                qk_norm: true,
            },
            sliding: Self::pattern(num_layers, pattern),
            sliding_window: get_u("attention.sliding_window").unwrap_or(4096),
            rope_local_theta: 10_000.0,
            query_pre_attn_scalar,
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_rope_layouts_and_the_layer_pattern() {
        let old = serde_json::json!({"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96,
            "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
            "vocab_size": 100, "sliding_window": 8, "sliding_window_pattern": 3, "rope_theta": 1e6,
            "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "query_pre_attn_scalar": 24, "final_logit_softcapping": null});
        let c = Gemma3Config::from_hf_json(&old).unwrap();
        assert_eq!(c.sliding, [true, true, false, true, true, false, true]);
        assert_eq!((c.sliding_window, c.rope_local_theta, c.base.rope_theta), (8, 1e4, 1e6));
        assert_eq!(c.base.rope_scaling, RopeScaling::Linear { factor: 8.0 });
        assert_eq!(c.query_pre_attn_scalar, 24.0);
        let new = serde_json::json!({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
            "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 100, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}}});
        let c = Gemma3Config::from_hf_json(&new).unwrap();
        assert_eq!(c.sliding, [true, false, true]);
        assert_eq!((c.rope_local_theta, c.base.rope_theta, c.query_pre_attn_scalar), (2e4, 5e5, 32.0));
        let mut capped = old.clone();
        capped["final_logit_softcapping"] = serde_json::json!(30.0);
        assert!(Gemma3Config::from_hf_json(&capped).unwrap_err().to_string().contains("soft-capping"));
        let mut bad = old;
        bad["sliding_window"] = serde_json::json!(0);
        assert!(Gemma3Config::from_hf_json(&bad).is_err());
    }
}
