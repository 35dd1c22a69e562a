//! Sizing the sliding-window layers' rings: each running sequence owns `len` blocks of every
//! ring layer's pool (the run of its state slot), enough for the window plus the longest chunk
//! one step writes, so a chunk never overwrites a key its own first query still sees and a
//! failed or speculative step can roll back within it ([`tandem_model::kv::SequenceCache::ring_slack`]).

use tandem_cache::SlotId;
use tandem_model::kv::{LayerCacheSpec, PagedKvStore};

use crate::engine::EngineConfig;
use crate::spec::MAX_DRAFT_TOKENS;

#[derive(Debug, Clone, Copy)]
pub(super) struct Rings {
    /// Blocks per sequence.
    pub len: usize,
    /// Bytes per sequence over every ring layer.
    pub bytes: usize,
}

impl Rings {
    /// The rings a model with sliding-window layers needs (`None` without such layers): the
    /// largest window less one, plus the longest chunk (a prefill chunk or a verify chunk),
    /// plus one block for a chunk that starts mid-block.
    pub fn plan(spec: &[LayerCacheSpec], cfg: &EngineConfig) -> Option<Self> {
        let window = spec.iter().map(LayerCacheSpec::window).max().filter(|&w| w > 0)?;
        let bs = cfg.block_size.max(1);
        let chunk = cfg.prefill_chunk.max(MAX_DRAFT_TOKENS + 1);
        let len = (window - 1 + chunk).div_ceil(bs) + 1;
        Some(Self { len, bytes: len * PagedKvStore::bytes_per_ring_block(spec, bs, cfg.kv_dtype) })
    }

    /// The first ring block of the sequence holding state slot `slot`.
    pub fn base(&self, slot: SlotId) -> u32 {
        slot * self.len as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_cover_the_window_and_a_chunk() {
        let spec = [
            LayerCacheSpec::SlidingWindow { kv_heads: 1, head_dim: 32, window: 512 },
            LayerCacheSpec::Attention { kv_heads: 1, head_dim: 32 },
        ];
        let cfg = EngineConfig::default();
        let r = Rings::plan(&spec, &cfg).unwrap();
        assert_eq!(r.len, (511 + cfg.prefill_chunk).div_ceil(cfg.block_size) + 1);
        assert_eq!(r.bytes, r.len * PagedKvStore::bytes_per_ring_block(&spec, cfg.block_size, cfg.kv_dtype));
        // Chunks of one token still leave room for a verify chunk.
        let tiny = EngineConfig { prefill_chunk: 1, ..EngineConfig::default() };
        assert!(Rings::plan(&spec, &tiny).unwrap().len * tiny.block_size >= 511 + MAX_DRAFT_TOKENS + 1);
        assert!(Rings::plan(&spec[1..], &cfg).is_none());
        assert_eq!(r.base(3), 3 * r.len as u32);
    }
}
