//! The gated delta rule, token by token (decode and speculative verify). Per v-head h with
//! k = k̂_t, q = q̂_t of its k-head:
//! `S ← e^g S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀ q` (the output reads the updated state).

use super::{GdnDims, RuleInputs};

#[allow(clippy::too_many_arguments)]
/// One token's update of every head, in place on `state: [nv, dk, dv]`; writes `out: [nv, dv]`.
fn step(q: &[f32], k: &[f32], v: &[f32], beta: &[f32], g: &[f32], state: &mut [f32], out: &mut [f32], d: GdnDims) {
    let (dk, dv) = (d.dk, d.dv);
    // Heads are independent (own state slice, own output row): each whole in one task, the
    // same arithmetic in the same order as one thread. On candle's barrier pool, whose
    // workers the step's matmuls use: with rayon's pool beside it the two fought for the
    // cores (a barrier worker spun through 28% of a 2-core hybrid decode).
    let inputs = RuleInputs { q, k, v, beta, g };
    let heads: Vec<_> = state.chunks_mut(dk * dv).zip(out.chunks_mut(dv)).collect();
    crate::ops::cpu_threads::for_each_item(heads, |h, (s, o)| head_step(inputs, s, o, h, d));
}

/// Head `h`'s update of its state `s`; writes its output row `o`.
fn head_step(inputs: RuleInputs<'_>, s: &mut [f32], o: &mut [f32], h: usize, d: GdnDims) {
    let _ftz = super::FlushDenormals::new();
    let RuleInputs { q, k, v, beta, g } = inputs;
    let (dk, dv, r) = (d.dk, d.dv, d.ratio());
    let kh = h / r;
    let (kv, qv) = (&k[kh * dk..(kh + 1) * dk], &q[kh * dk..(kh + 1) * dk]);
    let vv = &v[h * dv..(h + 1) * dv];
    let decay = g[h].exp();
    // The decay of state row i right before row i's part of Sᵀk: each element is decayed once
    // and then read, as in two passes, with one pass less over the state.
    let mut delta = vv.to_vec();
    for (i, &ki) in kv.iter().enumerate() {
        for (dj, sij) in delta.iter_mut().zip(&mut s[i * dv..(i + 1) * dv]) {
            *sij *= decay;
            *dj -= *sij * ki;
        }
    }
    delta.iter_mut().for_each(|x| *x *= beta[h]);
    o.iter_mut().for_each(|x| *x = 0.0);
    for i in 0..dk {
        let row = &mut s[i * dv..(i + 1) * dv];
        for ((sij, &dj), oj) in row.iter_mut().zip(&delta).zip(o.iter_mut()) {
            *sij += kv[i] * dj;
            *oj += *sij * qv[i];
        }
    }
}

/// Runs `t` tokens through the recurrence from `state` (updated in place). Returns `[t, nv, dv]`.
pub fn gated_delta_recurrent(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    g: &[f32],
    state: &mut [f32],
    d: GdnDims,
) -> Vec<f32> {
    let t = beta.len() / d.nv;
    let mut out = vec![0f32; t * d.nv * d.dv];
    let (qk, vs) = (d.nk * d.dk, d.nv * d.dv);
    for ti in 0..t {
        step(
            &q[ti * qk..(ti + 1) * qk],
            &k[ti * qk..(ti + 1) * qk],
            &v[ti * vs..(ti + 1) * vs],
            &beta[ti * d.nv..(ti + 1) * d.nv],
            &g[ti * d.nv..(ti + 1) * d.nv],
            state,
            &mut out[ti * vs..(ti + 1) * vs],
            d,
        );
    }
    out
}

/// Like [`gated_delta_recurrent`], and also returns a copy of the state after each position
/// (speculative verify: committing j tokens selects entry j - 1, with no recomputation).
pub fn gated_delta_recurrent_states(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    g: &[f32],
    state: &mut [f32],
    d: GdnDims,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let t = beta.len() / d.nv;
    let (qk, vs) = (d.nk * d.dk, d.nv * d.dv);
    let mut out = vec![0f32; t * vs];
    let mut states = Vec::with_capacity(t);
    for ti in 0..t {
        let o = gated_delta_recurrent(
            &q[ti * qk..(ti + 1) * qk],
            &k[ti * qk..(ti + 1) * qk],
            &v[ti * vs..(ti + 1) * vs],
            &beta[ti * d.nv..(ti + 1) * d.nv],
            &g[ti * d.nv..(ti + 1) * d.nv],
            state,
            d,
        );
        out[ti * vs..(ti + 1) * vs].copy_from_slice(&o);
        states.push(state.to_vec());
    }
    (out, states)
}

#[allow(clippy::too_many_arguments)]
/// Plain reference of one head's recurrence written as `S_t = e^g (I − β k kᵀ) S + β k vᵀ`,
/// `o = Sᵀ q` with explicit matrices (f64), for tests.
pub fn recurrent_reference_head(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    g: &[f32],
    s0: &[f32],
    dk: usize,
    dv: usize,
) -> (Vec<f32>, Vec<f32>) {
    let t = beta.len();
    let mut s: Vec<f64> = s0.iter().map(|&x| x as f64).collect();
    let mut out = Vec::with_capacity(t * dv);
    for ti in 0..t {
        let (kt, qt, vt) = (&k[ti * dk..(ti + 1) * dk], &q[ti * dk..(ti + 1) * dk], &v[ti * dv..(ti + 1) * dv]);
        let (b, e) = (beta[ti] as f64, (g[ti] as f64).exp());
        // (I − β k kᵀ) S
        let ks: Vec<f64> = (0..dv).map(|j| (0..dk).map(|i| kt[i] as f64 * s[i * dv + j]).sum()).collect();
        let mut next = vec![0f64; dk * dv];
        for i in 0..dk {
            for j in 0..dv {
                next[i * dv + j] = e * (s[i * dv + j] - b * kt[i] as f64 * ks[j]) + b * kt[i] as f64 * vt[j] as f64;
            }
        }
        s = next;
        for j in 0..dv {
            out.push((0..dk).map(|i| s[i * dv + j] * qt[i] as f64).sum::<f64>() as f32);
        }
    }
    (out, s.into_iter().map(|x| x as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::super::testdata::Rng;
    use super::*;

    /// Every token of every head in three passes over the state (decay, `Sᵀk`, update): the
    /// form `head_step` fuses the first two of. Returns `[t, nv, dv]`.
    fn three_pass(q: &[f32], k: &[f32], v: &[f32], beta: &[f32], g: &[f32], s: &mut [f32], d: GdnDims) -> Vec<f32> {
        let (dk, dv, t) = (d.dk, d.dv, beta.len() / d.nv);
        let mut out = vec![0f32; t * d.nv * dv];
        for ti in 0..t {
            for h in 0..d.nv {
                let (kh, th) = (ti * d.nk + h / d.ratio(), ti * d.nv + h);
                let (kv, qv) = (&k[kh * dk..(kh + 1) * dk], &q[kh * dk..(kh + 1) * dk]);
                let st = &mut s[h * dk * dv..(h + 1) * dk * dv];
                let decay = g[th].exp();
                st.iter_mut().for_each(|x| *x *= decay);
                let mut delta = v[th * dv..(th + 1) * dv].to_vec();
                for i in 0..dk {
                    for j in 0..dv {
                        delta[j] -= st[i * dv + j] * kv[i];
                    }
                }
                delta.iter_mut().for_each(|x| *x *= beta[th]);
                for i in 0..dk {
                    for j in 0..dv {
                        st[i * dv + j] += kv[i] * delta[j];
                        out[th * dv + j] += st[i * dv + j] * qv[i];
                    }
                }
            }
        }
        out
    }

    #[test]
    fn fused_decay_pass_gives_the_three_pass_bits() {
        let d = GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 };
        let t = 5;
        let mut rng = Rng(11);
        let (q, k, v) = (rng.vec(t * d.nk * d.dk), rng.vec(t * d.nk * d.dk), rng.vec(t * d.nv * d.dv));
        let beta: Vec<f32> = rng.vec(t * d.nv).into_iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
        let g: Vec<f32> = rng.vec(t * d.nv).into_iter().map(|x| -0.3 * (x + 1.0)).collect();
        let s0 = rng.vec(d.state_len());
        let (mut a, mut b) = (s0.clone(), s0);
        let out = gated_delta_recurrent(&q, &k, &v, &beta, &g, &mut a, d);
        let want = three_pass(&q, &k, &v, &beta, &g, &mut b, d);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for (ti, (o, w)) in out.chunks(d.nv * d.dv).zip(want.chunks(d.nv * d.dv)).enumerate() {
            assert_eq!(bits(o), bits(w), "token {ti}");
        }
        assert_eq!(bits(&a), bits(&b));
    }
}
