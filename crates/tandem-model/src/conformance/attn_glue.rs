//! The gated attention glue (`ops::attn_glue`: one kernel each side of attention on CUDA,
//! candle's ops elsewhere) against its plain reference: the q / k norms, the partial NeoX
//! rotation and the head-major copies from column views of a fused projection (as the layer
//! reads them), and the sigmoid gate; and row invariance: the last token of a 5-token call has
//! the bits of the same token alone. On CUDA also the plain (Llama-family) layer's form of the
//! same kernel (`cuda::prep_plain`: q rows of queries only, with and without per-head norms).

use candle_core::{Device, Tensor};

use super::{bits_err, host_f32, rel_err_slices, timed, Check, Judge, Rng};
use crate::config::{RopeScaling, RopeStyle};
use crate::error::Result;
use crate::ops::attn_glue::{gate, prep, reference_gate, reference_prep_rows};
use crate::ops::rope::Rope;

pub fn run(dev: &Device) -> Vec<Check> {
    let mut out = Vec::new();
    // (query heads, KV heads, head dim, rotated dims): the 9B and 0.8B shapes, a 128-dim head,
    // a whole-head rotation.
    for (nh, nkv, hd, rot) in [(16, 4, 256, 64), (8, 2, 256, 64), (4, 2, 128, 32), (2, 1, 64, 64)] {
        let shape = format!("h{nh}/{nkv} d{hd} rot{rot} t5");
        match case(dev, (nh, nkv, hd), rot, &shape) {
            Ok(c) => out.extend(c),
            Err(e) => out.push(Check::error("attn_glue", shape, "f32", e)),
        }
    }
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        // Llama-3-8B's heads (whole-head rotation, no norms) and Qwen3's (with norms).
        for (nh, nkv, hd, norms) in [(32, 8, 128, false), (16, 8, 128, true), (4, 2, 64, false)] {
            let shape = format!("plain h{nh}/{nkv} d{hd}{} t5", if norms { " normed" } else { "" });
            match plain_case(dev, (nh, nkv, hd), norms, &shape) {
                Ok(c) => out.extend(c),
                Err(e) => out.push(Check::error("attn_glue plain", shape, "f32", e)),
            }
        }
    }
    out
}

/// `cuda::prep_plain` against the reference, and the last token alone against its rows of the
/// 5-token call.
#[cfg(feature = "cuda")]
fn plain_case(dev: &Device, (nh, nkv, hd): (usize, usize, usize), norms: bool, shape: &str) -> Result<Vec<Check>> {
    let t = 5;
    let mut rng = Rng((nh * 31 + hd) as u64 | 1);
    let (qw, kw) = (nh * hd, nkv * hd);
    let width = qw + 2 * kw + 1;
    let proj = rng.vec(t * width);
    let wq: Vec<f32> = rng.vec(hd).iter().map(|w| 1.0 + 0.5 * w).collect();
    let wk: Vec<f32> = rng.vec(hd).iter().map(|w| 1.0 + 0.5 * w).collect();
    let eps = 1e-6;
    let positions: Vec<usize> = (700..700 + t).collect();
    let rope = Rope::new(hd, 5e5, &RopeScaling::None, RopeStyle::Half, None);
    let part = |off: usize, w: usize| -> Vec<f32> {
        (0..t).flat_map(|i| proj[i * width + off..i * width + off + w].to_vec()).collect()
    };
    let (qs, ks, vs) = (part(0, qw), part(qw, kw), part(qw + kw, kw));
    let host_norms = norms.then_some((wq.as_slice(), wk.as_slice()));
    let want = reference_prep_rows(&qs, &ks, &vs, host_norms, false, eps, &positions, rope.inv_freq(), (nh, nkv, hd));
    let p = Tensor::from_vec(proj.clone(), (t, width), dev)?;
    let (wqd, wkd) = (Tensor::from_slice(&wq, hd, dev)?, Tensor::from_slice(&wk, hd, dev)?);
    let run = |rows: std::ops::Range<usize>| -> Result<(Tensor, Tensor, Tensor)> {
        let p = p.narrow(0, rows.start, rows.len())?;
        let (q, k, v) = (p.narrow(1, 0, qw)?, p.narrow(1, qw, kw)?, p.narrow(1, qw + kw, kw)?);
        let (cos, sin) = rope.tables(&positions[rows.clone()], dev)?;
        let dn = norms.then_some((&wqd, &wkd));
        crate::ops::attn_glue::cuda::prep_plain(&q, &k, &v, dn, eps, &cos, &sin, (nh, nkv, hd))
    };
    let ((q, k, v), ms) = timed(dev, || run(0..t))?;
    let mut checks = Vec::new();
    for (name, got, want) in
        [("attn_glue plain q", &q, &want[0]), ("attn_glue plain k", &k, &want[1]), ("attn_glue plain v", &v, &want[2])]
    {
        let err = rel_err_slices(&host_f32(got)?, want);
        checks.push(Check::new(name, shape.into(), "f32", err, Judge::Tolerance(1e-5), ms));
    }
    let (q1, k1, v1) = run(t - 1..t)?;
    let last = |x: &Tensor| x.narrow(1, t - 1, 1);
    let err = [bits_err(&last(&q)?, &q1)?, bits_err(&last(&k)?, &k1)?, bits_err(&last(&v)?, &v1)?]
        .into_iter()
        .fold(0f32, f32::max);
    checks.push(Check::new("attn_glue plain rows", shape.into(), "f32", err, Judge::Exact, 0.0));
    Ok(checks)
}

fn case(dev: &Device, (nh, nkv, hd): (usize, usize, usize), rot: usize, shape: &str) -> Result<Vec<Check>> {
    let t = 5;
    let mut rng = Rng((nh * 131 + hd + rot) as u64 | 1);
    // The fused projection's output with one spare column, so each part is a strided view.
    let (qw, kw) = (2 * nh * hd, nkv * hd);
    let width = qw + 2 * kw + 1;
    let proj = rng.vec(t * width);
    let wq: Vec<f32> = rng.vec(hd).iter().map(|w| 1.0 + 0.5 * w).collect();
    let wk: Vec<f32> = rng.vec(hd).iter().map(|w| 1.0 + 0.5 * w).collect();
    let att = rng.vec(nh * t * hd);
    let eps = 1e-6;
    let positions: Vec<usize> = (300..300 + t).collect();
    let rope = Rope::new(rot, 1e7, &RopeScaling::None, RopeStyle::Half, None);

    let part = |off: usize, w: usize| -> Vec<f32> {
        (0..t).flat_map(|i| proj[i * width + off..i * width + off + w].to_vec()).collect()
    };
    let (qs, ks, vs) = (part(0, qw), part(qw, kw), part(qw + kw, kw));
    let norms = Some((wq.as_slice(), wk.as_slice()));
    let want = reference_prep_rows(&qs, &ks, &vs, norms, true, eps, &positions, rope.inv_freq(), (nh, nkv, hd));
    let mut want_gate = Vec::with_capacity(t * nh * hd);
    for i in 0..t {
        let a: Vec<f32> = (0..nh).flat_map(|h| att[(h * t + i) * hd..(h * t + i + 1) * hd].to_vec()).collect();
        want_gate.extend(reference_gate(&a, &qs[i * qw..(i + 1) * qw], nh, hd));
    }

    let p = Tensor::from_vec(proj.clone(), (t, width), dev)?;
    let (wqd, wkd) = (Tensor::from_slice(&wq, hd, dev)?, Tensor::from_slice(&wk, hd, dev)?);
    let attd = Tensor::from_vec(att, (nh, t, hd), dev)?;
    let run = |rows: std::ops::Range<usize>| -> Result<(Tensor, Tensor, Tensor, Tensor)> {
        let p = p.narrow(0, rows.start, rows.len())?;
        let (qg, k, v) = (p.narrow(1, 0, qw)?, p.narrow(1, qw, kw)?, p.narrow(1, qw + kw, kw)?);
        let tables = rope.tables(&positions[rows.clone()], dev)?;
        let (q, k, v) = prep(&qg, &k, &v, &wqd, &wkd, eps, &rope, &tables, (nh, nkv, hd))?;
        let g = gate(&attd.narrow(1, rows.start, rows.len())?.contiguous()?, &qg, nh, hd)?;
        Ok((q, k, v, g))
    };
    let ((q, k, v, g), ms) = timed(dev, || run(0..t))?;
    let mut checks = Vec::new();
    for (name, got, want) in
        [("attn_glue q", &q, &want[0]), ("attn_glue k", &k, &want[1]), ("attn_glue v", &v, &want[2])]
    {
        let err = rel_err_slices(&host_f32(got)?, want);
        checks.push(Check::new(name, shape.into(), "f32", err, Judge::Tolerance(1e-5), ms));
    }
    let err = rel_err_slices(&host_f32(&g)?, &want_gate);
    checks.push(Check::new("attn_glue gate", shape.into(), "f32", err, Judge::Tolerance(1e-5), 0.0));
    // The last token alone against its rows of the 5-token call.
    let (q1, k1, v1, g1) = run(t - 1..t)?;
    let last = |x: &Tensor| x.narrow(1, t - 1, 1);
    let same = [
        bits_err(&last(&q)?, &q1)?,
        bits_err(&last(&k)?, &k1)?,
        bits_err(&last(&v)?, &v1)?,
        bits_err(&g.narrow(0, t - 1, 1)?, &g1)?,
    ];
    let err = same.into_iter().fold(0f32, f32::max);
    checks.push(Check::new("attn_glue rows", shape.into(), "f32", err, Judge::Exact, 0.0));
    Ok(checks)
}
