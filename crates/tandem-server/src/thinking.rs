//! Thinking budget and loop escape: a driver between the engine and the response formatters.
//!
//! While the output is inside `<think>…</think>` the driver counts its tokens and watches for
//! repeated n-grams ([`LoopDetector`]). When the budget (`max_thinking_tokens`) is spent or a loop
//! is detected, it ends the engine request (dropping its receiver cancels it), emits a short
//! transition that closes the block ([`BUDGET_TRANSITION`], [`LOOP_TRANSITION`]) as if the model
//! had written it, and submits a continuation whose prompt is the original prompt + every token
//! generated so far + the transition's tokens. The continuation is an ordinary request, so the
//! engine needs nothing new. With a budget, `max_tokens` bounds the answer only: the driver
//! stops the answer after that many tokens with finish reason `length` (after a cut, the
//! continuation is submitted with exactly that `max_tokens`, so the engine ends it).
//!
//! Cost of the continuation: its prompt is a prefix-cache hit up to what the first request
//! committed. Full KV blocks enter the prefix tree as soon as they fill, generated tokens
//! included, so on attention-only models everything but the last partial block of prompt +
//! reasoning is reused. Models with recurrent layers resume only at a recurrent-state
//! checkpoint: the first request asks for one where the budget cuts (prompt + budget, passed as
//! a message boundary past the prompt; the engine keeps it at the block boundary at or before),
//! however far the engine has decoded by the time it sees the cancellation, so the continuation
//! resumes there and recomputes at most a block of reasoning plus the transition (a loop cut,
//! which has no known position, resumes at the last block boundary the first request reached
//! if that is on the path). `tests/thinking_cache.rs` measures both cases on real fixtures.
//!
//! Downstream sees one ordinary [`GenerationEvent`] stream (transition tokens included, usage
//! counting both requests' generated tokens against the original prompt; `cached_tokens` is
//! the continuation's prefix-cache hit, capped at the original prompt's length).

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tandem_engine::{FinishReason, GenerateRequest, GenerationEvent, SubmitError, Timings, Usage};
use tokio::sync::mpsc;

use crate::backend::Backend;
use crate::reasoning::ReasoningParser;

/// Closes the block when the budget is spent.
pub const BUDGET_TRANSITION: &str = "\n\nOkay, I have thought enough; now the answer.\n</think>\n\n";
/// Closes the block when the reasoning repeats itself.
pub const LOOP_TRANSITION: &str = "\n\nI am going around in circles; time to answer.\n</think>\n\n";

/// What the driver enforces for one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThinkingPolicy {
    /// Largest number of tokens inside the reasoning block.
    pub budget: Option<usize>,
    /// Largest number of answer tokens (after the block), when set.
    pub answer_max: Option<usize>,
    /// N-gram length of the loop detector (0 = off).
    pub loop_ngram: usize,
    /// Occurrences of one n-gram that count as a loop.
    pub loop_repeats: usize,
    /// The prompt opened the block.
    pub inside: bool,
    /// The model's context length.
    pub context: usize,
}

impl ThinkingPolicy {
    fn active(&self) -> bool {
        self.budget.is_some() || self.answer_max.is_some() || (self.loop_ngram > 0 && self.loop_repeats > 1)
    }
}

/// Counts n-grams of token ids; reports a loop when one occurs `repeats` times.
#[derive(Debug, Clone)]
pub struct LoopDetector {
    n: usize,
    repeats: usize,
    window: VecDeque<u32>,
    counts: HashMap<u64, usize>,
}

impl LoopDetector {
    pub fn new(n: usize, repeats: usize) -> Self {
        Self { n, repeats, window: VecDeque::with_capacity(n + 1), counts: HashMap::new() }
    }

    /// Adds a token; true when the n-gram it completes has now been seen `repeats` times.
    pub fn push(&mut self, id: u32) -> bool {
        if self.n == 0 || self.repeats < 2 {
            return false;
        }
        self.window.push_back(id);
        if self.window.len() > self.n {
            self.window.pop_front();
        }
        if self.window.len() < self.n {
            return false;
        }
        let mut h = DefaultHasher::new();
        self.window.hash(&mut h);
        let count = self.counts.entry(h.finish()).or_insert(0);
        *count += 1;
        *count >= self.repeats
    }
}

/// Submits `req`; with an active policy the events pass through the driver task.
pub fn submit(
    backend: Arc<dyn Backend>,
    mut req: GenerateRequest,
    policy: ThinkingPolicy,
) -> Result<mpsc::Receiver<GenerationEvent>, SubmitError> {
    if let Some(b) = policy.budget {
        // Where the budget would cut the reasoning (when it starts right after the prompt):
        // models with recurrent layers keep a checkpoint there for the continuation.
        req.message_boundaries.push(req.prompt_ids.len() + b);
    }
    let rx = backend.submit(req.clone())?;
    if !policy.active() {
        return Ok(rx);
    }
    let (tx, out) = mpsc::channel(16);
    tokio::spawn(drive(backend, rx, req, policy, tx));
    Ok(out)
}

async fn drive(
    backend: Arc<dyn Backend>,
    mut rx: mpsc::Receiver<GenerationEvent>,
    orig: GenerateRequest,
    policy: ThinkingPolicy,
    tx: mpsc::Sender<GenerationEvent>,
) {
    let mut tracker = ReasoningParser::new(policy.inside);
    let mut loops = LoopDetector::new(policy.loop_ngram, policy.loop_repeats);
    let mut generated: Vec<u32> = Vec::new();
    let (mut thinking, mut answer) = (0usize, 0usize);
    // Set once the block was closed by us: tokens generated before the continuation.
    let mut cut_at: Option<usize> = None;
    // Ends the stream before the engine finished (its prefix-cache hit is then unknown: 0).
    let finished = |reason, completion: usize| GenerationEvent::Finished {
        reason,
        text: String::new(),
        stop_string: None,
        usage: Usage { prompt_tokens: orig.prompt_ids.len(), completion_tokens: completion, ..Default::default() },
        timings: Timings::default(),
    };
    loop {
        let Some(event) = rx.recv().await else {
            let _ = tx.send(GenerationEvent::Error("The engine ended the request without finishing it.".into())).await;
            return;
        };
        match event {
            GenerationEvent::Token { id, text, logprobs } => {
                let was_inside = tracker.in_reasoning();
                tracker.push(&text);
                generated.push(id);
                let inside = tracker.in_reasoning();
                let looping = if was_inside || inside {
                    thinking += 1;
                    cut_at.is_none() && loops.push(id)
                } else {
                    if tracker.answered() {
                        answer += 1;
                    }
                    false
                };
                if tx.send(GenerationEvent::Token { id, text, logprobs }).await.is_err() {
                    return;
                }
                // After a cut the continuation's own `max_tokens` is the answer budget: its
                // `Finished` (with its prefix-cache hit) ends the stream.
                if cut_at.is_none() && policy.answer_max.is_some_and(|m| answer >= m) && !inside {
                    let _ = tx.send(finished(FinishReason::Length, generated.len())).await;
                    return;
                }
                let over = policy.budget.is_some_and(|b| thinking >= b);
                if cut_at.is_some() || !inside || !(over || looping) {
                    continue;
                }
                // Close the block ourselves and continue from the transition.
                let transition = if over { BUDGET_TRANSITION } else { LOOP_TRANSITION };
                tracing::debug!(thinking, looping, "closing the reasoning block");
                let ids = match backend.tokenize(transition, false) {
                    Ok(ids) => ids,
                    Err(e) => {
                        let _ = tx.send(GenerationEvent::Error(format!("cannot tokenize the transition: {e}"))).await;
                        return;
                    }
                };
                tracker.push(transition);
                for (k, &tid) in ids.iter().enumerate() {
                    let text = if k == 0 { transition.to_string() } else { String::new() };
                    if tx.send(GenerationEvent::Token { id: tid, text, logprobs: None }).await.is_err() {
                        return;
                    }
                }
                generated.extend(&ids);
                let mut prompt_ids = orig.prompt_ids.clone();
                prompt_ids.extend(&generated);
                let room = policy.context.saturating_sub(prompt_ids.len());
                let wanted = match policy.answer_max {
                    Some(m) => m,
                    None => orig.stop.max_tokens.saturating_sub(generated.len()),
                };
                let max_tokens = wanted.min(room);
                if max_tokens == 0 {
                    let _ = tx.send(finished(FinishReason::Length, generated.len())).await;
                    return;
                }
                let next = GenerateRequest {
                    prompt_ids,
                    stop: tandem_engine::StopParams { max_tokens, ..orig.stop.clone() },
                    // The block is closed: only the answer's part of a grammar is left.
                    grammar: orig.grammar.as_ref().map(tandem_engine::Grammar::answer_part),
                    ..orig.clone()
                };
                // Dropping the old receiver cancels the first request.
                rx = match backend.submit(next) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx
                            .send(GenerationEvent::Error(format!("cannot continue after the reasoning block: {e}")))
                            .await;
                        return;
                    }
                };
                cut_at = Some(generated.len());
            }
            GenerationEvent::Finished { reason, text, stop_string, usage, timings } => {
                let usage = match cut_at {
                    None => usage,
                    Some(n) => Usage {
                        prompt_tokens: orig.prompt_ids.len(),
                        completion_tokens: n + usage.completion_tokens,
                        cached_tokens: usage.cached_tokens.min(orig.prompt_ids.len()),
                        ..usage
                    },
                };
                let _ = tx.send(GenerationEvent::Finished { reason, text, stop_string, usage, timings }).await;
                return;
            }
            GenerationEvent::Error(e) => {
                let _ = tx.send(GenerationEvent::Error(e)).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loop_detector() {
        let mut d = LoopDetector::new(3, 3);
        let seq: Vec<u32> = (0..20).collect();
        assert!(!seq.iter().any(|&t| d.push(t)), "no repeats, no loop");
        let mut d = LoopDetector::new(3, 3);
        let looped: Vec<u32> = [1, 2, 3, 4].repeat(4);
        let hit = looped.iter().position(|&t| d.push(t)).unwrap();
        // The first trigram completes at index 2, again at 6 and 10.
        assert_eq!(hit, 10);
        assert!(!LoopDetector::new(0, 3).push(1));
    }

    #[test]
    fn policy_activity() {
        assert!(!ThinkingPolicy::default().active());
        assert!(ThinkingPolicy { budget: Some(5), ..Default::default() }.active());
        assert!(ThinkingPolicy { loop_ngram: 8, loop_repeats: 4, ..Default::default() }.active());
    }
}
