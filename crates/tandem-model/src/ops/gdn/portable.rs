//! The GDN ops in plain candle tensor ops, for any candle device (Metal today, and the
//! reference the CUDA kernels are checked against on the device). Same maths and layouts as
//! the slice kernels of this module: see `mod.rs`. States are f32 tensors and never written in
//! place; every call returns new ones.

use candle_core::{DType, Tensor, D};

use super::GdnDims;
use crate::error::Result;

/// Causal depthwise conv + SiLU of `x: [t, ch]` after `state: [K-1, ch]` with `w: [ch, K]`.
/// Returns `(y [t, ch], state after the last position, the state after every position
/// [t, K-1, ch] when `lanes`)`.
pub fn conv_silu(x: &Tensor, state: &Tensor, w: &Tensor, lanes: bool) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let (t, ch) = x.dims2()?;
    let (_, kernel) = w.dims2()?;
    let hist = kernel - 1;
    let xx = Tensor::cat(&[state, x], 0)?; // [hist + t, ch]
    let wt = w.t()?.contiguous()?; // [K, ch]
    let mut acc = Tensor::zeros((t, ch), DType::F32, x.device())?;
    for j in 0..kernel {
        acc = (acc + xx.narrow(0, j, t)?.broadcast_mul(&wt.narrow(0, j, 1)?)?)?;
    }
    let y = candle_nn::ops::silu(&acc)?;
    let next = xx.narrow(0, t, hist)?.contiguous()?;
    let lanes = if lanes {
        let rows: Vec<Tensor> = (0..t).map(|i| xx.narrow(0, i + 1, hist)).collect::<candle_core::Result<_>>()?;
        Some(Tensor::stack(&rows, 0)?)
    } else {
        None
    };
    Ok((y, next.reshape((hist, ch))?, lanes))
}

/// The gated delta rule over `t` tokens: q, k `[t, nk, dk]`, v `[t, nv, dv]`, beta, g `[t,
/// nv]`, `state: [nv, dk, dv]`. Returns `(o [t, nv, dv], state after the last token, the state
/// after every token [t, nv, dk, dv] when `lanes`)`.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    beta: &Tensor,
    g: &Tensor,
    state: &Tensor,
    d: GdnDims,
    lanes: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let t = v.dim(0)?;
    let r = d.ratio();
    // q/k heads per v-head.
    let expand = |x: &Tensor| -> Result<Tensor> {
        Ok(if r == 1 {
            x.clone()
        } else {
            let idx: Vec<u32> = (0..d.nv).map(|h| (h / r) as u32).collect();
            x.index_select(&Tensor::from_vec(idx, d.nv, x.device())?, 1)?
        })
    };
    let (q, k) = (expand(q)?, expand(k)?); // [t, nv, dk]
    let decay = g.exp()?; // [t, nv]
    let mut s = state.reshape((d.nv, d.dk, d.dv))?;
    let mut outs = Vec::with_capacity(t);
    let mut states = Vec::new();
    for i in 0..t {
        let qi = q.get(i)?.unsqueeze(1)?; // [nv, 1, dk]
        let ki = k.get(i)?; // [nv, dk]
        s = s.broadcast_mul(&decay.get(i)?.reshape((d.nv, 1, 1))?)?;
        let kv = ki.unsqueeze(1)?.matmul(&s)?; // [nv, 1, dv]
        let delta = (v.get(i)?.unsqueeze(1)? - kv)?.broadcast_mul(&beta.get(i)?.reshape((d.nv, 1, 1))?)?;
        s = (s + ki.unsqueeze(2)?.matmul(&delta)?)?; // k delta^T
        outs.push(qi.matmul(&s)?.squeeze(1)?); // [nv, dv]
        if lanes {
            states.push(s.clone());
        }
    }
    let o = Tensor::stack(&outs, 0)?;
    let lanes = if lanes { Some(Tensor::stack(&states, 0)?) } else { None };
    Ok((o, s.contiguous()?, lanes))
}

/// `x / sqrt(sum(x²) + eps)` over the last dimension.
pub fn l2_normalize(x: &Tensor, eps: f64) -> Result<Tensor> {
    let ss = x.sqr()?.sum_keepdim(D::Minus1)?;
    Ok(x.broadcast_div(&(ss + eps)?.sqrt()?)?)
}

/// `o / sqrt(mean(o²) + eps) * w * silu(z)` over the last dimension (`w: [dim]`).
pub fn gated_rms_norm(o: &Tensor, z: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = o.sqr()?.mean_keepdim(D::Minus1)?;
    let n = o.broadcast_div(&(ms + eps)?.sqrt()?)?;
    Ok(n.broadcast_mul(w)?.mul(&candle_nn::ops::silu(z)?)?)
}

/// The layer's step after the conv on tensors (see [`super::step`]): `u` `[t, 2 nk dk + nv
/// dv]`, `z` `[t, nv dv]`, raw `b`, `a` `[t, nv]`; `dt_bias`, `neg_a` `[nv]`, `norm_w` `[dv]`.
/// Returns `(o [t, nv dv], next state, lanes)` like [`delta_rule`].
#[allow(clippy::too_many_arguments)]
pub fn step(
    u: &Tensor,
    z: &Tensor,
    b: &Tensor,
    a: &Tensor,
    state: &Tensor,
    p: &super::device::StepTensors<'_>,
    d: GdnDims,
    lanes: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let GdnDims { nk, nv, dk, dv } = d;
    let t = u.dim(0)?;
    let kd = nk * dk;
    let q = (l2_normalize(&u.narrow(1, 0, kd)?.reshape((t, nk, dk))?, 1e-6)? * p.scale as f64)?;
    let k = l2_normalize(&u.narrow(1, kd, kd)?.reshape((t, nk, dk))?, 1e-6)?;
    let v = u.narrow(1, 2 * kd, nv * dv)?.reshape((t, nv, dv))?;
    let beta = candle_nn::ops::sigmoid(&b.contiguous()?)?;
    let g = softplus(&a.broadcast_add(p.dt_bias)?)?.broadcast_mul(p.neg_a)?;
    let (o, next, lanes) = super::device::delta_rule(&q, &k, &v, &beta, &g, state, d, lanes)?;
    let o = gated_rms_norm(&o, &z.reshape((t, nv, dv))?, p.norm_w, p.eps as f64)?;
    Ok((o.reshape((t, nv * dv))?, next, lanes))
}

/// `softplus(x) = max(x, 0) + ln(1 + e^-|x|)`, stable for any x.
pub fn softplus(x: &Tensor) -> Result<Tensor> {
    Ok((x.relu()? + (x.abs()?.neg()?.exp()? + 1.0)?.log()?)?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::super::testdata::Rng;
    use super::super::{causal_conv_silu, gated_delta_recurrent_states};
    use super::*;

    fn t(v: Vec<f32>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn portable_conv_equals_the_slice_kernel_with_every_lane() {
        let (ch, k, t_len) = (6, 4, 5);
        let mut rng = Rng(7);
        let (x, st, w) = (rng.vec(t_len * ch), rng.vec((k - 1) * ch), rng.vec(ch * k));
        let mut state = st.clone();
        let mut want_lanes = Vec::new();
        let mut want = Vec::new();
        for i in 0..t_len {
            want.extend(causal_conv_silu(&x[i * ch..(i + 1) * ch], &mut state, &w, ch, k));
            want_lanes.extend(state.clone());
        }
        let (y, next, lanes) = conv_silu(&t(x, &[t_len, ch]), &t(st, &[k - 1, ch]), &t(w, &[ch, k]), true).unwrap();
        assert!(max_diff(&y.flatten_all().unwrap().to_vec1().unwrap(), &want) < 1e-6);
        assert!(max_diff(&next.flatten_all().unwrap().to_vec1().unwrap(), &state) == 0.0);
        assert!(max_diff(&lanes.unwrap().flatten_all().unwrap().to_vec1().unwrap(), &want_lanes) == 0.0);
    }

    #[test]
    fn portable_delta_rule_equals_the_slice_kernel_with_every_lane() {
        let d = GdnDims { nk: 2, nv: 4, dk: 8, dv: 6 };
        let tl = 5;
        let mut rng = Rng(11);
        let mut q = rng.vec(tl * d.nk * d.dk);
        let mut k = rng.vec(tl * d.nk * d.dk);
        super::super::l2_normalize(&mut q, d.dk, 1e-6);
        super::super::l2_normalize(&mut k, d.dk, 1e-6);
        let v = rng.vec(tl * d.nv * d.dv);
        let beta: Vec<f32> = rng.vec(tl * d.nv).iter().map(|x| 0.5 + 0.4 * x).collect();
        let g: Vec<f32> = rng.vec(tl * d.nv).iter().map(|x| -0.5 * x.abs()).collect();
        let s0 = rng.vec(d.state_len());
        let mut s = s0.clone();
        let (want, want_states) = gated_delta_recurrent_states(&q, &k, &v, &beta, &g, &mut s, d);
        let (o, next, lanes) = delta_rule(
            &t(q, &[tl, d.nk, d.dk]),
            &t(k, &[tl, d.nk, d.dk]),
            &t(v, &[tl, d.nv, d.dv]),
            &t(beta, &[tl, d.nv]),
            &t(g, &[tl, d.nv]),
            &t(s0, &[d.nv, d.dk, d.dv]),
            d,
            true,
        )
        .unwrap();
        assert!(max_diff(&o.flatten_all().unwrap().to_vec1().unwrap(), &want) < 1e-5);
        assert!(max_diff(&next.flatten_all().unwrap().to_vec1().unwrap(), &s) < 1e-5);
        let lanes: Vec<f32> = lanes.unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert!(max_diff(&lanes, &want_states.concat()) < 1e-5);
    }

    #[test]
    fn portable_norms_and_softplus_equal_the_slice_versions() {
        let mut rng = Rng(3);
        let (o, z, w) = (rng.vec(24), rng.vec(24), rng.vec(6));
        let mut want = o.clone();
        super::super::gated_rms_norm(&mut want, &z, &w, 1e-6);
        let got = gated_rms_norm(&t(o.clone(), &[4, 6]), &t(z, &[4, 6]), &t(w, &[6]), 1e-6).unwrap();
        assert!(max_diff(&got.flatten_all().unwrap().to_vec1().unwrap(), &want) < 1e-5);
        let mut want = o.clone();
        super::super::l2_normalize(&mut want, 6, 1e-6);
        let got = l2_normalize(&t(o, &[4, 6]), 1e-6).unwrap();
        assert!(max_diff(&got.flatten_all().unwrap().to_vec1().unwrap(), &want) < 1e-6);
        let xs = [-100f32, -3.0, 0.0, 0.5, 25.0, 100.0];
        let got: Vec<f32> = softplus(&t(xs.to_vec(), &[6])).unwrap().to_vec1().unwrap();
        for (x, y) in xs.iter().zip(got) {
            let want = if *x > 20.0 { *x } else { x.exp().ln_1p() };
            assert!((y - want).abs() <= 1e-5 * want.abs().max(1.0), "softplus({x}) = {y}, want {want}");
        }
    }
}
