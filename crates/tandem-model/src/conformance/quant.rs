//! Quantised weights on a device against the CPU: every GGML type's matmul (relative error
//! against the f64 product of the dequantised weights; rows of a call against the same rows
//! alone, bit for bit; on CUDA the K-quant chain against `kq_chain` and both prefill GEMM
//! tiles) and the quantised token-embedding lookup. Part of `ops/quantised` and
//! `ops/embedding` in check-device's groups.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};

use super::ops::{push, tensor};
use super::{bits_err, rel_err, timed, Check, Judge, Rng};
use crate::error::Result;
use crate::ops::quant::row_stable;

const QTYPES: [GgmlDType; 10] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q8_0,
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

pub(super) fn quantised(dev: &Device, out: &mut Vec<Check>) {
    for q in QTYPES {
        // k = 2304 (nine superblocks) and 5120 (the 27B shape's rows): Q6_K rows that start
        // off a 16-byte boundary.
        for (n, k) in [(512, 1024), (37, 2304), (100, 4096), (24, 5120)] {
            let shape = format!("n{n} k{k}");
            let fmt = format!("{q:?}").to_lowercase();
            push(out, "quant_matmul", shape.clone(), &fmt, quant_case(dev, q, n, k, &shape, &fmt));
        }
    }
}

/// Whether `q` runs on tandem's own row-invariant kernel on `dev` (exact weights, f32
/// activations) rather than candle's (8-bit activations, row-count dependent on CUDA).
fn own_quant_kernel(dev: &Device, q: GgmlDType) -> bool {
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        return crate::ops::quant::cuda_quant::WeightFormat::of_ggml(q).is_some();
    }
    let _ = (dev, q);
    false
}

/// Whether `q` rows of `k` values run on kernels with 8-bit activations on `dev` (the
/// tensor-core Q8_0 kernels, the K-quant GEMV / mma ones): the tolerance of candle's kernels;
/// still row-invariant.
fn eight_bit_activations(dev: &Device, q: GgmlDType, k: usize) -> bool {
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        return (q == GgmlDType::Q8_0 && crate::ops::quant::cuda_qmma::enabled()) || kquant_chain(dev, q, k);
    }
    let _ = (dev, q, k);
    false
}

/// Whether `q` rows of `k` values take the K-quant kernels of `kqmma.cu` on `dev`, whose
/// chain `kq_chain` reproduces.
fn kquant_chain(dev: &Device, q: GgmlDType, k: usize) -> bool {
    #[cfg(feature = "cuda")]
    if dev.is_cuda() {
        use crate::ops::quant::{cuda_kqmma, cuda_quant::WeightFormat};
        // Device buffers are at least 256-byte aligned.
        return WeightFormat::of_ggml(q).is_some_and(|f| cuda_kqmma::takes(f, 256, k));
    }
    let _ = (dev, q, k);
    false
}

fn quant_case(dev: &Device, q: GgmlDType, n: usize, k: usize, shape: &str, fmt: &str) -> Result<Vec<Check>> {
    let mut rng = Rng(q as u64 + 5 + n as u64);
    let w = tensor(&mut rng, &[n, k], &Device::Cpu)?;
    let qt = QTensor::quantize(&w, q)?;
    let deq = qt.dequantize(&Device::Cpu)?;
    let on_dev = QMatMul::from_qtensor(QTensor::quantize(&w.to_device(dev)?, q).or_else(|_| {
        // Quantise on the CPU and move the blocks (devices without a quantiser).
        let data = qt.data()?;
        let storage = candle_core::quantized::QStorage::from_data(data, dev, q)?;
        QTensor::new(storage, (n, k))
    })?)?;
    // 100 rows: calls of 16+ rows take the tiled kernels on CUDA (K-quants: 64+ rows the
    // prefill GEMM, a full tile and a partial one), fewer the small-row ones.
    let x = tensor(&mut rng, &[100, k], &Device::Cpu)?;
    let want = x.to_dtype(DType::F64)?.matmul(&deq.to_dtype(DType::F64)?.t()?)?;
    let xd = x.to_device(dev)?;
    let (got, ms) = timed(dev, || Ok(row_stable::forward(&on_dev, &xd)?))?;
    // candle's kernels (the CPU's, and CUDA's for Q2_K / Q3_K) quantise activations to 8 bits;
    // ours decode the weights exactly and keep activations f32.
    let own = own_quant_kernel(dev, q);
    let tol = if own && !eight_bit_activations(dev, q, k) { 1e-4 } else { 2e-2 };
    let mut checks =
        vec![Check::new("quant_matmul", shape.into(), fmt, rel_err(&got, &want)?, Judge::Tolerance(tol), ms)];
    if kquant_chain(dev, q, k) {
        // The K-quant kernels against the plain reference of their chain (kq_chain), bit for
        // bit, on the same blocks.
        let data = qt.data()?;
        let storage = candle_core::quantized::QStorage::from_data(data.clone(), dev, q)?;
        let exact = QMatMul::from_qtensor(QTensor::new(storage, (n, k))?)?;
        let y = row_stable::forward(&exact, &xd)?;
        let xs = x.flatten_all()?.to_vec1::<f32>()?;
        let want = Tensor::from_vec(super::kq_chain::matmul(q, &data, n, k, &xs, 100)?, (100, n), &Device::Cpu)?;
        checks.push(Check::new("quant_matmul chain", shape.into(), fmt, bits_err(&y, &want)?, Judge::Exact, 0.0));
        // Both tiles of the prefill GEMM (kqgemm.cu), whichever the call's shape would get, on
        // 200 rows: a full 128-row tile and a partial one.
        #[cfg(feature = "cuda")]
        {
            let x2 = tensor(&mut rng, &[200, k], &Device::Cpu)?;
            let xs2 = x2.flatten_all()?.to_vec1::<f32>()?;
            let want2 = Tensor::from_vec(super::kq_chain::matmul(q, &data, n, k, &xs2, 200)?, (200, n), &Device::Cpu)?;
            let x2d = x2.to_device(dev)?;
            for tile in [64, 128] {
                let y2 = crate::ops::quant::gemm_tile::with_tile(tile, || row_stable::forward(&exact, &x2d))?;
                let name = format!("quant_matmul chain tile {tile}");
                checks.push(Check::new(&name, shape.into(), fmt, bits_err(&y2, &want2)?, Judge::Exact, 0.0));
            }
        }
    }
    #[cfg(feature = "cuda")]
    if dev.is_cuda() && q == GgmlDType::Q8_0 && crate::ops::quant::cuda_qmma::enabled() {
        // The Q8_0 prefill GEMM's two tiles (q8gemm.cu) on 200 rows (a full 128-row tile and a
        // partial one), whichever the shape would get: the same bits.
        use crate::ops::quant::gemm_tile::with_tile;
        let x2 = tensor(&mut rng, &[200, k], &Device::Cpu)?.to_device(dev)?;
        let y64 = with_tile(64, || row_stable::forward(&on_dev, &x2))?;
        let y128 = with_tile(128, || row_stable::forward(&on_dev, &x2))?;
        let y1 = row_stable::forward(&on_dev, &x2.narrow(0, 150, 1)?)?;
        let row = y128.narrow(0, 150, 1)?;
        for (name, a, b) in
            [("quant_matmul tile 64 vs 128", &y64, &y128), ("quant_matmul rows 1 vs 200 (tile 128)", &row, &y1)]
        {
            checks.push(Check::new(name, shape.into(), fmt, bits_err(a, b)?, Judge::Exact, 0.0));
        }
    }
    let last =
        |m: usize| -> Result<Tensor> { Ok(row_stable::forward(&on_dev, &xd.narrow(0, 0, m)?)?.narrow(0, m - 1, 1)?) };
    let alone = row_stable::forward(&on_dev, &xd.narrow(0, 4, 1)?)?;
    let in5 = last(5)?;
    let judge = if dev.is_cpu() || own { Judge::Exact } else { Judge::Info };
    // Calls of 2-8 rows (CUDA Q8_0: qmvm_q8_0 for k >= 2048, else qmv / the qmma tile; K-quants: the mma GEMV of
    // kqskinny.cu, 16 columns x 8 rows a tile) against the same rows alone.
    for m in [2, 3, 4, 8] {
        let alone_m = row_stable::forward(&on_dev, &xd.narrow(0, m - 1, 1)?)?;
        let name = format!("quant_matmul rows 1 vs {m}");
        checks.push(Check::new(&name, shape.into(), fmt, bits_err(&last(m)?, &alone_m)?, judge, 0.0));
    }
    checks.push(Check::new("quant_matmul rows 1 vs 5", shape.into(), fmt, bits_err(&in5, &alone)?, judge, 0.0));
    let in12 = row_stable::forward(&on_dev, &xd.narrow(0, 0, 12)?)?.narrow(0, 4, 1)?;
    checks.push(Check::new("quant_matmul rows 1 vs 12", shape.into(), fmt, bits_err(&in12, &alone)?, judge, 0.0));
    let in40 = row_stable::forward(&on_dev, &xd.narrow(0, 0, 40)?)?.narrow(0, 4, 1)?;
    checks.push(Check::new("quant_matmul rows 1 vs 40", shape.into(), fmt, bits_err(&in40, &alone)?, judge, 0.0));
    // The last row of the 100-row call (the partial tile) against the same row alone.
    let last_alone = row_stable::forward(&on_dev, &xd.narrow(0, 99, 1)?)?;
    let in100 = got.narrow(0, 99, 1)?;
    let name = "quant_matmul rows 1 vs 100";
    checks.push(Check::new(name, shape.into(), fmt, bits_err(&in100, &last_alone)?, judge, 0.0));
    // A row inside the first, full tile of the same call.
    let name = "quant_matmul rows 1 vs 100 (full tile)";
    checks.push(Check::new(name, shape.into(), fmt, bits_err(&got.narrow(0, 4, 1)?, &alone)?, judge, 0.0));
    Ok(checks)
}

/// Quantised token-embedding lookup (`Embedding::Quantized`: candle's embedding kernels) on
/// the device vs the CPU's dequantised rows, every type, ids repeated and at both ends.
pub(super) fn embedding(dev: &Device, out: &mut Vec<Check>) {
    for q in QTYPES {
        let fmt = format!("{q:?}").to_lowercase();
        let shape = "vocab 300 x 512, 6 ids".to_string();
        let r = (|| -> Result<Vec<Check>> {
            let mut rng = Rng(q as u64 + 77);
            let w = tensor(&mut rng, &[300, 512], &Device::Cpu)?;
            let qt = QTensor::quantize(&w, q)?;
            let ids = [7u32, 299, 0, 150, 7, 42];
            let deq = qt.dequantize(&Device::Cpu)?;
            let want = deq.index_select(&Tensor::new(&ids[..], &Device::Cpu)?, 0)?;
            let storage = candle_core::quantized::QStorage::from_data(qt.data()?, dev, q)?;
            let table = crate::loader::Embedding::Quantized(std::sync::Arc::new(QTensor::new(storage, (300, 512))?));
            let idt = Tensor::new(&ids[..], dev)?;
            let (got, ms) = timed(dev, || table.forward(&idt))?;
            Ok(vec![Check::new(
                "quant_embedding",
                shape.clone(),
                &fmt,
                rel_err(&got, &want)?,
                Judge::Tolerance(1e-6),
                ms,
            )])
        })();
        push(out, "quant_embedding", shape, &fmt, r);
    }
}
