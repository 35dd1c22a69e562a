//! The fused-projection check: projections of one input run as one matmul
//! ([`crate::loader::LinearSet`]: one weight buffer and one launch on CUDA) give each output
//! column the bits the projection's own matmul gives it, for decode (one row), small calls
//! and prefill, in the weight formats models use. Where nothing fuses (the CPU), one row says
//! so and the rest compare the unfused set with the separate layers.

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};

use super::{bits_err, Check, Judge, Rng};
use crate::error::Result;
use crate::loader::{Linear, LinearSet, LinearWeight};

const K: usize = 512;
/// Output widths of the parts: like `[qkv | z | b | a]`, two narrow ones at the end.
const WIDTHS: [usize; 4] = [96, 64, 8, 8];

pub fn run(dev: &Device) -> Vec<Check> {
    let mut out = Vec::new();
    for (fmt, q, dense) in [
        ("q8_0", Some(GgmlDType::Q8_0), DType::F32),
        ("q4_k", Some(GgmlDType::Q4K), DType::F32),
        ("q6_k", Some(GgmlDType::Q6K), DType::F32),
        ("bf16", None, DType::BF16),
        ("f32", None, DType::F32),
    ] {
        let shape = format!("k{K} parts {WIDTHS:?}");
        match case(dev, q, dense, &shape, fmt) {
            Ok(c) => out.extend(c),
            Err(e) => out.push(Check::error("fused projections", shape, fmt, e)),
        }
    }
    out
}

fn part(rng: &mut Rng, dev: &Device, q: Option<GgmlDType>, dense: DType, n: usize) -> Result<Linear> {
    let w = Tensor::from_vec(rng.vec(n * K), (n, K), &Device::Cpu)?;
    let weight = match q {
        Some(q) => {
            let qt = QTensor::quantize(&w, q)?;
            let storage = QStorage::from_data(qt.data()?, dev, q)?;
            QMatMul::QTensor(std::sync::Arc::new(QTensor::new(storage, (n, K))?))
        }
        None => QMatMul::Tensor(w.to_dtype(dense)?.to_device(dev)?),
    };
    Ok(Linear { weight: LinearWeight::Candle(weight), bias: None })
}

fn case(dev: &Device, q: Option<GgmlDType>, dense: DType, shape: &str, fmt: &str) -> Result<Vec<Check>> {
    let mut rng = Rng(q.map_or(3, |q| q as u64 + 11));
    let parts: Vec<Linear> = WIDTHS.iter().map(|&n| part(&mut rng, dev, q, dense, n)).collect::<Result<_>>()?;
    // The same weights again, for the separate matmuls (the set takes its parts).
    let mut rng = Rng(q.map_or(3, |q| q as u64 + 11));
    let alone: Vec<Linear> = WIDTHS.iter().map(|&n| part(&mut rng, dev, q, dense, n)).collect::<Result<_>>()?;
    let set = LinearSet::new(parts)?;
    let mut checks = Vec::new();
    if dev.is_cuda() {
        let fused = if set.is_fused() { 0.0 } else { 1.0 };
        checks.push(Check::new("fused projections: one launch", shape.into(), fmt, fused, Judge::Exact, 0.0));
    } else {
        checks.push(
            Check::new("fused projections: one launch", shape.into(), fmt, 0.0, Judge::Info, 0.0)
                .with_note(if set.is_fused() { "fused" } else { "not fused on this device" }),
        );
    }
    let x = Tensor::from_vec(rng.vec(40 * K), (40, K), &Device::Cpu)?.to_device(dev)?;
    for m in [1, 5, 40] {
        let xm = x.narrow(0, 0, m)?;
        let got = set.forward(&xm)?;
        let mut worst = 0f32;
        for (g, l) in got.iter().zip(&alone) {
            worst = worst.max(bits_err(g, &l.forward(&xm)?)?);
        }
        checks.push(Check::new(
            "fused projections vs separate",
            format!("{shape} m{m}"),
            fmt,
            worst,
            Judge::Exact,
            0.0,
        ));
    }
    Ok(checks)
}
