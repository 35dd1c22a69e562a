//! How many tokens to draft: a per-sequence acceptance model and an engine-wide cost model.
//!
//! Each sequence keeps, per draft position `i`, an exponential moving average of the chance
//! that draft `i` is accepted given that drafts `0..i` were. With `k` drafts a verification
//! then yields `E(k) = 1 + a_1 + a_1 a_2 + ...` tokens, and costs `1 + c_1 + c_e (k - 1)` plain
//! decode steps, where `c_1` (the first draft of a step: for a draft model also feeding it the
//! tokens of the last verification) and `c_e` (each further draft and its verify row), both
//! relative to a plain step, are measured by the engine as it runs ([`DraftCost`]). The chosen
//! `k` maximises `E(k) / cost(k)`; when no `k > 0` pays,
//! the sequence stops speculating and probes with one draft after [`PROBE_EVERY`] idle steps
//! so it notices when the text becomes predictable again. Each probe after which drafting
//! still does not pay doubles the wait, up to [`MAX_PROBE_EVERY`] steps: a probe costs more
//! than a plain step (a draft model first catches up on every token since its last draft), so
//! on text that stays unpredictable the probes' share of the time shrinks towards nothing.

/// Acceptance assumed before anything is observed.
const PRIOR: f64 = 0.6;
/// Weight of one observation in the moving averages.
const ALPHA: f64 = 0.25;
/// Idle steps before the first single-draft probe while speculation does not pay.
pub const PROBE_EVERY: usize = 8;
/// Longest wait between probes.
pub const MAX_PROBE_EVERY: usize = 256;

/// Per-sequence acceptance statistics and the draft length chosen from them.
#[derive(Debug, Clone)]
pub struct AdaptiveK {
    max_k: usize,
    /// Conditional acceptance per draft position.
    accept: Vec<f64>,
    /// Whether a verification has reached each position yet; a position never reached is
    /// assumed to accept like the deepest one that was (acceptance varies little with depth),
    /// so a costly first draft does not pin the length at one forever.
    seen: Vec<bool>,
    idle_steps: usize,
    /// Idle steps before the next probe.
    probe_every: usize,
    /// Whether the last choice was a probe.
    probed: bool,
}

impl AdaptiveK {
    pub fn new(max_k: usize) -> Self {
        Self {
            max_k,
            accept: vec![PRIOR; max_k],
            seen: vec![false; max_k],
            idle_steps: 0,
            probe_every: PROBE_EVERY,
            probed: false,
        }
    }

    /// Expected tokens per verification with `k` drafts.
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let mut e = 1.0;
        let mut reach = 1.0;
        let mut last = PRIOR;
        for (&a, &seen) in self.accept.iter().zip(&self.seen).take(k) {
            if seen {
                last = a;
            }
            reach *= last;
            e += reach;
        }
        e
    }

    /// The draft length for the next step, given what drafts cost.
    pub fn choose(&mut self, cost: DraftCost) -> usize {
        let (first, extra) = (cost.first.max(0.0), cost.extra.max(0.0));
        let (mut best_k, mut best) = (0, 1.0);
        for k in 1..=self.max_k {
            let gain = self.expected_tokens(k) / (1.0 + first + extra * (k - 1) as f64);
            if gain > best * 1.02 {
                best = gain;
                best_k = k;
            }
        }
        let after_probe = std::mem::take(&mut self.probed);
        if best_k == 0 && self.max_k > 0 {
            if after_probe {
                // The probe did not make drafting pay: wait longer before the next one.
                self.probe_every = (self.probe_every * 2).min(MAX_PROBE_EVERY);
            }
            self.idle_steps += 1;
            if self.idle_steps >= self.probe_every {
                self.idle_steps = 0;
                self.probed = true;
                return 1;
            }
        } else {
            self.idle_steps = 0;
            self.probe_every = PROBE_EVERY;
        }
        best_k
    }

    /// Records a verification: `accepted` of `drafted` drafts were accepted.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        let mut last_seen = PRIOR;
        let reached = drafted.min(accepted + 1);
        for (i, (a, seen)) in self.accept.iter_mut().zip(&mut self.seen).enumerate().take(reached) {
            let hit = if i < accepted { 1.0 } else { 0.0 };
            if !*seen {
                // The first observation starts from the value the position was assumed to have.
                *a = last_seen;
                *seen = true;
            }
            *a += ALPHA * (hit - *a);
            last_seen = *a;
        }
    }
}

/// What drafting costs, relative to a plain decode step: the first draft of a sequence in a
/// step, and each further one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftCost {
    pub first: f64,
    pub extra: f64,
}

impl DraftCost {
    /// The same cost for every draft.
    pub fn flat(c: f64) -> Self {
        Self { first: c, extra: c }
    }
}

/// The engine's running estimate of what drafts cost, relative to a plain decode step:
/// measured from step times of plain decode steps and of speculative steps. Steps where every
/// drafting sequence drafted one token measure the first draft's cost; steps with more drafts
/// measure the further ones' (the prior ratio between the two until then).
#[derive(Debug, Clone)]
pub struct CostModel {
    plain_step_s: Option<f64>,
    first_draft_s: Option<f64>,
    extra_draft_s: Option<f64>,
    prior: f64,
    /// Speculative steps since the last plain one.
    since_plain: usize,
}

/// Cost of a further draft relative to the first, until measured (a draft model's first draft
/// also re-feeds the last verified tokens; further ones are one token each).
pub const EXTRA_PRIOR: f64 = 0.75;

/// Speculative steps after which one plain step re-measures the plain-step time.
pub const CALIBRATE_EVERY: usize = 32;

impl CostModel {
    pub fn new(prior: f64) -> Self {
        Self { plain_step_s: None, first_draft_s: None, extra_draft_s: None, prior, since_plain: 0 }
    }

    /// A step that decoded one token per sequence with no drafts and no prefill.
    pub fn observe_plain(&mut self, seconds: f64) {
        ema(&mut self.plain_step_s, seconds);
        self.since_plain = 0;
    }

    /// A step without prefill in which `seqs` sequences drafted and verified `drafted` tokens
    /// in all.
    pub fn observe_speculative(&mut self, seconds: f64, drafted: usize, seqs: usize) {
        self.since_plain += 1;
        let Some(plain) = self.plain_step_s else { return };
        if drafted == 0 || seqs == 0 {
            return;
        }
        let over = (seconds - plain).max(0.0);
        if drafted <= seqs {
            ema(&mut self.first_draft_s, over / drafted as f64);
        } else {
            let first = self.first_draft_s.unwrap_or(over / drafted as f64);
            ema(&mut self.extra_draft_s, ((over - first * seqs as f64) / (drafted - seqs) as f64).max(0.0));
        }
    }

    /// Whether the next decode step should run without drafts to measure a plain step (none
    /// measured yet after a speculative one, or none for [`CALIBRATE_EVERY`] steps).
    pub fn wants_plain_step(&self) -> bool {
        self.since_plain >= CALIBRATE_EVERY || (self.plain_step_s.is_none() && self.since_plain > 0)
    }

    /// Relative cost of the first and of further drafts (the prior until measured; further
    /// drafts are assumed to cost [`EXTRA_PRIOR`] of the first until a step measures them).
    pub fn cost(&self) -> DraftCost {
        let Some(p) = self.plain_step_s.filter(|&p| p > 0.0) else { return DraftCost::flat(self.prior) };
        let (first, extra) = match (self.first_draft_s, self.extra_draft_s) {
            (Some(f), Some(e)) => (f, e),
            (Some(f), None) => (f, f * EXTRA_PRIOR),
            (None, Some(e)) => (e, e),
            (None, None) => return DraftCost::flat(self.prior),
        };
        DraftCost { first: first / p, extra: extra / p }
    }
}

fn ema(slot: &mut Option<f64>, x: f64) {
    if !x.is_finite() {
        return;
    }
    *slot = Some(match *slot {
        Some(v) => v + ALPHA * (x - v),
        None => x,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_acceptance_drafts_long_low_acceptance_stops() {
        let mut a = AdaptiveK::new(6);
        for _ in 0..30 {
            a.observe(6, 6);
        }
        assert_eq!(a.choose(DraftCost::flat(0.1)), 6);
        let mut b = AdaptiveK::new(6);
        for _ in 0..30 {
            b.observe(1, 0);
        }
        assert_eq!(b.choose(DraftCost::flat(0.3)), 0);
    }

    #[test]
    fn probes_while_idle() {
        let mut b = AdaptiveK::new(4);
        for _ in 0..30 {
            b.observe(1, 0);
        }
        let ks: Vec<usize> = (0..PROBE_EVERY).map(|_| b.choose(DraftCost::flat(0.5))).collect();
        assert_eq!(ks.iter().filter(|&&k| k == 1).count(), 1);
        assert_eq!(ks.iter().filter(|&&k| k == 0).count(), PROBE_EVERY - 1);
    }

    /// Failed probes double the wait (8, 16, 32, ... up to the maximum); a probe that makes
    /// drafting pay again resets it.
    #[test]
    fn failed_probes_back_off_and_success_resets() {
        let mut b = AdaptiveK::new(4);
        for _ in 0..30 {
            b.observe(1, 0);
        }
        let probe_steps = |b: &mut AdaptiveK, n: usize| -> Vec<usize> {
            (1..=n).filter(|_| b.choose(DraftCost::flat(0.5)) == 1).collect::<Vec<_>>()
        };
        let mut at = Vec::new();
        let mut step = 0;
        for _ in 0..2000 {
            step += 1;
            if b.choose(DraftCost::flat(0.5)) == 1 {
                at.push(step);
                b.observe(1, 0);
            }
        }
        let gaps: Vec<usize> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(at[0], PROBE_EVERY);
        assert_eq!(&gaps[..5], &[16, 32, 64, 128, 256], "{at:?}");
        assert!(gaps[5..].iter().all(|&g| g == MAX_PROBE_EVERY), "{gaps:?}");
        // Text turns predictable: the next probes are accepted and drafting resumes.
        let before = probe_steps(&mut b, MAX_PROBE_EVERY).len();
        assert_eq!(before, 1);
        for _ in 0..10 {
            b.observe(4, 4);
        }
        assert!(b.choose(DraftCost::flat(0.1)) > 0);
        for _ in 0..30 {
            b.observe(1, 0);
        }
        assert_eq!(probe_steps(&mut b, PROBE_EVERY).len(), 1, "the wait starts again at {PROBE_EVERY}");
    }

    #[test]
    fn expected_tokens_follow_the_chain() {
        let mut a = AdaptiveK::new(3);
        a.accept = vec![0.5, 0.5, 0.0];
        a.seen = vec![true; 3];
        assert_eq!(a.expected_tokens(0), 1.0);
        assert_eq!(a.expected_tokens(2), 1.75);
        assert_eq!(a.expected_tokens(3), 1.75);
        // Only positions up to the first rejection learn.
        a.observe(3, 0);
        assert_eq!(a.accept, vec![0.375, 0.5, 0.0]);
    }

    #[test]
    fn plain_steps_are_measured_now_and_then() {
        let mut c = CostModel::new(0.3);
        assert!(!c.wants_plain_step());
        c.observe_speculative(0.2, 4, 1);
        assert!(c.wants_plain_step(), "no plain step measured yet");
        c.observe_plain(0.1);
        for _ in 0..CALIBRATE_EVERY - 1 {
            c.observe_speculative(0.2, 4, 1);
        }
        assert!(!c.wants_plain_step());
        c.observe_speculative(0.2, 4, 1);
        assert!(c.wants_plain_step());
    }

    #[test]
    fn cost_is_measured_relative_to_plain_steps() {
        let mut c = CostModel::new(0.3);
        assert_eq!(c.cost(), DraftCost::flat(0.3));
        c.observe_speculative(0.2, 4, 1); // no plain step yet: ignored
        assert_eq!(c.cost(), DraftCost::flat(0.3));
        c.observe_plain(0.1);
        // Two sequences drafting one token each: 0.08 s over plain, 0.04 s per first draft.
        c.observe_speculative(0.18, 2, 2);
        let k1 = c.cost();
        assert!((k1.first - 0.4).abs() < 1e-9 && (k1.extra - 0.4 * EXTRA_PRIOR).abs() < 1e-9, "{k1:?}");
        // One sequence drafting four: 0.04 s first + 3 x 0.01 s further.
        c.observe_speculative(0.17, 4, 1);
        let k4 = c.cost();
        assert!((k4.first - 0.4).abs() < 1e-9 && (k4.extra - 0.1).abs() < 1e-9, "{k4:?}");
    }

    /// Positions never reached take the deepest reached one's acceptance: one-draft steps that
    /// are always accepted make two drafts look as good, so the length can grow.
    #[test]
    fn unreached_positions_follow_the_deepest_reached() {
        let mut a = AdaptiveK::new(4);
        for _ in 0..30 {
            a.observe(1, 1);
        }
        assert!(a.expected_tokens(2) > 2.9, "{}", a.expected_tokens(2));
        assert!(a.choose(DraftCost { first: 0.87, extra: 0.65 }) >= 2);
    }

    /// A first draft that costs much (a draft model re-feeding tokens) but cheap further ones:
    /// long drafts pay at high acceptance where a flat cost would stop at one.
    #[test]
    fn cheap_further_drafts_make_long_drafts_pay() {
        let mut a = AdaptiveK::new(4);
        for _ in 0..30 {
            a.observe(4, 4);
        }
        assert_eq!(a.choose(DraftCost { first: 0.87, extra: 0.6 }), 4);
        assert!(a.choose(DraftCost::flat(0.87)) < 4);
    }
}
