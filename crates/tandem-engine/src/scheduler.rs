//! The engine loop: queues requests, admits them first come first served when a state slot
//! and KV blocks are available (after a prefix-cache lookup), builds one ragged batch per step
//! (one decode token per running sequence, then prefill chunks under the token budget, cut at
//! checkpoint positions), reserves blocks for it (evicting unreferenced prefix-cache blocks,
//! then preempting the youngest sequences by recompute), runs the model, publishes new blocks
//! and checkpoints to the prefix cache, samples, applies stop rules and streams events.
//! A failing step fails only the sequences in it.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::cache::EngineCache;
use crate::engine::{EngineConfig, EngineError, EngineStats};
use crate::request::{GenerateRequest, GenerationEvent};
use crate::sampler::Sampler;
use crate::sequence::Sequence;

/// A validated request on its way to the engine thread.
pub(crate) struct Submission {
    pub req: GenerateRequest,
    pub sampler: Sampler,
    pub stop_ids: Vec<u32>,
    pub events: mpsc::Sender<GenerationEvent>,
    pub submitted: Instant,
}

pub(crate) struct Scheduler {
    model: Box<dyn CausalLm>,
    tokenizer: Arc<Tokenizer>,
    cfg: EngineConfig,
    context_length: usize,
    stats: Arc<EngineStats>,
    cache: EngineCache,
    /// Queued and preempted sequences, in admission order.
    waiting: VecDeque<Sequence>,
    /// Admitted sequences, oldest first.
    running: Vec<Sequence>,
}

impl Scheduler {
    pub fn new(
        model: Box<dyn CausalLm>,
        tokenizer: Arc<Tokenizer>,
        cfg: EngineConfig,
        context_length: usize,
        stats: Arc<EngineStats>,
    ) -> Result<Self, EngineError> {
        let cache = EngineCache::new(model.cache_spec(), &cfg, context_length, model.device())?;
        let s =
            Self { model, tokenizer, cfg, context_length, stats, cache, waiting: VecDeque::new(), running: Vec::new() };
        s.publish_stats();
        Ok(s)
    }

    /// Runs until every handle is gone and no work is left.
    pub fn run(mut self, rx: std_mpsc::Receiver<Submission>) {
        loop {
            // Block only when idle; otherwise take what has arrived.
            if self.running.is_empty() && self.waiting.is_empty() {
                match rx.recv() {
                    Ok(sub) => self.enqueue(sub),
                    Err(_) => return,
                }
            }
            while self.waiting.len() < self.cfg.max_queue {
                match rx.try_recv() {
                    Ok(sub) => self.enqueue(sub),
                    Err(_) => break,
                }
            }
            self.drop_cancelled();
            self.admit();
            if self.running.is_empty() {
                if !self.waiting.is_empty() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            } else {
                self.step();
            }
            self.retire_finished();
            self.publish_stats();
        }
    }

    fn enqueue(&mut self, sub: Submission) {
        let mut seq = Sequence::new(sub, self.cache.new_cache());
        seq.checkpoints = self.cache.checkpoint_positions(seq.prompt_len(), &seq.message_boundaries);
        self.waiting.push_back(seq);
    }

    /// Admits waiting sequences in order while slots and blocks allow.
    fn admit(&mut self) {
        while let Some(mut seq) = self.waiting.pop_front() {
            if !self.cache.fits(seq.max_len(self.context_length)) {
                seq.fail("the request needs more KV memory than the whole pool has; raise --kv-memory");
                self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            if self.running.len() >= self.cfg.max_running {
                self.waiting.push_front(seq);
                break;
            }
            let cached = match self.cache.start(&mut seq) {
                Ok(Some(c)) => c,
                Ok(None) => {
                    self.waiting.push_front(seq);
                    break;
                }
                Err(e) => {
                    seq.fail(&format!("cannot start the request: {e}"));
                    self.cache.release(&mut seq);
                    self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
                    continue;
                }
            };
            // Room for the first chunk, plus a block for each running sequence's next decode.
            let first = seq.pending().min(self.cfg.prefill_chunk);
            let need = self.cache.blocks_needed(&seq, first) + self.running.len();
            if !self.running.is_empty() && need > self.cache.available_blocks() {
                self.cache.release(&mut seq);
                self.waiting.push_front(seq);
                break;
            }
            if !seq.admitted_before {
                seq.admitted_before = true;
                seq.cached_tokens = cached;
                self.stats.prompt_tokens.fetch_add(seq.prompt_len(), Ordering::Relaxed);
                self.stats.prefix_hit_tokens.fetch_add(cached, Ordering::Relaxed);
            }
            self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
            self.stats.running.fetch_add(1, Ordering::Relaxed);
            self.running.push(seq);
        }
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].events.is_closed() {
                let mut s = self.running.remove(i);
                self.cache.release(&mut s);
                self.stats.running.fetch_sub(1, Ordering::Relaxed);
                self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            } else {
                i += 1;
            }
        }
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.events.is_closed());
        let gone = before - self.waiting.len();
        if gone > 0 {
            self.stats.waiting.fetch_sub(gone, Ordering::Relaxed);
            self.stats.cancelled.fetch_add(gone, Ordering::Relaxed);
        }
    }

    fn retire_finished(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].finished {
                let mut s = self.running.remove(i);
                self.cache.release(&mut s);
                self.stats.running.fetch_sub(1, Ordering::Relaxed);
                self.stats.finished.fetch_add(1, Ordering::Relaxed);
            } else {
                i += 1;
            }
        }
    }

    fn publish_stats(&self) {
        let c = self.cache.stats();
        let st = &self.stats;
        let kv: usize = self.running.iter().map(|s| self.cache.seq_bytes(s)).sum();
        st.kv_bytes.store(kv, Ordering::Relaxed);
        st.kv_blocks_total.store(c.blocks_total, Ordering::Relaxed);
        st.kv_blocks_free.store(c.blocks_free, Ordering::Relaxed);
        st.kv_block_bytes.store(c.block_bytes, Ordering::Relaxed);
        st.prefix_cache_blocks.store(c.tree_blocks, Ordering::Relaxed);
        st.state_slots_total.store(c.slots_total, Ordering::Relaxed);
        st.state_slots_free.store(c.slots_free, Ordering::Relaxed);
        st.checkpoints.store(c.checkpoints, Ordering::Relaxed);
        st.checkpoint_bytes.store(c.checkpoint_bytes, Ordering::Relaxed);
    }

    /// Tokens each running sequence feeds this step: decodes first (one token each, latency
    /// matters), then prefill chunks in admission order under the token budget, each cut at
    /// the sequence's next checkpoint position.
    fn plan_tokens(&self) -> Vec<usize> {
        let mut budget = self.cfg.max_batch_tokens;
        let mut want = vec![0; self.running.len()];
        for (i, s) in self.running.iter().enumerate() {
            if s.pending() == 1 && budget > 0 {
                want[i] = 1;
                budget -= 1;
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            let pending = s.pending();
            if pending > 1 && budget > 0 {
                let pos = s.cache.position();
                let mut n = pending.min(self.cfg.prefill_chunk).min(budget);
                if let Some(&cp) = s.checkpoints.iter().find(|&&c| c > pos) {
                    n = n.min(cp - pos);
                }
                want[i] = n;
                budget -= n;
            }
        }
        want
    }

    /// Reserves blocks for the plan in admission order. When the pool runs dry it evicts
    /// unreferenced prefix-cache blocks, then preempts the youngest running sequences (the
    /// current one last). Returns which sequences were preempted.
    fn reserve(&mut self, want: &mut [usize]) -> Vec<bool> {
        let mut preempted = vec![false; self.running.len()];
        for i in 0..self.running.len() {
            if want[i] == 0 || preempted[i] {
                continue;
            }
            loop {
                let need = self.cache.blocks_needed(&self.running[i], want[i]);
                if self.cache.make_room(need) {
                    if let Err(e) = self.cache.reserve(&mut self.running[i], want[i]) {
                        self.running[i].fail(&format!("KV reservation failed: {e}"));
                        want[i] = 0;
                    }
                    break;
                }
                let Some(victim) = (0..self.running.len()).rev().find(|&j| !preempted[j]) else { break };
                preempted[victim] = true;
                want[victim] = 0;
                self.cache.release(&mut self.running[victim]);
                self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(victim, "out of KV blocks: preempting a sequence for recompute");
                if victim == i {
                    break;
                }
            }
        }
        preempted
    }

    /// One forward pass over the running sequences.
    fn step(&mut self) {
        let mut want = self.plan_tokens();
        let preempted = self.reserve(&mut want);
        let plan: Vec<(usize, usize, LogitsWanted)> = want
            .iter()
            .enumerate()
            .filter(|&(i, &n)| n > 0 && !preempted[i] && !self.running[i].finished)
            .map(|(i, &n)| {
                let s = &self.running[i];
                let last = s.cache.position() + n == s.tokens().len();
                (i, n, if last { LogitsWanted::Last } else { LogitsWanted::None })
            })
            .collect();
        if !plan.is_empty() {
            self.forward(&plan);
        }
        // Preempted sequences go back to the front of the queue, oldest first.
        for i in (0..self.running.len()).rev() {
            if preempted[i] {
                let s = self.running.remove(i);
                self.waiting.push_front(s);
                self.stats.running.fetch_sub(1, Ordering::Relaxed);
                self.stats.waiting.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn forward(&mut self, plan: &[(usize, usize, LogitsWanted)]) {
        let started = Instant::now();
        let result = {
            let mut chunks: Vec<SeqChunk<'_>> = Vec::with_capacity(plan.len());
            let mut plan_iter = plan.iter().peekable();
            for (i, s) in self.running.iter_mut().enumerate() {
                if let Some(&&(pi, n, wanted)) = plan_iter.peek() {
                    if pi == i {
                        plan_iter.next();
                        let (tokens, cache) = s.next_input(n);
                        chunks.push(SeqChunk { tokens, cache, logits: wanted });
                    }
                }
            }
            let model = &self.model;
            catch_unwind(AssertUnwindSafe(|| model.forward(&mut chunks)))
        };
        let elapsed = started.elapsed().as_secs_f64();
        let logits = match result {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return self.fail(plan, &format!("forward pass failed: {e}")),
            Err(_) => return self.fail(plan, "forward pass panicked"),
        };
        for (&(i, n, _), l) in plan.iter().zip(logits) {
            let s = &mut self.running[i];
            self.cache.commit(s);
            s.consumed(n, elapsed);
            if let Some(l) = l {
                let row = match l.flatten_all().and_then(|t| t.to_vec1::<f32>()) {
                    Ok(v) => v,
                    Err(e) => {
                        s.fail(&format!("reading logits failed: {e}"));
                        continue;
                    }
                };
                s.on_logits(row, &self.tokenizer, self.context_length);
            }
        }
    }

    fn fail(&mut self, plan: &[(usize, usize, LogitsWanted)], msg: &str) {
        tracing::error!("{msg}");
        for &(i, _, _) in plan {
            self.running[i].fail(msg);
        }
    }
}
