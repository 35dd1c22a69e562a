//! Summary statistics of latency samples: mean, min, max and percentiles by linear
//! interpolation between closest ranks (numpy's default), so p50 of `[1, 2, 3, 4]` is 2.5.

use serde::{Deserialize, Serialize};

/// The `p`-th percentile (0..=100) of `values` (any order); `None` when empty or `p` is out of
/// range. NaNs are ignored.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    percentile_sorted(&v, p)
}

/// Like [`percentile`] on values already sorted ascending.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * frac)
}

/// Mean of the values; `None` when empty.
pub fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Count, mean, min, p50, p90, p99 and max of a sample.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises `values`; `None` when there is no (non-NaN) value.
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let p = |q| percentile_sorted(&v, q).unwrap_or(f64::NAN);
        Some(Self {
            n: v.len(),
            mean: mean(&v).unwrap_or(f64::NAN),
            min: v[0],
            p50: p(50.0),
            p90: p(90.0),
            p99: p(99.0),
            max: v[v.len() - 1],
        })
    }

    /// The same summary with every value multiplied by `k` (seconds → milliseconds).
    pub fn scaled(&self, k: f64) -> Self {
        Self {
            n: self.n,
            mean: self.mean * k,
            min: self.min * k,
            p50: self.p50 * k,
            p90: self.p90 * k,
            p99: self.p99 * k,
            max: self.max * k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [4.0, 1.0, 3.0, 2.0];
        assert_eq!(percentile(&v, 50.0), Some(2.5));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(4.0));
        assert!((percentile(&v, 90.0).unwrap() - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&v, 101.0), None);
        let s = Summary::of(&[1.0, f64::NAN, 3.0]).unwrap();
        assert_eq!((s.n, s.mean, s.p50), (2, 2.0, 2.0));
        assert!(Summary::of(&[]).is_none());
    }
}
