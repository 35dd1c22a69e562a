//! Running a step's plan through the model ([`Scheduler::forward`]): the target forward (a
//! panic inside the model caught), a failed batch retried one sequence at a time from its
//! snapshot, then verification, sampling and the events of each sequence in the plan.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Instant;

use tandem_model::batch::SeqChunk;
use tandem_model::ops::sampling::DEVICE_CANDIDATES;

use super::{argmax, speculate, PlanEntry, Scheduler};

/// A forward's logits per chunk and, where asked for, the final hidden states.
type ModelOutput = tandem_model::Result<(Vec<Option<candle_core::Tensor>>, Option<candle_core::Tensor>)>;

impl Scheduler {
    /// Runs the target forward of `plan` and everything after it; returns the milliseconds
    /// the forward itself took.
    ///
    /// A failed forward of several sequences is retried one sequence at a time, each first
    /// restored to its state before the step, so a failure that one request causes (a device
    /// allocation only it needs, an input the model refuses) fails that request alone. The
    /// restore needs a snapshot from before the step: free for attention KV (cut back) and for
    /// device recurrent state (never written in place, so a snapshot shares it), a copy of the
    /// state for host recurrent state, which is therefore not taken: a CPU hybrid model fails
    /// the whole step (where an allocation failure aborts the process anyway).
    pub(super) fn forward(&mut self, plan: &[PlanEntry]) -> f64 {
        let started = Instant::now();
        let before: Vec<usize> = plan.iter().map(|e| self.running[e.seq].cache.position()).collect();
        let cpu = self.model.device().is_cpu();
        let snaps: Option<Vec<tandem_model::kv::RecurrentSnapshot>> = (plan.len() > 1)
            .then(|| {
                plan.iter()
                    .map(|e| {
                        let c = &self.running[e.seq].cache;
                        (!(cpu && c.has_recurrent())).then(|| c.snapshot())
                    })
                    .collect()
            })
            .flatten();
        let hidden_wanted = self.proposers.needs_hidden(plan.iter().map(|e| &self.running[e.seq]));
        // Grammar masks of the sequences that sample this step, computed on another thread
        // while the model runs (they depend only on the tokens already kept).
        let mut grammars: Vec<(usize, crate::constraint::Constraint)> = plan
            .iter()
            .filter(|e| e.logits == tandem_model::batch::LogitsWanted::Last && !e.verify)
            .filter_map(|e| self.running[e.seq].constraint.take().map(|c| (e.seq, c)))
            .collect();
        let result = std::thread::scope(|scope| {
            let masks = (!grammars.is_empty()).then(|| {
                scope.spawn(|| {
                    for (_, c) in grammars.iter_mut() {
                        c.prepare();
                    }
                })
            });
            let r = self.run_model(plan, hidden_wanted);
            if let Some(h) = masks {
                let _ = h.join();
            }
            r
        });
        for (i, c) in grammars {
            self.running[i].constraint = Some(c);
        }
        let elapsed = started.elapsed().as_secs_f64();
        let (logits, hidden) = match result {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return self.forward_failed(plan, snaps, &format!("forward pass failed: {e}"), elapsed),
            Err(_) => return self.forward_failed(plan, snaps, "forward pass panicked", elapsed),
        };
        // Greedy rows on a GPU (decode steps and verify chunks): every such sequence's argmax
        // rows in one batched read.
        let greedy: Vec<bool> = plan
            .iter()
            .zip(&logits)
            .map(|(e, l)| l.as_ref().is_some_and(|l| !l.device().is_cpu()) && self.running[e.seq].argmax_only())
            .collect();
        let mut argmax = argmax::device_argmax_each(logits.iter().zip(greedy.iter().copied()));
        for ((e, l), g) in plan.iter().zip(logits).zip(greedy) {
            let s = &mut self.running[e.seq];
            s.consumed(e.n, elapsed);
            if g {
                // Greedy on a GPU: one id per position came back instead of the whole
                // vocabulary's logits.
                match argmax.next() {
                    Some(Ok(ids)) if e.verify => speculate::commit_verify(&self.stats, s, |s| {
                        s.on_verify_argmax(&ids, &self.tokenizer, self.context_length)
                    }),
                    Some(Ok(ids)) => match ids.first() {
                        Some(&id) => s.on_argmax(id, &self.tokenizer, self.context_length),
                        None => s.fail("reading the argmax failed: a row went missing"),
                    },
                    Some(Err(err)) => s.fail(&format!("reading the argmax failed: {err}")),
                    None => s.fail("reading the argmax failed: a row went missing"),
                }
                continue;
            }
            let Some(l) = l else { continue };
            if e.verify {
                let rows = match own_rows(&l).and_then(|l| l.to_vec2::<f32>()) {
                    Ok(v) => v,
                    Err(err) => {
                        s.fail(&format!("reading logits failed: {err}"));
                        continue;
                    }
                };
                speculate::commit_verify(&self.stats, s, |s| {
                    s.on_verify_logits(rows, &self.tokenizer, self.context_length)
                });
                continue;
            }
            if self.cfg.device_sampling && !l.device().is_cpu() {
                if let Some(inv_t) = s.candidates_temperature() {
                    // Sampled on a GPU: the device's top candidates, the row only if they
                    // cannot decide the token.
                    match tandem_model::ops::sampling::top_candidates(&l, DEVICE_CANDIDATES, inv_t) {
                        Ok(Some(top)) if s.on_candidates(&top, &self.tokenizer, self.context_length) => {
                            self.stats.candidate_samples.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Ok(_) => {}
                        Err(err) => {
                            s.fail(&format!("reading the sampling candidates failed: {err}"));
                            continue;
                        }
                    }
                }
            }
            let row = match own_rows(&l).and_then(|t| t.flatten_all()?.to_vec1::<f32>()) {
                Ok(v) => v,
                Err(err) => {
                    s.fail(&format!("reading logits failed: {err}"));
                    continue;
                }
            };
            s.on_logits(row, &self.tokenizer, self.context_length);
        }
        self.catch_up(plan, &before, hidden);
        for e in plan {
            self.cache.commit(&mut self.running[e.seq]);
        }
        elapsed * 1e3
    }

    /// One forward pass over the plan's chunks (a panic inside the model is caught).
    fn run_model(&mut self, plan: &[PlanEntry], hidden_wanted: bool) -> std::thread::Result<ModelOutput> {
        let mut chunks: Vec<SeqChunk<'_>> = Vec::with_capacity(plan.len());
        let mut plan_iter = plan.iter().peekable();
        for (i, s) in self.running.iter_mut().enumerate() {
            if let Some(&&e) = plan_iter.peek() {
                if e.seq == i {
                    plan_iter.next();
                    let (tokens, cache) = if e.verify { s.verify_input() } else { s.next_input(e.n) };
                    chunks.push(SeqChunk { tokens, cache, logits: e.logits });
                }
            }
        }
        let model = &self.model;
        catch_unwind(AssertUnwindSafe(|| {
            // On one thread when another process has taken the other cores (cpu_threads).
            tandem_model::ops::cpu_threads::within_limit(model.device(), || {
                if hidden_wanted {
                    model.forward_with_hidden(&mut chunks)
                } else {
                    model.forward(&mut chunks).map(|l| (l, None))
                }
            })
        }))
    }

    /// See [`Self::forward`]: fails the plan, or with snapshots restores every sequence and
    /// runs each alone.
    fn forward_failed(
        &mut self,
        plan: &[PlanEntry],
        snaps: Option<Vec<tandem_model::kv::RecurrentSnapshot>>,
        msg: &str,
        elapsed: f64,
    ) -> f64 {
        let Some(snaps) = snaps else {
            self.fail(plan, msg);
            return elapsed * 1e3;
        };
        tracing::warn!("{msg} for a batch of {}; running its sequences one at a time", plan.len());
        if plan.len() > 1 {
            self.stats.batch_fallbacks.fetch_add(1, Ordering::Relaxed);
        }
        for (e, snap) in plan.iter().zip(&snaps) {
            let s = &mut self.running[e.seq];
            if let Err(err) = s.cache.restore(snap) {
                s.fail(&format!("{msg}; restoring the cache failed: {err}"));
                continue;
            }
            if e.verify && s.cache.has_recurrent() {
                s.cache.begin_verify();
            }
        }
        let mut ms = elapsed * 1e3;
        for e in plan {
            if !self.running[e.seq].finished {
                ms += self.forward(std::slice::from_ref(e));
            }
        }
        ms
    }

    fn fail(&mut self, plan: &[PlanEntry], msg: &str) {
        tracing::error!("{msg}");
        for e in plan {
            self.running[e.seq].fail(msg);
        }
    }
}

/// A sequence's logits rows in a buffer of their own on a GPU: they are a view into the whole
/// batch's logits, and reading a view back copies its entire buffer.
fn own_rows(l: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
    if l.device().is_cpu() {
        Ok(l.clone())
    } else {
        l.force_contiguous()
    }
}
