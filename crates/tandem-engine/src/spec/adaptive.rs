//! How many tokens to draft: a per-sequence acceptance model and an engine-wide cost model.
//!
//! Each sequence keeps, per draft position `i`, an exponential moving average of the chance
//! that draft `i` is accepted given that drafts `0..i` were. With `k` drafts a verification
//! then yields `E(k) = 1 + a_1 + a_1 a_2 + ...` tokens, and costs `1 + c k` plain decode steps,
//! where `c` (drafting plus verifying one more token, relative to a plain step) is measured by
//! the engine as it runs. The chosen `k` maximises `E(k) / (1 + c k)`; when no `k > 0` pays,
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
    idle_steps: usize,
    /// Idle steps before the next probe.
    probe_every: usize,
    /// Whether the last choice was a probe.
    probed: bool,
}

impl AdaptiveK {
    pub fn new(max_k: usize) -> Self {
        Self { max_k, accept: vec![PRIOR; max_k], idle_steps: 0, probe_every: PROBE_EVERY, probed: false }
    }

    /// Expected tokens per verification with `k` drafts.
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let mut e = 1.0;
        let mut reach = 1.0;
        for a in self.accept.iter().take(k) {
            reach *= a;
            e += reach;
        }
        e
    }

    /// The draft length for the next step, given the relative cost of one drafted token.
    pub fn choose(&mut self, cost: f64) -> usize {
        let cost = cost.max(0.0);
        let (mut best_k, mut best) = (0, 1.0);
        for k in 1..=self.max_k {
            let gain = self.expected_tokens(k) / (1.0 + cost * k as f64);
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
        for (i, a) in self.accept.iter_mut().enumerate().take(drafted.min(accepted + 1)) {
            let hit = if i < accepted { 1.0 } else { 0.0 };
            *a += ALPHA * (hit - *a);
        }
    }
}

/// The engine's running estimate of what one drafted token costs, relative to a plain decode
/// step: measured from step times of plain decode steps and of speculative steps.
#[derive(Debug, Clone)]
pub struct CostModel {
    plain_step_s: Option<f64>,
    per_draft_s: Option<f64>,
    prior: f64,
    /// Speculative steps since the last plain one.
    since_plain: usize,
}

/// Speculative steps after which one plain step re-measures the plain-step time.
pub const CALIBRATE_EVERY: usize = 32;

impl CostModel {
    pub fn new(prior: f64) -> Self {
        Self { plain_step_s: None, per_draft_s: None, prior, since_plain: 0 }
    }

    /// A step that decoded one token per sequence with no drafts and no prefill.
    pub fn observe_plain(&mut self, seconds: f64) {
        ema(&mut self.plain_step_s, seconds);
        self.since_plain = 0;
    }

    /// A step without prefill that drafted and verified `drafted` tokens in all.
    pub fn observe_speculative(&mut self, seconds: f64, drafted: usize) {
        self.since_plain += 1;
        if let (Some(plain), true) = (self.plain_step_s, drafted > 0) {
            ema(&mut self.per_draft_s, ((seconds - plain) / drafted as f64).max(0.0));
        }
    }

    /// Whether the next decode step should run without drafts to measure a plain step (none
    /// measured yet after a speculative one, or none for [`CALIBRATE_EVERY`] steps).
    pub fn wants_plain_step(&self) -> bool {
        self.since_plain >= CALIBRATE_EVERY || (self.plain_step_s.is_none() && self.since_plain > 0)
    }

    /// Relative cost of one drafted token (the prior until both kinds of step were seen).
    pub fn cost(&self) -> f64 {
        match (self.plain_step_s, self.per_draft_s) {
            (Some(p), Some(d)) if p > 0.0 => d / p,
            _ => self.prior,
        }
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
        assert_eq!(a.choose(0.1), 6);
        let mut b = AdaptiveK::new(6);
        for _ in 0..30 {
            b.observe(1, 0);
        }
        assert_eq!(b.choose(0.3), 0);
    }

    #[test]
    fn probes_while_idle() {
        let mut b = AdaptiveK::new(4);
        for _ in 0..30 {
            b.observe(1, 0);
        }
        let ks: Vec<usize> = (0..PROBE_EVERY).map(|_| b.choose(0.5)).collect();
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
        let probe_steps =
            |b: &mut AdaptiveK, n: usize| -> Vec<usize> { (1..=n).filter(|_| b.choose(0.5) == 1).collect::<Vec<_>>() };
        let mut at = Vec::new();
        let mut step = 0;
        for _ in 0..2000 {
            step += 1;
            if b.choose(0.5) == 1 {
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
        assert!(b.choose(0.1) > 0);
        for _ in 0..30 {
            b.observe(1, 0);
        }
        assert_eq!(probe_steps(&mut b, PROBE_EVERY).len(), 1, "the wait starts again at {PROBE_EVERY}");
    }

    #[test]
    fn expected_tokens_follow_the_chain() {
        let mut a = AdaptiveK::new(3);
        a.accept = vec![0.5, 0.5, 0.0];
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
        c.observe_speculative(0.2, 4);
        assert!(c.wants_plain_step(), "no plain step measured yet");
        c.observe_plain(0.1);
        for _ in 0..CALIBRATE_EVERY - 1 {
            c.observe_speculative(0.2, 4);
        }
        assert!(!c.wants_plain_step());
        c.observe_speculative(0.2, 4);
        assert!(c.wants_plain_step());
    }

    #[test]
    fn cost_is_measured_relative_to_plain_steps() {
        let mut c = CostModel::new(0.3);
        assert_eq!(c.cost(), 0.3);
        c.observe_speculative(0.2, 4); // no plain step yet: ignored
        assert_eq!(c.cost(), 0.3);
        c.observe_plain(0.1);
        c.observe_speculative(0.14, 4);
        assert!((c.cost() - 0.1).abs() < 1e-9);
    }
}
