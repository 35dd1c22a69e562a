//! The memory estimate made before a cell is launched, from the model's description alone:
//! baseline process + a constant runtime overhead + resident weights + KV pool + activations,
//! taking the larger of the load peak (weights resident while the file is still mapped) and the
//! run peak.
//!
//! Coefficients were checked against measured `VmHWM` of cell processes on the fixture models
//! and SmolLM2-135M (see `tests/sweep.rs` and docs/BENCHMARKS.md).

use serde::{Deserialize, Serialize};
use tandem_model::loader::ModelSummary;

use super::grid::CellSpec;

/// f32 activations kept alive per token of a forward chunk, in multiples of `hidden_size`
/// (residual, norms, q/k/v/o, the gated MLP's three intermediate tensors at ~3-4x hidden).
const ACTIVATION_HIDDENS_PER_TOKEN: usize = 24;
/// Resident bytes of the tokenizer per vocabulary entry (token strings, merges, maps).
const TOKENIZER_BYTES_PER_TOKEN: u64 = 400;
/// What running any model adds to the probe's baseline whatever its size: code pages of the
/// kernels, tokenizer and engine as they are first executed, the engine and kernel threads'
/// stacks and allocator arenas. Measured as 9.1-9.5 MiB on every fixture model (tiny weights).
const RUNTIME_OVERHEAD_BYTES: u64 = 9 << 20;

/// The estimate, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    /// The process before loading (from a probe process).
    pub baseline_bytes: u64,
    /// Code, threads and allocator state any model run adds (a constant).
    pub runtime_bytes: u64,
    /// Weights as held while running.
    pub weights_bytes: u64,
    /// The checkpoint's bytes mapped while loading.
    pub mapped_bytes: u64,
    pub tokenizer_bytes: u64,
    /// The paged KV pool the cell sizes for its longest sequence.
    pub kv_bytes: u64,
    /// Largest transient activations: a prefill chunk or a perplexity window with its logits.
    pub activation_bytes: u64,
    pub load_peak_bytes: u64,
    pub run_peak_bytes: u64,
    /// `max(load_peak, run_peak)`.
    pub total_bytes: u64,
}

/// Estimates the peak resident memory of a cell process.
pub fn estimate(summary: &ModelSummary, spec: &CellSpec, baseline: u64) -> MemoryEstimate {
    let gguf = summary.format.to_ascii_lowercase().contains("gguf");
    // GGUF tensors stay in their stored types; Hugging Face matrices stored as bf16 / f16
    // stay 16-bit (the rest, embeddings and norms, become f32); quantised at load, every
    // parameter takes its type's bytes (f16 / bf16: two).
    // A GGUF of 16-bit matrices keeps them 16-bit; its embedding is widened to f32.
    let sixteen = |t: &str| matches!(t, "F16" | "BF16");
    let n16: usize = summary.tensor_types.iter().filter(|(t, _)| sixteen(t)).map(|(_, n)| n).sum();
    let mostly_16bit = 2 * n16 > summary.tensor_types.values().sum::<usize>();
    let weights_bytes = match spec.quantize() {
        Some(q) => (summary.parameters as f64 * bytes_per_param(q.0)) as u64,
        None if gguf && mostly_16bit => {
            summary.file_bytes.saturating_add(2 * summary.vocab_size as u64 * summary.hidden_size as u64)
        }
        None if gguf => summary.file_bytes,
        // The embedding (vocab x hidden) is widened to f32, every matrix kept 16-bit.
        None if mostly_16bit => summary
            .parameters
            .saturating_mul(2)
            .saturating_add(2 * summary.vocab_size as u64 * summary.hidden_size as u64),
        None => summary.parameters.saturating_mul(4),
    };
    let mapped_bytes = summary.file_bytes;
    let tokenizer_bytes = summary.vocab_size as u64 * TOKENIZER_BYTES_PER_TOKEN;
    let bs = spec.kv_block_size.max(1);
    let len = spec.max_len().min(summary.context_length.max(1));
    let blocks = (len.div_ceil(bs) + 2) as u64;
    let per_token =
        (2 * summary.num_layers * summary.num_kv_heads * spec.kv_dtype().row_bytes(summary.head_dim)) as u64;
    let kv_bytes = blocks * bs as u64 * per_token;
    let f32b = 4u64;
    let chunk = spec.prefill_chunk.min(len.max(1)) as u64;
    let hidden = summary.hidden_size as u64;
    let vocab = summary.vocab_size as u64;
    let prefill_act = chunk * hidden * ACTIVATION_HIDDENS_PER_TOKEN as u64 * f32b + vocab * f32b;
    let ppl_window = if spec.ppl_tokens > 1 { spec.ppl_window.min(spec.ppl_tokens) as u64 } else { 0 };
    // Logits of the window, their f32 copy on the host, and the window's activations.
    let ppl_act = ppl_window * (2 * vocab * f32b + hidden * ACTIVATION_HIDDENS_PER_TOKEN as u64 * f32b);
    let activation_bytes = prefill_act.max(ppl_act);
    let base = baseline + RUNTIME_OVERHEAD_BYTES;
    // Quantising at load holds one tensor as f32 at a time: the largest, the embedding.
    let staging_bytes = if spec.quantize().is_some() { vocab * hidden * f32b } else { 0 };
    let load_peak_bytes = base + weights_bytes + mapped_bytes + tokenizer_bytes + staging_bytes;
    let run_peak_bytes = base + weights_bytes + tokenizer_bytes + kv_bytes + activation_bytes;
    MemoryEstimate {
        baseline_bytes: baseline,
        runtime_bytes: RUNTIME_OVERHEAD_BYTES,
        weights_bytes,
        mapped_bytes,
        tokenizer_bytes,
        kv_bytes,
        activation_bytes,
        load_peak_bytes,
        run_peak_bytes,
        total_bytes: load_peak_bytes.max(run_peak_bytes),
    }
}

/// Bytes per weight of a GGML type (block bytes over block values).
fn bytes_per_param(t: candle_core::quantized::GgmlDType) -> f64 {
    use candle_core::quantized::GgmlDType as G;
    match t {
        G::F32 => 4.0,
        G::F16 | G::BF16 => 2.0,
        other => other.type_size() as f64 / other.block_size() as f64,
    }
}
