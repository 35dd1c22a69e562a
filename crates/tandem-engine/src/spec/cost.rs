//! What drafting costs: the engine's running estimate, per proposer, relative to a plain decode
//! step.
//!
//! Three terms, all measured from step times as the engine runs: the first draft of a sequence
//! in a step (for a draft model also feeding it the tokens of the last verification), each
//! further draft (one more proposer step and one more verify row), and each position the
//! proposer must catch up on after the sequence did not draft for a while (a draft model
//! re-reads the tokens decoded meanwhile before it can draft again, the MTP head reads the hidden
//! rows it gathered; prompt lookup has no such debt).

/// What drafting costs, relative to a plain decode step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftCost {
    /// The first draft of a sequence in a step.
    pub first: f64,
    /// Each further draft of that step.
    pub extra: f64,
    /// Each position decoded while the sequence did not draft, paid by its next draft.
    pub idle: f64,
}

impl DraftCost {
    /// The same cost for every draft, nothing for idle positions.
    pub fn flat(c: f64) -> Self {
        Self { first: c, extra: c, idle: 0.0 }
    }

    /// Cost of a step with `k > 0` drafts after `idle_steps` steps without any.
    pub fn step(&self, k: usize, idle_steps: usize) -> f64 {
        if k == 0 {
            return 0.0;
        }
        self.first.max(0.0) + self.extra.max(0.0) * (k - 1) as f64 + self.idle.max(0.0) * idle_steps as f64
    }
}

/// Weight of one observation in the moving averages.
const ALPHA: f64 = 0.25;

/// Cost of a further draft relative to the first, until measured (a draft model's first draft
/// also re-feeds the last verified tokens; further ones are one token each).
pub const EXTRA_PRIOR: f64 = 0.75;

/// Speculative steps after which one plain step re-measures the plain-step time.
pub const CALIBRATE_EVERY: usize = 32;

/// The engine's running estimate of what one proposer's drafts cost: measured from step times
/// of plain decode steps and of speculative steps. Steps where every drafting sequence drafted
/// one token measure the first draft's cost; steps with more drafts measure the further ones'
/// (the prior ratio between the two until then); the proposer reports what catching up on idle
/// positions took, per position.
#[derive(Debug, Clone)]
pub struct CostModel {
    plain_step_s: Option<f64>,
    first_draft_s: Option<f64>,
    extra_draft_s: Option<f64>,
    /// Catch-up on idle positions: decayed sums of seconds and of positions (a ratio of sums,
    /// so that long catch-ups weigh more than a few noisy tokens).
    idle_s: f64,
    idle_positions: f64,
    prior: f64,
    idle_prior: f64,
    /// Speculative steps since the last plain one.
    since_plain: usize,
}

impl CostModel {
    /// `prior`: relative cost of a draft until measured; `idle_prior`: of an idle position.
    pub fn new(prior: f64, idle_prior: f64) -> Self {
        Self {
            plain_step_s: None,
            first_draft_s: None,
            extra_draft_s: None,
            idle_s: 0.0,
            idle_positions: 0.0,
            prior,
            idle_prior,
            since_plain: 0,
        }
    }

    /// A step that decoded one token per sequence with no drafts and no prefill.
    pub fn observe_plain(&mut self, seconds: f64) {
        ema(&mut self.plain_step_s, seconds);
        self.since_plain = 0;
    }

    /// A step without prefill in which `seqs` sequences drafted and verified `drafted` tokens
    /// in all (idle catch-up already taken out of `seconds`).
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

    /// The proposer caught up on `positions` idle positions in `seconds`.
    pub fn observe_idle_catch_up(&mut self, seconds: f64, positions: usize) {
        if positions == 0 || !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        self.idle_s = self.idle_s * (1.0 - ALPHA) + seconds;
        self.idle_positions = self.idle_positions * (1.0 - ALPHA) + positions as f64;
    }

    /// Whether the next decode step should run without drafts to measure a plain step (none
    /// measured yet after a speculative one, or none for [`CALIBRATE_EVERY`] steps).
    pub fn wants_plain_step(&self) -> bool {
        self.since_plain >= CALIBRATE_EVERY || (self.plain_step_s.is_none() && self.since_plain > 0)
    }

    /// Relative costs (the priors until measured; further drafts are assumed to cost
    /// [`EXTRA_PRIOR`] of the first until a step measures them).
    pub fn cost(&self) -> DraftCost {
        let Some(p) = self.plain_step_s.filter(|&p| p > 0.0) else {
            return DraftCost { idle: self.idle_prior, ..DraftCost::flat(self.prior) };
        };
        let idle = if self.idle_positions > 0.0 { self.idle_s / self.idle_positions / p } else { self.idle_prior };
        let (first, extra) = match (self.first_draft_s, self.extra_draft_s) {
            (Some(f), Some(e)) => (f / p, e / p),
            (Some(f), None) => (f / p, f / p * EXTRA_PRIOR),
            (None, Some(e)) => (e / p, e / p),
            (None, None) => (self.prior, self.prior),
        };
        DraftCost { first, extra, idle }
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
    fn plain_steps_are_measured_now_and_then() {
        let mut c = CostModel::new(0.3, 0.0);
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
        let mut c = CostModel::new(0.3, 0.0);
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
        assert!((k4.step(4, 0) - (0.4 + 3.0 * 0.1)).abs() < 1e-9);
        assert_eq!(k4.step(0, 10), 0.0);
    }

    /// Idle catch-up is priced per position, long catch-ups weighing more than short ones.
    #[test]
    fn idle_catch_up_is_priced_per_position() {
        let mut c = CostModel::new(0.5, 0.2);
        assert_eq!(c.cost().idle, 0.2, "the prior until measured");
        c.observe_plain(0.1);
        assert_eq!(c.cost().idle, 0.2);
        c.observe_idle_catch_up(0.64, 64); // 10 ms a position: 0.1 of a plain step
        assert!((c.cost().idle - 0.1).abs() < 1e-9, "{:?}", c.cost());
        c.observe_idle_catch_up(0.06, 2); // a noisy short one moves it little
        let idle = c.cost().idle;
        assert!(idle > 0.1 && idle < 0.12, "{idle}");
        assert!((c.cost().step(2, 20) - (0.5 + 0.5 + 20.0 * idle)).abs() < 1e-9);
    }
}
