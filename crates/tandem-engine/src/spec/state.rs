//! A sequence's speculation state: its method and draft-length controller, this step's drafts,
//! the proposer's own cache (draft-model KV or the MTP head's position and last output), and
//! its counters.

use candle_core::Tensor;
use tandem_model::kv::SequenceCache;

use super::adaptive::AdaptiveK;
use super::{SpecMethod, SpecUsage};

pub struct SeqSpec {
    pub method: SpecMethod,
    /// Most drafts per step for this request.
    pub max_k: usize,
    pub adaptive: Option<AdaptiveK>,
    /// Drafts of the current step, after the pending token.
    pub drafts: Vec<u32>,
    /// The verify chunk of the current step: `[pending, drafts..]`.
    pub verify_input: Vec<u32>,
    /// Draft model: its paged cache over the sequence's block table.
    pub draft_cache: Option<SequenceCache>,
    /// MTP: positions whose head KV is written, and the head's last output row (the first
    /// draft of the next step comes from its logits).
    pub mtp_pos: usize,
    pub mtp_last: Option<Tensor>,
    /// MTP: the target's hidden rows of the committed positions from `mtp_pos` on that the
    /// head has not consumed yet (it catches up lazily while the sequence does not draft).
    pub mtp_rows: Option<Tensor>,
    pub usage: SpecUsage,
    /// Accepted drafts per draft position (index `i`: draft `i` accepted), for metrics.
    pub accepted_at: Vec<usize>,
    pub drafted_at: Vec<usize>,
}

impl SeqSpec {
    pub fn new(method: SpecMethod, max_k: usize, adaptive: bool) -> Self {
        let max_k = if method == SpecMethod::Off { 0 } else { max_k };
        Self {
            method,
            max_k,
            adaptive: (adaptive && max_k > 0).then(|| AdaptiveK::new(max_k)),
            drafts: Vec::new(),
            verify_input: Vec::new(),
            draft_cache: None,
            mtp_pos: 0,
            mtp_last: None,
            mtp_rows: None,
            usage: SpecUsage::default(),
            accepted_at: vec![0; max_k],
            drafted_at: vec![0; max_k],
        }
    }

    pub fn is_on(&self) -> bool {
        self.method != SpecMethod::Off && self.max_k > 0
    }

    /// Turns speculation off for the rest of the request (a proposer failed).
    pub fn disable(&mut self) {
        self.method = SpecMethod::Off;
        self.max_k = 0;
        self.drafts.clear();
        self.draft_cache = None;
        self.mtp_last = None;
        self.mtp_rows = None;
    }

    /// The sequence (re)starts at `position` with a fresh draft cache (if any): after
    /// admission, a prefix-cache hit or preemption. KV of earlier positions is in the shared
    /// blocks; the draft model's only up to `draft_position`, from where it recomputes.
    pub fn reset(&mut self, position: usize, draft_cache: Option<SequenceCache>, draft_position: usize) {
        self.drafts.clear();
        self.verify_input.clear();
        self.mtp_pos = position;
        self.mtp_last = None;
        self.mtp_rows = None;
        self.draft_cache = if self.method == SpecMethod::Draft { draft_cache } else { None };
        if let Some(c) = &mut self.draft_cache {
            if c.resume(draft_position.min(position), None).is_err() {
                self.disable();
            }
        }
    }

    /// Up to which position the proposer's own KV is written: blocks beyond it must not be
    /// published to the prefix cache yet.
    pub fn written_up_to(&self, main_pos: usize) -> usize {
        match self.method {
            SpecMethod::Draft => self.draft_cache.as_ref().map_or(main_pos, |c| c.position().min(main_pos)),
            SpecMethod::Mtp => self.mtp_pos.min(main_pos),
            _ => main_pos,
        }
    }

    /// Whether the sequence drafted in its last step (or drafts every step: no controller), so
    /// its proposer should keep up now rather than lazily.
    pub fn drafting(&self) -> bool {
        self.adaptive.as_ref().is_none_or(|a| a.since_draft() == 0)
    }

    /// Records one verification of `drafted` drafts with `accepted` accepted.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.usage.steps += 1;
        self.usage.drafted_tokens += drafted;
        self.usage.accepted_tokens += accepted;
        for i in 0..drafted.min(self.drafted_at.len()) {
            self.drafted_at[i] += 1;
            if i < accepted {
                self.accepted_at[i] += 1;
            }
        }
        if let Some(a) = &mut self.adaptive {
            a.observe(drafted, accepted);
        }
    }
}

impl SeqSpec {
    /// The last draft and the draft model's cache, to draft one more token.
    pub fn last_draft_input(&mut self) -> Option<(&[u32], &mut SequenceCache)> {
        let n = self.drafts.len();
        let cache = self.draft_cache.as_mut()?;
        if n == 0 {
            return None;
        }
        Some((&self.drafts[n - 1..], cache))
    }
}
