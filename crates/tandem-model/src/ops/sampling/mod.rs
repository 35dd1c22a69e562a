//! Sampling candidates computed where the logits live: the `k` largest logits of a row and the
//! row's softmax mass at a temperature ([`TopCandidates`]), so a sampled request on a GPU
//! reads back `k` ids and logits instead of the whole vocabulary (`tandem-engine`'s sampler
//! filters them exactly as it filters a full row, and asks for the row where they cannot
//! decide). [`top_candidates_ref`] is the plain reference; [`top_candidates`] runs the CUDA
//! kernel (`tandem-kernels/cuda/sampling.cu`) and is `None` on devices without one. Greedy
//! rows: [`argmax_rows`] (the CUDA kernel, or [`argmax_ref`] per row elsewhere).

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

/// Index of the largest logit, ties to the lowest index, NaN counted as `-inf`; 0 for an
/// empty or all-`-inf` row (the host sampler's argmax).
pub fn argmax_ref(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// The device kernel's packed result (`argmax_rows` in `sampling.cu`: the low and high words of
/// `(order key << 32) | !index`) as an index: 0 where the row held only `-inf` / NaN.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn unpack_argmax(lo: u32, hi: u32) -> u32 {
    const NEG_INF_KEY: u32 = !0xff80_0000u32;
    if hi <= NEG_INF_KEY {
        0
    } else {
        !lo
    }
}

/// The argmax ([`argmax_ref`]) of every row of `x` `[rows, n]`, computed where the rows live
/// (one small read back on a GPU instead of the rows).
pub fn argmax_rows(x: &Tensor) -> Result<Vec<u32>> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return cuda::argmax_rows(x);
    }
    let rows = x.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
    Ok(rows.iter().map(|r| argmax_ref(r)).collect())
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
    fn argmax_takes_the_first_largest_and_ignores_nan() {
        assert_eq!(argmax_ref(&[1.0, f32::NAN, 3.0, 3.0, -2.0]), 2);
        assert_eq!(argmax_ref(&[f32::NAN, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax_ref(&[]), 0);
        assert_eq!(argmax_ref(&[-5.0, f32::INFINITY, f32::MAX]), 1);
        let t = Tensor::new(&[[0.5f32, 2.0, 2.0], [f32::NAN, -1.0, -3.0]], &candle_core::Device::Cpu).unwrap();
        assert_eq!(argmax_rows(&t).unwrap(), vec![1, 1]);
        // The device kernel's packing, decoded: index 7 of a finite key; -inf / NaN rows give 0.
        let key = |x: f32| {
            let u = x.to_bits();
            if u & 0x8000_0000 != 0 {
                !u
            } else {
                u | 0x8000_0000
            }
        };
        assert_eq!(unpack_argmax(!7u32, key(1.5)), 7);
        assert_eq!(unpack_argmax(!7u32, key(f32::NEG_INFINITY)), 0);
    }

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
