//! Decode and verify steps as CUDA graphs ([`crate::ops::cuda_graph`]), for every
//! architecture: a batch of sequences taking the same number of tokens each (one: a decode
//! step; up to [`MAX_T`]: a speculative verify step, every position's logits, recurrent layers
//! recording each token's state), every sequence paged in one store.
//!
//! One graph per (batch size, tokens per sequence, verify mode, segment bucket, KV store): the
//! bucket is the most 256-key attention segments a sequence of the batch spans, rounded up to
//! a power of two, so a sequence's growing context needs a new graph only at 256, 512, 1K, 2K,
//! ... keys. The architecture's graph body queues the launches of its batched eager forward,
//! reading what changes from step to step out of input buffers rewritten before each launch:
//! token ids, the RoPE rows of the positions, the batch's block tables and KV slots
//! ([`BatchTables::in_buffer`]), and for recurrent layers the addresses of every sequence's
//! input state and of the buffers its next state (and in a verify step, its per-token states)
//! go to (`arch/qwen_hybrid/graph.rs`). Each row then gets the bits of the eager step
//! (check-device's `decode graph` and `verify graph` rows compare them over many steps). The
//! eager path runs whenever a step does not fit, a capture fails (logged once per shape), or
//! `TANDEM_CUDA_GRAPHS=0`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use candle_core::cuda_backend::CudaDevice;
use candle_core::{DType, Device, Tensor};

use crate::batch::{LogitsWanted, SeqChunk};
use crate::error::{ModelError, Result};
use crate::kv::PagedKvStore;
use crate::ops::cuda_graph::{self, Graph};
use crate::ops::cuda_util::write_host;
use crate::ops::paged_attention::cuda_batch::{BatchTables, SeqRows, SPLIT};

/// Graphs kept at most; the least recently used goes first.
const MAX_GRAPHS: usize = 32;
/// Largest batch that runs as a graph.
const MAX_BATCH: usize = 256;
/// Most tokens per sequence a graph step takes (a verify step of `k` drafts takes `k + 1`).
pub const MAX_T: usize = 16;
/// Most rows (tokens over the batch) a graph step takes.
const MAX_ROWS: usize = 256;

/// What a captured graph is for: steps of the same key replay it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Key {
    bsz: usize,
    /// Tokens per sequence.
    t: usize,
    /// Caches in verify mode (recurrent layers keep every token's state).
    verify: bool,
    /// Segment bucket.
    nsplit: usize,
}

/// A model's captured decode graphs.
#[derive(Default)]
pub struct DecodeGraphs {
    inner: Mutex<Inner>,
    launches: AtomicUsize,
}

#[derive(Default)]
struct Inner {
    entries: Vec<Entry>,
    /// Shapes whose capture failed: they stay eager.
    failed: Vec<Key>,
    clock: u64,
}

struct Entry {
    key: Key,
    store: Weak<PagedKvStore>,
    graph: Graph,
    inputs: Inputs,
    used: u64,
}

/// A graph's input buffers (rewritten before each launch) and its logits.
pub struct Inputs {
    /// `[B T]` u32.
    pub ids: Tensor,
    /// `[B T, rot / 2]` f32 each.
    pub cos: Tensor,
    pub sin: Tensor,
    /// The batch's attention tables for every attention layer.
    pub tables: BatchTables,
    attn: Tensor,
    /// Recurrent layers' state addresses (i64; the architecture lays them out), if any.
    pub states: Tensor,
    /// `[B T, columns]` f32, written by the graph.
    pub logits: Tensor,
    /// `[B T, hidden]` f32, the final-normed hidden states, where the model asked for them
    /// ([`Shape::hidden`]: an MTP head's input).
    pub hidden: Option<Tensor>,
}

/// A decode or verify step that fits a graph, as [`plan`] finds it.
pub struct Step {
    pub store: Arc<PagedKvStore>,
    pub bsz: usize,
    /// Tokens per sequence.
    pub t: usize,
    /// Whether the caches are in verify mode.
    pub verify: bool,
    /// Segment bucket.
    pub nsplit: usize,
    /// Token ids and positions (`[B T]`, sequence after sequence) and the attention tables'
    /// values.
    pub ids: Vec<u32>,
    pub positions: Vec<usize>,
    attn: Vec<u32>,
}

impl Step {
    fn key(&self) -> Key {
        Key { bsz: self.bsz, t: self.t, verify: self.verify, nsplit: self.nsplit }
    }

    /// Each chunk's logits `[t, columns]` out of a graph's `[B t, columns]`.
    pub fn per_chunk(&self, logits: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok((0..self.bsz).map(|i| logits.narrow(0, i * self.t, self.t).map(Some)).collect::<candle_core::Result<_>>()?)
    }
}

/// Whether `chunks` fit a graph step (the same number of tokens each, at most [`MAX_T`], within
/// `vocab`; a single token's logits, or every token's; all caches in verify mode or none; one
/// paged store whose layers `attention` (by index) all have the batched kernels): the step
/// with its tables laid out (an error where a block table cannot hold the step, as the eager
/// step would fail).
pub fn plan(chunks: &[SeqChunk<'_>], vocab: usize, attention: &[usize]) -> Result<Option<Step>> {
    let bsz = chunks.len();
    if !cuda_graph::enabled() || bsz == 0 || bsz > MAX_BATCH {
        return Ok(None);
    }
    let Some(store) = chunks[0].cache.paged_store().cloned() else { return Ok(None) };
    let t = chunks[0].tokens.len();
    let verify = chunks[0].cache.verify.is_some();
    if t == 0 || t > MAX_T || bsz * t > MAX_ROWS {
        return Ok(None);
    }
    let fits = chunks.iter().all(|c| {
        c.tokens.len() == t
            && c.tokens.iter().all(|&id| (id as usize) < vocab)
            && (c.logits == LogitsWanted::All || (t == 1 && c.logits == LogitsWanted::Last))
            && c.cache.verify.is_some() == verify
            && c.cache.paged_store().is_some_and(|s| Arc::ptr_eq(s, &store))
    });
    // Ring layers (sliding windows) index other tables than the one a graph step uploads.
    if !fits || store.has_rings() || !attention.iter().all(|&li| store.batches(li)) {
        return Ok(None);
    }
    let seqs: Vec<SeqRows<'_>> =
        chunks.iter().map(|c| SeqRows { blocks: c.cache.block_table(), past: c.cache.position(), t }).collect();
    let (attn, shape) = BatchTables::layout(&seqs, store.block_size(), store.num_blocks())?;
    drop(seqs);
    Ok(Some(Step {
        store,
        bsz,
        t,
        verify,
        nsplit: shape.nsplit.next_power_of_two(),
        ids: chunks.iter().flat_map(|c| c.tokens.iter().copied()).collect(),
        positions: chunks.iter().flat_map(|c| (0..t).map(|i| c.cache.position() + i)).collect(),
        attn,
    }))
}

/// The shape of a model's graph inputs: RoPE half width, state words per step, logit columns,
/// and the hidden width when the graph also keeps the final-normed hidden states (0: not).
pub struct Shape {
    pub rope_half: usize,
    pub state_words: usize,
    pub columns: usize,
    pub hidden: usize,
}

/// A graph step's outputs: copies of its logits `[B T, columns]` and, where the shape asked,
/// of its hidden states `[B T, hidden]`.
pub struct Outputs {
    pub logits: Tensor,
    pub hidden: Option<Tensor>,
}

impl DecodeGraphs {
    /// Steps (decode and verify) run as graphs so far.
    pub fn launches(&self) -> usize {
        self.launches.load(Ordering::Relaxed)
    }

    /// Whether `step`'s shape failed to capture before (it runs eagerly: check before making
    /// anything for the launch).
    pub fn stays_eager(&self, step: &Step) -> bool {
        self.inner.lock().is_ok_and(|i| i.failed.contains(&step.key()))
    }

    /// Launches `step`'s graph (capturing `body` first when this shape has none) with the
    /// RoPE rows `(cos, sin)` and the recurrent layers' `states` words written to its inputs;
    /// returns copies of its outputs. `None`: the capture failed (now or before), nothing ran;
    /// the caller runs the eager step.
    pub fn run(
        &self,
        dev: &CudaDevice,
        step: &Step,
        shape: &Shape,
        (cos, sin): (&[f32], &[f32]),
        states: &[i64],
        body: impl Fn(&Inputs) -> Result<()>,
    ) -> Result<Option<Outputs>> {
        let key = step.key();
        let mut inner = self.inner.lock().map_err(|_| ModelError::Input("decode graph cache poisoned".into()))?;
        if inner.failed.contains(&key) {
            return Ok(None);
        }
        inner.clock += 1;
        let clock = inner.clock;
        inner.entries.retain(|e| e.store.strong_count() > 0);
        let same = |e: &Entry| e.key == key && std::ptr::eq(e.store.as_ptr(), Arc::as_ptr(&step.store));
        let idx = match inner.entries.iter().position(same) {
            Some(i) => {
                inner.entries[i].inputs.write(step, cos, sin, states)?;
                i
            }
            None => {
                let inputs = Inputs::new(dev, step, shape)?;
                inputs.write(step, cos, sin, states)?;
                let t0 = std::time::Instant::now();
                match cuda_graph::capture(dev, || body(&inputs)) {
                    Ok(graph) => {
                        tracing::debug!(?key, ms = t0.elapsed().as_secs_f64() * 1e3, "captured a step graph");
                        if inner.entries.len() >= MAX_GRAPHS {
                            if let Some(old) = (0..inner.entries.len()).min_by_key(|&i| inner.entries[i].used) {
                                inner.entries.swap_remove(old);
                            }
                        }
                        let store = Arc::downgrade(&step.store);
                        inner.entries.push(Entry { key, store, graph, inputs, used: clock });
                        inner.entries.len() - 1
                    }
                    Err(e) => {
                        tracing::warn!(
                            "steps of {} sequences x {} tokens ({} segments{}) stay eager: {e}",
                            key.bsz,
                            key.t,
                            key.nsplit,
                            if key.verify { ", verify" } else { "" }
                        );
                        inner.failed.push(key);
                        return Ok(None);
                    }
                }
            }
        };
        let entry = &mut inner.entries[idx];
        entry.used = clock;
        entry.graph.launch()?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        // Copies: the graph's own buffers are rewritten by its next launch.
        let hidden = entry.inputs.hidden.as_ref().map(Tensor::copy).transpose()?;
        Ok(Some(Outputs { logits: entry.inputs.logits.copy()?, hidden }))
    }
}

impl Inputs {
    fn new(dev: &CudaDevice, step: &Step, shape: &Shape) -> Result<Self> {
        let d = Device::Cuda(dev.clone());
        let (bsz, nsplit) = (step.bsz, step.nsplit);
        let rows = bsz * step.t;
        // [meta 4 per sequence | a slot per row | each sequence's table for the bucket's keys]
        let words = 4 * bsz + rows + bsz * (nsplit * SPLIT).div_ceil(step.store.block_size().max(1));
        let attn = Tensor::zeros(words, DType::U32, &d)?;
        let hidden = (shape.hidden > 0).then(|| Tensor::zeros((rows, shape.hidden), DType::F32, &d)).transpose()?;
        Ok(Self {
            ids: Tensor::zeros(rows, DType::U32, &d)?,
            cos: Tensor::zeros((rows, shape.rope_half), DType::F32, &d)?,
            sin: Tensor::zeros((rows, shape.rope_half), DType::F32, &d)?,
            tables: BatchTables::in_buffer(attn.clone(), bsz, rows, step.t, nsplit),
            attn,
            states: Tensor::zeros(shape.state_words.max(1), DType::I64, &d)?,
            logits: Tensor::zeros((rows, shape.columns), DType::F32, &d)?,
            hidden,
        })
    }

    fn write(&self, step: &Step, cos: &[f32], sin: &[f32], states: &[i64]) -> Result<()> {
        write_host(&self.ids, &step.ids)?;
        write_host(&self.cos, cos)?;
        write_host(&self.sin, sin)?;
        write_host(&self.attn, &step.attn)?;
        write_host(&self.states, states)
    }
}
