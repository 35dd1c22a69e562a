//! `tandem bench --bandwidth TB/s`: the memory-bandwidth bound of a batch-1 decode step, printed
//! beside the measured rate (issue 16's target 1 compares decode with it). A step must read
//! every weight matrix once (the LM head included; the token embedding table only where it is
//! also the LM head), the keys and values of every attention layer over the context (a sliding
//! window caps it), and read and write every recurrent layer's state; at `bandwidth` bytes a
//! second that takes `bytes / bandwidth` seconds, the fastest a step can be. A batched step
//! reads the weights once and every sequence's state, keys and values (`StepBytes::batch_at`).

use std::path::Path;

use anyhow::Context;
use candle_core::quantized::GgmlDType;
use tandem_model::kv::{KvDtype, LayerCacheSpec};

/// What a batch-1 decode step reads, apart from the context's keys and values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepBytes {
    /// The weight matrices a step multiplies by (the embedding table only when tied).
    pub weights: u64,
    /// Recurrent layers' states, read and written.
    pub state: u64,
}

impl StepBytes {
    /// Bytes of a step at `context` positions: the fixed part plus every attention layer's
    /// keys and values of the positions it sees.
    pub fn at(&self, spec: &[LayerCacheSpec], kv: KvDtype, context: usize) -> u64 {
        self.batch_at(spec, kv, context, 1)
    }

    /// Bytes of a batched step of `batch` sequences at `context` positions each: the weights
    /// once (every row of the batch multiplies by the same read), every sequence's recurrent
    /// state and its attention layers' keys and values.
    pub fn batch_at(&self, spec: &[LayerCacheSpec], kv: KvDtype, context: usize, batch: usize) -> u64 {
        self.weights + batch as u64 * (self.state + kv_bytes(spec, kv, context))
    }
}

/// The keys and values the attention layers of `spec` read for one query at `context`
/// positions (a sliding-window layer at most its window).
pub fn kv_bytes(spec: &[LayerCacheSpec], kv: KvDtype, context: usize) -> u64 {
    spec.iter()
        .map(|s| {
            let seen = if s.window() > 0 { context.min(s.window()) } else { context };
            (s.bytes_per_token(kv) * seen) as u64
        })
        .sum()
}

/// The recurrent layers' states of `spec`, read and written once a step.
pub fn state_bytes(spec: &[LayerCacheSpec]) -> u64 {
    spec.iter().map(|s| 2 * s.fixed_bytes() as u64).sum()
}

/// Bytes of `elements` values stored as `dtype` (whole blocks).
pub fn stored_bytes(elements: u64, dtype: GgmlDType) -> u64 {
    let block = dtype.block_size() as u64;
    elements.div_ceil(block) * dtype.type_size() as u64
}

/// The weights a step reads for a random preset of `params` parameters in `dtype` matrices
/// whose embedding table has `embedding` parameters: all of them, less the table unless it
/// is tied to the LM head. (Norms and the small GDN vectors count as `dtype` too: under 0.1%.)
pub fn random_weights(params: u64, embedding: u64, tied: bool, dtype: GgmlDType) -> u64 {
    stored_bytes(if tied { params } else { params.saturating_sub(embedding) }, dtype)
}

/// The weights a step reads for the GGUF file at `path`: every tensor's stored bytes, less
/// `token_embd.weight` when the file has its own `output.weight` (the LM head) and less the
/// MTP head's tensors (`nextn` / `mtp`), which a plain decode step does not run.
pub fn gguf_weights(path: &Path) -> anyhow::Result<u64> {
    let mut f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let content = candle_core::quantized::gguf_file::Content::read(&mut f)
        .with_context(|| format!("cannot read the GGUF header of {}", path.display()))?;
    let untied = content.tensor_infos.contains_key("output.weight");
    let mut total = 0u64;
    for (name, info) in &content.tensor_infos {
        if (untied && name == "token_embd.weight") || name.contains("nextn") || name.contains("mtp") {
            continue;
        }
        total += stored_bytes(info.shape.elem_count() as u64, info.ggml_dtype);
    }
    Ok(total)
}

/// Bytes for people: GB from a gigabyte, MB from a megabyte, else bytes.
pub fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1_000_000_000 => format!("{:.2} GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.1} MB", b as f64 / 1e6),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_reads_weights_state_and_the_context() {
        let spec = [
            LayerCacheSpec::Attention { kv_heads: 4, head_dim: 256 },
            LayerCacheSpec::SlidingWindow { kv_heads: 2, head_dim: 64, window: 100 },
            LayerCacheSpec::Recurrent { conv_channels: 10, conv_kernel: 4, state_heads: 2, key_dim: 8, value_dim: 8 },
        ];
        // f16 keys and values: 2 x 4 x 256 x 2 bytes a position; the window layer 2 x 2 x 64
        // x 2 bytes, at most 100 positions.
        assert_eq!(kv_bytes(&spec, KvDtype::F16, 1000), 4096 * 1000 + 512 * 100);
        assert_eq!(kv_bytes(&spec, KvDtype::F16, 50), 4096 * 50 + 512 * 50);
        // The state: f32 conv (10 x 3) and matrices (2 x 8 x 8), read and written.
        assert_eq!(state_bytes(&spec), 2 * 4 * (30 + 128));
        let sb = StepBytes { weights: 1_000_000, state: state_bytes(&spec) };
        assert_eq!(sb.at(&spec, KvDtype::F16, 0), 1_000_000 + 1264);
        // A batch of 8 at 50 positions: the weights once, each sequence's state and context.
        assert_eq!(sb.batch_at(&spec, KvDtype::F16, 50, 8), 1_000_000 + 8 * (1264 + 4096 * 50 + 512 * 50));
    }

    #[test]
    fn stored_bytes_follow_the_block_formats() {
        assert_eq!(stored_bytes(4096, GgmlDType::BF16), 8192);
        assert_eq!(stored_bytes(4096, GgmlDType::Q8_0), 4096 / 32 * 34);
        assert_eq!(stored_bytes(4096, GgmlDType::Q4K), 4096 / 256 * 144);
        assert_eq!(stored_bytes(4096, GgmlDType::Q6K), 4096 / 256 * 210);
        // The 9B preset in bf16: 8.95 B parameters, 1.02 B of them the untied embedding table:
        // 15.9 GB a step (the figure PERFORMANCE.md's bound uses).
        let w = random_weights(8_953_000_000, 248_320 * 4096, false, GgmlDType::BF16);
        assert!((15.8e9..16.0e9).contains(&(w as f64)), "{w}");
        assert_eq!(random_weights(100, 40, true, GgmlDType::F32), 400);
        assert_eq!(random_weights(100, 40, false, GgmlDType::F32), 240);
        assert_eq!(human(15_900_000_000), "15.90 GB");
        assert_eq!(human(2_500_000), "2.5 MB");
        assert_eq!(human(512), "512 bytes");
    }
}
