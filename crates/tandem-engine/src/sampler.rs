//! Token sampling: repetition/presence/frequency penalties, then greedy or temperature,
//! top-k, top-p and min-p filtering and a draw from a per-request seeded ChaCha RNG.
//!
//! Logits enter as one `f32` per vocabulary entry (raw model output for one position) and
//! leave as a token id. NaN logits count as `-inf`, `+inf` as the largest finite value; no
//! input makes the sampler panic. The same seed and the same logits always give the same
//! token. [`top_logprobs`] reports log-probabilities of the raw (unpenalised, temperature 1)
//! distribution, which is what OpenAI-style `logprobs` show.

use std::cmp::Ordering;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use tandem_model::ops::sampling::sanitize;

use crate::request::SamplingParams;

/// A token candidate: (id, logit before softmax / relative probability after).
type Candidate = (u32, f32);

/// Orders candidates by value descending, ties by the lower id (a total order).
fn by_value_desc(a: &Candidate, b: &Candidate) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Chooses the next token of one sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    /// Scratch: surviving candidates of the current step.
    cands: Vec<Candidate>,
    /// Scratch: the penalty window, sorted, to count occurrences.
    window: Vec<u32>,
}

impl Sampler {
    /// Validates `params` and seeds the RNG (from `params.seed`, else from the OS).
    ///
    /// Errors name the offending field: temperature must be finite and >= 0, top_p in (0, 1],
    /// min_p in [0, 1], repetition_penalty finite and > 0, presence/frequency penalties finite.
    pub fn new(params: SamplingParams) -> Result<Self, String> {
        let p = &params;
        if !(p.temperature.is_finite() && p.temperature >= 0.0) {
            return Err(format!("temperature must be a finite number >= 0, got {}", p.temperature));
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return Err(format!("top_p must be in (0, 1], got {}", p.top_p));
        }
        if !(p.min_p >= 0.0 && p.min_p <= 1.0) {
            return Err(format!("min_p must be in [0, 1], got {}", p.min_p));
        }
        if !(p.repetition_penalty.is_finite() && p.repetition_penalty > 0.0) {
            return Err(format!("repetition_penalty must be a finite number > 0, got {}", p.repetition_penalty));
        }
        if !p.presence_penalty.is_finite() {
            return Err(format!("presence_penalty must be finite, got {}", p.presence_penalty));
        }
        if !p.frequency_penalty.is_finite() {
            return Err(format!("frequency_penalty must be finite, got {}", p.frequency_penalty));
        }
        let rng = match p.seed {
            Some(seed) => ChaCha20Rng::seed_from_u64(seed),
            None => ChaCha20Rng::from_rng(&mut rand::rng()),
        };
        Ok(Self { params, rng, cands: Vec::new(), window: Vec::new() })
    }

    /// The validated parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// True when [`Sampler::sample`] is an argmax of the penalised logits: temperature 0,
    /// top_k 1, or a temperature so small that its inverse overflows.
    pub fn is_greedy(&self) -> bool {
        let t = self.params.temperature;
        t == 0.0 || self.params.top_k == 1 || (1.0 / t).is_infinite()
    }

    /// Whether picking a token needs nothing but the argmax of the raw logits (greedy, no
    /// penalties): then a GPU engine picks it on the device and reads back one id.
    pub fn argmax_only(&self) -> bool {
        let p = &self.params;
        self.is_greedy()
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && p.logit_bias.is_empty()
    }

    /// A uniform draw in [0, 1) from this request's RNG (for speculative acceptance tests, so
    /// that a seeded request stays reproducible).
    pub fn uniform(&mut self) -> f64 {
        self.rng.random::<f64>()
    }

    /// Picks the next token. `history` is every token of the sequence so far (prompt included);
    /// penalties look at its last `penalty_last_n` entries. `logits` is modified in place.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        if self.is_greedy() {
            return argmax(logits);
        }
        if !self.filter(logits) {
            return argmax(logits);
        }
        self.draw()
    }

    /// A draw from `self.cands` (in id order), weighted by their relative probabilities.
    fn draw(&mut self) -> u32 {
        let total: f64 = self.cands.iter().map(|c| c.1 as f64).sum();
        let mut r = self.rng.random::<f64>() * total;
        for &(id, p) in &self.cands {
            r -= p as f64;
            if r < 0.0 {
                return id;
            }
        }
        // Rounding left a sliver: the last candidate with nonzero mass takes it.
        self.cands.iter().rev().find(|c| c.1 > 0.0).map_or(self.cands[0].0, |c| c.0)
    }

    /// The distribution [`Sampler::sample`] draws from: (id, probability) pairs summing to 1,
    /// after penalties, temperature and filtering (a single `(argmax, 1.0)` when greedy).
    /// Speculative verification uses it for rejection sampling. `logits` is modified in place.
    pub fn distribution(&mut self, logits: &mut [f32], history: &[u32]) -> Vec<(u32, f32)> {
        self.apply_penalties(logits, history);
        if self.is_greedy() || !self.filter(logits) {
            return vec![(argmax(logits), 1.0)];
        }
        let total: f64 = self.cands.iter().map(|c| c.1 as f64).sum();
        self.cands.iter().map(|&(id, p)| (id, (p as f64 / total) as f32)).collect()
    }

    /// Applies the repetition, presence and frequency penalties (llama.cpp semantics:
    /// repetition first — divide a positive logit, multiply a non-positive one — then subtract
    /// `count * frequency + presence`). Ids outside the vocabulary are ignored.
    fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        for &(id, bias) in &self.params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        let p = &self.params;
        if p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        let n = if p.penalty_last_n == 0 { history.len() } else { p.penalty_last_n.min(history.len()) };
        self.window.clear();
        self.window.extend_from_slice(&history[history.len() - n..]);
        self.window.sort_unstable();
        let mut i = 0;
        while i < self.window.len() {
            let id = self.window[i];
            let mut j = i + 1;
            while j < self.window.len() && self.window[j] == id {
                j += 1;
            }
            let count = (j - i) as f32;
            i = j;
            let Some(l) = logits.get_mut(id as usize) else { continue };
            if *l <= 0.0 {
                *l *= p.repetition_penalty;
            } else {
                *l /= p.repetition_penalty;
            }
            *l -= count * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Fills `self.cands` with the surviving candidates and their relative probabilities
    /// (the most likely one has 1.0), in id order (so that sums and draws do not depend on how
    /// the candidates were found: [`candidates`] gets the same set from a device's top
    /// candidates). Returns false when no logit is finite.
    ///
    /// Tokens whose probability relative to the best is below e^-88 (an f32 underflow: they
    /// could never be drawn) are dropped up front, which keeps the later steps small.
    fn filter(&mut self, logits: &[f32]) -> bool {
        let p = &self.params;
        let max = sanitize(max_ignoring_nan(logits));
        if max == f32::NEG_INFINITY {
            return false;
        }
        // Temperature and softmax numerators relative to the maximum (max -> 1.0).
        let inv_t = 1.0 / p.temperature;
        let cands = &mut self.cands;
        cands.clear();
        for (i, &l) in logits.iter().enumerate() {
            let z = (sanitize(l) - max) * inv_t;
            if z > MIN_EXPONENT {
                cands.push((i as u32, z.exp()));
            }
        }

        // top-k (the temperature does not change the order).
        if p.top_k > 0 && p.top_k < cands.len() {
            cands.select_nth_unstable_by(p.top_k - 1, by_value_desc);
            cands.truncate(p.top_k);
            cands.sort_unstable_by_key(|c| c.0);
        }

        // top-p: keep the smallest set of most likely tokens whose mass reaches top_p.
        if p.top_p < 1.0 {
            let total: f64 = cands.iter().map(|c| c.1 as f64).sum();
            let keep = nucleus_len(cands, p.top_p as f64 * total);
            cands.truncate(keep.max(1));
            cands.sort_unstable_by_key(|c| c.0);
        }

        // min-p: keep p >= min_p * p_max; p_max is 1.0 here and always survives.
        if p.min_p > 0.0 {
            let min_p = p.min_p;
            cands.retain(|c| c.1 >= min_p);
        }
        !cands.is_empty()
    }
}

/// exp(z) of an f32 underflows below this; such tokens are never drawn.
const MIN_EXPONENT: f32 = -88.0;

/// Reorders `cands` so that its first `k` entries are the `k` most likely (by the total order
/// [`by_value_desc`]) and returns the smallest such `k` whose mass reaches `target` (all of
/// them if none does). Expected O(n): a bisection with `select_nth_unstable`, then a sort of
/// the last small range only.
fn nucleus_len(cands: &mut [Candidate], target: f64) -> usize {
    let (mut lo, mut hi) = (0usize, cands.len());
    let mut acc = 0.0f64; // mass of cands[..lo], all more likely than anything in lo..
    while hi - lo > 64 {
        let mid = lo + (hi - lo) / 2;
        cands[lo..hi].select_nth_unstable_by(mid - lo, by_value_desc);
        let head: f64 = cands[lo..=mid].iter().map(|c| c.1 as f64).sum();
        if acc + head >= target {
            hi = mid + 1;
        } else {
            acc += head;
            lo = mid + 1;
        }
    }
    cands[lo..hi].sort_unstable_by(by_value_desc);
    for (i, c) in cands[lo..hi].iter().enumerate() {
        acc += c.1 as f64;
        if acc >= target {
            return lo + i + 1;
        }
    }
    hi
}

/// Index of the largest logit, ties broken by the lowest id; NaN counts as `-inf`.
/// Returns 0 for an empty or all-`-inf` slice.
pub fn argmax(logits: &[f32]) -> u32 {
    let m = max_ignoring_nan(logits);
    if m == f32::NEG_INFINITY {
        return 0;
    }
    logits.iter().position(|&v| v == m).unwrap_or(0) as u32
}

/// The largest value, NaN ignored (`-inf` when there is none). Eight independent lanes so
/// the compiler can vectorise the loop.
fn max_ignoring_nan(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for j in 0..8 {
            lanes[j] = if c[j] > lanes[j] { c[j] } else { lanes[j] };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(rest) {
        m = if v > m { v } else { m };
    }
    m
}

/// Log-softmax of the raw `logits`: the log-probability of `id` and the top `n`
/// `(id, logprob)` pairs, sorted descending with ties by lower id. NaN counts as `-inf`.
/// An out-of-range `id`, or an all-`-inf` row, gets `-inf`.
pub fn top_logprobs(logits: &[f32], id: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
    let n = n.min(logits.len());
    let max = sanitize(max_ignoring_nan(logits));
    if max == f32::NEG_INFINITY {
        let top = (0..n as u32).map(|i| (i, f32::NEG_INFINITY)).collect();
        return (f32::NEG_INFINITY, top);
    }
    // One pass: the softmax denominator and, for small n, the running top-n (kept sorted; a
    // token enters only if it beats the current last).
    let small = n <= 64;
    let mut top: Vec<Candidate> = Vec::with_capacity(if small { n + 1 } else { logits.len() });
    let mut sum = 0.0f64;
    for (i, &l) in logits.iter().enumerate() {
        let l = sanitize(l);
        sum += (l - max).exp() as f64;
        if n == 0 {
            continue;
        }
        let c = (i as u32, l);
        if !small {
            top.push(c);
        } else if top.len() < n || by_value_desc(&c, &top[n - 1]) == Ordering::Less {
            let pos = top.partition_point(|t| by_value_desc(t, &c) == Ordering::Less);
            top.insert(pos, c);
            top.truncate(n);
        }
    }
    if !small {
        if n < top.len() {
            top.select_nth_unstable_by(n - 1, by_value_desc);
            top.truncate(n);
        }
        top.sort_unstable_by(by_value_desc);
    }
    let lse = max as f64 + sum.ln();
    let lp = |l: f32| (sanitize(l) as f64 - lse) as f32;
    let chosen = logits.get(id as usize).map_or(f32::NEG_INFINITY, |&l| lp(l));
    (chosen, top.into_iter().map(|(i, l)| (i, lp(l))).collect())
}

mod candidates;
#[cfg(test)]
mod tests;
