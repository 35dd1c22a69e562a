//! How many tokens to draft: a per-sequence acceptance model, the engine's cost model
//! ([`super::cost`]) and a per-sequence exploration budget.
//!
//! Each sequence keeps, per draft position `i`, an exponential moving average of the chance
//! that draft `i` is accepted given that drafts `0..i` were. With `k` drafts a verification
//! then yields `E(k) = 1 + a_1 + a_1 a_2 + ...` tokens, and costs `1 + c_1 + c_e (k - 1)` plain
//! decode steps, where `c_1` (the first draft of a step: for a draft model also feeding it the
//! tokens of the last verification) and `c_e` (each further draft and its verify row), both
//! relative to a plain step, are measured by the engine as it runs ([`DraftCost`]). The chosen
//! `k` maximises `E(k) / cost(k)`; when no `k > 0` pays, the sequence stops speculating and
//! probes with one draft after [`PROBE_EVERY`] idle steps so it notices when the text becomes
//! predictable again. Each probe after which drafting still does not pay doubles the wait, up
//! to [`MAX_PROBE_EVERY`] steps.
//!
//! A draft model that sat idle must first catch up on every position decoded meanwhile, so on
//! text it cannot predict, keeping it ready to probe costs about as much as running it on every
//! token (a 0.5B draft next to a 1.5B target: ~12% of the time), whatever the probes' spacing.
//! Exploration therefore runs on a budget: each sequence keeps a ledger, in plain-step units,
//! of the time it has spent and of what speculation has gained or lost so far (accepted tokens
//! minus what the drafts and catch-up cost). A probe, or a return to drafting that first needs
//! a catch-up, happens only while the gains so far plus [`EXPLORATION_BUDGET`] of the time spent
//! cover its cost; a sequence on which speculation does not pay thus ends at most a few percent
//! (plus [`EXPLORATION_CREDIT`], a first probe) slower than plain decoding, while one that has
//! gained keeps exploring on its gains. A sequence for which no draft length pays at the start
//! probes at once, while its proposer has nothing to catch up on, and a probe whose draft is
//! accepted is followed by another (the proposer is level, so it costs no catch-up and pays
//! for itself when accepted) until one is rejected or the estimates make drafting pay.

use super::cost::DraftCost;

/// Acceptance assumed before anything is observed.
const PRIOR: f64 = 0.6;
/// Weight of one observation in the moving averages.
const ALPHA: f64 = 0.25;
/// Idle steps before the first single-draft probe while speculation does not pay.
pub const PROBE_EVERY: usize = 8;
/// Longest wait between probes.
pub const MAX_PROBE_EVERY: usize = 256;
/// Share of a sequence's time that exploring (probes that do not pay) may cost it beyond what
/// speculation has gained it.
pub const EXPLORATION_BUDGET: f64 = 0.03;
/// Plain steps every sequence may spend exploring before anything is known: a first
/// single-draft probe even where drafts look dear.
pub const EXPLORATION_CREDIT: f64 = 2.0;

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
    /// Steps since the sequence last verified drafts: positions a lazy proposer must catch up
    /// on before its next draft.
    since_draft: usize,
    /// Plain-step units this sequence has spent decoding (plain steps plus what its drafts and
    /// catch-ups cost).
    spent: f64,
    /// Tokens speculation gained minus what drafting cost, in plain-step units.
    net: f64,
    /// The cost model and idle positions the current step's draft length was chosen with.
    pending: Option<(DraftCost, usize)>,
    /// Whether the last verification accepted every draft.
    all_accepted: bool,
}

impl AdaptiveK {
    pub fn new(max_k: usize) -> Self {
        Self {
            max_k,
            accept: vec![PRIOR; max_k],
            seen: vec![false; max_k],
            // A sequence for which no length pays yet probes at once (nothing to catch up on).
            idle_steps: PROBE_EVERY,
            probe_every: PROBE_EVERY,
            probed: false,
            since_draft: 0,
            spent: 0.0,
            net: 0.0,
            pending: None,
            all_accepted: false,
        }
    }

    /// Whether exploring at `cost` (plain-step units) stays within the budget.
    fn affordable(&self, cost: f64) -> bool {
        EXPLORATION_CREDIT + self.net + EXPLORATION_BUDGET * self.spent >= cost
    }

    /// Steps since the sequence last verified drafts.
    pub fn since_draft(&self) -> usize {
        self.since_draft
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
        let (mut best_k, mut best) = (0, 1.0);
        for k in 1..=self.max_k {
            let gain = self.expected_tokens(k) / (1.0 + cost.step(k, 0));
            if gain > best * 1.02 {
                best = gain;
                best_k = k;
            }
        }
        self.spent += 1.0;
        self.pending = None;
        let after_probe = std::mem::take(&mut self.probed);
        let streak = std::mem::take(&mut self.all_accepted);
        // Positions the proposer must catch up on before it can draft now.
        let idle = self.since_draft;
        if best_k > 0 && idle > 0 && !self.affordable(cost.idle.max(0.0) * idle as f64) {
            // Drafting would pay, but not the catch-up it needs first (not within the budget).
            best_k = 0;
        }
        if best_k == 0 && self.max_k > 0 {
            // Every draft of the last step was accepted: probe again while the proposer is
            // level (the estimates may not have caught up with predictable text yet).
            let follow_up = streak && idle == 0;
            if after_probe && !follow_up {
                // The probe did not make drafting pay: wait longer before the next one.
                self.probe_every = (self.probe_every * 2).min(MAX_PROBE_EVERY);
            }
            self.idle_steps += 1;
            if (follow_up || self.idle_steps >= self.probe_every) && self.affordable(cost.step(1, idle)) {
                self.idle_steps = 0;
                self.probed = true;
                self.pending = Some((cost, idle));
                return 1;
            }
            self.since_draft += 1;
            return 0;
        }
        self.idle_steps = 0;
        self.probe_every = PROBE_EVERY;
        self.pending = Some((cost, idle));
        best_k
    }

    /// Records a verification: `accepted` of `drafted` drafts were accepted.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        if let Some((cost, idle)) = self.pending.take() {
            let charge = cost.step(drafted, idle);
            self.spent += charge;
            self.net += accepted as f64 - charge;
        }
        self.since_draft = 0;
        self.all_accepted = accepted == drafted;
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
        assert_eq!(b.choose(DraftCost::flat(0.3)), 1, "a first probe");
        b.observe(1, 0);
        assert_eq!(b.choose(DraftCost::flat(0.3)), 0);
    }

    #[test]
    fn probes_while_idle() {
        let mut b = AdaptiveK::new(4);
        b.net = 1e3; // gains so far cover any probe
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
        b.net = 1e3; // gains so far cover any probe
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
        assert_eq!(at[0], 1, "a sequence probes at once at the start");
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

    /// Positions never reached take the deepest reached one's acceptance: one-draft steps that
    /// are always accepted make two drafts look as good, so the length can grow.
    #[test]
    fn unreached_positions_follow_the_deepest_reached() {
        let mut a = AdaptiveK::new(4);
        for _ in 0..30 {
            a.observe(1, 1);
        }
        assert!(a.expected_tokens(2) > 2.9, "{}", a.expected_tokens(2));
        assert!(a.choose(DraftCost { first: 0.87, extra: 0.65, idle: 0.0 }) >= 2);
    }

    /// A first draft that costs much (a draft model re-feeding tokens) but cheap further ones:
    /// long drafts pay at high acceptance where a flat cost would stop at one.
    #[test]
    fn cheap_further_drafts_make_long_drafts_pay() {
        let mut a = AdaptiveK::new(4);
        for _ in 0..30 {
            a.observe(4, 4);
        }
        assert_eq!(a.choose(DraftCost { first: 0.87, extra: 0.6, idle: 0.0 }), 4);
        assert!(a.choose(DraftCost::flat(0.87)) < 4);
    }

    /// Steps of a sequence whose drafts are never accepted; returns the steps that drafted.
    fn run_unpredictable(a: &mut AdaptiveK, cost: DraftCost, steps: usize) -> Vec<usize> {
        let mut drafted_at = Vec::new();
        for step in 0..steps {
            let k = a.choose(cost);
            if k > 0 {
                a.observe(k, 0);
                drafted_at.push(step);
            }
        }
        drafted_at
    }

    /// A draft model whose every draft is rejected and which must catch up on each idle
    /// position before it drafts: exploration stops once it would cost more than the budget,
    /// so the sequence loses at most [`EXPLORATION_BUDGET`] of its time to speculation.
    #[test]
    fn costly_exploration_stays_within_the_budget() {
        let cost = DraftCost { first: 0.7, extra: 0.5, idle: 0.12 };
        let mut a = AdaptiveK::new(4);
        let drafted = run_unpredictable(&mut a, cost, 2000);
        assert!(!drafted.is_empty(), "it tries at first (prior acceptance)");
        assert!(-a.net <= EXPLORATION_CREDIT + EXPLORATION_BUDGET * a.spent + 1e-9, "net {} spent {}", a.net, a.spent);
        assert!(a.spent < 2000.0 * (1.0 + EXPLORATION_BUDGET) + 1e-9);
        // Probes that need a catch-up of the whole idle stretch stop for good.
        assert!(drafted.last().unwrap() < &200, "{drafted:?}");
    }

    /// Prompt lookup has no catch-up: its cheap probes go on over a long unpredictable
    /// stretch, at the backoff's pace, still within the budget.
    #[test]
    fn cheap_probes_go_on_within_the_budget() {
        let cost = DraftCost { first: 0.15, extra: 0.1, idle: 0.0 };
        let mut a = AdaptiveK::new(4);
        let drafted = run_unpredictable(&mut a, cost, 4000);
        assert!(-a.net <= EXPLORATION_CREDIT + EXPLORATION_BUDGET * a.spent + 1e-9);
        assert!(drafted.iter().filter(|&&s| s > 2000).count() >= 4, "{drafted:?}");
    }

    /// Gains pay for exploration: after drafting has paid off, probes resume even when each
    /// needs a costly catch-up, and stop again once the gains are spent.
    #[test]
    fn gains_fund_exploration() {
        let cost = DraftCost { first: 0.55, extra: 0.35, idle: 0.12 };
        let mut a = AdaptiveK::new(4);
        for _ in 0..100 {
            let k = a.choose(cost);
            assert!(k > 0);
            a.observe(k, k);
        }
        let gained = a.net;
        assert!(gained > 50.0, "{gained}");
        // The text turns unpredictable: probes continue at the backoff's pace on the gains.
        let drafted = run_unpredictable(&mut a, cost, 3000);
        assert!(drafted.iter().filter(|&&s| s > 500).count() >= 2, "{drafted:?}");
        assert!(a.net >= -EXPLORATION_CREDIT - EXPLORATION_BUDGET * a.spent - 1e-9);
    }

    /// Accepted probes are followed by more, so a sequence whose drafts look too dear at the
    /// prior acceptance finds out that they are accepted and drafts for good; the first
    /// rejection ends the run of probes.
    #[test]
    fn accepted_probes_lead_to_drafting() {
        let cost = DraftCost { first: 0.7, extra: 0.4, idle: 0.12 };
        let mut a = AdaptiveK::new(4);
        let ks: Vec<usize> = (0..12)
            .map(|_| {
                let k = a.choose(cost);
                a.observe(k, k);
                k
            })
            .collect();
        assert!(ks.iter().all(|&k| k > 0), "{ks:?}");
        assert!(ks[11] >= 2, "{ks:?}");
        let mut b = AdaptiveK::new(4);
        assert_eq!(b.choose(cost), 1);
        b.observe(1, 1);
        let k = b.choose(cost);
        assert!(k >= 1, "drafting goes on");
        b.observe(k, 0);
        assert_eq!(b.choose(cost), 0, "a rejection ends the run");
        // Drafts too dear for one accepted probe to make them pay: another probe follows.
        let dear = DraftCost { first: 0.9, extra: 0.6, idle: 0.12 };
        let mut c = AdaptiveK::new(4);
        assert_eq!(c.choose(dear), 1);
        c.observe(1, 1);
        assert_eq!(c.choose(dear), 1, "a follow-up probe");
        c.observe(1, 0);
        assert_eq!(c.choose(dear), 0);
    }
}
