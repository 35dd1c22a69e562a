//! One request in flight: its tokens, cache (block table, state slot, place in the prefix
//! tree), sampler, stop rules, detokenizer and timings.
//!
//! The tokens fed to the model are always a prefix of `tokens` (prompt, then generated ones);
//! whatever is not yet in the cache is fed next, so a preempted sequence simply starts again
//! from its longest cached prefix and recomputes the rest.

use std::time::Instant;

use tandem_model::kv::SequenceCache;
use tandem_model::ops::sampling::TopCandidates;
use tandem_model::tokenizer::{IncrementalDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::cache::CacheBook;
use crate::constraint::Constraint;
use crate::request::{FinishReason, GenerationEvent, PositionLogprobs, Timings, TokenLogprob, Usage};
use crate::sampler::{top_logprobs, Sampler};
use crate::scheduler::Submission;
use crate::spec::verify::Verdict;
use crate::spec::{ProposerView, SeqSpec};
use crate::stop::StopStringMatcher;

pub(crate) struct Sequence {
    /// Prompt followed by generated tokens (read-only outside this module).
    pub(crate) tokens: Vec<u32>,
    prompt_len: usize,
    pub cache: SequenceCache,
    /// Block table, state slot, prefix-tree place and checkpoints: the cache module's.
    pub book: CacheBook,
    /// Prompt tokens served from the prefix cache at first admission.
    cached_tokens: usize,
    disk_cached_tokens: usize,
    admitted_before: bool,
    /// Positions the prompt's chat messages end at.
    message_boundaries: Vec<usize>,
    /// Speculative decoding state (method, drafts, proposer cache, counters).
    pub spec: SeqSpec,
    sampler: Sampler,
    /// The grammar the output must match (constrained decoding), if any.
    pub(crate) constraint: Option<Constraint>,
    stop_ids: Vec<u32>,
    max_tokens: usize,
    logprobs: Option<usize>,
    stop_strings: StopStringMatcher,
    decoder: IncrementalDecoder,
    pub events: mpsc::Sender<GenerationEvent>,
    pub finished: bool,
    submitted: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    prefill_s: f64,
}

impl Sequence {
    pub fn new(sub: Submission, cache: SequenceCache, spec: SeqSpec) -> Self {
        let Submission { req, sampler, constraint, stop_ids, events, submitted } = sub;
        Self {
            prompt_len: req.prompt_ids.len(),
            tokens: req.prompt_ids,
            cache,
            book: CacheBook::new(),
            cached_tokens: 0,
            disk_cached_tokens: 0,
            admitted_before: false,
            message_boundaries: req.message_boundaries,
            spec,
            sampler,
            constraint,
            stop_ids,
            max_tokens: req.stop.max_tokens,
            logprobs: req.logprobs,
            stop_strings: StopStringMatcher::new(&req.stop.stop_strings),
            decoder: IncrementalDecoder::new(true),
            events,
            finished: false,
            submitted,
            first_token: None,
            last_token: None,
            prefill_s: 0.0,
        }
    }

    /// Prompt followed by the generated tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Positions the prompt's chat messages end at.
    pub fn message_boundaries(&self) -> &[usize] {
        &self.message_boundaries
    }

    /// Records the first admission's prefix hit; `false` when it was admitted before (a
    /// preempted sequence coming back keeps its first numbers).
    pub fn note_first_admission(&mut self, cached: usize) -> bool {
        if self.admitted_before {
            return false;
        }
        self.admitted_before = true;
        self.cached_tokens = cached;
        self.disk_cached_tokens = self.book.disk_tokens();
        true
    }

    /// The most positions this sequence can occupy.
    pub fn max_len(&self, context_length: usize) -> usize {
        (self.prompt_len + self.max_tokens).min(context_length)
    }

    /// Tokens not yet in the cache (1 for a decoding sequence).
    pub fn pending(&self) -> usize {
        self.tokens.len().saturating_sub(self.cache.position())
    }

    /// The next `n` tokens to feed and the cache they go into.
    pub fn next_input(&mut self, n: usize) -> (&[u32], &mut SequenceCache) {
        let start = self.cache.position();
        let end = (start + n).min(self.tokens.len());
        (&self.tokens[start..end], &mut self.cache)
    }

    /// Book-keeping after a forward that consumed `n` of this sequence's tokens.
    pub fn consumed(&mut self, _n: usize, step_s: f64) {
        if self.first_token.is_none() {
            self.prefill_s += step_s;
        }
    }

    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// What a proposer may see and touch of this sequence.
    pub fn proposer_view(&mut self) -> ProposerView<'_> {
        ProposerView::new(&self.tokens, self.prompt_len, &mut self.cache, &mut self.spec)
    }

    /// Builds this step's verify chunk `[pending token, drafts..]`; its length.
    pub fn prepare_verify(&mut self) -> usize {
        let pending = self.tokens.last().copied().unwrap_or(0);
        self.spec.verify_input.clear();
        self.spec.verify_input.push(pending);
        self.spec.verify_input.extend_from_slice(&self.spec.drafts);
        if self.cache.has_recurrent() {
            self.cache.begin_verify();
        }
        self.spec.verify_input.len()
    }

    /// The verify chunk and the cache it goes into.
    pub fn verify_input(&mut self) -> (&[u32], &mut SequenceCache) {
        (&self.spec.verify_input, &mut self.cache)
    }

    /// After the verify forward: accepts a prefix of the drafts against the target's logits
    /// (`rows[i]` for position `i` of the verify chunk), appends the accepted tokens and the
    /// target's own next token (as far as the stop rules allow) and keeps only the committed
    /// positions in the cache.
    pub fn on_verify_logits(
        &mut self,
        rows: Vec<Vec<f32>>,
        tok: &Tokenizer,
        context_length: usize,
    ) -> Result<(), String> {
        let drafts = std::mem::take(&mut self.spec.drafts);
        let verdict =
            crate::spec::verify::verify(&mut self.sampler, self.constraint.as_mut(), &self.tokens, &drafts, &rows)?;
        self.apply_verdict(drafts.len() + 1, verdict, Some(&rows), tok, context_length)
    }

    /// [`Self::on_verify_logits`] for a request that takes the plain argmax
    /// ([`Self::argmax_only`]), from the argmax of each verify position picked on the device.
    pub fn on_verify_argmax(&mut self, ids: &[u32], tok: &Tokenizer, context_length: usize) -> Result<(), String> {
        let drafts = std::mem::take(&mut self.spec.drafts);
        let verdict = crate::spec::verify::verify_argmax(&drafts, ids)?;
        self.apply_verdict(drafts.len() + 1, verdict, None, tok, context_length)
    }

    /// Appends a verdict's tokens (log-probs from `rows` where given) as far as the stop rules
    /// allow and keeps only the committed positions of the `fed` verified ones in the cache.
    fn apply_verdict(
        &mut self,
        fed: usize,
        Verdict { tokens, accepted }: Verdict,
        rows: Option<&[Vec<f32>]>,
        tok: &Tokenizer,
        context_length: usize,
    ) -> Result<(), String> {
        self.spec.record(fed - 1, accepted);
        let mut appended = 0;
        for (i, &id) in tokens.iter().enumerate() {
            if self.finished {
                break;
            }
            self.push_token(id, rows.and_then(|r| r.get(i)).map(Vec::as_slice), tok, context_length);
            appended += 1;
        }
        // The bonus token is not in the cache: it is the next pending token.
        let keep = 1 + appended.min(accepted);
        self.cache.commit_speculative(fed, keep).map_err(|e| e.to_string())
    }

    /// Whether the next token can be picked from the device's argmax alone (no log-probs
    /// asked for, greedy without penalties).
    pub fn argmax_only(&self) -> bool {
        !self.finished && self.logprobs.is_none() && self.constraint.is_none() && self.sampler.argmax_only()
    }

    /// Takes a token the device picked (see [`Self::argmax_only`]) and applies the stop rules.
    pub fn on_argmax(&mut self, id: u32, tok: &Tokenizer, context_length: usize) {
        if !self.finished {
            self.push_token(id, None, tok, context_length);
        }
    }

    /// `Some(1 / temperature)` when the next token can come from a device's top candidates
    /// (no log-probs asked for; see [`crate::sampler::Sampler::candidates_temperature`]).
    pub fn candidates_temperature(&self) -> Option<f32> {
        if self.finished || self.logprobs.is_some() || self.constraint.is_some() {
            return None;
        }
        self.sampler.candidates_temperature()
    }

    /// Samples from a device's top candidates and applies the stop rules; false (nothing
    /// done) when they cannot decide the token and the row must be read.
    pub fn on_candidates(&mut self, top: &TopCandidates, tok: &Tokenizer, context_length: usize) -> bool {
        if self.finished {
            return true;
        }
        match self.sampler.sample_top(top) {
            Some(id) => {
                self.push_token(id, None, tok, context_length);
                true
            }
            None => false,
        }
    }

    /// Samples from the logits of the last fed position and applies the stop rules.
    pub fn on_logits(&mut self, mut logits: Vec<f32>, tok: &Tokenizer, context_length: usize) {
        if self.finished {
            return;
        }
        let raw = self.logprobs.map(|_| logits.clone());
        if let Some(c) = self.constraint.as_mut() {
            if let Err(e) = c.apply(&mut logits) {
                return self.fail(&e);
            }
        }
        let id = self.sampler.sample(&mut logits, &self.tokens);
        if let Some(c) = self.constraint.as_mut() {
            if let Err(e) = c.consume(id) {
                return self.fail(&e);
            }
        }
        self.push_token(id, raw.as_deref(), tok, context_length);
    }

    /// Appends a chosen token, streams it (with log-probs from the `raw` logits it was chosen
    /// from, when asked for) and applies the stop rules.
    fn push_token(&mut self, id: u32, raw: Option<&[f32]>, tok: &Tokenizer, context_length: usize) {
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        self.tokens.push(id);
        let logprobs = match (raw, self.logprobs) {
            (Some(raw), Some(n)) => {
                let (lp, top) = top_logprobs(raw, id, n);
                let entry = |id: u32, logprob: f32| TokenLogprob { id, text: tok.token_text(id), logprob };
                Some(PositionLogprobs {
                    chosen: entry(id, lp),
                    top: top.into_iter().map(|(i, l)| entry(i, l)).collect(),
                })
            }
            _ => None,
        };
        if self.stop_ids.contains(&id) {
            self.emit(GenerationEvent::Token { id, text: String::new(), logprobs });
            return self.finish(FinishReason::Stop, tok);
        }
        let piece = self.decoder.push(tok, id);
        let (text, matched) = self.stop_strings.push(&piece);
        self.emit(GenerationEvent::Token { id, text, logprobs });
        if matched {
            return self.finish(FinishReason::Stop, tok);
        }
        if self.generated() >= self.max_tokens || self.tokens.len() >= context_length {
            self.finish(FinishReason::Length, tok);
        }
    }

    /// Tokens this sequence may still generate.
    pub fn remaining(&self, context_length: usize) -> usize {
        let by_max = self.max_tokens.saturating_sub(self.generated());
        by_max.min(context_length.saturating_sub(self.tokens.len()))
    }

    fn finish(&mut self, reason: FinishReason, tok: &Tokenizer) {
        let mut text = String::new();
        if !self.stop_strings.is_matched() {
            let tail = self.decoder.flush(tok);
            let (t, matched) = self.stop_strings.push(&tail);
            text.push_str(&t);
            if !matched {
                text.push_str(&self.stop_strings.flush());
            }
        }
        let first = self.first_token.unwrap_or(self.submitted);
        let timings = Timings {
            ttft_s: (first - self.submitted).as_secs_f64(),
            prefill_s: self.prefill_s,
            decode_s: self.last_token.map(|l| (l - first).as_secs_f64()).unwrap_or(0.0),
        };
        let usage = Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.generated(),
            cached_tokens: self.cached_tokens,
            disk_cached_tokens: self.disk_cached_tokens,
            speculative: self.spec.usage,
        };
        // A stop string that completed (possibly in the flushed tail) cut the text: report it.
        let stop_string = self.stop_strings.matched_stop().map(str::to_owned);
        let reason = if stop_string.is_some() { FinishReason::Stop } else { reason };
        self.emit(GenerationEvent::Finished { reason, text, stop_string, usage, timings });
        self.finished = true;
    }

    pub fn fail(&mut self, msg: &str) {
        self.emit(GenerationEvent::Error(msg.to_string()));
        self.finished = true;
    }

    fn emit(&self, ev: GenerationEvent) {
        // The channel is sized for every event; a closed one means the client went away,
        // which the scheduler notices before the next step.
        let _ = self.events.try_send(ev);
    }
}
