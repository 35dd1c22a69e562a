//! Sampling from a device's top candidates ([`TopCandidates`]: the K largest logits of a row
//! and its softmax mass) instead of the whole row, with the result [`Sampler::sample`] would
//! give on the full row, or `None` where the candidates cannot decide it (then the caller reads
//! the row).
//!
//! Let D be the candidates and `e_min` the smallest relative probability among them: every
//! token outside D has at most `e_min`. top-k is decided when its k-th candidate is strictly
//! above `e_min`; top-p when the nucleus ends at a candidate strictly above `e_min` (after
//! top-k the total is summed over D exactly as the full path does; without top-k it is the
//! device's `mass`, the same sum in another order, so the cut can differ from the full row's
//! only where the running mass is within rounding of `top_p`); min-p when `e_min < min_p`.
//! What survives is then the same set the full row gives, in the same (id) order, and the draw
//! uses the same arithmetic and one number from the RNG, so a seeded request gets the same
//! tokens either way. A request that needs the whole distribution (plain temperature
//! sampling) or penalties gets `None` from [`Sampler::candidates_temperature`].

use tandem_model::ops::sampling::{sanitize, TopCandidates, DEVICE_CANDIDATES};

use super::{by_value_desc, nucleus_len, Sampler, MIN_EXPONENT};

impl Sampler {
    /// `Some(1 / temperature)` when this request's next token can come from a device's top
    /// candidates (sampled, no penalties or biases, and a top-k below the candidate count, a
    /// top-p or a min-p to cut the distribution), the inverse temperature the device needs.
    pub fn candidates_temperature(&self) -> Option<f32> {
        let p = &self.params;
        let plain = p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && p.logit_bias.is_empty();
        let cut = (p.top_k > 0 && p.top_k < DEVICE_CANDIDATES) || p.top_p < 1.0 || p.min_p > 0.0;
        (!self.is_greedy() && plain && cut).then(|| 1.0 / p.temperature)
    }

    /// The token [`Sampler::sample`] would pick from the full row, from its top candidates;
    /// `None` (and the RNG untouched) when they cannot decide it.
    pub fn sample_top(&mut self, top: &TopCandidates) -> Option<u32> {
        self.candidates_temperature()?;
        if !self.filter_top(top) {
            return None;
        }
        Some(self.draw())
    }

    /// [`Sampler::filter`] on the candidates; false when undecided.
    fn filter_top(&mut self, top: &TopCandidates) -> bool {
        let p = &self.params;
        let (top_k, top_p, min_p, inv_t) = (p.top_k, p.top_p, p.min_p, 1.0 / p.temperature);
        let max = top.logits.iter().map(|&l| sanitize(l)).fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY || top.ids.len() != top.logits.len() {
            return false;
        }
        let mut pairs: Vec<(u32, f32)> = top.ids.iter().copied().zip(top.logits.iter().copied()).collect();
        pairs.sort_unstable_by_key(|c| c.0);
        let cands = &mut self.cands;
        cands.clear();
        let mut e_min = f32::INFINITY;
        for (id, l) in pairs {
            let z = (sanitize(l) - max) * inv_t;
            let e = if z > MIN_EXPONENT { z.exp() } else { 0.0 };
            e_min = e_min.min(e);
            if z > MIN_EXPONENT {
                cands.push((id, e));
            }
        }
        // Tokens outside the candidates may survive the exponent cut (each with at most e_min).
        let mut outside = top.ids.len() < top.vocab && e_min > 0.0;

        if top_k > 0 {
            if outside {
                if top_k > cands.len() {
                    return false;
                }
                cands.select_nth_unstable_by(top_k - 1, by_value_desc);
                if cands[top_k - 1].1 <= e_min {
                    return false;
                }
                cands.truncate(top_k);
                cands.sort_unstable_by_key(|c| c.0);
                outside = false;
            } else if top_k < cands.len() {
                cands.select_nth_unstable_by(top_k - 1, by_value_desc);
                cands.truncate(top_k);
                cands.sort_unstable_by_key(|c| c.0);
            }
        }

        if top_p < 1.0 {
            let total = if outside { top.mass } else { cands.iter().map(|c| c.1 as f64).sum() };
            let target = top_p as f64 * total;
            let keep = nucleus_len(cands, target).max(1);
            if outside {
                let head: f64 = cands[..keep].iter().map(|c| c.1 as f64).sum();
                let last = cands[..keep].iter().map(|c| c.1).fold(f32::INFINITY, f32::min);
                if head < target || last <= e_min {
                    return false;
                }
                outside = false;
            }
            cands.truncate(keep);
            cands.sort_unstable_by_key(|c| c.0);
        }

        if min_p > 0.0 {
            if outside {
                if e_min >= min_p {
                    return false;
                }
                outside = false;
            }
            cands.retain(|c| c.1 >= min_p);
        }
        !outside && !cands.is_empty()
    }
}
