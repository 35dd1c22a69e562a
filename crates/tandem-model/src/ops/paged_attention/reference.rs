//! The plain reference of the kernel on the same slices: per query row, every visible key's
//! score, the softmax and the weighted sum of values, two passes in f64. The tests compare the
//! tiled, split and vectorised kernel against it.

use super::kernel::Dims;

/// `q: [n_heads, t, hd]`, pools `[rows, n_kv, hd]` addressed through `blocks`; returns
/// `[n_heads, t, hd]`.
pub(super) fn paged_attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    blocks: &[u32],
    d: Dims,
    scale: f32,
) -> Vec<f32> {
    let Dims { n_heads, n_kv, t, hd, past, block_size: bs, .. } = d;
    let group = n_heads / n_kv;
    let row = |p: usize, kh: usize| ((blocks[p / bs] as usize * bs + p % bs) * n_kv + kh) * hd;
    let mut out = vec![0f32; n_heads * t * hd];
    for h in 0..n_heads {
        let kh = h / group;
        for i in 0..t {
            let qrow = &q[(h * t + i) * hd..][..hd];
            let seen = past + i + 1;
            let first = d.first_key(past + i);
            let s: Vec<f64> = (first..seen)
                .map(|p| {
                    let krow = &k[row(p, kh)..][..hd];
                    qrow.iter().zip(krow).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum();
            let mut acc = vec![0f64; hd];
            for (p, &w) in (first..seen).zip(&e) {
                for (a, &x) in acc.iter_mut().zip(&v[row(p, kh)..][..hd]) {
                    *a += w * x as f64;
                }
            }
            for (o, a) in out[(h * t + i) * hd..][..hd].iter_mut().zip(acc) {
                *o = (a / l) as f32;
            }
        }
    }
    out
}
