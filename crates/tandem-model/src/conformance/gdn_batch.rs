//! The batched GDN step check (CUDA): one [`gdn::cuda_batch::step_batch`] over sequences of
//! different lengths, each from its own state, against the same sequences one at a time
//! through the one-sequence ops (conv, then [`gdn::device::step`]). Bit equality for the
//! output, every next state and every verify lane: batching decode and verify sequences must
//! not change a single bit (batch invariance). Other devices have no batched step: no rows.

use candle_core::Device;

use super::Check;

pub fn run(dev: &Device) -> Vec<Check> {
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        return cuda::run(dev);
    }
    let _ = dev;
    Vec::new()
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::{Device, Tensor};

    use super::super::{bits_err, timed, Check, Judge, Rng};
    use crate::error::Result;
    use crate::ops::gdn::cuda_batch::{step_batch, BatchSeq};
    use crate::ops::gdn::device::{conv_silu, step, StepTensors};
    use crate::ops::gdn::GdnDims;

    pub fn run(dev: &Device) -> Vec<Check> {
        let cases: [(GdnDims, &[usize], bool); 4] = [
            (GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 }, &[1, 3, 2, 1], true),
            (GdnDims { nk: 2, nv: 4, dk: 16, dv: 24 }, &[1, 1, 1], false),
            (GdnDims { nk: 16, nv: 32, dk: 128, dv: 128 }, &[1, 1, 1, 1, 1, 1, 1, 1], false),
            (GdnDims { nk: 16, nv: 32, dk: 128, dv: 128 }, &[5, 5, 2], true),
        ];
        let mut out = Vec::new();
        for (d, lens, lanes) in cases {
            let shape =
                format!("k{}x{} v{}x{} t{:?}{}", d.nk, d.dk, d.nv, d.dv, lens, if lanes { " lanes" } else { "" });
            match case(dev, d, lens, lanes, &shape) {
                Ok(c) => out.push(c),
                Err(e) => out.push(Check::error("gdn_step batch", shape, "f32", e)),
            }
        }
        out
    }

    fn case(dev: &Device, d: GdnDims, lens: &[usize], lanes: bool, shape: &str) -> Result<Check> {
        let kernel = 4;
        let mut rng = Rng((d.dk * 31 + lens.len() * 7) as u64 | 1);
        let ch = 2 * d.nk * d.dk + d.nv * d.dv;
        let total: usize = lens.iter().sum();
        let t2 = |v: Vec<f32>, r: usize, c: usize| Tensor::from_vec(v, (r, c), dev);
        let x = t2(rng.vec(total * ch), total, ch)?;
        let z = t2(rng.vec(total * d.nv * d.dv), total, d.nv * d.dv)?;
        let b = t2(rng.vec(total * d.nv), total, d.nv)?;
        let a = t2(rng.vec(total * d.nv).iter().map(|v| 12.0 * v + 8.0).collect(), total, d.nv)?;
        let conv_w = t2(rng.vec(ch * kernel).iter().map(|v| 0.5 * v).collect(), ch, kernel)?;
        let dt_bias = Tensor::from_vec(rng.vec(d.nv).iter().map(|v| 0.5 * v).collect(), d.nv, dev)?;
        let neg_a = Tensor::from_vec(rng.vec(d.nv).iter().map(|v| -0.05 * (v + 1.5)).collect(), d.nv, dev)?;
        let norm_w = Tensor::from_vec(rng.vec(d.dv).iter().map(|v| 1.0 + 0.2 * v).collect(), d.dv, dev)?;
        let p = StepTensors {
            dt_bias: &dt_bias,
            neg_a: &neg_a,
            norm_w: &norm_w,
            scale: (d.dk as f32).powf(-0.5),
            eps: 1e-6,
        };
        let states = lens
            .iter()
            .map(|_| {
                Ok((
                    t2(rng.vec((kernel - 1) * ch), kernel - 1, ch)?,
                    Tensor::from_vec(rng.vec(d.state_len()).iter().map(|v| 0.1 * v).collect(), d.state_len(), dev)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let seqs: Vec<BatchSeq<'_>> =
            lens.iter().zip(&states).map(|(&len, (conv, ssm))| BatchSeq { len, conv, ssm }).collect();
        let (r, ms) = timed(dev, || step_batch(&x, &z, &b, &a, &seqs, &conv_w, &p, d, lanes))?;
        let mut err = 0f32;
        let mut off = 0;
        for (i, (&t, (conv, ssm))) in lens.iter().zip(&states).enumerate() {
            let rows = |m: &Tensor| m.narrow(0, off, t);
            let (u, conv_next, conv_lanes) = conv_silu(&rows(&x)?, conv, &conv_w, lanes)?;
            let (o, ssm_next, ssm_lanes) = step(&u, &rows(&z)?, &rows(&b)?, &rows(&a)?, ssm, &p, d, lanes)?;
            err = err.max(bits_err(&r.o.narrow(0, off, t)?, &o)?);
            err = err.max(bits_err(&r.conv.get(i)?, &conv_next)?);
            err = err.max(bits_err(&r.ssm.get(i)?, &ssm_next)?);
            if let (Some(want_c), Some(want_s), Some(got_c), Some(got_s)) =
                (conv_lanes, ssm_lanes, &r.conv_lanes, &r.ssm_lanes)
            {
                err = err.max(bits_err(&got_c.narrow(0, off, t)?, &want_c)?);
                err = err.max(bits_err(&got_s.narrow(0, off, t)?, &want_s)?);
            } else if lanes {
                err = f32::INFINITY;
            }
            off += t;
        }
        Ok(Check::new("gdn_step batch", shape.into(), "f32", err, Judge::Exact, ms))
    }
}
