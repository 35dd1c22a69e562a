//! A description of a loaded checkpoint for `tandem inspect` and `/v1/models`.

use std::collections::BTreeMap;

/// What `tandem inspect` prints.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ModelSummary {
    pub path: String,
    pub format: String,
    pub architecture: String,
    pub parameters: u64,
    pub file_bytes: u64,
    /// Number of tensors per storage type (`Q4_1`, `F32`, ...).
    pub tensor_types: BTreeMap<String, usize>,
    pub context_length: usize,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub tie_word_embeddings: bool,
    pub rope: String,
    pub chat_template: Option<String>,
    /// The type `--quantize` turned the matmul weights into at load, if it was given.
    pub quantized_at_load: Option<String>,
}

impl ModelSummary {
    /// The fields that come from the architecture config; the loader fills in the rest.
    pub fn from_config(cfg: &crate::config::LlamaConfig) -> Self {
        ModelSummary {
            architecture: cfg.arch.clone(),
            context_length: cfg.max_position_embeddings,
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            num_layers: cfg.num_layers,
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            tie_word_embeddings: cfg.tie_word_embeddings,
            rope: format!("theta {}, {:?} pairing, scaling {:?}", cfg.rope_theta, cfg.rope_style, cfg.rope_scaling),
            ..Default::default()
        }
    }
}
