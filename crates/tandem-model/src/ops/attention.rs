//! Causal grouped-query attention of one sequence's new tokens over its whole KV.
//!
//! The materialised version (scores, mask, softmax, values as tensor ops) on devices; on the
//! CPU the query-block kernel of [`super::attention_blocks`]. The tiled kernel over paged KV
//! (`paged_attention`) sits beside both, and the plain loops here are their reference.

use candle_core::{DType, Tensor};

use super::attention_blocks::{causal_attention_blocked, Dims};
use super::host::with_values;
use crate::error::Result;

/// `q: [n_heads, t, hd]` for the last `t` positions, `k`, `v: [n_kv, len, hd]` with
/// `len >= t` (the past plus these t tokens). Query i (absolute position len - t + i) sees keys
/// 0..=len - t + i, or with a sliding `window` > 0 only the last `window` of them.
/// Returns `[n_heads, t, hd]`.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, window: usize) -> Result<Tensor> {
    let (n_heads, t, hd) = q.dims3()?;
    let (n_kv, len, _) = k.dims3()?;
    if q.device().is_cpu() && [q.dtype(), k.dtype(), v.dtype()] == [DType::F32; 3] {
        // The CPU: by query blocks over only the keys each block sees, no score tensor; the
        // operands read in place.
        let d = Dims { n_heads, n_kv, t, len, hd, window };
        let out = with_values(q, |qv| {
            with_values(k, |kv| with_values(v, |vv| Ok(causal_attention_blocked(qv, kv, vv, d, scale as f32))))
        })?;
        return Ok(Tensor::from_vec(out, (n_heads, t, hd), q.device())?);
    }
    let group = n_heads / n_kv;
    let past = len - t;
    // Heads sharing a KV head are adjacent: view q as [n_kv, group * t, hd] (no KV copies).
    let q = (q.reshape((n_kv, group * t, hd))? * scale)?;
    let kt = k.transpose(1, 2)?;
    let scores = match q.matmul(&kt) {
        Ok(s) => s,
        Err(_) => q.matmul(&kt.contiguous()?)?,
    };
    let first = |i: usize| if window == 0 { 0 } else { (past + i + 1).saturating_sub(window) };
    let scores = if t > 1 || first(0) > 0 {
        let mut mask = Vec::with_capacity(t * len);
        for i in 0..t {
            for j in 0..len {
                mask.push(if j <= past + i && j >= first(i) { 0f32 } else { f32::NEG_INFINITY });
            }
        }
        let mask = Tensor::from_vec(mask, (1, 1, t, len), q.device())?;
        scores.reshape((n_kv, group, t, len))?.broadcast_add(&mask)?.reshape((n_kv, group * t, len))?
    } else {
        scores
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?;
    let out = match probs.matmul(v) {
        Ok(o) => o,
        Err(_) => probs.matmul(&v.contiguous()?)?,
    };
    Ok(out.reshape((n_heads, t, hd))?)
}

/// Straightforward loops over plain slices, the reference for [`causal_attention`] (no
/// window). Layouts as above, row-major.
#[allow(clippy::too_many_arguments)] // the shapes, spelled out, as the reference should
pub fn causal_attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_heads: usize,
    n_kv: usize,
    t: usize,
    len: usize,
    hd: usize,
    scale: f32,
) -> Vec<f32> {
    let group = n_heads / n_kv;
    let past = len - t;
    let mut out = vec![0f32; n_heads * t * hd];
    for h in 0..n_heads {
        let kh = h / group;
        for i in 0..t {
            let qv = &q[(h * t + i) * hd..(h * t + i + 1) * hd];
            let visible = past + i + 1;
            let mut s: Vec<f32> = (0..visible)
                .map(|j| {
                    let kv = &k[(kh * len + j) * hd..(kh * len + j + 1) * hd];
                    qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale
                })
                .collect();
            let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let mut z = 0f32;
            for x in s.iter_mut() {
                *x = (*x - m).exp();
                z += *x;
            }
            let o = &mut out[(h * t + i) * hd..(h * t + i + 1) * hd];
            for (j, p) in s.iter().enumerate() {
                let vv = &v[(kh * len + j) * hd..(kh * len + j + 1) * hd];
                for d in 0..hd {
                    o[d] += p / z * vv[d];
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.731).sin()).collect()
    }

    #[test]
    fn matches_reference_prefill_and_decode() -> Result<()> {
        let dev = Device::Cpu;
        let (nh, nkv, hd) = (4, 2, 8);
        for (t, len) in [(5usize, 5usize), (3, 9), (1, 7)] {
            let q = data(nh * t * hd, 1.0);
            let k = data(nkv * len * hd, 2.0);
            let v = data(nkv * len * hd, 3.0);
            let qt = Tensor::from_vec(q.clone(), (nh, t, hd), &dev)?;
            let kt = Tensor::from_vec(k.clone(), (nkv, len, hd), &dev)?;
            let vt = Tensor::from_vec(v.clone(), (nkv, len, hd), &dev)?;
            let scale = 1.0 / (hd as f64).sqrt();
            let got = causal_attention(&qt, &kt, &vt, scale, 0)?.flatten_all()?.to_vec1::<f32>()?;
            let want = causal_attention_reference(&q, &k, &v, nh, nkv, t, len, hd, scale as f32);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "t={t} len={len}: {a} vs {b}");
            }
        }
        Ok(())
    }
}
