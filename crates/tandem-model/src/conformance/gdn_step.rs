//! The GDN step check: the layer's step after the conv ([`gdn::device::step`], one fused
//! kernel on CUDA) against [`gdn::step::step_reference`] on slices, with and without verify
//! lanes, and chunk invariance on the device: `t` tokens in one call give the bits of the same
//! tokens in two calls (states carried between them), which is what makes short prefill chunks
//! and verify chunks exact on the GPU. Prefill chunks of 64+ tokens take the chunked WY kernels
//! on CUDA (`gdn_step wy`): checked against the CPU's chunked form and the recurrent
//! reference, and in two calls against one within rounding.

use candle_core::{Device, Tensor};

use super::{bits_err, host_f32, rel_err_slices, timed, Check, Judge, Rng};
use crate::error::Result;
use crate::ops::gdn::device::{step, StepTensors, CHUNKED_MIN_TOKENS};
use crate::ops::gdn::step::{step_reference, step_reference_chunked, StepParams};
use crate::ops::gdn::{self, GdnDims};

pub fn run(dev: &Device) -> Vec<Check> {
    let cases = [
        (GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 }, 9, true),
        (GdnDims { nk: 16, nv: 32, dk: 128, dv: 128 }, 1, false),
        (GdnDims { nk: 16, nv: 32, dk: 128, dv: 128 }, 6, true),
        (GdnDims { nk: 16, nv: 16, dk: 128, dv: 128 }, 40, false),
        (GdnDims { nk: 4, nv: 8, dk: 64, dv: 96 }, 3, true),
        // prefill chunks of 64+ tokens: the chunked WY kernels on CUDA
        (GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 }, 130, false),
        (GdnDims { nk: 16, nv: 32, dk: 128, dv: 128 }, 64, false),
        (GdnDims { nk: 16, nv: 16, dk: 128, dv: 128 }, 300, false),
        (GdnDims { nk: 4, nv: 8, dk: 64, dv: 96 }, 200, false),
        (GdnDims { nk: 2, nv: 2, dk: 256, dv: 256 }, 70, false),
    ];
    let mut out = Vec::new();
    for (d, t, lanes) in cases {
        // The WY cases test the CUDA kernels; on the CPU `step` is the portable path, already
        // checked by the short cases.
        if dev.is_cpu() && t >= CHUNKED_MIN_TOKENS {
            continue;
        }
        let shape = format!("k{}x{} v{}x{} t{t}{}", d.nk, d.dk, d.nv, d.dv, if lanes { " lanes" } else { "" });
        match case(dev, d, t, lanes, &shape) {
            Ok(c) => out.extend(c),
            Err(e) => out.push(Check::error("gdn_step", shape, "f32", e)),
        }
    }
    out
}

fn case(dev: &Device, d: GdnDims, t: usize, lanes: bool, shape: &str) -> Result<Vec<Check>> {
    let mut rng = Rng((d.dk * 13 + d.dv * 7 + t) as u64 | 1);
    let ch = 2 * d.nk * d.dk + d.nv * d.dv;
    let u = rng.vec(t * ch);
    let z = rng.vec(t * d.nv * d.dv);
    let b = rng.vec(t * d.nv);
    // a + dt_bias spans both softplus branches (up to ~25).
    let a: Vec<f32> = rng.vec(t * d.nv).iter().map(|x| 12.0 * x + 8.0).collect();
    let dt_bias: Vec<f32> = rng.vec(d.nv).iter().map(|x| x * 0.5).collect();
    let neg_a: Vec<f32> = rng.vec(d.nv).iter().map(|x| -0.05 * (x + 1.5)).collect();
    let norm_w: Vec<f32> = rng.vec(d.dv).iter().map(|x| 1.0 + 0.2 * x).collect();
    let s0: Vec<f32> = rng.vec(d.state_len()).iter().map(|x| 0.1 * x).collect();
    let scale = (d.dk as f32).powf(-0.5);
    let mut s = s0.clone();
    let params = StepParams { dt_bias: &dt_bias, neg_a: &neg_a, norm_w: &norm_w, scale, eps: 1e-6 };
    let (want_o, want_states) = step_reference(&u, &z, &b, &a, &mut s, &params, d);
    let want_lanes = want_states.concat();
    // Chunks of 64+ tokens take the WY form on CUDA: compared with the CPU's chunked form too.
    let wy = t >= CHUNKED_MIN_TOKENS && !lanes;
    let mut s_wy = s0.clone();
    let want_wy = if wy { Some(step_reference_chunked(&u, &z, &b, &a, &mut s_wy, &params, d)) } else { None };

    let tt = |v: &[f32], shape: (usize, usize)| Tensor::from_slice(v, shape, dev);
    let (tu, tz, tb, ta) = (tt(&u, (t, ch))?, tt(&z, (t, d.nv * d.dv))?, tt(&b, (t, d.nv))?, tt(&a, (t, d.nv))?);
    let (dtb, nga, nw) = (
        Tensor::from_slice(&dt_bias, d.nv, dev)?,
        Tensor::from_slice(&neg_a, d.nv, dev)?,
        Tensor::from_slice(&norm_w, d.dv, dev)?,
    );
    let ts = Tensor::from_slice(&s0, (d.nv, d.dk, d.dv), dev)?;
    let p = StepTensors { dt_bias: &dtb, neg_a: &nga, norm_w: &nw, scale, eps: 1e-6 };

    let mut checks = Vec::new();
    let mut one = |name: &str, f: &dyn Fn() -> Result<(Tensor, Tensor, Option<Tensor>)>| -> Result<()> {
        let ((o, next, l), ms) = timed(dev, f)?;
        let (ho, hs) = (host_f32(&o)?, host_f32(&next)?);
        let mut e = rel_err_slices(&ho, &want_o).max(rel_err_slices(&hs, &s));
        if let Some(w) = &want_wy {
            e = e.max(rel_err_slices(&ho, w)).max(rel_err_slices(&hs, &s_wy));
        }
        if let Some(l) = l {
            e = e.max(rel_err_slices(&host_f32(&l)?, &want_lanes));
        }
        checks.push(Check::new(name, shape.into(), "f32", e, Judge::Tolerance(1e-4), ms));
        Ok(())
    };
    one(if wy { "gdn_step wy" } else { "gdn_step" }, &|| step(&tu, &tz, &tb, &ta, &ts, &p, d, lanes))?;
    if !dev.is_cpu() && t <= 16 {
        one("gdn_step portable", &|| gdn::portable::step(&tu, &tz, &tb, &ta, &ts, &p, d, lanes))?;
    }

    // Chunk invariance: the first t1 tokens, then the rest from their state.
    if t > 1 && !dev.is_cpu() {
        let t1 = t / 2;
        let (o_all, s_all, _) = step(&tu, &tz, &tb, &ta, &ts, &p, d, false)?;
        let part = |x: &Tensor, from: usize, n: usize| x.narrow(0, from, n);
        let (o1, s1, _) =
            step(&part(&tu, 0, t1)?, &part(&tz, 0, t1)?, &part(&tb, 0, t1)?, &part(&ta, 0, t1)?, &ts, &p, d, false)?;
        let n2 = t - t1;
        let (o2, s2, _) = step(
            &part(&tu, t1, n2)?,
            &part(&tz, t1, n2)?,
            &part(&tb, t1, n2)?,
            &part(&ta, t1, n2)?,
            &s1,
            &p,
            d,
            false,
        )?;
        let split = Tensor::cat(&[o1, o2], 0)?;
        if t1.max(n2) < CHUNKED_MIN_TOKENS && t < CHUNKED_MIN_TOKENS {
            let e = bits_err(&split, &o_all)?.max(bits_err(&s2, &s_all)?);
            checks.push(Check::new("gdn_step chunks", shape.into(), "f32", e, Judge::Exact, 0.0));
        } else {
            // The WY form's chunks start where the call starts: equal within rounding.
            let e = rel_err_slices(&host_f32(&split)?, &host_f32(&o_all)?)
                .max(rel_err_slices(&host_f32(&s2)?, &host_f32(&s_all)?));
            checks.push(Check::new("gdn_step wy chunks", shape.into(), "f32", e, Judge::Tolerance(1e-4), 0.0));
        }
    }
    Ok(checks)
}
