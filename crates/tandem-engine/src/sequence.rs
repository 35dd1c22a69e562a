//! One request in flight: its tokens, cache (block table, state slot, place in the prefix
//! tree), sampler, stop rules, detokenizer and timings.
//!
//! The tokens fed to the model are always a prefix of `tokens` (prompt, then generated ones);
//! whatever is not yet in the cache is fed next, so a preempted sequence simply starts again
//! from its longest cached prefix and recomputes the rest.

use std::time::Instant;

use tandem_cache::{BlockTable, NodeRef, SlotId};
use tandem_model::kv::SequenceCache;
use tandem_model::tokenizer::{IncrementalDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::request::{FinishReason, GenerationEvent, PositionLogprobs, Timings, TokenLogprob, Usage};
use crate::sampler::{top_logprobs, Sampler};
use crate::scheduler::Submission;
use crate::stop::StopStringMatcher;

pub(crate) struct Sequence {
    /// Prompt followed by generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    pub cache: SequenceCache,
    pub table: BlockTable,
    pub slot: Option<SlotId>,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: usize,
    pub admitted_before: bool,
    /// Full blocks of `tokens` already in the prefix tree and the node of the last one.
    pub tree_blocks: usize,
    pub tree_node: Option<NodeRef>,
    /// A hash collision stopped prefix caching for this sequence.
    pub tree_stuck: bool,
    /// Block-aligned positions at which to checkpoint recurrent state, ascending.
    pub checkpoints: Vec<usize>,
    /// Positions the prompt's chat messages end at.
    pub message_boundaries: Vec<usize>,
    sampler: Sampler,
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
    pub fn new(sub: Submission, cache: SequenceCache) -> Self {
        let Submission { req, sampler, stop_ids, events, submitted } = sub;
        Self {
            prompt_len: req.prompt_ids.len(),
            tokens: req.prompt_ids,
            cache,
            table: BlockTable::new(),
            slot: None,
            cached_tokens: 0,
            admitted_before: false,
            tree_blocks: 0,
            tree_node: None,
            tree_stuck: false,
            checkpoints: Vec::new(),
            message_boundaries: req.message_boundaries,
            sampler,
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

    /// Samples from the logits of the last fed position and applies the stop rules.
    pub fn on_logits(&mut self, mut logits: Vec<f32>, tok: &Tokenizer, context_length: usize) {
        if self.finished {
            return;
        }
        let raw = self.logprobs.map(|_| logits.clone());
        let id = self.sampler.sample(&mut logits, &self.tokens);
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
        self.tokens.push(id);
        let logprobs = match (raw, self.logprobs) {
            (Some(raw), Some(n)) => {
                let (lp, top) = top_logprobs(&raw, id, n);
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
        };
        self.emit(GenerationEvent::Finished { reason, text, usage, timings });
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
