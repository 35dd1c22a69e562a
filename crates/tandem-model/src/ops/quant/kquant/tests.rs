//! The Q4K / Q5K kernel against its reference (bit for bit), the packing against candle's
//! dequantisation (exact), rows against calls of other sizes (bit for bit), and the product
//! against candle's own matmul of the same type (within quantisation noise); every test for
//! every type (Q2K .. Q6K, Q8_0, Q5_0, Q4_0; Q8_0, Q5_0 and Q4_0 also on rows padded to
//! whole superblocks).

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use super::*;

fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

const TYPES: [GgmlDType; 8] = [
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
    GgmlDType::Q8_0,
    GgmlDType::Q5_0,
    GgmlDType::Q4_0,
];

/// A random `[n, k]` matrix of `dt` as candle quantises it: its GGUF bytes and the candle tensor.
fn matrix(dt: GgmlDType, n: usize, k: usize, seed: u64) -> (Vec<u8>, QTensor) {
    let w = Tensor::from_vec(random(n * k, seed), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, dt).unwrap();
    (q.data().unwrap().to_vec(), q)
}

#[test]
fn packing_keeps_every_weight() {
    for dt in TYPES {
        for (n, k) in [(16, 256), (37, 512), (5, 768)] {
            let (bytes, q) = matrix(dt, n, k, 7 + n as u64);
            let ours = KQuantMatrix::from_bytes(dt, n, k, &bytes).unwrap().dequantize();
            let candle = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(ours, candle, "{dt:?} [{n}, {k}]");
        }
    }
}

/// Every kernel this CPU runs (AVX-512 VNNI, AVX2) against the reference, bit for bit (the
/// 32-value block types also on rows padded to whole superblocks).
#[cfg(target_arch = "x86_64")]
#[test]
fn kernel_equals_reference_bit_for_bit() {
    let kernels: Vec<Simd> = [Simd::Avx512, Simd::Avx2].into_iter().filter(|s| s.available()).collect();
    if kernels.is_empty() {
        eprintln!("no AVX2 here: skipped");
        return;
    }
    let shapes =
        [(16, 256, 1), (48, 512, 3), (37, 768, 8), (21, 256, 13), (64, 1024, 20), (4, 256, 12), (1040, 256, 24)];
    // Rows padded to whole superblocks (the 32-value block types only): the kernels' shortened
    // last stretch (AVX2) and the padding read through (AVX-512), one and many rows.
    let padded = [(21, 640, 1), (40, 896, 2), (19, 576, 5), (3, 1056, 9)];
    let block32 = [GgmlDType::Q8_0, GgmlDType::Q5_0, GgmlDType::Q4_0];
    let cases = shapes
        .into_iter()
        .flat_map(|s| TYPES.map(|t| (s, t)))
        .chain(padded.into_iter().flat_map(|s| block32.map(|t| (s, t))));
    for ((n, k, m), dt) in cases {
        let (bytes, _) = matrix(dt, n, k, 11 * n as u64 + k as u64);
        let w = KQuantMatrix::from_bytes(dt, n, k, &bytes).unwrap();
        let x = random(m * k, 3 + m as u64);
        let acts = w.acts(&x, m);
        let mut plain = vec![f32::NAN; m * n];
        w.matmul_reference(&acts, m, &mut plain);
        let pb: Vec<u32> = plain.iter().map(|v| v.to_bits()).collect();
        for &simd in &kernels {
            let mut fast = vec![f32::NAN; m * n];
            // SAFETY: the CPU has `simd` (filtered above).
            unsafe { w.matmul_simd(simd, &acts, m, &mut fast) };
            let fb: Vec<u32> = fast.iter().map(|v| v.to_bits()).collect();
            assert_eq!(fb, pb, "{dt:?} [{n}, {k}] x {m} rows, {simd:?}");
        }
    }
}

/// A row's result does not depend on the other rows of the call (decode = verify = prefill).
#[test]
fn rows_are_independent_of_the_call() {
    for dt in TYPES {
        let (n, k) = (40, 512);
        let (bytes, _) = matrix(dt, n, k, 99);
        let w = KQuantMatrix::from_bytes(dt, n, k, &bytes).unwrap();
        let x = random(17 * k, 5);
        let mut all = vec![0f32; 17 * n];
        w.matmul(&x, 17, &mut all);
        for m in [1, 2, 5, 8, 9, 16] {
            for r0 in [0, 17 - m] {
                let mut part = vec![0f32; m * n];
                w.matmul(&x[r0 * k..(r0 + m) * k], m, &mut part);
                let want: Vec<u32> = all[r0 * n..(r0 + m) * n].iter().map(|v| v.to_bits()).collect();
                let got: Vec<u32> = part.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{dt:?}: rows {r0}..{} in a call of {m}", r0 + m);
            }
        }
    }
}

#[test]
fn product_matches_candles_matmul() {
    for dt in TYPES {
        let (n, k, m) = (48, 1024, 6);
        let (bytes, q) = matrix(dt, n, k, 1234);
        let w = KQuantMatrix::from_bytes(dt, n, k, &bytes).unwrap();
        let x = Tensor::from_vec(random(m * k, 77), (m, k), &Device::Cpu).unwrap();
        let ours = w.forward(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let candle =
            QMatMul::from_qtensor(q).unwrap().forward(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // candle quantises the activations as we do (Q8K) for every K-quant; for Q8_0 only in
        // its x86 tiles: elsewhere (aarch64) per 32-value block, as ggml does, which rounds
        // them differently, so there both are only near each other as each is near the f32
        // product below (1-2% of the largest output).
        let largest = candle.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in ours.iter().zip(&candle).enumerate() {
            // Q5_0, Q4_0: candle quantises the activations per 32-value block (ggml's Q8_0).
            let block_acts = matches!(dt, GgmlDType::Q8_0 | GgmlDType::Q5_0 | GgmlDType::Q4_0);
            let tol = if block_acts { 0.02 * largest } else { 1e-3 * (1.0 + b.abs()) };
            assert!((a - b).abs() <= tol, "{dt:?} element {i}: {a} against candle's {b}");
        }
        // And both near the f32 product of the dequantised weights (activation rounding only).
        let wd = Tensor::from_vec(w.dequantize(), (n, k), &Device::Cpu).unwrap();
        let exact = x.matmul(&wd.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // 8-bit activations: errors of about 1% of the largest output, wherever it lands.
        let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in ours.iter().zip(&exact).enumerate() {
            assert!((a - b).abs() <= 0.02 * scale, "{dt:?} element {i}: {a} against f32 {b} (largest {scale})");
        }
    }
}

/// A tied table packed as tiles (`Embedding::KQuant`): a lookup gives the rows candle's
/// embedding of the file's blocks gives, bit for bit; an id past the table is an input error;
/// as the LM head it is the kernel's product.
#[test]
fn packed_embedding_rows_equal_candles_lookup() {
    use crate::loader::Embedding;
    use std::sync::Arc;
    for dt in TYPES {
        let (n, k) = (37, 512);
        let (bytes, q) = matrix(dt, n, k, 5 + k as u64);
        let w = Arc::new(KQuantMatrix::from_bytes(dt, n, k, &bytes).unwrap());
        let ids = Tensor::new(&[0u32, 36, 5, 16, 5, 15], &Device::Cpu).unwrap();
        let ours = Embedding::KQuant(w.clone()).forward(&ids).unwrap();
        let candle = Embedding::Quantized(Arc::new(q)).forward(&ids).unwrap();
        assert_eq!(ours.dims(), &[6, k]);
        let bits = |t: &Tensor| {
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(bits(&ours), bits(&candle), "{dt:?}");
        let bad = Tensor::new(&[3u32, 37], &Device::Cpu).unwrap();
        assert!(Embedding::KQuant(w.clone()).forward(&bad).is_err(), "{dt:?}: id 37 of 37 rows");
        let x = Tensor::from_vec(random(3 * k, 9), (3, k), &Device::Cpu).unwrap();
        let head = Embedding::KQuant(w.clone()).as_linear().unwrap().forward(&x).unwrap();
        assert_eq!(bits(&head), bits(&w.forward(&x).unwrap()), "{dt:?}: the head is the kernel");
    }
}

#[test]
fn first_rows_and_bad_sizes() {
    for dt in TYPES {
        let (bytes, _) = matrix(dt, 40, 256, 3);
        let w = KQuantMatrix::from_bytes(dt, 40, 256, &bytes).unwrap();
        let head = w.first_rows(20);
        assert_eq!((head.n(), head.k()), (20, 256));
        assert_eq!(head.dequantize(), w.dequantize()[..20 * 256].to_vec());
        assert!(KQuantMatrix::from_bytes(dt, 40, 256, &bytes[1..]).is_err());
        assert!(KQuantMatrix::from_bytes(dt, 40, 100, &bytes).is_err());
        let x = Tensor::zeros((2, 128), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(w.forward(&x).is_err());
        assert_eq!(w.dtype(), dt);
    }
    assert!(KQuantMatrix::from_bytes(GgmlDType::Q4_1, 40, 256, &[0; 40 * 8 * 20]).is_err());
}

/// The largest integer sums a kernel can meet: every weight value at its type's maximum (Q4K
/// 15, Q5K 31, Q6K 63, Q3K 7, Q2K 3, Q8_0 127 and -128, Q5_0 31, Q4_0 15) against activations of -127 (a row of equal values): the
/// AVX2 kernel's i16 partial sums are at their bound here, and must still equal the reference.
#[cfg(target_arch = "x86_64")]
#[test]
fn largest_sums_equal_the_reference() {
    let kernels: Vec<Simd> = [Simd::Avx512, Simd::Avx2].into_iter().filter(|s| s.available()).collect();
    // The bytes of each block that hold the values (GGUF layouts), set to all ones.
    let value_bytes = |dt: GgmlDType| match dt {
        GgmlDType::Q4K => 16..144,
        GgmlDType::Q5K => 16..176,
        GgmlDType::Q6K => 0..192,
        GgmlDType::Q3K => 0..96,
        _ => 16..80,
    };
    for dt in TYPES {
        let (n, k, m) = (24, 512, 5);
        let (mut bytes, _) = matrix(dt, n, k, 5);
        let block = bytes.len() / (n * k / QK_K);
        for blk in bytes.chunks_exact_mut(block) {
            if dt == GgmlDType::Q8_0 {
                // Eight `block_q8_0`s a stretch: d, then 32 signed values each; every other
                // block at -128 (the AVX2 kernel's |w| = 128 under the sign).
                for (i, b) in blk.chunks_exact_mut(34).enumerate() {
                    b[2..].fill(if i % 2 == 0 { 0x7F } else { 0x80 });
                }
            } else if dt == GgmlDType::Q5_0 {
                // Eight `block_q5_0`s: d, then the fifth bits and the nibbles (q = 31).
                blk.chunks_exact_mut(22).for_each(|b| b[2..].fill(0xFF));
            } else if dt == GgmlDType::Q4_0 {
                // Eight `block_q4_0`s: d, then the nibbles (q = 15).
                blk.chunks_exact_mut(18).for_each(|b| b[2..].fill(0xFF));
            } else {
                blk[value_bytes(dt)].fill(0xFF);
            }
        }
        let w = KQuantMatrix::from_bytes(dt, n, k, &bytes).unwrap();
        let mut x = vec![1.0f32; m * k];
        x[2 * k..3 * k].fill(-3.0);
        let acts = w.acts(&x, m);
        let mut plain = vec![f32::NAN; m * n];
        w.matmul_reference(&acts, m, &mut plain);
        assert!(plain.iter().all(|v| v.is_finite() && *v != 0.0), "{dt:?}: {plain:?}");
        for &simd in &kernels {
            let mut fast = vec![f32::NAN; m * n];
            // SAFETY: the CPU has `simd` (filtered above).
            unsafe { w.matmul_simd(simd, &acts, m, &mut fast) };
            let fb: Vec<u32> = fast.iter().map(|v| v.to_bits()).collect();
            let pb: Vec<u32> = plain.iter().map(|v| v.to_bits()).collect();
            assert_eq!(fb, pb, "{dt:?}, {simd:?}");
        }
    }
}

/// Q8_0, Q5_0 and Q4_0 rows of any multiple of 32 values (qwen2.5's 896, gemma3's 640): padded
/// to whole superblocks, the packing still keeps every weight, the kernel gives the reference's bits on
/// the padded rows, rows do not depend on the call, and the product is near the f32 one.
#[test]
fn block32_types_take_rows_of_any_length() {
    for dt in [GgmlDType::Q8_0, GgmlDType::Q5_0, GgmlDType::Q4_0] {
        block32_rows_of_any_length(dt);
    }
    assert!(KQuantMatrix::from_bytes(GgmlDType::Q4_0, 4, 48, &[0; 4 * 18]).is_err(), "48 is not a multiple of 32");
}

fn block32_rows_of_any_length(dt: GgmlDType) {
    for (n, k) in [(17, 32), (5, 96), (40, 896), (3, 1056), (21, 640)] {
        let (bytes, q) = matrix(dt, n, k, 3 * k as u64 + n as u64);
        let w = KQuantMatrix::from_bytes(dt, n, k, &bytes).unwrap();
        let candle = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(w.dequantize(), candle, "[{n}, {k}] weights");
        let m = 11;
        let x = random(m * k, k as u64);
        let mut got = vec![f32::NAN; m * n];
        w.matmul(&x, m, &mut got);
        // The reference on the same activations (padded to whole stretches by `acts`), and the
        // activations are ggml's per-block quantisation of each row.
        let acts = w.acts(&x, m);
        let Acts::Block(a) = &acts else { panic!("{dt:?} takes per-block activations") };
        let nb = k.div_ceil(QK_K);
        for r in 0..m {
            let mut blocks = vec![crate::ops::quant::activation::Q8Block::ZERO; k / 32];
            crate::ops::quant::activation::quantize_row_scalar(&x[r * k..(r + 1) * k], &mut blocks);
            for (i, b) in blocks.iter().enumerate() {
                let st = &a[r * nb + i / 8];
                assert_eq!(
                    (st.d[i % 8], &st.qs[32 * (i % 8)..32 * (i % 8) + 32]),
                    (b.d, &b.qs[..]),
                    "row {r} block {i}"
                );
                assert_eq!(st.sums[i % 8], b.qs.iter().map(|&q| q as i32).sum::<i32>());
            }
            for i in k / 32..8 * nb {
                assert_eq!((a[r * nb + i / 8].d[i % 8], a[r * nb + i / 8].sums[i % 8]), (0.0, 0), "padding");
            }
        }
        let mut plain = vec![f32::NAN; m * n];
        w.matmul_reference(&acts, m, &mut plain);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&plain), "{dt:?} [{n}, {k}]: kernel against reference");
        for r in [0, 4, 10] {
            let mut one = vec![0f32; n];
            w.matmul(&x[r * k..(r + 1) * k], 1, &mut one);
            assert_eq!(bits(&one), bits(&got[r * n..(r + 1) * n]), "[{n}, {k}]: row {r} alone");
        }
        let exact: Vec<f32> =
            (0..m * n).map(|i| (0..k).map(|j| x[(i / n) * k + j] * candle[(i % n) * k + j]).sum::<f32>()).collect();
        let scale = exact.iter().fold(0f32, |a, v| a.max(v.abs()));
        for (i, (a, b)) in got.iter().zip(&exact).enumerate() {
            assert!((a - b).abs() <= 0.02 * scale, "[{n}, {k}] element {i}: {a} against f32 {b}");
        }
    }
    assert!(KQuantMatrix::from_bytes(dt, 4, 48, &[0; 4 * 22]).is_err(), "48 is not a multiple of 32");
}
