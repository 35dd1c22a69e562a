//! The fused-projection check: projections of one input run as one matmul
//! ([`crate::loader::LinearSet`]: one weight buffer and one launch on CUDA) give each output
//! column the bits the projection's own matmul gives it, for decode (one row), small calls
//! and prefill, in the weight formats models use. Where nothing fuses (the CPU), one row says
//! so and the rest compare the unfused set with the separate layers.
//!
//! The gated down projection ([`Linear::forward_silu_mul`]: on CUDA the activation quantiser
//! of Q8_0 and K-quant weights forms `silu(g) ⊙ u` as it reads it; bf16 weights take the two
//! steps) must give the bits of `silu_mul` followed by the matmul, for the halves of a fused
//! `[gate | up]` output (row views) and for separate tensors, at every row count.

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
    for (fmt, q, dense) in [
        ("bf16", None, DType::BF16),
        ("q8_0", Some(GgmlDType::Q8_0), DType::F32),
        ("q4_k", Some(GgmlDType::Q4K), DType::F32),
        ("q6_k", Some(GgmlDType::Q6K), DType::F32),
    ] {
        match gated(dev, q, dense, fmt) {
            Ok(c) => out.extend(c),
            Err(e) => out.push(Check::error("gated down projection", format!("k{K}"), fmt, e)),
        }
    }
    out
}

/// Whether the one-launch gated path is on (`TANDEM_GATED_GEMV`; CUDA builds only).
fn gated_on() -> bool {
    #[cfg(feature = "cuda")]
    return crate::ops::quant::cuda_quant::gated_enabled();
    #[cfg(not(feature = "cuda"))]
    false
}

/// Inner size of the gated check: 4,096 values (128 Q8_0 blocks, 16 K-quant superblocks).
const GK: usize = 4096;

/// `forward_silu_mul(g, u)` against `forward(silu_mul(g, u))`, bit for bit: `g` and `u` as the
/// halves of one `[gate | up]` output (the same row stride), as separate tensors, and `g` a
/// view with `u` separate (different strides); gate values up to +-120 (silu's tails, `expf`
/// overflowing to infinity) and exact zeros.
fn gated(dev: &Device, q: Option<GgmlDType>, dense: DType, fmt: &str) -> Result<Vec<Check>> {
    let mut rng = Rng(q.map_or(5, |q| q as u64 + 29));
    let down = part_k(&mut rng, dev, q, dense, 64, GK)?;
    let gu: Vec<f32> = (0..40 * 2 * GK)
        .map(|i| match (i / GK % 2, i % 97) {
            (0, 0) => 0.0,
            (0, j) if j % 13 == 0 => rng.next_f32() * 120.0,
            (0, _) => rng.next_f32() * 6.0,
            _ => rng.next_f32(),
        })
        .collect();
    let gu = Tensor::from_vec(gu, (40, 2 * GK), &Device::Cpu)?.to_device(dev)?;
    let LinearWeight::Candle(w) = &down.weight else { return Ok(Vec::new()) };
    let mut checks = Vec::new();
    for m in [1, 3, 8, 9, 16, 17, 40] {
        let rows = gu.narrow(0, 0, m)?;
        let (g, u) = (rows.narrow(1, 0, GK)?, rows.narrow(1, GK, GK)?);
        let (gc, uc) = (g.contiguous()?, u.contiguous()?);
        let want = down.forward(&crate::ops::norm::silu_mul(&g, &u)?)?;
        let mut worst = 0f32;
        let mut fused = 0;
        for (gi, ui) in [(&g, &u), (&gc, &uc), (&g, &uc)] {
            worst = worst.max(bits_err(&down.forward_silu_mul(gi, ui)?, &want)?);
            fused += usize::from(crate::ops::quant::row_stable::forward_gated(w, gi, ui)?.is_some());
        }
        let note = format!("{fused} of 3 layouts in one launch");
        checks.push(
            Check::new("gated down projection", format!("k{GK} n64 m{m}"), fmt, worst, Judge::Exact, 0.0)
                .with_note(note),
        );
        // On CUDA with the fused path on (the default; TANDEM_GATED_GEMV=0 turns it off),
        // quantised calls of any size must take the one launch in every layout.
        if dev.is_cuda() && q.is_some() && fused < 3 && gated_on() {
            checks.push(Check::new("gated down projection: one launch", format!("m{m}"), fmt, 1.0, Judge::Exact, 0.0));
        }
    }
    Ok(checks)
}

fn part(rng: &mut Rng, dev: &Device, q: Option<GgmlDType>, dense: DType, n: usize) -> Result<Linear> {
    part_k(rng, dev, q, dense, n, K)
}

fn part_k(rng: &mut Rng, dev: &Device, q: Option<GgmlDType>, dense: DType, n: usize, k: usize) -> Result<Linear> {
    let w = Tensor::from_vec(rng.vec(n * k), (n, k), &Device::Cpu)?;
    let weight = match q {
        Some(q) => {
            let qt = QTensor::quantize(&w, q)?;
            let storage = QStorage::from_data(qt.data()?, dev, q)?;
            QMatMul::QTensor(std::sync::Arc::new(QTensor::new(storage, (n, k))?))
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
