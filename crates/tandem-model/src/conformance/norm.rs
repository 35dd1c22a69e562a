//! The layer-glue checks (`ops::norm`): RMSNorm, the residual add fused with it and SiLU(gate)
//! x up on the device against candle's ops on the CPU (the eager path the kernels replace), and
//! row invariance of the norm (a row inside a batch has the bits of the row alone).

use candle_core::{Device, Tensor};

use super::{bits_err, rel_err, timed, Check, Judge, Rng};
use crate::error::Result;
use crate::ops::norm::{add_rms_norm, rms_norm, silu_mul};

pub fn run(dev: &Device) -> Vec<Check> {
    let mut out = Vec::new();
    for (rows, n) in [(1, 4096), (7, 4096), (16, 256), (5, 1000), (3, 64)] {
        let shape = format!("rows {rows} x {n}");
        match case(dev, rows, n, &shape) {
            Ok(c) => out.extend(c),
            Err(e) => out.push(Check::error("rms_norm", shape, "f32", e)),
        }
    }
    out
}

fn case(dev: &Device, rows: usize, n: usize, shape: &str) -> Result<Vec<Check>> {
    let mut rng = Rng(rows as u64 * 31 + n as u64);
    let cpu = Device::Cpu;
    let x = Tensor::from_vec(rng.vec(rows * n), (rows, n), &cpu)?;
    let d = Tensor::from_vec(rng.vec(rows * n), (rows, n), &cpu)?;
    let w = Tensor::from_vec(rng.vec(n), n, &cpu)?;
    let gu = Tensor::from_vec(rng.vec(rows * 2 * n), (rows, 2 * n), &cpu)?;
    let eps = 1e-6;
    let (xd, dd, wd, gud) = (x.to_device(dev)?, d.to_device(dev)?, w.to_device(dev)?, gu.to_device(dev)?);
    let want_h = candle_nn::ops::rms_norm(&x, &w, eps)?;
    let (got_h, ms) = timed(dev, || rms_norm(&xd, &wd, eps))?;
    let mut checks =
        vec![Check::new("rms_norm", shape.into(), "f32", rel_err(&got_h, &want_h)?, Judge::Tolerance(1e-5), ms)];
    let want_s = (&x + &d)?;
    let want_h = candle_nn::ops::rms_norm(&want_s, &w, eps)?;
    let ((got_s, got_h), ms) = timed(dev, || add_rms_norm(&xd, &dd, &wd, eps))?;
    checks.push(Check::new("add_rms_norm sum", shape.into(), "f32", bits_err(&got_s, &want_s)?, Judge::Exact, ms));
    checks.push(Check::new(
        "add_rms_norm",
        shape.into(),
        "f32",
        rel_err(&got_h, &want_h)?,
        Judge::Tolerance(1e-5),
        0.0,
    ));
    if rows > 1 {
        let r = rows / 2;
        let alone = rms_norm(&xd.narrow(0, r, 1)?, &wd, eps)?;
        let inside = rms_norm(&xd, &wd, eps)?.narrow(0, r, 1)?;
        checks.push(Check::new(
            "rms_norm row alone vs in batch",
            shape.into(),
            "f32",
            bits_err(&inside, &alone)?,
            Judge::Exact,
            0.0,
        ));
    }
    // The halves of a fused [gate | up] output: row views with a stride of 2n.
    let want = (candle_nn::ops::silu(&gu.narrow(1, 0, n)?)? * gu.narrow(1, n, n)?)?;
    let (got, ms) = timed(dev, || silu_mul(&gud.narrow(1, 0, n)?, &gud.narrow(1, n, n)?))?;
    checks.push(Check::new(
        "silu_mul (row views)",
        shape.into(),
        "f32",
        rel_err(&got, &want)?,
        Judge::Tolerance(1e-6),
        ms,
    ));
    Ok(checks)
}
