//! Sampling candidates computed where the logits live: the `k` largest logits of a row and the
//! row's softmax mass at a temperature ([`TopCandidates`]), so a sampled request on a GPU
//! reads back `k` ids and logits instead of the whole vocabulary (`tandem-engine`'s sampler
//! filters them exactly as it filters a full row, and asks for the row where they cannot
//! decide). [`top_candidates_ref`] is the plain reference; [`top_candidates`] runs the CUDA
//! kernel (`tandem-kernels/cuda/sampling.cu`) and is `None` on devices without one.

#[cfg(feature = "cuda")]
mod cuda;

use candle_core::Tensor;

use crate::error::Result;

/// How many candidates a device returns per row.
pub const DEVICE_CANDIDATES: usize = 256;

/// The `k` largest logits of one row (ties to the lower id; NaN counts as `-inf`, `+inf` as
/// `f32::MAX`), in no particular order, and the row's softmax mass.
#[derive(Debug, Clone, PartialEq)]
pub struct TopCandidates {
    /// Token ids, `min(k, vocab)` of them.
    pub ids: Vec<u32>,
    /// Their raw logits.
    pub logits: Vec<f32>,
    /// The row's length.
    pub vocab: usize,
    /// `sum exp((l - max) * inv_t)` over the tokens whose exponent is above -88 (each term an
    /// f32 exp, summed in f64), i.e. the host sampler's softmax denominator.
    pub mass: f64,
}

/// The host sampler's view of a logit: NaN is `-inf`, `+inf` the largest finite value.
pub fn sanitize(v: f32) -> f32 {
    if v.is_nan() {
        f32::NEG_INFINITY
    } else if v == f32::INFINITY {
        f32::MAX
    } else {
        v
    }
}

/// Reference: the candidates of `row` by sorting it.
pub fn top_candidates_ref(row: &[f32], k: usize, inv_t: f32) -> TopCandidates {
    let max = row.iter().map(|&v| sanitize(v)).fold(f32::NEG_INFINITY, f32::max);
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    order.sort_by(|&a, &b| sanitize(row[b as usize]).total_cmp(&sanitize(row[a as usize])).then(a.cmp(&b)));
    order.truncate(k);
    let mass =
        row.iter().map(|&l| (sanitize(l) - max) * inv_t).filter(|&z| z > -88.0).map(|z| z.exp() as f64).sum::<f64>();
    TopCandidates { logits: order.iter().map(|&i| row[i as usize]).collect(), ids: order, vocab: row.len(), mass }
}

/// The candidates of a `[1, vocab]` (or `[vocab]`) logits row on its device, `None` where the
/// device has no kernel for it (the caller reads the row).
pub fn top_candidates(logits: &Tensor, k: usize, inv_t: f32) -> Result<Option<TopCandidates>> {
    #[cfg(feature = "cuda")]
    if logits.device().is_cuda() {
        return cuda::top_candidates(logits, k, inv_t).map(Some);
    }
    let _ = (logits, k, inv_t);
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_takes_the_largest_with_ties_to_the_lower_id() {
        let row = [1.0, f32::NAN, 3.0, 3.0, f32::INFINITY, -2.0, 3.0];
        let c = top_candidates_ref(&row, 3, 1.0);
        assert_eq!(c.ids, vec![4, 2, 3]);
        assert_eq!(c.vocab, 7);
        // +inf counts as f32::MAX: every finite logit is ~3.4e38 below it.
        assert_eq!(c.mass, 1.0);
        let all = top_candidates_ref(&[0.0, 0.0], 5, 2.0);
        assert_eq!(all.ids, vec![0, 1]);
        assert_eq!(all.mass, 2.0);
    }
}
