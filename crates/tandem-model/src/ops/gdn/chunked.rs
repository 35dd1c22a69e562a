//! The gated delta rule over whole chunks of C = 64 tokens (prefill), in the WY/UT form of the
//! shared spec §4.8. Per head and chunk, with γ the in-chunk cumulative log decay and
//! Γ_ij = e^{γ_i − γ_j}:
//! `A = strict_tril(β_i k_i·k_j Γ_ij)`, `T = (I + A)⁻¹`, `U = T diag(β) V`,
//! `W = T diag(β e^γ) K`, `V' = U − W S`, `O = diag(e^γ) Q S + (Q Kᵀ ⊙ Γ ⊙ M) V'`,
//! `S ← e^{γ_last} S + (diag(e^{γ_last − γ}) K)ᵀ V'`.
//! A short last chunk is processed at its own length, which equals zero padding exactly.

use super::{GdnDims, RuleInputs};

/// Chunk length.
pub const CHUNK: usize = 64;

/// Same contract as [`super::gated_delta_recurrent`]: runs `t` tokens from `state` (updated
/// in place) and returns `[t, nv, dv]`.
pub fn gated_delta_chunked(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    beta: &[f32],
    g: &[f32],
    state: &mut [f32],
    d: GdnDims,
) -> Vec<f32> {
    use rayon::prelude::*;
    let GdnDims { nv, dk, dv, .. } = d;
    let t = beta.len() / nv;
    // Heads are independent (each its own state slice and output columns): one task per head,
    // the same arithmetic in the same order as a single thread, so the bits do not depend on
    // the thread count.
    let inputs = RuleInputs { q, k, v, beta, g };
    let per_head: Vec<Vec<f32>> =
        state.par_chunks_mut(dk * dv).enumerate().map(|(h, s)| head_chunked(inputs, s, h, d)).collect();
    let mut out = vec![0f32; t * nv * dv];
    for (h, o) in per_head.iter().enumerate() {
        for ti in 0..t {
            out[(ti * nv + h) * dv..(ti * nv + h + 1) * dv].copy_from_slice(&o[ti * dv..(ti + 1) * dv]);
        }
    }
    out
}

/// Head `h`'s outputs `[t, dv]` over all chunks; `s` is its state, updated in place.
fn head_chunked(inputs: RuleInputs<'_>, s: &mut [f32], h: usize, d: GdnDims) -> Vec<f32> {
    let RuleInputs { q, k, v, beta, g } = inputs;
    let GdnDims { nk, nv, dk, dv } = d;
    let r = d.ratio();
    let t = beta.len() / nv;
    let mut out = vec![0f32; t * dv];
    // Per-chunk scratch, reused across chunks.
    let mut kc = vec![0f32; CHUNK * dk];
    let mut qc = vec![0f32; CHUNK * dk];
    let mut vn = vec![0f32; CHUNK * dv];
    let mut w = vec![0f32; CHUNK * dk];
    let mut a = vec![0f32; CHUNK * CHUNK];
    let mut tm = vec![0f32; CHUNK * CHUNK];
    let mut gam = vec![0f32; CHUNK];
    let mut bc = vec![0f32; CHUNK];
    let kh = h / r;
    let mut start = 0;
    while start < t {
        let c = CHUNK.min(t - start);
        // Gather this head's rows.
        let mut acc = 0f32;
        for i in 0..c {
            let ti = start + i;
            kc[i * dk..(i + 1) * dk].copy_from_slice(&k[(ti * nk + kh) * dk..(ti * nk + kh + 1) * dk]);
            qc[i * dk..(i + 1) * dk].copy_from_slice(&q[(ti * nk + kh) * dk..(ti * nk + kh + 1) * dk]);
            acc += g[ti * nv + h];
            gam[i] = acc;
            bc[i] = beta[ti * nv + h];
        }
        let dot = |x: &[f32], y: &[f32]| -> f32 { x.iter().zip(y).map(|(a, b)| a * b).sum() };
        // A (strictly lower) and T = (I + A)^-1 by forward substitution.
        for i in 0..c {
            for j in 0..i {
                a[i * CHUNK + j] =
                    bc[i] * dot(&kc[i * dk..(i + 1) * dk], &kc[j * dk..(j + 1) * dk]) * (gam[i] - gam[j]).exp();
            }
        }
        for i in 0..c {
            tm[i * CHUNK + i] = 1.0;
            for j in 0..i {
                let mut sum = 0f32;
                for m in j..i {
                    sum += a[i * CHUNK + m] * tm[m * CHUNK + j];
                }
                tm[i * CHUNK + j] = -sum;
            }
        }
        // U = T diag(β) V (into vn), W = T diag(β e^γ) K; then V' = U − W S (in vn).
        for i in 0..c {
            let (ui, wi) = (&mut vn[i * dv..(i + 1) * dv], &mut w[i * dk..(i + 1) * dk]);
            ui.iter_mut().for_each(|x| *x = 0.0);
            wi.iter_mut().for_each(|x| *x = 0.0);
            for j in 0..=i {
                let tij = tm[i * CHUNK + j] * bc[j];
                let vj = &v[((start + j) * nv + h) * dv..((start + j) * nv + h + 1) * dv];
                for (u, &x) in ui.iter_mut().zip(vj) {
                    *u += tij * x;
                }
                let twj = tij * gam[j].exp();
                for (wv, &x) in wi.iter_mut().zip(&kc[j * dk..(j + 1) * dk]) {
                    *wv += twj * x;
                }
            }
            for (m, &wm) in wi.iter().enumerate() {
                for (u, &sm) in ui.iter_mut().zip(&s[m * dv..(m + 1) * dv]) {
                    *u -= wm * sm;
                }
            }
        }
        // O = diag(e^γ) Q S + (Q Kᵀ ⊙ Γ ⊙ M) V'.
        for i in 0..c {
            let o = &mut out[(start + i) * dv..(start + i + 1) * dv];
            let qi = &qc[i * dk..(i + 1) * dk];
            let e = gam[i].exp();
            for (m, &qm) in qi.iter().enumerate() {
                let f = e * qm;
                for (oj, &sm) in o.iter_mut().zip(&s[m * dv..(m + 1) * dv]) {
                    *oj += f * sm;
                }
            }
            for j in 0..=i {
                let f = dot(qi, &kc[j * dk..(j + 1) * dk]) * (gam[i] - gam[j]).exp();
                for (oj, &x) in o.iter_mut().zip(&vn[j * dv..(j + 1) * dv]) {
                    *oj += f * x;
                }
            }
        }
        // S ← e^{γ_last} S + Σ_j e^{γ_last − γ_j} k_j V'_jᵀ.
        let last = gam[c - 1];
        let e = last.exp();
        s.iter_mut().for_each(|x| *x *= e);
        for j in 0..c {
            let f = (last - gam[j]).exp();
            for m in 0..dk {
                let km = f * kc[j * dk + m];
                for (sm, &x) in s[m * dv..(m + 1) * dv].iter_mut().zip(&vn[j * dv..(j + 1) * dv]) {
                    *sm += km * x;
                }
            }
        }
        start += c;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::recurrent::{gated_delta_recurrent, recurrent_reference_head};
    use super::super::testdata::Rng;
    use super::super::{l2_normalize, GdnDims};
    use super::*;

    struct Case {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        beta: Vec<f32>,
        g: Vec<f32>,
        s0: Vec<f32>,
    }

    fn case(t: usize, d: GdnDims, seed: u64) -> Case {
        let mut rng = Rng(seed);
        let mut q = rng.vec(t * d.nk * d.dk);
        let mut k = rng.vec(t * d.nk * d.dk);
        l2_normalize(&mut q, d.dk, 1e-6);
        l2_normalize(&mut k, d.dk, 1e-6);
        let scale = (d.dk as f32).powf(-0.5);
        q.iter_mut().for_each(|x| *x *= scale);
        let v = rng.vec(t * d.nv * d.dv);
        let beta = rng.vec(t * d.nv).into_iter().map(|x| 1.0 / (1.0 + (-2.0 * x).exp())).collect();
        let g = rng.vec(t * d.nv).into_iter().map(|x| -0.3 * (x + 1.0)).collect();
        let s0 = rng.vec(d.state_len()).into_iter().map(|x| 0.5 * x).collect();
        Case { q, k, v, beta, g, s0 }
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn recurrent_matches_matrix_reference() {
        let d = GdnDims { nk: 2, nv: 4, dk: 8, dv: 6 };
        let t = 9;
        let c = case(t, d, 7);
        let mut s = c.s0.clone();
        let out = gated_delta_recurrent(&c.q, &c.k, &c.v, &c.beta, &c.g, &mut s, d);
        for h in 0..d.nv {
            let kh = h / d.ratio();
            let pick = |x: &[f32], heads: usize, hh: usize, dim: usize| -> Vec<f32> {
                (0..t).flat_map(|ti| x[(ti * heads + hh) * dim..(ti * heads + hh + 1) * dim].to_vec()).collect()
            };
            let (qh, kh_, vh) = (pick(&c.q, d.nk, kh, d.dk), pick(&c.k, d.nk, kh, d.dk), pick(&c.v, d.nv, h, d.dv));
            let bh: Vec<f32> = (0..t).map(|ti| c.beta[ti * d.nv + h]).collect();
            let gh: Vec<f32> = (0..t).map(|ti| c.g[ti * d.nv + h]).collect();
            let sz = d.dk * d.dv;
            let (o, sf) = recurrent_reference_head(&qh, &kh_, &vh, &bh, &gh, &c.s0[h * sz..(h + 1) * sz], d.dk, d.dv);
            assert!(max_diff(&pick(&out, d.nv, h, d.dv), &o) < 1e-5);
            assert!(max_diff(&s[h * sz..(h + 1) * sz], &sf) < 1e-5);
        }
    }

    #[test]
    fn chunked_equals_recurrent_outputs_and_state() {
        for (t, d, zero_state) in [
            (150, GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 }, true),
            (150, GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 }, false),
            (64, GdnDims { nk: 1, nv: 1, dk: 8, dv: 8 }, false),
            (1, GdnDims { nk: 2, nv: 2, dk: 4, dv: 4 }, false),
            (130, GdnDims { nk: 3, nv: 6, dk: 8, dv: 5 }, false),
        ] {
            let mut c = case(t, d, 11 + t as u64);
            if zero_state {
                c.s0.iter_mut().for_each(|x| *x = 0.0);
            }
            let (mut s1, mut s2) = (c.s0.clone(), c.s0.clone());
            let o1 = gated_delta_recurrent(&c.q, &c.k, &c.v, &c.beta, &c.g, &mut s1, d);
            let o2 = gated_delta_chunked(&c.q, &c.k, &c.v, &c.beta, &c.g, &mut s2, d);
            let (eo, es) = (max_diff(&o1, &o2), max_diff(&s1, &s2));
            assert!(eo < 1e-5 && es < 1e-5, "t={t} {d:?}: output diff {eo}, state diff {es}");
        }
    }

    #[test]
    fn heads_in_parallel_give_the_bits_of_one_thread() {
        let d = GdnDims { nk: 2, nv: 4, dk: 16, dv: 16 };
        let c = case(150, d, 7);
        type Kernel = fn(&[f32], &[f32], &[f32], &[f32], &[f32], &mut [f32], GdnDims) -> Vec<f32>;
        for (name, kernel) in [("chunked", gated_delta_chunked as Kernel), ("recurrent", gated_delta_recurrent)] {
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                pool.install(|| {
                    let mut s = c.s0.clone();
                    let o = kernel(&c.q, &c.k, &c.v, &c.beta, &c.g, &mut s, d);
                    (o, s)
                })
            };
            let (one, three) = (run(1), run(3));
            assert!(one.0 == three.0 && one.1 == three.1, "{name}: outputs or states differ with the thread count");
        }
    }

    #[test]
    fn chunked_in_pieces_equals_one_shot() {
        let d = GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 };
        let t = 150;
        let c = case(t, d, 5);
        let mut s_one = c.s0.clone();
        let whole = gated_delta_chunked(&c.q, &c.k, &c.v, &c.beta, &c.g, &mut s_one, d);
        let mut s = c.s0.clone();
        let mut got = Vec::new();
        let mut off = 0;
        for n in [7usize, 64, 79] {
            let (qk, vs) = (d.nk * d.dk, d.nv * d.dv);
            got.extend(gated_delta_chunked(
                &c.q[off * qk..(off + n) * qk],
                &c.k[off * qk..(off + n) * qk],
                &c.v[off * vs..(off + n) * vs],
                &c.beta[off * d.nv..(off + n) * d.nv],
                &c.g[off * d.nv..(off + n) * d.nv],
                &mut s,
                d,
            ));
            off += n;
        }
        assert!(max_diff(&got, &whole) < 1e-5);
        assert!(max_diff(&s, &s_one) < 1e-5);
    }
}
