//! The routed-experts maths in plain loops over f32 slices (f64 sums): what the device kernels
//! and the CPU per-expert path (`arch::qwen_hybrid::ffn::Moe`) must both compute.
//!
//! Per token: p = softmax(logits); the `top_k` largest p (ties to the lower expert index);
//! weights p / Σp (renormalised over the chosen experts when `norm_topk`);
//! out = Σ_j w_j · down_j(silu(gate_j x) ⊙ up_j x).

/// The chosen experts and their weights for one row of router logits, in rank order.
pub fn route(logits: &[f32], top_k: usize, norm_topk: bool) -> Vec<(usize, f64)> {
    let mx = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let p: Vec<f64> = logits.iter().map(|&l| (l as f64 - mx).exp()).collect();
    let z: f64 = p.iter().sum();
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    idx.truncate(top_k);
    let sel: f64 = idx.iter().map(|&e| p[e] / z).sum();
    idx.into_iter().map(|e| (e, if norm_topk { p[e] / z / sel } else { p[e] / z })).collect()
}

/// `y[n] = W[n, k] · x[k]` in f64.
fn matvec(w: &[f32], n: usize, k: usize, x: &[f64]) -> Vec<f64> {
    (0..n).map(|r| w[r * k..(r + 1) * k].iter().zip(x).map(|(&a, &b)| a as f64 * b).sum()).collect()
}

/// Dense expert weights, row-major: `gate[e]`, `up[e]` `[inter, hidden]`, `down[e]` `[hidden, inter]`.
pub struct Experts<'a> {
    pub gate: &'a [Vec<f32>],
    pub up: &'a [Vec<f32>],
    pub down: &'a [Vec<f32>],
    pub hidden: usize,
    pub inter: usize,
}

/// `x` `[m, hidden]`, `logits` `[m, E]` → `[m, hidden]`.
pub fn forward(ex: &Experts<'_>, x: &[f32], logits: &[f32], m: usize, top_k: usize, norm_topk: bool) -> Vec<f32> {
    let (h, i) = (ex.hidden, ex.inter);
    let e_count = logits.len() / m.max(1);
    let mut out = vec![0f32; m * h];
    for r in 0..m {
        let xr: Vec<f64> = x[r * h..(r + 1) * h].iter().map(|&v| v as f64).collect();
        let mut acc = vec![0f64; h];
        for (e, w) in route(&logits[r * e_count..(r + 1) * e_count], top_k, norm_topk) {
            let g = matvec(&ex.gate[e], i, h, &xr);
            let u = matvec(&ex.up[e], i, h, &xr);
            let act: Vec<f64> = g.iter().zip(&u).map(|(&g, &u)| g / (1.0 + (-g).exp()) * u).collect();
            for (a, y) in acc.iter_mut().zip(matvec(&ex.down[e], h, i, &act)) {
                *a += w * y;
            }
        }
        for (o, a) in out[r * h..(r + 1) * h].iter_mut().zip(acc) {
            *o = a as f32;
        }
    }
    out
}
