//! The sweep's axes and cells, and which combinations tandem can run today.

use serde::{Deserialize, Serialize};
use tandem_model::kv::KvDtype;

/// Weight precisions the sweep knows: the checkpoint's own (`native`) and load-time variants.
pub const WEIGHT_PRECISIONS: &[&str] =
    &["native", "f16", "bf16", "q8_0", "q6_k", "q5_k", "q5_0", "q4_k", "q4_0", "q3_k", "q2_k"];
/// KV-cache precisions the sweep knows.
pub const KV_PRECISIONS: &[&str] = &["f32", "f16", "q8_0", "q4_0"];

/// One cell: a model, a precision pair, a prefill chunk, and what to measure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellSpec {
    /// GGUF file or model directory (already resolved).
    pub model: String,
    pub weights: String,
    pub kv: String,
    pub prefill_chunk: usize,
    /// Prompt lengths to measure TTFT / prefill / decode at.
    pub prompt_lens: Vec<usize>,
    /// Tokens decoded after each prompt.
    pub gen_tokens: usize,
    /// Tokens of the shipped text scored for perplexity (0 = skip).
    pub ppl_tokens: usize,
    /// Tokens per perplexity forward pass.
    pub ppl_window: usize,
    /// CPU threads (0 = all).
    pub threads: usize,
    pub kv_block_size: usize,
}

impl CellSpec {
    /// The cell's key in results files.
    pub fn id(&self) -> String {
        format!("weights={},kv={},chunk={}", self.weights, self.kv, self.prefill_chunk)
    }

    /// `Err(reason)` when tandem cannot run this combination yet.
    pub fn supported(&self) -> Result<(), String> {
        if !WEIGHT_PRECISIONS.contains(&self.weights.as_str()) {
            return Err(format!(
                "unknown weight precision `{}` (known: {})",
                self.weights,
                WEIGHT_PRECISIONS.join(", ")
            ));
        }
        if !KV_PRECISIONS.contains(&self.kv.as_str()) {
            return Err(format!("unknown KV precision `{}` (known: {})", self.kv, KV_PRECISIONS.join(", ")));
        }
        if self.prefill_chunk == 0 {
            return Err("prefill chunk must be positive".into());
        }
        Ok(())
    }

    /// The load-time quantisation the cell asks for (`None`: the checkpoint's own weights).
    pub fn quantize(&self) -> Option<tandem_model::loader::quantize::WeightQuant> {
        (self.weights != "native").then(|| self.weights.parse().ok()).flatten()
    }

    /// The cell's KV-cache format (f32 for an unknown name; such cells are never run).
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv.parse().unwrap_or_default()
    }

    /// Longest sequence the cell runs (prompt + generated tokens).
    pub fn max_len(&self) -> usize {
        self.prompt_lens.iter().copied().max().unwrap_or(0) + self.gen_tokens
    }
}

/// The axes of a sweep and the fixed measurement settings.
#[derive(Debug, Clone)]
pub struct GridAxes {
    pub weights: Vec<String>,
    pub kv: Vec<String>,
    pub chunks: Vec<usize>,
}

/// Every combination of the axes, in order (weights outermost, chunk innermost), from a
/// template cell that carries the model and measurement settings.
pub fn grid(axes: &GridAxes, template: &CellSpec) -> Vec<CellSpec> {
    let mut cells = Vec::new();
    for w in &axes.weights {
        for kv in &axes.kv {
            for &c in &axes.chunks {
                cells.push(CellSpec { weights: w.clone(), kv: kv.clone(), prefill_chunk: c, ..template.clone() });
            }
        }
    }
    cells
}
