//! Causal attention of a CPU prefill chunk by query blocks: for each head, blocks of
//! [`QUERY_BLOCK`] queries take their scores against only the keys the block can see (the
//! causal triangle's lower half is never computed), the softmax in place, and the values'
//! product straight into the output: no `[heads, t, len]` score tensor, no mask, no copies.
//!
//! Heads run in parallel (rayon), each on its own thread-local score buffer; a head's result
//! depends only on its inputs, so the output is the same for any thread count. It is the same
//! maths as [`super::attention::causal_attention_reference`] (tested against it), summed in
//! another order: prefill chunks are equivalent within rounding, as they always were on the
//! CPU (verify chunks and decode take the row-invariant paged kernel instead).

use std::cell::RefCell;

use rayon::prelude::*;

use super::gemm::gemm_into;

/// Queries per block: the block's scores (64 rows of up to `len` floats) stay in L2.
pub const QUERY_BLOCK: usize = 64;

/// Shapes of one call.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub n_heads: usize,
    pub n_kv: usize,
    /// New positions (queries), the last `t` of the `len` keys.
    pub t: usize,
    pub len: usize,
    pub hd: usize,
    /// Sliding window (0: none): query `i` sees only the last `window` keys up to itself.
    pub window: usize,
}

/// `q [n_heads, t, hd]`, `k`, `v [n_kv, len, hd]` (row-major, contiguous) → `[n_heads, t, hd]`.
pub fn causal_attention_blocked(q: &[f32], k: &[f32], v: &[f32], d: Dims, scale: f32) -> Vec<f32> {
    let Dims { n_heads, n_kv, t, len, hd, .. } = d;
    assert!(n_kv > 0 && n_heads.is_multiple_of(n_kv) && t <= len, "attention shapes {d:?}");
    assert!(q.len() == n_heads * t * hd && k.len() == n_kv * len * hd && v.len() == k.len(), "attention sizes {d:?}");
    let mut out = vec![0f32; n_heads * t * hd];
    if t == 0 || hd == 0 {
        return out;
    }
    let head = |(h, o): (usize, &mut [f32])| {
        SCORES.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => head_blocks(q, k, v, d, scale, h, o, &mut buf),
            Err(_) => head_blocks(q, k, v, d, scale, h, o, &mut Vec::new()),
        })
    };
    if n_heads > 1 && t * len * hd >= 1 << 16 {
        out.par_chunks_mut(t * hd).enumerate().for_each(head);
    } else {
        out.chunks_mut(t * hd).enumerate().for_each(head);
    }
    out
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Head `h`'s `t` outputs into `o` (`[t, hd]`).
#[allow(clippy::too_many_arguments)]
fn head_blocks(q: &[f32], k: &[f32], v: &[f32], d: Dims, scale: f32, h: usize, o: &mut [f32], s: &mut Vec<f32>) {
    let Dims { n_heads, n_kv, t, len, hd, window } = d;
    let kh = h / (n_heads / n_kv);
    let past = len - t;
    let (qh, kh, vh) = (&q[h * t * hd..][..t * hd], &k[kh * len * hd..][..len * hd], &v[kh * len * hd..][..len * hd]);
    // Query i (absolute position past + i) sees keys first(i) ..= past + i.
    let first = |i: usize| if window == 0 { 0 } else { (past + i + 1).saturating_sub(window) };
    for i0 in (0..t).step_by(QUERY_BLOCK) {
        let rows = QUERY_BLOCK.min(t - i0);
        let (lo, hi) = (first(i0), past + i0 + rows);
        let width = hi - lo;
        if s.len() < rows * width {
            s.resize(rows * width, 0.0);
        }
        let s = &mut s[..rows * width];
        // Scores: the block's queries against keys lo..hi (Kᵀ as a column-major view).
        gemm_into(s, width, None, (&qh[i0 * hd..], hd, 1), (&kh[lo * hd..], 1, hd), rows, hd, width);
        for (r, row) in s.chunks_mut(width).enumerate() {
            let i = i0 + r;
            let (a, b) = (first(i) - lo, past + i + 1 - lo);
            let (live, tail) = row.split_at_mut(b);
            let (dead, live) = live.split_at_mut(a);
            dead.fill(0.0);
            tail.fill(0.0);
            scaled_softmax(live, scale);
        }
        gemm_into(&mut o[i0 * hd..], hd, None, (s, width, 1), (&vh[lo * hd..], hd, 1), rows, width, hd);
    }
}

/// `x <- softmax(scale · x)`, the max and the sum in order.
fn scaled_softmax(x: &mut [f32], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        unsafe { scaled_softmax_avx2(x, scale) };
        return;
    }
    scaled_softmax_plain(x, scale);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scaled_softmax_avx2(x: &mut [f32], scale: f32) {
    scaled_softmax_plain(x, scale);
}

#[inline(always)]
fn scaled_softmax_plain(x: &mut [f32], scale: f32) {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) * scale;
    for v in x.iter_mut() {
        *v = crate::ops::act::exp(*v * scale - m);
    }
    let z: f32 = x.iter().sum();
    let inv = 1.0 / z;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::attention::causal_attention_reference;

    fn data(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.731).sin()).collect()
    }

    /// Against the plain reference, over block edges (t of 1, 63, 64, 65, 130), with and
    /// without a past, GQA groups of 1 and 3; the same bits at 1 and 3 threads.
    #[test]
    fn matches_the_reference_at_any_thread_count() {
        for (nh, nkv, hd) in [(6usize, 2usize, 16usize), (2, 2, 8)] {
            for (t, past) in [(1usize, 0usize), (63, 0), (64, 5), (65, 0), (130, 70)] {
                let len = past + t;
                let (q, k, v) = (data(nh * t * hd, 1.0), data(nkv * len * hd, 2.0), data(nkv * len * hd, 3.0));
                let scale = 1.0 / (hd as f32).sqrt();
                let d = Dims { n_heads: nh, n_kv: nkv, t, len, hd, window: 0 };
                let got = causal_attention_blocked(&q, &k, &v, d, scale);
                let want = causal_attention_reference(&q, &k, &v, nh, nkv, t, len, hd, scale);
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < 2e-5, "t={t} past={past}: {a} vs {b}");
                }
                let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
                let three = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
                let a = one.install(|| causal_attention_blocked(&q, &k, &v, d, scale));
                let b = three.install(|| causal_attention_blocked(&q, &k, &v, d, scale));
                assert_eq!(a, b, "t={t} past={past}: thread count changed the bits");
            }
        }
    }

    /// A sliding window: query i sees keys max(0, p - w + 1) ..= p (p its position), checked
    /// against the reference on exactly those keys, one query at a time.
    #[test]
    fn window_sees_only_its_last_keys() {
        let (nh, nkv, hd, w) = (2usize, 1usize, 8usize, 5usize);
        let (t, past) = (70usize, 9usize);
        let len = past + t;
        let (q, k, v) = (data(nh * t * hd, 1.0), data(nkv * len * hd, 2.0), data(nkv * len * hd, 3.0));
        let got = causal_attention_blocked(&q, &k, &v, Dims { n_heads: nh, n_kv: nkv, t, len, hd, window: w }, 0.5);
        for h in 0..nh {
            for i in 0..t {
                let p = past + i;
                let lo = (p + 1).saturating_sub(w);
                let qi: Vec<f32> = q[(h * t + i) * hd..][..hd].to_vec();
                let (ks, vs) = (&k[lo * hd..(p + 1) * hd], &v[lo * hd..(p + 1) * hd]);
                let want = causal_attention_reference(&qi, ks, vs, 1, 1, 1, p + 1 - lo, hd, 0.5);
                for (a, b) in got[(h * t + i) * hd..][..hd].iter().zip(&want) {
                    assert!((a - b).abs() < 2e-5, "h={h} i={i}: {a} vs {b}");
                }
            }
        }
    }
}
