//! One GDN layer's step after the conv, as the fused CUDA kernel runs it (`gdn_delta_fused`):
//! split the conv output into q, k, v; L2-normalise q and k (q then scaled by dk^-1/2); beta =
//! sigmoid(b), g = -A softplus(a + dt_bias); the gated delta rule; the gated RMSNorm of the
//! output. [`gates`] is the gate arithmetic the CPU layer uses too; [`step_reference`] the
//! whole step on slices, the reference `tandem check-device` compares the kernel and the
//! portable tensor version ([`super::portable::step`]) with; [`step_reference_chunked`] the
//! same with the chunked WY delta rule, the reference of the chunked CUDA kernels.

use super::{gated_delta_chunked, gated_delta_recurrent_states, gated_rms_norm, l2_normalize, GdnDims};

/// `(beta, g)` of one (token, v-head) from the raw projections: `sigmoid(b)` and
/// `neg_a * softplus(a + dt_bias)` (softplus taken as linear above 20).
pub fn gates(b: f32, a: f32, dt_bias: f32, neg_a: f32) -> (f32, f32) {
    let x = a + dt_bias;
    let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
    (1.0 / (1.0 + (-b).exp()), neg_a * softplus)
}

/// The layer's per-head parameters and constants.
pub struct StepParams<'a> {
    pub dt_bias: &'a [f32],
    pub neg_a: &'a [f32],
    pub norm_w: &'a [f32],
    pub scale: f32,
    pub eps: f32,
}

/// q, k, v split from the conv output, q and k normalised (q scaled), and beta and g.
type Prepared = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

fn prepare(u: &[f32], b: &[f32], a: &[f32], p: &StepParams<'_>, d: GdnDims) -> Prepared {
    let kd = d.nk * d.dk;
    let ch = 2 * kd + d.nv * d.dv;
    let t = u.len() / ch;
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for row in u.chunks(ch) {
        q.extend_from_slice(&row[..kd]);
        k.extend_from_slice(&row[kd..2 * kd]);
        v.extend_from_slice(&row[2 * kd..]);
    }
    l2_normalize(&mut q, d.dk, 1e-6);
    l2_normalize(&mut k, d.dk, 1e-6);
    q.iter_mut().for_each(|x| *x *= p.scale);
    let (mut beta, mut g) = (Vec::with_capacity(t * d.nv), Vec::with_capacity(t * d.nv));
    for i in 0..t * d.nv {
        let h = i % d.nv;
        let (bt, gt) = gates(b[i], a[i], p.dt_bias[h], p.neg_a[h]);
        beta.push(bt);
        g.push(gt);
    }
    (q, k, v, beta, g)
}

/// The same step with the delta rule in the CPU's chunked WY form (what its prefill runs), the
/// reference of the chunked CUDA kernels: the normed output `[t, nv dv]`; `state` is updated.
pub fn step_reference_chunked(
    u: &[f32],
    z: &[f32],
    b: &[f32],
    a: &[f32],
    state: &mut [f32],
    p: &StepParams<'_>,
    d: GdnDims,
) -> Vec<f32> {
    let (q, k, v, beta, g) = prepare(u, b, a, p, d);
    let mut o = gated_delta_chunked(&q, &k, &v, &beta, &g, state, d);
    gated_rms_norm(&mut o, z, p.norm_w, p.eps);
    o
}

/// From `u` `[t, 2 nk dk + nv dv]`, `z` `[t, nv dv]`, `b`, `a` `[t, nv]` and `state`
/// `[nv, dk, dv]` (updated): the normed output `[t, nv dv]` and the state after each token.
pub fn step_reference(
    u: &[f32],
    z: &[f32],
    b: &[f32],
    a: &[f32],
    state: &mut [f32],
    p: &StepParams<'_>,
    d: GdnDims,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (q, k, v, beta, g) = prepare(u, b, a, p, d);
    let (mut o, states) = gated_delta_recurrent_states(&q, &k, &v, &beta, &g, state, d);
    gated_rms_norm(&mut o, z, p.norm_w, p.eps);
    (o, states)
}
