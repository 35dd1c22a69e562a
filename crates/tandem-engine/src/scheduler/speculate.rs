//! The scheduler's speculative-decoding phases: choosing each sequence's draft length,
//! drafting (batched per proposer) before the target forward, and letting proposers catch up
//! on the committed positions after it.

use std::sync::atomic::Ordering;

use candle_core::Tensor;
use tandem_model::arch::CausalLm;

use super::{PlanEntry, Scheduler};
use crate::engine::EngineStats;
use crate::sequence::Sequence;
use crate::spec::cost::{CostModel, DraftCost};
use crate::spec::draft::DraftProposer;
use crate::spec::mtp::MtpProposer;
use crate::spec::ngram::NgramProposer;
use crate::spec::ProposerView;
use crate::spec::{Proposer, SpecConfig, SpecMethod};

/// The proposers this engine can use, one per method.
pub(crate) struct Proposers {
    /// Boxed so that tests can put a scripted proposer in its place.
    pub(super) ngram: Box<dyn Proposer>,
    draft: Option<DraftProposer>,
    mtp: Option<MtpProposer>,
}

const METHODS: [SpecMethod; 3] = [SpecMethod::Ngram, SpecMethod::Draft, SpecMethod::Mtp];

impl Proposers {
    pub fn new(cfg: &SpecConfig, draft_model: Option<Box<dyn CausalLm>>, has_mtp: bool) -> Self {
        Self {
            ngram: Box::new(NgramProposer { min_n: cfg.ngram_min, max_n: cfg.ngram_max }),
            draft: draft_model.map(|model| DraftProposer { model, idle_catch_up: (0.0, 0), steady_round0_s: None }),
            mtp: has_mtp.then(MtpProposer::default),
        }
    }

    fn get(&mut self, m: SpecMethod) -> Option<&mut dyn Proposer> {
        match m {
            SpecMethod::Ngram => Some(self.ngram.as_mut()),
            SpecMethod::Draft => self.draft.as_mut().map(|p| p as &mut dyn Proposer),
            SpecMethod::Mtp => self.mtp.as_mut().map(|p| p as &mut dyn Proposer),
            SpecMethod::Off => None,
        }
    }

    /// Per method, seconds and positions the proposers spent catching up on idle positions
    /// since the last call.
    pub fn take_idle_catch_up(&mut self) -> Vec<(SpecMethod, f64, usize)> {
        METHODS
            .into_iter()
            .filter_map(|m| {
                let (s, n) = self.get(m)?.take_idle_catch_up();
                (n > 0 || s > 0.0).then_some((m, s, n))
            })
            .collect()
    }

    /// Whether the target forward must return hidden states for these sequences.
    pub fn needs_hidden<'a>(&mut self, seqs: impl Iterator<Item = &'a Sequence>) -> bool {
        let methods: Vec<SpecMethod> = seqs.filter(|s| s.spec.is_on()).map(|s| s.spec.method).collect();
        methods.into_iter().any(|m| self.get(m).is_some_and(|p| p.needs_hidden()))
    }
}

/// Relative cost of one drafted token assumed until the engine has measured it: prompt lookup
/// only lengthens the verify chunk, a draft model also runs a forward per draft.
pub(super) fn cost_prior(method: SpecMethod) -> f64 {
    match method {
        SpecMethod::Draft => 0.5,
        SpecMethod::Mtp => 0.3,
        _ => 0.15,
    }
}

/// Relative cost of catching up on one idle position assumed until measured: a draft model
/// re-reads each token with a forward of its own; the MTP head reads its gathered rows in one
/// cheap chunk (measured as it happens); prompt lookup has no state.
pub(super) fn idle_cost_prior(method: SpecMethod) -> f64 {
    match method {
        SpecMethod::Draft => 0.15,
        _ => 0.0,
    }
}

/// One cost model per proposer.
pub(crate) struct CostModels {
    models: Vec<(SpecMethod, CostModel)>,
}

impl CostModels {
    pub fn new() -> Self {
        Self { models: METHODS.iter().map(|&m| (m, CostModel::new(cost_prior(m), idle_cost_prior(m)))).collect() }
    }

    /// The model of `method` (the n-gram one for `off`, which never drafts).
    pub fn get(&mut self, method: SpecMethod) -> &mut CostModel {
        let i = self.models.iter().position(|(m, _)| *m == method).unwrap_or(0);
        &mut self.models[i].1
    }

    /// Whether any model wants a plain step measured.
    pub fn wants_plain_step(&self) -> bool {
        self.models.iter().any(|(_, c)| c.wants_plain_step())
    }

    /// A plain decode step's time, for every model.
    pub fn observe_plain(&mut self, seconds: f64) {
        for (_, c) in &mut self.models {
            c.observe_plain(seconds);
        }
    }
}

/// Drafts a decoding sequence asks for this step: the adaptive choice (or its maximum), never
/// more than the tokens it may still generate minus the one the target adds.
pub(super) fn draft_length(s: &mut Sequence, cost: DraftCost, context_length: usize) -> usize {
    if !s.spec.is_on() || s.finished {
        return 0;
    }
    let k = match &mut s.spec.adaptive {
        Some(a) => a.choose(cost),
        None => s.spec.max_k,
    };
    k.min(s.remaining(context_length).saturating_sub(1))
}

/// Adds one verification's numbers to the engine-wide counters.
/// Commits a verify step's verdict with `apply` (from the logits rows or the device argmax)
/// and counts its drafts; a failure fails the sequence.
pub(super) fn commit_verify(
    stats: &EngineStats,
    s: &mut crate::sequence::Sequence,
    apply: impl FnOnce(&mut crate::sequence::Sequence) -> Result<(), String>,
) {
    let (d0, a0) = (s.spec.usage.drafted_tokens, s.spec.usage.accepted_tokens);
    if let Err(err) = apply(s) {
        s.fail(&format!("committing verified tokens failed: {err}"));
        return;
    }
    count(stats, s.spec.usage.drafted_tokens - d0, s.spec.usage.accepted_tokens - a0);
}

pub(super) fn count(stats: &EngineStats, drafted: usize, accepted: usize) {
    if drafted == 0 {
        return;
    }
    stats.spec_steps.fetch_add(1, Ordering::Relaxed);
    stats.spec_drafted.fetch_add(drafted, Ordering::Relaxed);
    stats.spec_accepted.fetch_add(accepted, Ordering::Relaxed);
    for i in 0..drafted.min(stats.spec_drafted_at.len()) {
        stats.spec_drafted_at[i].fetch_add(1, Ordering::Relaxed);
        if i < accepted {
            stats.spec_accepted_at[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Scheduler {
    /// Lets every decoding sequence that wants drafts (`want[i] > 1`) draft up to
    /// `want[i] - 1` tokens with its proposer. Returns the drafts made in all.
    pub(super) fn propose(&mut self, want: &[usize], preempted: &[bool]) -> usize {
        for s in self.running.iter_mut() {
            s.spec.drafts.clear();
        }
        let model = self.model.as_ref();
        for m in METHODS {
            let Some(p) = self.proposers.get(m) else { continue };
            let mut batch: Vec<(ProposerView<'_>, usize)> = self
                .running
                .iter_mut()
                .enumerate()
                .filter(|(i, s)| want[*i] > 1 && !preempted[*i] && s.pending() == 1 && s.spec.method == m)
                .map(|(i, s)| (s.proposer_view(), want[i] - 1))
                .collect();
            if batch.is_empty() {
                continue;
            }
            if let Err(e) = p.propose(model, &mut batch) {
                tracing::warn!("{} drafting failed, decoding without drafts: {e}", m.as_str());
                for (s, _) in batch.iter_mut() {
                    s.spec.drafts.clear();
                }
            }
            for (s, k) in batch.iter_mut() {
                s.spec.drafts.truncate(*k);
            }
        }
        self.running.iter().map(|s| s.spec.drafts.len()).sum()
    }

    /// After the target forward: each proposer brings its state up to the committed positions
    /// of the sequences it serves (with the hidden rows of those positions when it needs them).
    pub(super) fn catch_up(&mut self, plan: &[PlanEntry], before: &[usize], hidden: Option<Tensor>) {
        let model = self.model.as_ref();
        // Hidden rows of each plan entry's committed positions.
        let mut rows: Vec<Option<Tensor>> = vec![None; plan.len()];
        if let Some(h) = &hidden {
            let mut off = 0;
            for (j, e) in plan.iter().enumerate() {
                let kept = self.running[e.seq].cache.position().saturating_sub(before[j]).min(e.n);
                rows[j] = h.narrow(0, off, kept).ok();
                off += e.n;
            }
        }
        for m in METHODS {
            let Some(p) = self.proposers.get(m) else { continue };
            let mut in_plan = vec![None; self.running.len()];
            for (j, e) in plan.iter().enumerate() {
                in_plan[e.seq] = Some(j);
            }
            let mut batch: Vec<(ProposerView<'_>, Option<Tensor>)> = self
                .running
                .iter_mut()
                .enumerate()
                .filter_map(|(i, s)| {
                    let j = in_plan[i]?;
                    // A draft model mirrors the prompt even for a request that finished at its
                    // first token, so the prompt blocks it publishes hold draft KV too.
                    let wanted = !s.finished || m == SpecMethod::Draft;
                    (s.spec.is_on() && s.spec.method == m && wanted).then(|| (s.proposer_view(), rows[j].take()))
                })
                .collect();
            if batch.is_empty() {
                continue;
            }
            if let Err(e) = p.catch_up(model, &mut batch) {
                tracing::warn!("{} proposer lost track; speculation off for its sequences: {e}", m.as_str());
                for (s, _) in batch.iter_mut() {
                    s.spec.disable();
                }
            }
        }
    }
}
