//! The gated delta rule over whole chunks of C = 64 tokens (prefill), in the WY/UT form of the
//! shared spec §4.8. Per head and chunk, with γ the in-chunk cumulative log decay and
//! Γ_ij = e^{γ_i − γ_j}:
//! `A = strict_tril(β_i k_i·k_j Γ_ij)`, `T = (I + A)⁻¹`, `U = T diag(β) V`,
//! `W = T diag(β e^γ) K`, `V' = U − W S`, `O = diag(e^γ) Q S + (Q Kᵀ ⊙ Γ ⊙ M) V'`,
//! `S ← e^{γ_last} S + (diag(e^{γ_last − γ}) K)ᵀ V'`.
//! A short last chunk is processed at its own length, which equals zero padding exactly.

use super::{GdnDims, RuleInputs};
use crate::ops::gemm::gemm_into;

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

/// Head `h`'s outputs `[t, dv]` over all chunks; `s` is its state, updated in place, with
/// subnormal floats flushed to zero ([`super::FlushDenormals`]). On x86
/// CPUs with AVX2 + FMA the same code is compiled for them (8-wide vectors; Rust never fuses a
/// multiply and an add on its own, so the bits are those of the baseline build).
fn head_chunked(inputs: RuleInputs<'_>, s: &mut [f32], h: usize, d: GdnDims) -> Vec<f32> {
    let _ftz = super::FlushDenormals::new();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        return unsafe { head_chunked_avx2(inputs, s, h, d) };
    }
    head_chunked_body(inputs, s, h, d)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn head_chunked_avx2(inputs: RuleInputs<'_>, s: &mut [f32], h: usize, d: GdnDims) -> Vec<f32> {
    head_chunked_body(inputs, s, h, d)
}

#[inline(always)]
fn head_chunked_body(inputs: RuleInputs<'_>, s: &mut [f32], h: usize, d: GdnDims) -> Vec<f32> {
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
    // e^{γ_i} q_i (for Q S) and e^{γ_last − γ_j} k_j transposed (for the state update).
    let mut qe = vec![0f32; CHUNK * dk];
    let mut kt = vec![0f32; dk * CHUNK];
    // Γ, K Kᵀ / Q Kᵀ, and T diag(β) / T diag(β e^γ) of the chunk.
    let mut decay = vec![0f32; CHUNK * CHUNK];
    let mut kk = vec![0f32; CHUNK * CHUNK];
    let mut tbm = vec![0f32; CHUNK * CHUNK];
    let mut twm = vec![0f32; CHUNK * CHUNK];
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
        // Γ_ij = e^{γ_i − γ_j} on and below the diagonal.
        for i in 0..c {
            for j in 0..=i {
                decay[i * CHUNK + j] = (gam[i] - gam[j]).exp();
            }
        }
        // A = strict_tril(β_i k_i·k_j Γ_ij) from K Kᵀ.
        gemm_into(&mut kk, CHUNK, None, (&kc, dk, 1), (&kc, 1, dk), c, dk, c);
        for i in 0..c {
            for j in 0..i {
                a[i * CHUNK + j] = bc[i] * kk[i * CHUNK + j] * decay[i * CHUNK + j];
            }
        }
        // T = (I + A)^-1 by forward substitution, a row at a time:
        // T_i = e_i − Σ_{m<i} A_im T_m (T_m is zero right of m).
        for i in 0..c {
            let (done, rest) = tm.split_at_mut(i * CHUNK);
            let row = &mut rest[..CHUNK];
            row.iter_mut().for_each(|x| *x = 0.0);
            for m in 0..i {
                let am = a[i * CHUNK + m];
                for (x, &y) in row[..=m].iter_mut().zip(&done[m * CHUNK..m * CHUNK + m + 1]) {
                    *x -= am * y;
                }
            }
            row[i] = 1.0;
        }
        // U = T diag(β) V (into vn), W = T diag(β e^γ) K; then V' = U − W S (in vn).
        for i in 0..c {
            for j in 0..c {
                let (tb, tw) = if j <= i {
                    let tij = tm[i * CHUNK + j] * bc[j];
                    (tij, tij * gam[j].exp())
                } else {
                    (0.0, 0.0)
                };
                tbm[i * CHUNK + j] = tb;
                twm[i * CHUNK + j] = tw;
            }
        }
        let vh = &v[(start * nv + h) * dv..];
        gemm_into(&mut vn, dv, None, (&tbm, CHUNK, 1), (vh, nv * dv, 1), c, c, dv);
        gemm_into(&mut w, dk, None, (&twm, CHUNK, 1), (&kc, dk, 1), c, c, dk);
        gemm_into(&mut vn, dv, Some(-1.0), (&w, dk, 1), (s, dv, 1), c, dk, dv);
        // O = diag(e^γ) Q S + (Q Kᵀ ⊙ Γ ⊙ M) V'.
        for i in 0..c {
            let e = gam[i].exp();
            for (x, &qm) in qe[i * dk..(i + 1) * dk].iter_mut().zip(&qc[i * dk..(i + 1) * dk]) {
                *x = e * qm;
            }
        }
        gemm_into(&mut out[start * dv..], dv, Some(1.0), (&qe, dk, 1), (s, dv, 1), c, dk, dv);
        gemm_into(&mut kk, CHUNK, None, (&qc, dk, 1), (&kc, 1, dk), c, dk, c);
        for i in 0..c {
            for j in 0..c {
                let x = &mut kk[i * CHUNK + j];
                *x = if j <= i { *x * decay[i * CHUNK + j] } else { 0.0 };
            }
        }
        gemm_into(&mut out[start * dv..], dv, Some(1.0), (&kk, CHUNK, 1), (&vn, dv, 1), c, c, dv);
        // S ← e^{γ_last} S + Σ_j e^{γ_last − γ_j} k_j V'_jᵀ.
        let last = gam[c - 1];
        let e = last.exp();
        s.iter_mut().for_each(|x| *x *= e);
        for j in 0..c {
            let f = (last - gam[j]).exp();
            for m in 0..dk {
                kt[m * CHUNK + j] = f * kc[j * dk + m];
            }
        }
        gemm_into(s, dv, Some(1.0), (&kt, CHUNK, 1), (&vn, dv, 1), dk, c, dv);
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
    fn the_avx2_build_gives_the_bits_of_the_baseline_build() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            let d = GdnDims { nk: 2, nv: 4, dk: 20, dv: 24 };
            let c = case(150, d, 9);
            let inputs = RuleInputs { q: &c.q, k: &c.k, v: &c.v, beta: &c.beta, g: &c.g };
            let sz = d.dk * d.dv;
            for h in 0..d.nv {
                let (mut s1, mut s2) = (c.s0[h * sz..(h + 1) * sz].to_vec(), c.s0[h * sz..(h + 1) * sz].to_vec());
                let base = head_chunked_body(inputs, &mut s1, h, d);
                // SAFETY: detected above.
                let wide = unsafe { head_chunked_avx2(inputs, &mut s2, h, d) };
                assert!(base == wide && s1 == s2, "head {h}: the AVX2 build differs");
            }
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
