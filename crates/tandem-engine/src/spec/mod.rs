//! Speculative decoding: proposers draft tokens, one target forward verifies them.
//!
//! A speculating sequence feeds `[pending token, d_1 .. d_k]` as one chunk of the ordinary
//! ragged batch (next to plain decodes and prefill chunks) and asks for the logits of every
//! position; [`verify`] accepts a prefix of the drafts (exactly for greedy requests, by
//! rejection sampling otherwise) and adds one token from the target. The cache then keeps only
//! the committed positions: attention KV is cut back, recurrent layers take the state their
//! verify lanes recorded after the last kept position (no replay, no full-state copy). Only
//! committed positions ever reach the prefix cache.
//!
//! Proposers ([`Proposer`]) are chosen per server and per request: prompt lookup
//! ([`ngram`]), a smaller draft model whose KV lives in the same block tables and therefore in
//! the same prefix cache ([`draft`]), and the model's own MTP head, whose KV is one more layer
//! of those blocks ([`mtp`]). [`adaptive`] picks each sequence's draft length from its
//! observed acceptance and the measured cost of drafting.

pub mod adaptive;
pub mod cost;
pub mod draft;
pub mod mtp;
pub mod ngram;
pub mod state;
pub mod verify;
mod view;
pub(crate) use view::ProposerView;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use tandem_model::arch::CausalLm;

pub use state::SeqSpec;

/// Where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SpecMethod {
    /// No speculation.
    #[default]
    Off,
    /// Prompt lookup in the sequence's own tokens.
    Ngram,
    /// A smaller draft model with the same vocabulary.
    Draft,
    /// The model's built-in multi-token-prediction head.
    Mtp,
}

impl SpecMethod {
    pub fn as_str(&self) -> &'static str {
        match self {
            SpecMethod::Off => "off",
            SpecMethod::Ngram => "ngram",
            SpecMethod::Draft => "draft",
            SpecMethod::Mtp => "mtp",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "off" | "none" => Some(SpecMethod::Off),
            "ngram" | "prompt-lookup" => Some(SpecMethod::Ngram),
            "draft" => Some(SpecMethod::Draft),
            "mtp" => Some(SpecMethod::Mtp),
            _ => None,
        }
    }
}

/// Server-wide speculation settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecConfig {
    pub method: SpecMethod,
    /// Most tokens drafted per step (`k`); the adaptive controller may use fewer.
    pub num_draft_tokens: usize,
    /// N-gram sizes prompt lookup tries, longest first.
    pub ngram_min: usize,
    pub ngram_max: usize,
    /// Adapt `k` to the observed acceptance (off: always draft `num_draft_tokens`).
    pub adaptive: bool,
    /// A draft model computes logits for the first this many token ids only (0: all): BPE
    /// vocabularies put frequent tokens first, so most drafts survive while most of the draft
    /// model's LM head is skipped. Drafts are verified either way; output never changes.
    pub draft_vocab: usize,
}

impl Default for SpecConfig {
    fn default() -> Self {
        Self {
            method: SpecMethod::Off,
            num_draft_tokens: 4,
            ngram_min: 2,
            ngram_max: 4,
            adaptive: true,
            draft_vocab: DEFAULT_DRAFT_VOCAB,
        }
    }
}

/// Token ids a draft model drafts from unless configured otherwise (see
/// [`SpecConfig::draft_vocab`]).
pub const DEFAULT_DRAFT_VOCAB: usize = 65536;

/// Upper bound on `k` (keeps per-position metrics and verify chunks bounded).
pub const MAX_DRAFT_TOKENS: usize = 16;

/// A request's override of the server's speculation settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecRequest {
    /// `None` keeps the server's method; `Some(Off)` turns speculation off for this request.
    pub method: Option<SpecMethod>,
    pub num_draft_tokens: Option<usize>,
}

/// Per-request speculation numbers, reported with the usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecUsage {
    /// Verification steps that carried drafts.
    pub steps: usize,
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
}

impl SpecUsage {
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted_tokens == 0 {
            0.0
        } else {
            self.accepted_tokens as f64 / self.drafted_tokens as f64
        }
    }

    /// Tokens gained per verification step (accepted drafts plus the target's own token).
    pub fn mean_accepted_length(&self) -> f64 {
        if self.steps == 0 {
            0.0
        } else {
            (self.accepted_tokens + self.steps) as f64 / self.steps as f64
        }
    }
}

/// A source of draft tokens. Proposers work on batches: every sequence listed speculates with
/// this proposer.
pub(crate) trait Proposer: Send {
    /// Fills `seq.spec.drafts` with up to `k` tokens for each `(seq, k)` (fewer or none when
    /// nothing good is found). Drafts follow `seq.tokens()`; the last of those is the pending
    /// token, not yet in the cache. An error leaves the sequences without drafts.
    fn propose(&mut self, model: &dyn CausalLm, seqs: &mut [(ProposerView<'_>, usize)]) -> Result<(), String>;

    /// After a target forward: brings the proposer's own state (draft KV, MTP KV) up to the
    /// positions the sequences have committed. `hidden` holds the target's final-normed hidden
    /// states of the committed positions fed in that forward, when [`Self::needs_hidden`].
    /// An error turns speculation off for the sequences listed.
    fn catch_up(&mut self, model: &dyn CausalLm, seqs: &mut [(ProposerView<'_>, Option<Tensor>)])
        -> Result<(), String>;

    /// Whether [`Self::catch_up`] needs the target's hidden states.
    fn needs_hidden(&self) -> bool {
        false
    }

    /// Seconds of the `propose` calls since the last call that went into catching up on
    /// positions decoded while the sequences were not drafting (a draft model re-reading the
    /// tokens of its idle steps), not into drafting itself, and how many positions that was.
    /// The cost model prices them apart, so a probe after a long idle stretch does not make
    /// drafting itself look dearer than it is, while the catch-up still counts against the
    /// sequence's exploration budget.
    fn take_idle_catch_up(&mut self) -> (f64, usize) {
        (0.0, 0)
    }
}

/// Index of the most likely token of a logits row (lowest id on ties, NaN never wins).
pub(crate) fn argmax(row: &[f32]) -> u32 {
    tandem_model::ops::sampling::argmax_ref(row)
}
