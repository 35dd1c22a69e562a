//! Verification of drafted tokens against the target model's logits.
//!
//! Greedy requests accept a draft exactly when it equals the target's (penalised) argmax, so
//! the output is token for token that of plain decoding. Sampled requests use rejection
//! sampling for a deterministic proposal (every proposer here drafts greedily, so the draft
//! distribution `q` is one-hot): draft `d` is accepted with probability `p(d)`, and on
//! rejection the token is drawn from `p` with `d` removed and renormalised — together exactly
//! `p`, the distribution plain sampling draws from. The first rejected or the bonus position
//! always yields one token from the target, so every verification makes progress.
//!
//! Under a grammar ([`Constraint`]) each position's logits are masked before any of this and
//! every kept token advances the grammar, so a draft the grammar forbids has probability 0:
//! it is rejected and ends the accepted run, and the result is what masked plain decoding
//! would give.

use crate::constraint::Constraint;
use crate::sampler::Sampler;

/// The outcome of verifying one sequence's drafts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Tokens to append, in order: the accepted drafts, then one token from the target.
    pub tokens: Vec<u32>,
    /// How many drafts were accepted (`tokens.len() - 1`).
    pub accepted: usize,
}

/// Verifies `drafts` given the target's raw logits at each of the `drafts.len() + 1` positions
/// (`rows[i]` predicts the token after `history + drafts[..i]`). `history` is the sequence so
/// far (penalties look at it, extended by the accepted drafts).
/// With a `constraint`, every row is masked by the grammar first and each kept token advances
/// it; an error means the grammar failed (the request cannot go on).
pub fn verify(
    sampler: &mut Sampler,
    mut constraint: Option<&mut Constraint>,
    history: &[u32],
    drafts: &[u32],
    rows: &[Vec<f32>],
) -> Result<Verdict, String> {
    debug_assert_eq!(rows.len(), drafts.len() + 1);
    let mut hist = history.to_vec();
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    for (i, row) in rows.iter().enumerate().take(drafts.len() + 1) {
        let mut logits = row.clone();
        if let Some(c) = constraint.as_deref_mut() {
            c.apply(&mut logits)?;
        }
        let draft = drafts.get(i).copied();
        let (tok, go_on) = if sampler.is_greedy() {
            let tok = sampler.sample(&mut logits, &hist);
            (tok, Some(tok) == draft)
        } else {
            let dist = sampler.distribution(&mut logits, &hist);
            match draft {
                // Every draft accepted: the bonus token comes straight from the target.
                None => {
                    let u = sampler.uniform();
                    (draw(&dist, u, None), false)
                }
                Some(d) => {
                    let p = dist.iter().find(|c| c.0 == d).map_or(0.0, |c| c.1 as f64);
                    if sampler.uniform() < p {
                        (d, true)
                    } else {
                        let u = sampler.uniform();
                        (draw(&dist, u, Some(d)), false)
                    }
                }
            }
        };
        if let Some(c) = constraint.as_deref_mut() {
            c.consume(tok)?;
        }
        tokens.push(tok);
        if !go_on {
            break;
        }
        hist.push(tok);
    }
    let accepted = tokens.len() - 1;
    Ok(Verdict { tokens, accepted })
}

/// Greedy verification from the target's argmax at each position, picked where the logits
/// live (for requests whose next token is the plain argmax: no penalties, grammar or log-probs,
/// [`crate::sequence::Sequence::argmax_only`]): the drafts are accepted up to the first that
/// differs from the argmax at its position, whose argmax then comes from the target. That is
/// [`verify`]'s verdict for such a sampler, from `drafts.len() + 1` ids instead of as many
/// vocabulary-wide rows.
pub fn verify_argmax(drafts: &[u32], ids: &[u32]) -> Result<Verdict, String> {
    if ids.len() != drafts.len() + 1 {
        return Err(format!("verify: {} argmax rows for {} drafts", ids.len(), drafts.len()));
    }
    let mut tokens = Vec::with_capacity(ids.len());
    for (i, &id) in ids.iter().enumerate() {
        tokens.push(id);
        if drafts.get(i) != Some(&id) {
            break;
        }
    }
    let accepted = tokens.len() - 1;
    Ok(Verdict { tokens, accepted })
}

/// Draws from `dist` (probabilities summing to 1) with the uniform `u`, leaving out `exclude`
/// and renormalising. Falls back to the most likely remaining token when rounding leaves a
/// sliver, and to `exclude` itself when nothing else has mass.
fn draw(dist: &[(u32, f32)], u: f64, exclude: Option<u32>) -> u32 {
    let keep = |c: &&(u32, f32)| Some(c.0) != exclude && c.1 > 0.0;
    let total: f64 = dist.iter().filter(keep).map(|c| c.1 as f64).sum();
    if total <= 0.0 {
        return exclude.or_else(|| dist.first().map(|c| c.0)).unwrap_or(0);
    }
    let mut r = u * total;
    for c in dist.iter().filter(keep) {
        r -= c.1 as f64;
        if r < 0.0 {
            return c.0;
        }
    }
    dist.iter().filter(keep).max_by(|a, b| a.1.total_cmp(&b.1)).map_or(0, |c| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SamplingParams;

    fn greedy() -> Sampler {
        Sampler::new(SamplingParams::default()).unwrap()
    }

    fn one_hot(vocab: usize, id: usize) -> Vec<f32> {
        let mut v = vec![0.0; vocab];
        v[id] = 5.0;
        v
    }

    #[test]
    fn greedy_accepts_matching_prefix_then_corrects() {
        let rows = vec![one_hot(8, 3), one_hot(8, 4), one_hot(8, 6), one_hot(8, 1)];
        let v = verify(&mut greedy(), None, &[0], &[3, 4, 5], &rows).unwrap();
        assert_eq!(v, Verdict { tokens: vec![3, 4, 6], accepted: 2 });
        let v = verify(&mut greedy(), None, &[0], &[3, 4, 6], &rows).unwrap();
        assert_eq!(v, Verdict { tokens: vec![3, 4, 6, 1], accepted: 3 });
        let v = verify(&mut greedy(), None, &[0], &[7, 4, 6], &rows).unwrap();
        assert_eq!(v, Verdict { tokens: vec![3], accepted: 0 });
        let v = verify(&mut greedy(), None, &[0], &[], &rows[..1]).unwrap();
        assert_eq!(v, Verdict { tokens: vec![3], accepted: 0 });
    }

    #[test]
    fn argmax_verdict_is_the_greedy_verdict() {
        // Random rows (ties included: ids 0..8 over values 0..4) and drafts that match the
        // argmax for a while, then maybe not: the argmax path's verdict is verify()'s.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |m: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % m
        };
        let argmax = |r: &[f32]| crate::sampler::argmax(r);
        for _ in 0..500 {
            let k = next(6) as usize;
            let rows: Vec<Vec<f32>> = (0..=k).map(|_| (0..8).map(|_| next(5) as f32).collect()).collect();
            let ids: Vec<u32> = rows.iter().map(|r| argmax(r)).collect();
            let drafts: Vec<u32> = (0..k).map(|i| if next(4) == 0 { next(8) as u32 } else { ids[i] }).collect();
            let want = verify(&mut greedy(), None, &[0], &drafts, &rows).unwrap();
            assert_eq!(verify_argmax(&drafts, &ids).unwrap(), want, "rows {rows:?} drafts {drafts:?}");
        }
        assert!(verify_argmax(&[1, 2], &[1]).is_err());
    }

    #[test]
    fn greedy_penalties_see_accepted_drafts() {
        // Token 2 wins unless penalised; it is drafted first, so the second position, which
        // sees it in the history, must pick token 1 under a strong repetition penalty.
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 10.0, ..Default::default() }).unwrap();
        let row = vec![0.0, 2.0, 3.0];
        let v = verify(&mut s, None, &[0], &[2, 2], &[row.clone(), row.clone(), row]).unwrap();
        assert_eq!(v, Verdict { tokens: vec![2, 1], accepted: 1 });
    }

    #[test]
    fn draw_excludes_and_renormalises() {
        let dist = [(0u32, 0.5f32), (1, 0.3), (2, 0.2)];
        assert_eq!(draw(&dist, 0.0, Some(0)), 1);
        assert_eq!(draw(&dist, 0.59, Some(0)), 1); // 0.59 * 0.5 = 0.295 < 0.3
        assert_eq!(draw(&dist, 0.61, Some(0)), 2);
        assert_eq!(draw(&dist, 0.99, None), 2);
        assert_eq!(draw(&[(4, 1.0)], 0.5, Some(4)), 4);
    }

    /// Rejection sampling with a one-hot proposal reproduces the target distribution at the
    /// first position (chi-square, 4 categories, p > 0.01 needs statistic < 11.34).
    #[test]
    fn rejection_sampling_keeps_the_target_distribution() {
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed: Some(7), ..Default::default() }).unwrap();
        let probs = [0.1f64, 0.2, 0.3, 0.4];
        let row: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let n = 20_000;
        let mut counts = [0usize; 4];
        for i in 0..n {
            let draft = (i % 4) as u32; // proposals of every quality
            let v = verify(&mut s, None, &[], &[draft], &[row.clone(), row.clone()]).unwrap();
            counts[v.tokens[0] as usize] += 1;
        }
        let chi2: f64 = probs
            .iter()
            .zip(counts)
            .map(|(p, c)| {
                let e = p * n as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum();
        assert!(chi2 < 11.34, "chi-square {chi2:.2}, counts {counts:?}");
    }
}
