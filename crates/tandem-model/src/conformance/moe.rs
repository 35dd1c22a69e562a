//! The routed-experts check: the device's MoE kernels (routing, slots sorted by expert, the
//! grouped gate/up and down matmuls, the weighted sum) against [`crate::ops::moe::reference`]
//! on the dequantised weights, for dense (fused gate/up) and quantised stacks, plus row
//! invariance (a token routed alone has the bits it gets among others). Devices without MoE
//! kernels (the CPU, Metal) run the per-expert path instead; they get no rows here.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{Device, Tensor};

use super::{bits_err, rel_err, timed, Check, Judge, Rng};
use crate::error::Result;
use crate::ops::moe::{reference, ExpertStack, RoutedExperts, StackData};

const EXPERTS: usize = 16;
const TOP_K: usize = 4;
const HIDDEN: usize = 512;
const INTER: usize = 256;

pub fn run(dev: &Device) -> Vec<Check> {
    let mut out = Vec::new();
    for (fmt, q) in [("f32 fused", None), ("q8_0", Some(GgmlDType::Q8_0)), ("q4_k", Some(GgmlDType::Q4K))] {
        for m in [7, 40] {
            let shape = format!("E{EXPERTS} top{TOP_K} h{HIDDEN} i{INTER} m{m}");
            match case(dev, q, m, &shape, fmt) {
                Ok(Some(c)) => out.extend(c),
                Ok(None) => return out,
                Err(e) => out.push(Check::error("moe", shape, fmt, e)),
            }
        }
    }
    out
}

/// A stack of `EXPERTS` matrices `[rows, k]` on `dev`, and each expert's dequantised values.
fn stack(
    rng: &mut Rng,
    dev: &Device,
    q: Option<GgmlDType>,
    rows: usize,
    k: usize,
) -> Result<(StackData, Vec<Vec<f32>>)> {
    let w = Tensor::from_vec(rng.vec(EXPERTS * rows * k), (EXPERTS * rows, k), &Device::Cpu)?;
    let (data, deq) = match q {
        None => (StackData::Dense(w.reshape((EXPERTS, rows, k))?.to_device(dev)?), w),
        Some(q) => {
            let qt = QTensor::quantize(&w, q)?;
            let deq = qt.dequantize(&Device::Cpu)?;
            let storage = QStorage::from_data(qt.data()?, dev, q)?;
            (StackData::Quant(Arc::new(QTensor::new(storage, (EXPERTS * rows, k))?)), deq)
        }
    };
    let deq = deq.reshape((EXPERTS, rows * k))?.to_vec2::<f32>()?;
    Ok((data, deq))
}

fn case(dev: &Device, q: Option<GgmlDType>, m: usize, shape: &str, fmt: &str) -> Result<Option<Vec<Check>>> {
    let mut rng = Rng(m as u64 * 7 + q.map_or(1, |q| q as u64 + 2));
    let (gate, up, gate_w, up_w) = if q.is_none() {
        // One fused [E, 2I, H] tensor: gate rows first, up rows at an offset of I.
        let (gu, deq) = stack(&mut rng, dev, None, 2 * INTER, HIDDEN)?;
        let (g, u): (Vec<_>, Vec<_>) =
            deq.into_iter().map(|e| (e[..INTER * HIDDEN].to_vec(), e[INTER * HIDDEN..].to_vec())).unzip();
        (
            ExpertStack::new(gu.clone(), EXPERTS, 2 * INTER, 0, INTER, HIDDEN)?,
            ExpertStack::new(gu, EXPERTS, 2 * INTER, INTER, INTER, HIDDEN)?,
            g,
            u,
        )
    } else {
        let (g, gw) = stack(&mut rng, dev, q, INTER, HIDDEN)?;
        let (u, uw) = stack(&mut rng, dev, q, INTER, HIDDEN)?;
        (
            ExpertStack::new(g, EXPERTS, INTER, 0, INTER, HIDDEN)?,
            ExpertStack::new(u, EXPERTS, INTER, 0, INTER, HIDDEN)?,
            gw,
            uw,
        )
    };
    let (down, down_w) = stack(&mut rng, dev, q, HIDDEN, INTER)?;
    let down = ExpertStack::new(down, EXPERTS, HIDDEN, 0, HIDDEN, INTER)?;
    let routed = RoutedExperts::new(gate, up, down, TOP_K, true)?;
    if !routed.supported() {
        return Ok(None);
    }
    let x: Vec<f32> = rng.vec(m * HIDDEN);
    let logits: Vec<f32> = rng.vec(m * EXPERTS).into_iter().map(|v| v * 3.0).collect();
    let ex = reference::Experts { gate: &gate_w, up: &up_w, down: &down_w, hidden: HIDDEN, inter: INTER };
    let want = Tensor::from_vec(reference::forward(&ex, &x, &logits, m, TOP_K, true), (m, HIDDEN), &Device::Cpu)?;
    let xd = Tensor::from_vec(x, (m, HIDDEN), dev)?;
    let ld = Tensor::from_vec(logits, (m, EXPERTS), dev)?;
    let (got, ms) = timed(dev, || routed.forward(&xd, &ld))?;
    let mut checks = vec![Check::new("moe", shape.into(), fmt, rel_err(&got, &want)?, Judge::Tolerance(1e-4), ms)];
    let r = m / 2;
    let alone = routed.forward(&xd.narrow(0, r, 1)?, &ld.narrow(0, r, 1)?)?;
    checks.push(Check::new("moe rows", shape.into(), fmt, bits_err(&got.narrow(0, r, 1)?, &alone)?, Judge::Exact, 0.0));
    Ok(Some(checks))
}
