//! The engine loop: admits queued requests, builds one ragged batch per step (prefill chunks
//! under a token budget plus one decode token per running sequence), runs the model, samples,
//! applies stop rules and streams events. A failing step fails only the sequences in it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Instant;

use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::engine::{EngineConfig, EngineStats};
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
    running: Vec<Sequence>,
}

impl Scheduler {
    pub fn new(
        model: Box<dyn CausalLm>,
        tokenizer: Arc<Tokenizer>,
        cfg: EngineConfig,
        context_length: usize,
        stats: Arc<EngineStats>,
    ) -> Self {
        Self { model, tokenizer, cfg, context_length, stats, running: Vec::new() }
    }

    /// Runs until every handle is gone and no work is left.
    pub fn run(mut self, rx: std_mpsc::Receiver<Submission>) {
        loop {
            // Block only when idle; otherwise take what has arrived, FCFS, up to max_running.
            if self.running.is_empty() {
                match rx.recv() {
                    Ok(sub) => self.admit(sub),
                    Err(_) => return,
                }
            }
            while self.running.len() < self.cfg.max_running {
                match rx.try_recv() {
                    Ok(sub) => self.admit(sub),
                    Err(_) => break,
                }
            }
            self.drop_cancelled();
            if !self.running.is_empty() {
                self.step();
            }
            self.retire_finished();
        }
    }

    fn admit(&mut self, sub: Submission) {
        self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
        self.stats.running.fetch_add(1, Ordering::Relaxed);
        let spec = self.model.cache_spec();
        self.running.push(Sequence::new(sub, &spec, self.model.device()));
    }

    fn drop_cancelled(&mut self) {
        let before = self.running.len();
        self.running.retain(|s| !s.events.is_closed());
        let gone = before - self.running.len();
        if gone > 0 {
            self.stats.running.fetch_sub(gone, Ordering::Relaxed);
            self.stats.cancelled.fetch_add(gone, Ordering::Relaxed);
        }
    }

    fn retire_finished(&mut self) {
        let before = self.running.len();
        self.running.retain(|s| !s.finished);
        let gone = before - self.running.len();
        if gone > 0 {
            self.stats.running.fetch_sub(gone, Ordering::Relaxed);
            self.stats.finished.fetch_add(gone, Ordering::Relaxed);
        }
        let kv: usize = self.running.iter().map(|s| s.cache.allocated_bytes()).sum();
        self.stats.kv_bytes.store(kv, Ordering::Relaxed);
    }

    /// One forward pass over every running sequence.
    fn step(&mut self) {
        let mut budget = self.cfg.max_batch_tokens;
        // Decodes first (they are one token each and latency-sensitive), then prefill chunks.
        let mut plan: Vec<(usize, usize, LogitsWanted)> = Vec::new(); // (seq index, tokens, logits)
        for (i, s) in self.running.iter().enumerate() {
            if s.pending_prompt() == 0 && budget > 0 {
                plan.push((i, 1, LogitsWanted::Last));
                budget -= 1;
            }
        }
        for (i, s) in self.running.iter().enumerate() {
            let pending = s.pending_prompt();
            if pending > 0 && budget > 0 {
                let n = pending.min(self.cfg.prefill_chunk).min(budget);
                let wanted = if n == pending { LogitsWanted::Last } else { LogitsWanted::None };
                plan.push((i, n, wanted));
                budget -= n;
            }
        }
        if plan.is_empty() {
            return;
        }
        plan.sort_by_key(|p| p.0);
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
            Ok(Err(e)) => return self.fail(&plan, &format!("forward pass failed: {e}")),
            Err(_) => return self.fail(&plan, "forward pass panicked"),
        };
        for (&(i, n, _), l) in plan.iter().zip(logits) {
            let s = &mut self.running[i];
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
