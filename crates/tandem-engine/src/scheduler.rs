//! The engine loop: queues requests, admits them first come first served when a state slot
//! and KV blocks are available (after a prefix-cache lookup), builds one ragged batch per step
//! (one decode token per running sequence, then prefill chunks under the token budget, cut at
//! checkpoint positions), reserves blocks for it (evicting unreferenced prefix-cache blocks,
//! then preempting the youngest sequences by recompute), lets speculating sequences draft
//! (see [`speculate`]), runs the model, verifies drafts, publishes new blocks and checkpoints
//! to the prefix cache, samples, applies stop rules and streams events.
//! A failing step fails only the sequences in it.

pub(crate) mod align;
mod argmax;
mod forward;
mod speculate;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_model::arch::CausalLm;
use tandem_model::batch::LogitsWanted;
use tandem_model::tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::cache::EngineCache;
use crate::engine::{EngineConfig, EngineError, EngineStats};
use crate::request::{GenerateRequest, GenerationEvent};
use crate::sampler::Sampler;
use crate::sequence::Sequence;
use crate::spec::SeqSpec;
use speculate::Proposers;

/// A validated request on its way to the engine thread.
pub(crate) struct Submission {
    pub req: GenerateRequest,
    pub sampler: Sampler,
    pub constraint: Option<crate::constraint::Constraint>,
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
    proposers: Proposers,
    /// What drafts cost, per proposer (a draft model's drafts cost far more than prompt
    /// lookup's, and requests may choose their method).
    spec_costs: speculate::CostModels,
}

/// One sequence's part of a step: its index in `running`, tokens fed, logits wanted, and
/// whether the chunk verifies drafts.
#[derive(Debug, Clone, Copy)]
struct PlanEntry {
    seq: usize,
    n: usize,
    logits: LogitsWanted,
    verify: bool,
}

impl Scheduler {
    pub fn new(
        model: Box<dyn CausalLm>,
        draft_model: Option<Box<dyn CausalLm>>,
        tokenizer: Arc<Tokenizer>,
        cfg: EngineConfig,
        context_length: usize,
        stats: Arc<EngineStats>,
        disk: Option<crate::cache::disk::DiskTier>,
    ) -> Result<Self, EngineError> {
        let draft_spec = draft_model.as_ref().map(|d| d.cache_spec());
        let cache = EngineCache::new(
            model.cache_spec(),
            draft_spec,
            model.mtp().is_some(),
            &cfg,
            context_length,
            model.device(),
            disk,
        )?;
        let proposers = Proposers::new(&cfg.speculative, draft_model, model.mtp().is_some());
        let s = Self {
            model,
            tokenizer,
            cfg,
            context_length,
            stats,
            cache,
            waiting: VecDeque::new(),
            running: Vec::new(),
            proposers,
            spec_costs: speculate::CostModels::new(),
        };
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
        let sc = &self.cfg.speculative;
        let over = sub.req.speculative.clone().unwrap_or_default();
        let method = over.method.unwrap_or(sc.method);
        let k = over.num_draft_tokens.unwrap_or(sc.num_draft_tokens);
        let spec = SeqSpec::new(method, k, sc.adaptive);
        let mut seq = Sequence::new(sub, self.cache.new_cache(), spec);
        self.cache.plan_checkpoints(&mut seq);
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
            if seq.note_first_admission(cached) {
                self.stats.prompt_tokens.fetch_add(seq.prompt_len(), Ordering::Relaxed);
                self.stats.prefix_hit_tokens.fetch_add(cached, Ordering::Relaxed);
            }
            // Running first: the engine never looks idle in between.
            self.stats.running.fetch_add(1, Ordering::Relaxed);
            self.stats.waiting.fetch_sub(1, Ordering::Release);
            self.running.push(seq);
        }
    }

    fn drop_cancelled(&mut self) {
        let (mut i, mut gone) = (0, 0);
        while i < self.running.len() {
            if self.running[i].events.is_closed() {
                let mut s = self.running.remove(i);
                // What it computed stays useful (a thinking-budget continuation resumes there).
                self.cache.keep_decode_checkpoint(&mut s);
                self.cache.release(&mut s);
                self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                gone += 1;
            } else {
                i += 1;
            }
        }
        self.retired(gone);
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.events.is_closed());
        let gone = before - self.waiting.len();
        if gone > 0 {
            self.stats.waiting.fetch_sub(gone, Ordering::Relaxed);
            self.stats.cancelled.fetch_add(gone, Ordering::Relaxed);
        }
    }

    fn retire_finished(&mut self) {
        let (mut i, mut done) = (0, 0);
        while i < self.running.len() {
            if self.running[i].finished {
                let mut s = self.running.remove(i);
                self.cache.keep_decode_checkpoint(&mut s);
                self.cache.release(&mut s);
                self.stats.finished.fetch_add(1, Ordering::Relaxed);
                done += 1;
            } else {
                i += 1;
            }
        }
        self.retired(done);
    }

    /// `n` sequences left the running set: the gauges (KV bytes and blocks, slots) are
    /// published before `running` drops, so whoever sees the engine idle sees what it holds
    /// idle (the tests' `kv_bytes == 0` once idle raced with the next `publish_stats`).
    fn retired(&self, n: usize) {
        if n > 0 {
            self.publish_stats();
            self.stats.running.fetch_sub(n, Ordering::Release);
        }
    }

    fn publish_stats(&self) {
        let c = self.cache.stats();
        let st = &self.stats;
        let kv: usize = self.running.iter().map(|s| self.cache.seq_bytes(s)).sum();
        st.kv_bytes.store(kv, Ordering::Relaxed);
        st.kv_bytes_peak.fetch_max(kv, Ordering::Relaxed);
        st.kv_blocks_total.store(c.blocks_total, Ordering::Relaxed);
        st.kv_blocks_free.store(c.blocks_free, Ordering::Relaxed);
        st.kv_block_bytes.store(c.block_bytes, Ordering::Relaxed);
        st.kv_ring_bytes.store(c.ring_bytes, Ordering::Relaxed);
        st.prefix_cache_blocks.store(c.tree_blocks, Ordering::Relaxed);
        st.state_slots_total.store(c.slots_total, Ordering::Relaxed);
        st.state_slots_free.store(c.slots_free, Ordering::Relaxed);
        st.checkpoints.store(c.checkpoints, Ordering::Relaxed);
        st.checkpoint_bytes.store(c.checkpoint_bytes, Ordering::Relaxed);
    }

    /// Tokens each running sequence feeds this step: decodes first (one token each plus the
    /// drafts a speculating sequence wants, latency matters), then prefill chunks in admission
    /// order under the token budget, each cut at the sequence's next checkpoint position.
    fn plan_tokens(&mut self) -> Vec<usize> {
        let mut budget = self.cfg.max_batch_tokens;
        let mut want = vec![0; self.running.len()];
        // Now and then a step without drafts keeps the cost models' plain-step time current.
        let calibrate = self.spec_costs.wants_plain_step();
        for (i, s) in self.running.iter_mut().enumerate() {
            if s.pending() == 1 && budget > 0 {
                let adaptive = s.spec.adaptive.is_some();
                let cost = self.spec_costs.get(s.spec.method).cost();
                let k = if calibrate && adaptive { 0 } else { speculate::draft_length(s, cost, self.context_length) };
                let mut k = k.min(budget - 1);
                // A verification must not commit past a checkpoint position: it would skip it.
                let pos = s.cache.position();
                if let Some(cp) = s.book.next_checkpoint_after(pos) {
                    k = k.min(cp - pos - 1);
                }
                want[i] = 1 + k;
                budget -= 1 + k;
            }
        }
        let mut last_chunk = None;
        for (i, s) in self.running.iter().enumerate() {
            let pending = s.pending();
            if pending > 1 && budget > 0 {
                let pos = s.cache.position();
                let mut n = pending.min(self.cfg.prefill_chunk).min(budget);
                if let Some(cp) = s.book.next_checkpoint_after(pos) {
                    n = n.min(cp - pos);
                }
                want[i] = n;
                budget -= n;
                // A chunk that ends its prompt gives no rows back: that would delay the
                // request's first token by a step.
                last_chunk = (n < pending).then_some(i);
            }
        }
        let trimmed = align::trim_to_tiles(&mut want, last_chunk, self.cfg.step_align);
        self.stats.step_rows_trimmed.fetch_add(trimmed, Ordering::Relaxed);
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
                if !self.cache.make_room(need) && self.running[i].pending() == 1 && want[i] > 1 {
                    // Drafts are optional: drop them before preempting anyone.
                    want[i] = 1;
                    continue;
                }
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
        let started = Instant::now();
        let mut want = self.plan_tokens();
        let preempted = self.reserve(&mut want);
        let drafted = self.propose(&want, &preempted);
        let proposed = started.elapsed();
        let idle_catch_up = self.proposers.take_idle_catch_up();
        let idle_catch_up_s: f64 = idle_catch_up.iter().map(|c| c.1).sum();
        for &(m, seconds, positions) in &idle_catch_up {
            self.spec_costs.get(m).observe_idle_catch_up(seconds, positions);
        }
        let drafting = self.running.iter().filter(|s| !s.spec.drafts.is_empty()).count();
        // The method of this step's drafts when they all share one (mixed steps measure nothing).
        let mut methods = self.running.iter().filter(|s| !s.spec.drafts.is_empty()).map(|s| s.spec.method);
        let first_method = methods.next();
        let step_method = first_method.filter(|&m| methods.all(|x| x == m));
        let mut plan = Vec::new();
        for (i, &n) in want.iter().enumerate() {
            let s = &mut self.running[i];
            if n == 0 || preempted[i] || s.finished {
                continue;
            }
            if s.pending() == 1 && !s.spec.drafts.is_empty() {
                let n = s.prepare_verify();
                plan.push(PlanEntry { seq: i, n, logits: LogitsWanted::All, verify: true });
                continue;
            }
            let n = if s.pending() == 1 { 1 } else { n };
            let last = s.cache.position() + n == s.tokens().len();
            let logits = if last { LogitsWanted::Last } else { LogitsWanted::None };
            plan.push(PlanEntry { seq: i, n, logits, verify: false });
        }
        if !plan.is_empty() {
            let prefill = plan.iter().any(|e| !e.verify && e.n > 1);
            let forward_ms = self.forward(&plan);
            let t = started.elapsed().as_secs_f64();
            tracing::debug!(
                target: "tandem::step",
                tokens = plan.iter().map(|e| e.n).sum::<usize>(),
                drafted,
                propose_ms = proposed.as_secs_f64() * 1e3,
                forward_ms,
                idle_catch_up_ms = idle_catch_up_s * 1e3,
                rest_ms = t * 1e3 - forward_ms - proposed.as_secs_f64() * 1e3,
                "step"
            );
            if !prefill {
                if drafted == 0 {
                    self.spec_costs.observe_plain(t);
                } else {
                    // Catching up on idle positions is the price of not drafting, not of
                    // drafting: it stays out of the per-draft cost.
                    if let Some(m) = step_method {
                        self.spec_costs.get(m).observe_speculative(t - idle_catch_up_s, drafted, drafting);
                    }
                }
            }
        }
        // Preempted sequences go back to the front of the queue, oldest first.
        for i in (0..self.running.len()).rev() {
            if preempted[i] {
                let s = self.running.remove(i);
                self.waiting.push_front(s);
                // Waiting first: the engine never looks idle in between.
                self.stats.waiting.fetch_add(1, Ordering::Relaxed);
                self.stats.running.fetch_sub(1, Ordering::Release);
            }
        }
    }
}
