//! The rotary embedding check: [`Rope::apply`] on the device (candle's rope kernels, with the
//! pass-through half of a partial rotation concatenated) against [`rope_reference`] per head
//! vector, both pairing styles, whole-head and partial (Qwen3.5's 64 of 256) rotations; and
//! row invariance: a position rotated inside a 7-row call has the bits of the same position
//! rotated alone.

use candle_core::{Device, Tensor};

use super::{bits_err, host_f32, rel_err_slices, timed, Check, Judge, Rng};
use crate::config::{RopeScaling, RopeStyle};
use crate::error::Result;
use crate::ops::rope::{rope_reference, Rope};

pub fn run(dev: &Device) -> Vec<Check> {
    let mut out = Vec::new();
    // (heads, head dim, rotated dims, rows, first position)
    for (heads, hd, rot, t, p0) in [(8, 128, 128, 7, 0), (4, 256, 64, 7, 1000), (2, 64, 32, 7, 37)] {
        for style in [RopeStyle::Half, RopeStyle::Interleaved] {
            let shape = format!("h{heads} d{hd} rot{rot} t{t} @{p0}");
            let fmt = format!("{style:?}").to_lowercase();
            match case(dev, heads, hd, rot, t, p0, style, &shape, &fmt) {
                Ok(c) => out.extend(c),
                Err(e) => out.push(Check::error("rope", shape, &fmt, e)),
            }
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn case(
    dev: &Device,
    heads: usize,
    hd: usize,
    rot: usize,
    t: usize,
    p0: usize,
    style: RopeStyle,
    shape: &str,
    fmt: &str,
) -> Result<Vec<Check>> {
    let mut rng = Rng((hd * 31 + rot + p0) as u64 | 1);
    let x = rng.vec(heads * t * hd);
    let rope = Rope::new(rot, 1e6, &RopeScaling::None, style, None);
    let positions: Vec<usize> = (p0..p0 + t).collect();
    let mut want = Vec::with_capacity(x.len());
    for h in 0..heads {
        for (i, &p) in positions.iter().enumerate() {
            let v = &x[(h * t + i) * hd..(h * t + i + 1) * hd];
            let mut r = rope_reference(&v[..rot], p, rope.inv_freq(), style);
            r.extend_from_slice(&v[rot..]);
            want.extend(r);
        }
    }
    let tx = Tensor::from_slice(&x, (1, heads, t, hd), dev)?;
    let (got, ms) = timed(dev, || {
        let (c, s) = rope.tables(&positions, dev)?;
        rope.apply(&tx, &c, &s)
    })?;
    let mut checks = vec![Check::new(
        "rope",
        shape.into(),
        fmt,
        rel_err_slices(&host_f32(&got)?, &want),
        Judge::Tolerance(1e-5),
        ms,
    )];
    // The last position alone, against its row of the 7-row call.
    let last = t - 1;
    let (c, s) = rope.tables(&positions[last..], dev)?;
    let alone = rope.apply(&tx.narrow(2, last, 1)?.contiguous()?, &c, &s)?;
    let inside = got.narrow(2, last, 1)?.contiguous()?;
    checks.push(Check::new("rope rows", shape.into(), fmt, bits_err(&inside, &alone)?, Judge::Exact, 0.0));
    Ok(checks)
}
