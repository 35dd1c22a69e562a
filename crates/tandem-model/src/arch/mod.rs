//! Model architectures behind one trait, [`CausalLm`]: the engine drives every model the same
//! way and allocates caches from [`CausalLm::cache_spec`], never by architecture name.

pub mod llama;
pub mod qwen_hybrid;

use candle_core::{Device, Tensor};

use crate::batch::SeqChunk;
use crate::error::Result;
use crate::kv::LayerCacheSpec;

/// A decoder-only language model.
pub trait CausalLm: Send + Sync {
    /// One entry per layer that keeps per-sequence state.
    fn cache_spec(&self) -> Vec<LayerCacheSpec>;
    fn vocab_size(&self) -> usize;
    /// Longest sequence the model supports.
    fn context_length(&self) -> usize;
    fn device(&self) -> &Device;
    /// Runs one ragged batch. Each chunk continues its sequence at `cache.position()` and
    /// advances it. Returns, per chunk, f32 logits `[rows, vocab]` for the rows it asked for.
    fn forward(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>>;
}
