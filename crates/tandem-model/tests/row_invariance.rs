//! Row invariance of the linear layers: a row of `x · Wᵀ` must have the same bits whether it
//! is computed alone (a decode step) or as one of `m` rows (a speculative verify chunk, a
//! ragged batch, a prefill chunk). Speculative decoding is only lossless if it is: a verify
//! chunk's logits (and the KV it writes) must equal what plain decoding computes one token at a
//! time, or a near-tie between two tokens can go the other way.
//!
//! Every quantised type a GGUF can hand us is checked on synthetic weights, through the same
//! [`Linear`] the models use, with the thread pool as configured (the CLI's `-t`).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Tensor};
use tandem_model::loader::{Linear, LinearWeight};
use tandem_model::ops::quant::{GgmlMatrix, KQuantMatrix};

/// Deterministic values roughly like hidden states: mostly small, a few large.
fn values(seed: u64, len: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if i % 97 == 0 {
                u * 8.0
            } else {
                u
            }
        })
        .collect()
}

/// The linear layer candle or our kernels build for `dtype` from random `[n, k]` weights.
fn linear(dtype: GgmlDType, n: usize, k: usize) -> Linear {
    let w = Tensor::from_vec(values(n as u64 * 31 + k as u64, n * k), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, dtype).unwrap();
    let weight = match GgmlMatrix::from_qtensor(&q).unwrap() {
        Some(g) => LinearWeight::Ggml(std::sync::Arc::new(g)),
        None => LinearWeight::Candle(QMatMul::from_qtensor(q).unwrap()),
    };
    let bias = Tensor::from_vec(values(7, n), n, &Device::Cpu).unwrap();
    Linear { weight, bias: Some(bias) }
}

fn bits(t: &Tensor) -> Vec<Vec<u32>> {
    t.to_vec2::<f32>().unwrap().into_iter().map(|r| r.into_iter().map(f32::to_bits).collect()).collect()
}

/// Row `i` of every `m`-row call equals row `i` computed alone, bit for bit.
fn check(dtype: GgmlDType, n: usize, k: usize) -> Vec<String> {
    check_linear(&format!("{dtype:?} [{n}, {k}]"), &linear(dtype, n, k), n, k)
}

fn check_linear(name: &str, lin: &Linear, n: usize, k: usize) -> Vec<String> {
    const ROWS: usize = 40;
    let x = Tensor::from_vec(values(12345, ROWS * k), (ROWS, k), &Device::Cpu).unwrap();
    let alone: Vec<Vec<u32>> =
        (0..ROWS).map(|i| bits(&lin.forward(&x.narrow(0, i, 1).unwrap()).unwrap()).remove(0)).collect();
    let mut failures = Vec::new();
    for m in [2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 31, 32, 33, 40] {
        for start in [0, 1] {
            if start + m > ROWS {
                continue;
            }
            let many = bits(&lin.forward(&x.narrow(0, start, m).unwrap()).unwrap());
            for (i, row) in many.iter().enumerate() {
                let want = &alone[start + i];
                if let Some(c) = (0..n).find(|&c| row[c] != want[c]) {
                    failures.push(format!(
                        "{name}: row {i} of a {m}-row call (from row {start}) differs at column {c}: {} vs {} alone",
                        f32::from_bits(row[c]),
                        f32::from_bits(want[c])
                    ));
                    break;
                }
            }
        }
    }
    failures
}

fn check_all(types: &[GgmlDType]) {
    let mut failures = Vec::new();
    for &dtype in types {
        // n a multiple of 16 takes candle's repacked x86 kernels where it has them; n = 16j + 3
        // leaves a column tail.
        for (n, k) in [(144, 512), (147, 512), (64, 1024)] {
            failures.extend(check(dtype, n, k));
        }
    }
    assert!(failures.is_empty(), "{} row-variant results:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn k_quant_rows_equal_decode_rows() {
    check_all(&[GgmlDType::Q2K, GgmlDType::Q3K, GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K]);
}

/// Q2_K .. Q6_K through our own kernel ([`KQuantMatrix`], what the GGUF loader builds on
/// AVX-512 VNNI CPUs).
#[test]
fn our_kquant_rows_equal_decode_rows() {
    if !tandem_model::ops::quant::kquant::available() {
        eprintln!("no AVX-512 VNNI here: our Q4K kernel does not run (candle's is checked above)");
    }
    let mut failures = Vec::new();
    for dt in [GgmlDType::Q2K, GgmlDType::Q3K, GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K] {
        for (n, k) in [(144, 512), (147, 512), (64, 1024)] {
            let w = Tensor::from_vec(values(n as u64 * 31 + k as u64, n * k), (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&w, dt).unwrap();
            let m = KQuantMatrix::from_bytes(dt, n, k, &q.data().unwrap()).unwrap();
            let lin = Linear { weight: LinearWeight::KQuant(std::sync::Arc::new(m)), bias: None };
            failures.extend(check_linear(&format!("our {dt:?} [{n}, {k}]"), &lin, n, k));
        }
    }
    assert!(failures.is_empty(), "{} row-variant results:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn legacy_quant_rows_equal_decode_rows() {
    check_all(&[GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1, GgmlDType::Q8_0]);
}

/// Dense f32 weights (safetensors models, random hybrids, dense embeddings used as LM heads:
/// `QMatMul::Tensor`), which `row_stable` sends to our dense kernel (candle's own f32 matmul
/// takes another kernel for a single row). Shapes with `k` not a multiple of 8 or 32 and `n`
/// not a multiple of the column tile included.
#[test]
fn dense_rows_equal_decode_rows() {
    let mut failures = Vec::new();
    for (n, k) in [(144, 512), (147, 512), (896, 896), (37, 100), (13, 1003), (5, 7), (61, 263)] {
        let w = Tensor::from_vec(values(n as u64 * 31 + k as u64, n * k), (n, k), &Device::Cpu).unwrap();
        let lin = Linear { weight: LinearWeight::Candle(QMatMul::Tensor(w)), bias: None };
        failures.extend(check_linear(&format!("F32 [{n}, {k}]"), &lin, n, k));
    }
    assert!(failures.is_empty(), "{} row-variant results:\n{}", failures.len(), failures.join("\n"));
}

/// A layer cut to its first `n` outputs (`Linear::first_rows`: a draft model's LM head limited
/// to frequent token ids) is the layer built from the first `n` rows of the same weights, bit
/// for bit, in every format (a kernel may still sum differently for another column count, so
/// the whole layer's first columns are only close).
#[test]
fn first_rows_are_the_layer_of_the_first_rows() {
    let (n_all, k) = (147, 512);
    let x = Tensor::from_vec(values(99, 3 * k), (3, k), &Device::Cpu).unwrap();
    let w = Tensor::from_vec(values(5, n_all * k), (n_all, k), &Device::Cpu).unwrap();
    let bias = Tensor::from_vec(values(7, n_all), n_all, &Device::Cpu).unwrap();
    // `ours`: Q4_K through our kernel's packed matrix instead of candle's QMatMul.
    let build = |(dtype, ours): (Option<GgmlDType>, bool), n: usize| -> Linear {
        let w = w.narrow(0, 0, n).unwrap().contiguous().unwrap();
        let weight = match dtype {
            None => LinearWeight::Candle(QMatMul::Tensor(w)),
            Some(d) if ours => {
                let q = QTensor::quantize(&w, d).unwrap();
                LinearWeight::KQuant(std::sync::Arc::new(
                    KQuantMatrix::from_bytes(d, n, k, &q.data().unwrap()).unwrap(),
                ))
            }
            Some(d) => {
                let q = QTensor::quantize(&w, d).unwrap();
                match GgmlMatrix::from_qtensor(&q).unwrap() {
                    Some(g) => LinearWeight::Ggml(std::sync::Arc::new(g)),
                    None => LinearWeight::Candle(QMatMul::from_qtensor(q).unwrap()),
                }
            }
        };
        Linear { weight, bias: Some(bias.narrow(0, 0, n).unwrap()) }
    };
    let types = [None, Some(GgmlDType::Q4K), Some(GgmlDType::Q6K), Some(GgmlDType::Q5_0), Some(GgmlDType::Q8_0)];
    for dtype in types.into_iter().map(|d| (d, false)).chain([(Some(GgmlDType::Q4K), true)]) {
        let whole = build(dtype, n_all);
        let whole_out = whole.forward(&x).unwrap().to_vec2::<f32>().unwrap();
        for n in [1, 16, 100, 146, 147] {
            let part = whole.first_rows(n).unwrap().forward(&x).unwrap();
            let want = build(dtype, n).forward(&x).unwrap();
            assert_eq!(bits(&part), bits(&want), "{dtype:?}: first {n} rows");
            // Close to the whole layer's first columns (activation rounding of another kernel).
            for (pr, wr) in part.to_vec2::<f32>().unwrap().iter().zip(&whole_out) {
                let scale = wr.iter().fold(1f32, |m, v| m.max(v.abs()));
                for (a, b) in pr.iter().zip(wr) {
                    assert!((a - b).abs() <= 2e-2 * scale, "{dtype:?}: first {n} rows: {a} vs {b}");
                }
            }
        }
        assert!(whole.first_rows(n_all + 1).is_err(), "{dtype:?}: more rows than the layer has");
    }
}
