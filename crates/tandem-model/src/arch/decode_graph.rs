//! Decode steps as CUDA graphs ([`crate::ops::cuda_graph`]), for every architecture: a batch of
//! sequences taking one token each, no verify lanes, every sequence paged in one store.
//!
//! One graph per (batch size, segment bucket, KV store): the bucket is the most 256-key
//! attention segments a sequence of the batch spans, rounded up to a power of two, so a
//! sequence's growing context needs a new graph only at 256, 512, 1K, 2K, ... keys. The
//! architecture's graph body queues the launches of its batched eager decode, reading what
//! changes from step to step out of input buffers rewritten before each launch: token ids, the
//! RoPE rows of the positions, the batch's block tables and KV slots
//! ([`BatchTables::in_buffer`]), and for recurrent layers the addresses of every sequence's
//! input state and of the buffer its next state goes to (`arch/qwen_hybrid/graph.rs`). Each
//! row then gets the bits of the eager step (check-device's `decode graph` rows compare them
//! over many steps). The eager path runs whenever a step does not fit, a capture fails (logged
//! once per shape), or `TANDEM_CUDA_GRAPHS=0`.

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
const MAX_GRAPHS: usize = 16;
/// Largest batch that runs as a graph.
const MAX_BATCH: usize = 256;

/// A model's captured decode graphs.
#[derive(Default)]
pub struct DecodeGraphs {
    inner: Mutex<Inner>,
    launches: AtomicUsize,
}

#[derive(Default)]
struct Inner {
    entries: Vec<Entry>,
    /// Shapes (batch, bucket) whose capture failed: they stay eager.
    failed: Vec<(usize, usize)>,
    clock: u64,
}

struct Entry {
    bsz: usize,
    nsplit: usize,
    store: Weak<PagedKvStore>,
    graph: Graph,
    inputs: Inputs,
    used: u64,
}

/// A graph's input buffers (rewritten before each launch) and its logits.
pub struct Inputs {
    /// `[B]` u32.
    pub ids: Tensor,
    /// `[B, rot / 2]` f32 each.
    pub cos: Tensor,
    pub sin: Tensor,
    /// The batch's attention tables for every attention layer.
    pub tables: BatchTables,
    attn: Tensor,
    /// Recurrent layers' state addresses (i64; the architecture lays them out), if any.
    pub states: Tensor,
    /// `[B, columns]` f32, written by the graph.
    pub logits: Tensor,
}

/// A decode step that fits a graph, as [`plan`] finds it.
pub struct Step {
    pub store: Arc<PagedKvStore>,
    pub bsz: usize,
    /// Segment bucket.
    pub nsplit: usize,
    /// Token ids, positions and the attention tables' values.
    pub ids: Vec<u32>,
    pub positions: Vec<usize>,
    attn: Vec<u32>,
}

/// Whether `chunks` fit a decode graph (one token each within `vocab`, logits of it, no verify,
/// one paged store whose layers `attention` (by index) all have the batched kernels): the step
/// with its tables laid out (an error where a block table cannot hold the step, as the eager
/// step would fail).
pub fn plan(chunks: &[SeqChunk<'_>], vocab: usize, attention: &[usize]) -> Result<Option<Step>> {
    let bsz = chunks.len();
    if !cuda_graph::enabled() || bsz == 0 || bsz > MAX_BATCH {
        return Ok(None);
    }
    let Some(store) = chunks[0].cache.paged_store().cloned() else { return Ok(None) };
    let fits = chunks.iter().all(|c| {
        c.tokens.len() == 1
            && (c.tokens[0] as usize) < vocab
            && c.logits == LogitsWanted::Last
            && c.cache.verify.is_none()
            && c.cache.paged_store().is_some_and(|s| Arc::ptr_eq(s, &store))
    });
    // Ring layers (sliding windows) index other tables than the one a graph step uploads.
    if !fits || store.has_rings() || !attention.iter().all(|&li| store.batches(li)) {
        return Ok(None);
    }
    let seqs: Vec<SeqRows<'_>> =
        chunks.iter().map(|c| SeqRows { blocks: c.cache.block_table(), past: c.cache.position(), t: 1 }).collect();
    let (attn, shape) = BatchTables::layout(&seqs, store.block_size(), store.num_blocks())?;
    drop(seqs);
    Ok(Some(Step {
        store,
        bsz,
        nsplit: shape.nsplit.next_power_of_two(),
        ids: chunks.iter().map(|c| c.tokens[0]).collect(),
        positions: chunks.iter().map(|c| c.cache.position()).collect(),
        attn,
    }))
}

/// The shape of a model's graph inputs: RoPE half width, state words per step, logit columns.
pub struct Shape {
    pub rope_half: usize,
    pub state_words: usize,
    pub columns: usize,
}

impl DecodeGraphs {
    /// Steps run as graphs so far.
    pub fn launches(&self) -> usize {
        self.launches.load(Ordering::Relaxed)
    }

    /// Whether `step`'s shape failed to capture before (it runs eagerly: check before making
    /// anything for the launch).
    pub fn stays_eager(&self, step: &Step) -> bool {
        self.inner.lock().is_ok_and(|i| i.failed.contains(&(step.bsz, step.nsplit)))
    }

    /// Launches `step`'s graph (capturing `body` first when this shape has none) with the
    /// RoPE rows `(cos, sin)` and the recurrent layers' `states` words written to its inputs;
    /// returns a copy of its logits `[B, columns]`. `None`: the capture failed (now or
    /// before), nothing ran; the caller runs the eager step.
    pub fn run(
        &self,
        dev: &CudaDevice,
        step: &Step,
        shape: &Shape,
        (cos, sin): (&[f32], &[f32]),
        states: &[i64],
        body: impl Fn(&Inputs) -> Result<()>,
    ) -> Result<Option<Tensor>> {
        let (bsz, nsplit) = (step.bsz, step.nsplit);
        let mut inner = self.inner.lock().map_err(|_| ModelError::Input("decode graph cache poisoned".into()))?;
        if inner.failed.contains(&(bsz, nsplit)) {
            return Ok(None);
        }
        inner.clock += 1;
        let clock = inner.clock;
        inner.entries.retain(|e| e.store.strong_count() > 0);
        let same =
            |e: &Entry| e.bsz == bsz && e.nsplit == nsplit && std::ptr::eq(e.store.as_ptr(), Arc::as_ptr(&step.store));
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
                        tracing::debug!(bsz, nsplit, ms = t0.elapsed().as_secs_f64() * 1e3, "captured a decode graph");
                        if inner.entries.len() >= MAX_GRAPHS {
                            if let Some(old) = (0..inner.entries.len()).min_by_key(|&i| inner.entries[i].used) {
                                inner.entries.swap_remove(old);
                            }
                        }
                        let store = Arc::downgrade(&step.store);
                        inner.entries.push(Entry { bsz, nsplit, store, graph, inputs, used: clock });
                        inner.entries.len() - 1
                    }
                    Err(e) => {
                        tracing::warn!("decode steps of {bsz} sequences ({nsplit} segments) stay eager: {e}");
                        inner.failed.push((bsz, nsplit));
                        return Ok(None);
                    }
                }
            }
        };
        let entry = &mut inner.entries[idx];
        entry.used = clock;
        entry.graph.launch()?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        // A copy: the graph's own buffer is rewritten by its next launch.
        Ok(Some(entry.inputs.logits.copy()?))
    }
}

impl Inputs {
    fn new(dev: &CudaDevice, step: &Step, shape: &Shape) -> Result<Self> {
        let d = Device::Cuda(dev.clone());
        let (bsz, nsplit) = (step.bsz, step.nsplit);
        let words = 5 * bsz + bsz * (nsplit * SPLIT).div_ceil(step.store.block_size().max(1));
        let attn = Tensor::zeros(words, DType::U32, &d)?;
        Ok(Self {
            ids: Tensor::zeros(bsz, DType::U32, &d)?,
            cos: Tensor::zeros((bsz, shape.rope_half), DType::F32, &d)?,
            sin: Tensor::zeros((bsz, shape.rope_half), DType::F32, &d)?,
            tables: BatchTables::in_buffer(attn.clone(), bsz, bsz, 1, nsplit),
            attn,
            states: Tensor::zeros(shape.state_words.max(1), DType::I64, &d)?,
            logits: Tensor::zeros((bsz, shape.columns), DType::F32, &d)?,
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
