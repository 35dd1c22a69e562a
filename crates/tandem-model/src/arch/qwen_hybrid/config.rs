//! Configuration of the Qwen hybrid family (`qwen3_next`, `qwen3_5` / `qwen3_5_text`,
//! `qwen3_5_moe` / `qwen3_5_moe_text`) from a Hugging Face `config.json`. Qwen3.5 wrappers nest
//! the text model's keys under `text_config`; RoPE keys may sit at the top level or inside
//! `rope_parameters`.

use serde_json::Value as Json;

use crate::error::{ModelError, Result};

/// The token mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet ("linear_attention").
    Linear,
    /// Gated full attention.
    Full,
}

/// Sparse MoE block settings.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    pub intermediate_size: usize,
    pub shared_intermediate_size: usize,
    pub norm_topk_prob: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    /// `model_type` of the text model.
    pub model_type: String,
    /// Qwen3-Next family: HF checkpoints hold `in_proj_qkvz` / `in_proj_ba` grouped per k-head
    /// (the GDN loader recognises the layout from the tensors present).
    pub grouped_projections: bool,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub layer_kinds: Vec<LayerKind>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rotary_dim: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub conv_kernel: usize,
    /// Dense MLP width (layers that are not MoE).
    pub intermediate_size: usize,
    pub moe: Option<MoeConfig>,
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
    /// MTP blocks declared by the config (the weights decide whether one is loaded).
    pub mtp_layers: usize,
    /// GDN V heads stored in llama.cpp's "tiled" order (v-head `j·nk + g` reads k-head `g`), as
    /// in `qwen35` / `qwen35moe` GGUFs; the loader puts them back in HF's grouped order.
    pub v_heads_tiled: bool,
}

const TYPES: [&str; 5] = ["qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"];

/// Whether `config.json` describes a model of this family.
pub fn is_hybrid(v: &Json) -> bool {
    v.get("model_type").and_then(Json::as_str).is_some_and(|t| TYPES.contains(&t))
}

impl HybridConfig {
    pub fn num_layers(&self) -> usize {
        self.layer_kinds.len()
    }

    /// Whether layer `i` uses the MoE block (Qwen3-Next rule; Qwen3.5-MoE: every layer).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        self.moe.is_some()
            && !self.mlp_only_layers.contains(&i)
            && (i + 1).is_multiple_of(self.decoder_sparse_step.max(1))
    }

    pub fn conv_channels(&self) -> usize {
        2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
    }

    pub fn from_hf_json(root: &Json) -> Result<Self> {
        let top_type = root.get("model_type").and_then(Json::as_str).unwrap_or_default().to_string();
        if !TYPES.contains(&top_type.as_str()) {
            return Err(ModelError::Unsupported(format!("model_type `{top_type}` is not a Qwen hybrid model")));
        }
        let v = match root.get("text_config") {
            Some(t) if t.is_object() => t,
            _ => root,
        };
        let model_type = v.get("model_type").and_then(Json::as_str).unwrap_or(&top_type).to_string();
        let get = |k: &str| v.get(k).or_else(|| root.get(k));
        let opt_u = |k: &str| get(k).and_then(Json::as_u64).map(|x| x as usize);
        let u = |k: &str| opt_u(k).ok_or_else(|| ModelError::Config(format!("config.json: missing integer `{k}`")));
        let rope = get("rope_parameters").filter(|p| p.is_object());
        let rope_f = |k: &str| rope.and_then(|p| p.get(k)).or_else(|| get(k)).and_then(Json::as_f64);
        let hidden_size = u("hidden_size")?;
        let num_heads = u("num_attention_heads")?;
        let num_layers = u("num_hidden_layers")?;
        crate::config::limits::check("num_hidden_layers", num_layers, crate::config::limits::LAYERS)?;
        let head_dim = opt_u("head_dim").unwrap_or(hidden_size / num_heads.max(1));
        let layer_kinds = match get("layer_types").and_then(Json::as_array) {
            Some(a) => a
                .iter()
                .map(|x| match x.as_str() {
                    Some("linear_attention") => Ok(LayerKind::Linear),
                    Some("full_attention") => Ok(LayerKind::Full),
                    other => Err(ModelError::Config(format!("unknown layer type {other:?}"))),
                })
                .collect::<Result<Vec<_>>>()?,
            None => {
                let every = opt_u("full_attention_interval").unwrap_or(4).max(1);
                (0..num_layers)
                    .map(|i| if (i + 1) % every == 0 { LayerKind::Full } else { LayerKind::Linear })
                    .collect()
            }
        };
        if layer_kinds.len() != num_layers {
            return Err(ModelError::Config(format!("{} layer_types for {num_layers} layers", layer_kinds.len())));
        }
        let partial = rope_f("partial_rotary_factor").unwrap_or(0.25);
        let rotary_dim = ((head_dim as f64 * partial) as usize) & !1;
        let moe = match opt_u("num_experts") {
            Some(n) if n > 0 => Some(MoeConfig {
                num_experts: n,
                top_k: u("num_experts_per_tok")?,
                intermediate_size: u("moe_intermediate_size")?,
                shared_intermediate_size: opt_u("shared_expert_intermediate_size").unwrap_or(0),
                // Qwen3.5-MoE always renormalises.
                norm_topk_prob: model_type.starts_with("qwen3_5")
                    || get("norm_topk_prob").and_then(Json::as_bool).unwrap_or(true),
            }),
            _ => None,
        };
        let cfg = HybridConfig {
            grouped_projections: model_type == "qwen3_next",
            model_type,
            vocab_size: u("vocab_size")?,
            hidden_size,
            layer_kinds,
            num_heads,
            num_kv_heads: opt_u("num_key_value_heads").unwrap_or(num_heads),
            head_dim,
            rotary_dim,
            rope_theta: rope_f("rope_theta").unwrap_or(10_000_000.0),
            rms_norm_eps: get("rms_norm_eps").and_then(Json::as_f64).unwrap_or(1e-6),
            max_position_embeddings: opt_u("max_position_embeddings").unwrap_or(262_144),
            tie_word_embeddings: get("tie_word_embeddings").and_then(Json::as_bool).unwrap_or(false),
            linear_num_key_heads: u("linear_num_key_heads")?,
            linear_num_value_heads: u("linear_num_value_heads")?,
            linear_key_head_dim: u("linear_key_head_dim")?,
            linear_value_head_dim: u("linear_value_head_dim")?,
            conv_kernel: opt_u("linear_conv_kernel_dim").unwrap_or(4),
            intermediate_size: opt_u("intermediate_size").unwrap_or(0),
            moe,
            decoder_sparse_step: opt_u("decoder_sparse_step").unwrap_or(1),
            mlp_only_layers: get("mlp_only_layers")
                .and_then(Json::as_array)
                .map(|a| a.iter().filter_map(Json::as_u64).map(|x| x as usize).collect())
                .unwrap_or_default(),
            mtp_layers: opt_u("mtp_num_hidden_layers").or_else(|| opt_u("num_nextn_predict_layers")).unwrap_or(0),
            v_heads_tiled: false,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<()> {
        use crate::config::limits::{self, check};
        let bad = |m: String| Err(ModelError::Config(m));
        let (nk, nv) = (self.linear_num_key_heads, self.linear_num_value_heads);
        check("num_hidden_layers", self.num_layers(), limits::LAYERS)?;
        check("hidden_size", self.hidden_size, limits::HIDDEN)?;
        check("num_attention_heads", self.num_heads, limits::HEADS)?;
        check("num_key_value_heads", self.num_kv_heads, limits::HEADS)?;
        check("head_dim", self.head_dim, limits::HEAD_DIM)?;
        check("linear_num_key_heads", nk, limits::HEADS)?;
        check("linear_num_value_heads", nv, limits::HEADS)?;
        check("linear_key_head_dim", self.linear_key_head_dim, limits::HEAD_DIM)?;
        check("linear_value_head_dim", self.linear_value_head_dim, limits::HEAD_DIM)?;
        check("linear_conv_kernel_dim", self.conv_kernel, 64)?;
        check("intermediate_size", self.intermediate_size, limits::INTERMEDIATE)?;
        check("vocab_size", self.vocab_size, limits::VOCAB)?;
        check("max_position_embeddings", self.max_position_embeddings, limits::CONTEXT)?;
        check("mtp_num_hidden_layers", self.mtp_layers, limits::LAYERS)?;
        if let Some(m) = &self.moe {
            check("num_experts", m.num_experts, limits::EXPERTS)?;
        }
        if [self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim, nk, nv, self.vocab_size].contains(&0)
            || self.linear_key_head_dim == 0
            || self.linear_value_head_dim == 0
            || self.conv_kernel == 0
        {
            return bad(format!("zero-sized dimension in {self:?}"));
        }
        if !nv.is_multiple_of(nk) {
            return bad(format!("linear_num_value_heads {nv} is not a multiple of linear_num_key_heads {nk}"));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "num_attention_heads {} not a multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        if let Some(m) = &self.moe {
            if m.top_k == 0 || m.top_k > m.num_experts {
                return bad(format!("num_experts_per_tok {} out of range for {} experts", m.top_k, m.num_experts));
            }
        }
        let dense_needed = (0..self.num_layers()).any(|i| !self.is_moe_layer(i));
        if dense_needed && self.intermediate_size == 0 {
            return bad("a dense layer needs intermediate_size".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_text_config_and_defaults() {
        let v: Json = serde_json::json!({
            "model_type": "qwen3_5_moe",
            "text_config": {"model_type": "qwen3_5_moe_text", "vocab_size": 10, "hidden_size": 8,
                "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
                "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 4,
                "linear_value_head_dim": 4, "num_experts": 4, "num_experts_per_tok": 2,
                "moe_intermediate_size": 4, "rope_parameters": {"rope_theta": 100.0, "partial_rotary_factor": 0.5}}
        });
        let c = HybridConfig::from_hf_json(&v).unwrap();
        assert_eq!(c.layer_kinds, vec![LayerKind::Linear, LayerKind::Linear, LayerKind::Linear, LayerKind::Full]);
        assert_eq!((c.rotary_dim, c.rope_theta), (4, 100.0));
        assert!(!c.grouped_projections && c.is_moe_layer(3));
        assert!(HybridConfig::from_hf_json(&serde_json::json!({"model_type": "llama"})).is_err());
    }
}
