//! The engine's side of the KV and state cache: the paged KV store the model writes into, the
//! block pool and state slots that ration it, and the prefix tree that keeps finished work.
//!
//! Sequences get their cache from here at admission ([`EngineCache::start`]: prefix lookup,
//! shared blocks, recurrent state from the deepest usable checkpoint), reserve blocks before
//! every forward pass ([`EngineCache::reserve`], copy-on-write included), publish full blocks
//! and checkpoints after it ([`EngineCache::commit`]) and give everything back when they
//! finish, are cancelled or preempted ([`EngineCache::release`]). Everything is sized from the
//! model's per-layer cache description, never from its architecture.
//!
//! Sliding-window layers keep a ring per running sequence ([`ring::Rings`]) instead of blocks:
//! their memory stays at the window (plus one chunk) however long the sequence grows, and a
//! prefix hit resumes from a checkpoint carrying their last window of keys and values, the
//! way recurrent layers resume from their state (prompt ends, message boundaries, intervals,
//! and the last block boundary a finished request reached).

use std::sync::Arc;

use candle_core::Device;
use tandem_cache::{BlockPool, CacheError, PrefixTree, StateSlots};
use tandem_model::kv::{LayerCacheSpec, PagedKvStore, RecurrentSnapshot, SequenceCache};

use crate::engine::{EngineConfig, EngineError};
use crate::sequence::Sequence;
use crate::spec::SpecMethod;

mod book;
pub mod disk;
mod proposer_kv;
mod ring;
mod tiering;
pub(crate) use book::CacheBook;
use proposer_kv::{ProposerKv, DRAFT, MTP};

/// Occupancy numbers for stats.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CacheStats {
    pub blocks_total: usize,
    pub blocks_free: usize,
    pub block_bytes: usize,
    pub tree_blocks: usize,
    pub slots_total: usize,
    pub slots_free: usize,
    pub checkpoints: usize,
    pub checkpoint_bytes: usize,
    /// Bytes of one running sequence's sliding-window rings (0: none).
    pub ring_bytes: usize,
}

pub(crate) struct EngineCache {
    spec: Vec<LayerCacheSpec>,
    store: Arc<PagedKvStore>,
    /// A draft model's KV, in blocks with the same ids as `store`'s (one block table serves both).
    draft: Option<(Vec<LayerCacheSpec>, Arc<PagedKvStore>)>,
    /// Per block id: which proposers' KV it holds (a block filled by a sequence that did not
    /// run the draft model or the MTP head holds none of theirs).
    proposer_kv: ProposerKv,
    /// Whether the target has an MTP head whose KV lives in its blocks.
    mtp: bool,
    pool: BlockPool,
    tree: Option<PrefixTree<RecurrentSnapshot>>,
    slots: StateSlots,
    /// Sequences resume only at checkpoints: the model has recurrent layers or rings.
    stateful: bool,
    /// The sliding-window layers' per-sequence rings, when the model has such layers.
    rings: Option<ring::Rings>,
    block_bytes: usize,
    /// Tokens between interval checkpoints (a multiple of the block size; 0 = none).
    checkpoint_interval: usize,
    /// The tier below memory (`--cache-dir`), when on.
    disk: Option<disk::DiskTier>,
}

fn snapshot_bytes(s: &RecurrentSnapshot) -> usize {
    s.bytes()
}

impl EngineCache {
    pub fn new(
        spec: Vec<LayerCacheSpec>,
        draft_spec: Option<Vec<LayerCacheSpec>>,
        mtp: bool,
        cfg: &EngineConfig,
        context_length: usize,
        device: &Device,
        disk: Option<disk::DiskTier>,
    ) -> Result<Self, EngineError> {
        let bs = cfg.block_size;
        if bs == 0 {
            return Err(EngineError::Config("the KV block size must be positive".into()));
        }
        let draft_block_bytes = draft_spec.as_ref().map_or(0, |d| PagedKvStore::bytes_per_block(d, bs, cfg.kv_dtype));
        let rings = ring::Rings::plan(&spec, cfg);
        let target_block_bytes = match rings {
            Some(_) => PagedKvStore::bytes_per_paged_block(&spec, bs, cfg.kv_dtype),
            None => PagedKvStore::bytes_per_block(&spec, bs, cfg.kv_dtype),
        };
        let block_bytes = target_block_bytes + draft_block_bytes;
        // On a GPU a fraction is of the device memory free now (weights already loaded) and
        // a byte budget must fit in it.
        let device_free = tandem_model::device::memory_info(device).map(|(free, _)| free as u64);
        let budget = cfg.kv_memory.bytes_on(device_free).map_err(|e| EngineError::Config(e.to_string()))?;
        if let Some(free) = device_free {
            if budget > free {
                return Err(EngineError::Config(format!(
                    "a KV memory of {budget} bytes does not fit in the {free} bytes free on {device:?}; lower --kv-memory (e.g. 0.8 for 80% of free device memory)"
                )));
            }
        }
        // The rings come first: every running sequence holds its own.
        let ring_total = rings.map_or(0, |r| (r.bytes * cfg.max_running.max(1)) as u64);
        if ring_total > 0 && ring_total + block_bytes as u64 > budget {
            return Err(EngineError::Config(format!(
                "the sliding-window layers of {} running sequences need {ring_total} bytes of KV ({} each) and the budget is {budget}; raise --kv-memory or lower --max-running",
                cfg.max_running.max(1),
                rings.map_or(0, |r| r.bytes)
            )));
        }
        let budget = budget - ring_total;
        // The most the configuration can fill: every running sequence at the full context,
        // plus one context more of cached prefixes. A bigger pool only holds memory no
        // request can use (`tandem run` holds one sequence).
        let useful = (cfg.max_running.max(1) + 1).saturating_mul(context_length.div_ceil(bs).max(1));
        let num_blocks = if block_bytes == 0 {
            // No attention layers: blocks are bookkeeping only.
            cfg.max_running * context_length.div_ceil(bs)
        } else {
            ((budget / block_bytes as u64).min(u32::MAX as u64) as usize).min(useful)
        };
        if num_blocks == 0 {
            return Err(EngineError::Config(format!(
                "a KV memory of {budget} bytes holds no block of {block_bytes} bytes ({bs} tokens); raise --kv-memory"
            )));
        }
        let checkpoint_budget = cfg.checkpoint_memory.bytes().map_err(|e| EngineError::Config(e.to_string()))?;
        let recurrent = spec.iter().any(|s| matches!(s, LayerCacheSpec::Recurrent { .. }));
        let started = std::time::Instant::now();
        let ring_blocks = rings.map_or(0, |r| r.len * cfg.max_running.max(1));
        let store = Arc::new(PagedKvStore::with_rings(&spec, num_blocks, ring_blocks, bs, cfg.kv_dtype, device)?);
        let draft = match draft_spec {
            Some(d) => {
                let st = Arc::new(PagedKvStore::new(&d, num_blocks, bs, cfg.kv_dtype, device)?);
                Some((d, st))
            }
            None => None,
        };
        tracing::info!(
            blocks = num_blocks,
            block_tokens = bs,
            dtype = %cfg.kv_dtype,
            kv_mib = (num_blocks * block_bytes) >> 20,
            ring_blocks_per_seq = rings.map_or(0, |r| r.len),
            ring_mib = ring_total >> 20,
            alloc_ms = started.elapsed().as_millis() as u64,
            prefix_cache = cfg.prefix_cache,
            "paged KV cache"
        );
        Ok(Self {
            spec,
            store,
            proposer_kv: ProposerKv::new(num_blocks, draft.is_some() || mtp),
            mtp,
            draft,
            pool: BlockPool::new(num_blocks, bs).map_err(|e| EngineError::Config(e.to_string()))?,
            tree: cfg.prefix_cache.then(|| PrefixTree::new(bs, checkpoint_budget as usize)),
            slots: StateSlots::new(cfg.max_running),
            stateful: recurrent || rings.is_some(),
            rings,
            block_bytes,
            checkpoint_interval: cfg.checkpoint_interval.div_ceil(bs) * bs,
            disk: if cfg.prefix_cache { disk } else { None },
        })
    }

    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    /// A fresh, empty cache for a new or preempted sequence.
    pub fn new_cache(&self) -> SequenceCache {
        SequenceCache::new_paged(&self.spec, self.store.clone())
    }

    /// A fresh cache for the draft model, when there is one.
    pub fn new_draft_cache(&self) -> Option<SequenceCache> {
        self.draft.as_ref().map(|(spec, store)| SequenceCache::new_paged(spec, store.clone()))
    }

    /// Hands the block table to the sequence's caches (target and draft model).
    fn sync_tables(seq: &mut Sequence) {
        seq.cache.set_block_table(seq.book.table.blocks());
        if let Some(dc) = &mut seq.spec.draft_cache {
            dc.set_block_table(seq.book.table.blocks());
        }
    }

    /// Whether a sequence that may grow to `max_len` positions can ever run alone.
    pub fn fits(&self, max_len: usize) -> bool {
        self.pool.blocks_for(max_len) < self.pool.total()
    }

    /// Blocks free now or after evicting everything unreferenced from the prefix tree.
    pub fn available_blocks(&self) -> usize {
        self.pool.free_count() + self.tree.as_ref().map_or(0, |t| t.evictable_blocks(&self.pool))
    }

    /// Block-aligned positions at which a sequence with this prompt checkpoints its
    /// recurrent state: the end of the prompt, every message boundary (also those past the
    /// prompt, reached while decoding), every interval.
    /// Plans where a new sequence checkpoints its recurrent state.
    pub fn plan_checkpoints(&self, seq: &mut Sequence) {
        seq.book.checkpoints = self.checkpoint_positions(seq.prompt_len(), seq.message_boundaries());
    }

    fn checkpoint_positions(&self, prompt_len: usize, boundaries: &[usize]) -> Vec<usize> {
        if !self.stateful || self.tree.is_none() {
            return Vec::new();
        }
        let bs = self.block_size();
        let down = |p: usize| p / bs * bs;
        let mut at = vec![down(prompt_len)];
        if prompt_len.is_multiple_of(bs) {
            // The same prompt again must recompute its last token: keep a checkpoint before it.
            at.push(prompt_len.saturating_sub(bs));
        }
        at.extend(boundaries.iter().map(|&b| down(b)));
        if let Some(n) = prompt_len.checked_div(self.checkpoint_interval) {
            at.extend((1..=n).map(|i| i * self.checkpoint_interval));
        }
        at.retain(|&p| p > 0);
        at.sort_unstable();
        at.dedup();
        at
    }

    /// Takes a state slot and starts the sequence at its longest usable cached prefix: the
    /// whole match for attention-only models, the deepest checkpoint on it for models with
    /// recurrent layers; at least one token is always left to compute, and an MTP request
    /// starts no later than the MTP head's KV goes (the head cannot rebuild it without the
    /// target's hidden states). Returns the cached tokens, or `None` when no slot is free.
    pub fn start(&mut self, seq: &mut Sequence) -> Result<Option<usize>, EngineError> {
        let Some(slot) = self.slots.acquire() else { return Ok(None) };
        seq.book.slot = Some(slot);
        seq.cache = self.new_cache();
        if let Some(r) = self.rings {
            seq.cache.set_ring(r.base(slot), r.len as u32);
        }
        let bs = self.block_size();
        let mut limit = seq.tokens().len().saturating_sub(1);
        let (mut usable, mut snapshot, mut nodes) = (0, None, Vec::new());
        // An MTP request cannot use blocks without the head's KV, which disk blocks lack.
        let mtp_request = self.mtp && seq.spec.method == SpecMethod::Mtp;
        let from_disk = if mtp_request { 0 } else { self.promote_from_disk(seq.tokens(), limit) };
        if let Some(tree) = &mut self.tree {
            let m = tree.lookup(seq.tokens());
            if self.mtp && seq.spec.method == SpecMethod::Mtp {
                limit = limit.min(self.proposer_kv.leading(&m.blocks, MTP) * bs);
            }
            if self.stateful {
                if let Some((pos, snap)) = tree.deepest_checkpoint(&m, limit) {
                    usable = pos;
                    snapshot = Some(snap.clone());
                }
            } else {
                usable = (m.blocks.len() * bs).min(limit);
            }
            let shared = self.pool.blocks_for(usable);
            seq.book.table.share_prefix(&mut self.pool, &m.blocks[..shared]).map_err(cache_err)?;
            nodes = m.nodes;
        }
        seq.cache.resume(usable, snapshot.as_ref())?;
        let draft_cache = self.new_draft_cache();
        let draft_blocks = self.proposer_kv.leading(seq.book.table.blocks(), DRAFT);
        seq.spec.reset(usable, draft_cache, (draft_blocks * bs).min(usable));
        Self::sync_tables(seq);
        seq.book.tree_blocks = usable / bs;
        seq.book.tree_node = seq.book.tree_blocks.checked_sub(1).and_then(|i| nodes.get(i).copied());
        seq.book.checkpoints.retain(|&p| p > usable);
        seq.book.disk_tokens = from_disk.min(usable);
        if let (Some(d), true) = (&self.disk, from_disk > 0) {
            d.count_hit(seq.book.disk_tokens);
        }
        Ok(Some(usable))
    }

    /// Free blocks writing the sequence's next `n` tokens takes.
    pub fn blocks_needed(&self, seq: &Sequence, n: usize) -> usize {
        let pos = seq.cache.position();
        seq.book.table.blocks_needed(&self.pool, pos, pos + n)
    }

    /// Evicts unreferenced prefix-tree blocks until `need` blocks are free; whether they are.
    pub fn make_room(&mut self, need: usize) -> bool {
        let free = self.pool.free_count();
        if need > free {
            if let Some(tree) = &mut self.tree {
                tree.evict(&mut self.pool, need - free);
            }
        }
        self.pool.free_count() >= need
    }

    /// Makes the sequence's next `n` positions writable (new blocks, copies of shared ones)
    /// and hands the block table to its cache.
    pub fn reserve(&mut self, seq: &mut Sequence, n: usize) -> Result<(), CacheError> {
        let pos = seq.cache.position();
        if n > seq.cache.ring_slack() {
            // The ring was sized for the longest chunk the scheduler makes; a longer one would
            // overwrite keys its own first queries still see.
            return Err(CacheError::Config(format!(
                "a chunk of {n} tokens is longer than the sliding-window ring's slack of {}",
                seq.cache.ring_slack()
            )));
        }
        let copies = seq.book.table.prepare_write(&mut self.pool, pos, pos + n)?;
        // These blocks are about to be written; the proposers' part is unknown until `commit`
        // sees how far their KV goes.
        let bs = self.pool.block_size();
        let first = pos / bs;
        let end = (pos + n).div_ceil(bs).min(seq.book.table.blocks().len());
        self.proposer_kv.clear(&seq.book.table.blocks()[first.min(end)..end]);
        for c in copies {
            let draft = self.draft.as_ref().map(|(_, st)| st.copy_block(c.src, c.dst));
            if let Err(e) = self.store.copy_block(c.src, c.dst).and(draft.unwrap_or(Ok(()))) {
                tracing::error!("copy-on-write of KV block {} failed: {e}", c.src);
                return Err(CacheError::NotAllocated(c.src));
            }
        }
        Self::sync_tables(seq);
        Ok(())
    }

    /// After a forward pass: caches the sequence's newly filled blocks in the prefix tree and
    /// checkpoints its recurrent state if it stands at a checkpoint position.
    pub fn commit(&mut self, seq: &mut Sequence) {
        let Some(tree) = &mut self.tree else { return };
        let bs = self.pool.block_size();
        let pos = seq.cache.position();
        if pos > seq.tokens().len() {
            return; // a failed step left the cache ahead of the tokens: nothing to publish
        }
        if let Some(dc) = &seq.spec.draft_cache {
            let full = (dc.position().min(pos) / bs).min(seq.book.table.blocks().len());
            self.proposer_kv.mark(&seq.book.table.blocks()[..full], DRAFT);
        }
        if self.mtp && seq.spec.method == SpecMethod::Mtp {
            let full = (seq.spec.mtp_pos.min(pos) / bs).min(seq.book.table.blocks().len());
            self.proposer_kv.mark(&seq.book.table.blocks()[..full], MTP);
        }
        // Blocks are published once every model's KV in them is written.
        let written = seq.spec.written_up_to(pos);
        let mut persist = Vec::new();
        while !seq.book.tree_stuck && seq.book.tree_blocks < written / bs {
            let i = seq.book.tree_blocks;
            let tokens = &seq.tokens()[i * bs..(i + 1) * bs];
            let Some(&block) = seq.book.table.blocks().get(i) else { break };
            match tree.insert(&mut self.pool, seq.book.tree_node, tokens, block) {
                Ok(Some(node)) => {
                    // The same tokens were cached by a sequence that did not run this one's
                    // proposer: the node takes this block, which holds that proposer's KV too.
                    if tree.node_block(node).is_some_and(|old| self.proposer_kv.richer(block, old)) {
                        if let Err(e) = tree.replace_block(&mut self.pool, node, block) {
                            tracing::warn!("prefix cache block swap failed: {e}");
                        }
                    }
                    seq.book.tree_node = Some(node);
                    seq.book.tree_blocks += 1;
                    persist.push((i, block));
                }
                Ok(None) => seq.book.tree_stuck = true,
                Err(CacheError::StaleNode) => {
                    // The node we hung below was evicted: walk again from the root.
                    let end = (i + 1) * bs;
                    let path = tree.insert_chain(&mut self.pool, &seq.tokens()[..end], &seq.book.table.blocks()[..=i]);
                    match path {
                        Ok(p) if p.len() == i + 1 => {
                            seq.book.tree_node = p.last().copied();
                            seq.book.tree_blocks += 1;
                        }
                        _ => seq.book.tree_stuck = true,
                    }
                }
                Err(e) => {
                    tracing::warn!("prefix cache insert failed: {e}");
                    seq.book.tree_stuck = true;
                }
            }
        }
        self.persist_blocks(&mut seq.book, &seq.tokens, &persist);
        while seq.book.checkpoints.first().is_some_and(|&p| p < pos) {
            seq.book.checkpoints.remove(0);
        }
        let aligned = pos.is_multiple_of(bs) && !seq.book.tree_stuck && seq.book.tree_blocks == pos / bs;
        if self.stateful && aligned && pos > seq.prompt_len() {
            if let Some(node) = seq.book.tree_node {
                // Ring windows are copied only when the request finishes (the ring still holds
                // them then): copying them at every block boundary would cost a window per
                // block of output.
                match seq.cache.snapshot().detached() {
                    Ok(snap) => seq.book.decode_checkpoint = Some((node, snap)),
                    Err(e) => tracing::warn!("generated-token checkpoint at position {pos} not taken: {e}"),
                }
            }
        }
        if seq.book.checkpoints.first() == Some(&pos) && !seq.book.tree_stuck && seq.book.tree_blocks == pos / bs {
            seq.book.checkpoints.remove(0);
            if let Some(node) = seq.book.tree_node {
                let snap = match seq.cache.checkpoint() {
                    Ok(snap) => snap,
                    Err(e) => {
                        tracing::warn!("checkpoint at position {pos} not taken: {e}");
                        return;
                    }
                };
                let bytes = snapshot_bytes(&snap);
                self.persist_checkpoint(&mut seq.book, &seq.tokens, &snap);
                let Some(tree) = &mut self.tree else { return };
                if let Err(e) = tree.attach_checkpoint(node, snap, bytes) {
                    tracing::warn!("checkpoint at position {pos} not kept: {e}");
                }
            }
        }
    }

    /// Keeps a finished sequence's last generated-token checkpoint (see
    /// [`Sequence::decode_checkpoint`]) in the prefix tree.
    pub fn keep_decode_checkpoint(&mut self, seq: &mut Sequence) {
        let Some((node, mut snap)) = seq.book.decode_checkpoint.take() else { return };
        if self.rings.is_some() {
            match seq.cache.window_rows(snap.position) {
                Ok(w) => snap.windows = w,
                Err(e) => {
                    tracing::debug!("generated-token checkpoint not kept: {e}");
                    return;
                }
            }
        }
        self.persist_checkpoint(&mut seq.book, &seq.tokens, &snap);
        let Some(tree) = &mut self.tree else { return };
        let bytes = snapshot_bytes(&snap);
        if let Err(e) = tree.attach_checkpoint(node, snap, bytes) {
            tracing::debug!("generated-token checkpoint not kept: {e}");
        }
    }

    /// Gives back everything the sequence holds; its cache is left empty.
    pub fn release(&mut self, seq: &mut Sequence) {
        if let Err(e) = seq.book.table.release(&mut self.pool) {
            tracing::error!("releasing KV blocks failed: {e}");
        }
        if let Some(slot) = seq.book.slot.take() {
            if let Err(e) = self.slots.release(slot) {
                tracing::error!("releasing a state slot failed: {e}");
            }
        }
        seq.cache = self.new_cache();
        seq.spec.reset(0, None, 0);
        seq.book.decode_checkpoint = None;
        seq.book.tree_blocks = 0;
        seq.book.tree_node = None;
        seq.book.tree_stuck = false;
        seq.book.disk_keys.clear();
        seq.book.disk_tokens = 0;
    }

    /// Bytes of KV blocks, rings and recurrent state a live sequence holds.
    pub fn seq_bytes(&self, seq: &Sequence) -> usize {
        let ring = match (self.rings, seq.book.slot) {
            (Some(r), Some(_)) => r.bytes,
            _ => 0,
        };
        seq.book.table.blocks().len() * self.block_bytes + ring + seq.cache.allocated_bytes()
    }

    pub fn stats(&self) -> CacheStats {
        let tree = self.tree.as_ref();
        CacheStats {
            blocks_total: self.pool.total(),
            blocks_free: self.pool.free_count(),
            block_bytes: self.block_bytes,
            tree_blocks: tree.map_or(0, |t| t.node_count()),
            slots_total: self.slots.total(),
            slots_free: self.slots.free_count(),
            checkpoints: tree.map_or(0, |t| t.checkpoint_count()),
            checkpoint_bytes: tree.map_or(0, |t| t.checkpoint_bytes()),
            ring_bytes: self.rings.map_or(0, |r| r.bytes),
        }
    }
}

fn cache_err(e: CacheError) -> EngineError {
    EngineError::Config(format!("cache bookkeeping: {e}"))
}
