//! Unit tests against candle: block decoding and matmul equal candle's own Q4_1/Q5_0/Q5_1/Q8_0
//! `QMatMul` on the same `QTensor`, and the loader's layers run on [`GgmlMatrix`].

use candle_core::quantized::k_quants::{BlockQ8_0, BlockQ8_1, GgmlType};
use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;

use super::tests::{random_blocks, random_x, rel_err, Rng, KS, MS, N};
use super::*;

/// candle's own activation quantisation (round half away from zero, `s` multiplied in f16),
/// read back from its `#[repr(C)]` blocks.
fn candle_acts(ty: QuantType, x: &[f32]) -> Vec<Q8Block> {
    let h = |b: &[u8]| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    let qs = |b: &[u8]| {
        let mut q = [0i8; 32];
        q.iter_mut().zip(b).for_each(|(q, &v)| *q = v as i8);
        q
    };
    let nb = x.len() / 32;
    if matches!(ty, QuantType::Q5_0 | QuantType::Q8_0) {
        let mut blocks = vec![BlockQ8_0::zeros(); nb];
        BlockQ8_0::from_float(x, &mut blocks);
        // SAFETY: BlockQ8_0 is #[repr(C)] { d: f16, qs: [i8; 32] }, 34 bytes, no padding.
        let bytes = unsafe { std::slice::from_raw_parts(blocks.as_ptr() as *const u8, nb * 34) };
        bytes.chunks_exact(34).map(|b| Q8Block { qs: qs(&b[2..]), d: h(b), s: 0.0 }).collect()
    } else {
        let mut blocks = vec![BlockQ8_1::zeros(); nb];
        BlockQ8_1::from_float(x, &mut blocks);
        // SAFETY: BlockQ8_1 is #[repr(C)] { d: f16, s: f16, qs: [i8; 32] }, 36 bytes.
        let bytes = unsafe { std::slice::from_raw_parts(blocks.as_ptr() as *const u8, nb * 36) };
        bytes.chunks_exact(36).map(|b| Q8Block { qs: qs(&b[4..]), d: h(b), s: h(&b[2..]) }).collect()
    }
}

/// Same QTensor through candle's `QMatMul` and through ours: decoding identical, dot products
/// identical given candle's activations, and close with ggml's.
fn check_candle(ty: QuantType, seed: u64) {
    let dev = Device::Cpu;
    let mut worst = [0f32; 2];
    let mut rng = Rng(seed);
    for k in KS {
        let wf: Vec<f32> = (0..N * k).map(|_| rng.f32() * 0.1).collect();
        let qt = QTensor::quantize(&Tensor::from_vec(wf, (N, k), &dev).unwrap(), ty.to_ggml()).unwrap();
        let ours = GgmlMatrix::from_qtensor(&qt).unwrap().expect("supported type");
        let theirs_w = qt.dequantize(&dev).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(ours.dequantize(), theirs_w, "{ty:?} k={k}: dequantised weights differ");
        let qmm = QMatMul::from_qtensor(qt).unwrap();
        assert!(matches!(qmm, QMatMul::QTensor(_)), "CANDLE_DEQUANTIZE_ALL is set?");
        for m in MS {
            let x = random_x(&mut rng, m * k);
            let xt = Tensor::from_vec(x.clone(), (m, k), &dev).unwrap();
            let theirs = qmm.forward(&xt).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();

            // Our reference dot products on candle's activation blocks.
            let acts = candle_acts(ty, &x);
            let y = match ty {
                QuantType::Q4_1 => reference_matmul::<BlockQ4_1>(&ours, &acts, m),
                QuantType::Q5_0 => reference_matmul::<BlockQ5_0>(&ours, &acts, m),
                QuantType::Q5_1 => reference_matmul::<BlockQ5_1>(&ours, &acts, m),
                QuantType::Q8_0 => reference_matmul::<blocks::BlockQ8_0>(&ours, &acts, m),
            };
            let e = rel_err(&y, &theirs);
            worst[0] = worst[0].max(e);
            assert!(e <= 1e-5, "{ty:?} m={m} k={k}: reference (candle's activations) vs candle rel err {e}");

            // The production path (ggml's activation quantisation) through the tensor API.
            let got = ours.forward(&xt).unwrap();
            assert_eq!(got.dims(), &[m, N]);
            let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let e = rel_err(&got, &theirs);
            worst[1] = worst[1].max(e);
            let tol = if matches!(ty, QuantType::Q5_0 | QuantType::Q8_0) { 1e-4 } else { 2e-3 };
            assert!(e <= tol, "{ty:?} m={m} k={k}: ours vs candle rel err {e}");
            if ty == QuantType::Q8_0 && cfg!(target_arch = "x86_64") && Kernel::best() != Kernel::Reference {
                // Both quantise activations as ggml does and sum as its AVX2 vec_dot: the same
                // bits (on aarch64 candle sums in ggml's NEON order, ours in the reference's).
                assert_eq!(got, theirs, "Q8_0 m={m} k={k}: ours and candle's differ");
            }
        }
    }
    eprintln!(
        "{ty:?}: max rel err vs candle QMatMul {:.1e} (candle's activations), {:.1e} (ggml's)",
        worst[0], worst[1]
    );
}

/// `vec_dot` of every activation row with every weight row.
fn reference_matmul<B: WeightBlock>(w: &GgmlMatrix, acts: &[Q8Block], m: usize) -> Vec<f32> {
    let blocks: Vec<B> = blocks::parse_blocks(&w.to_bytes());
    let nb = w.k() / 32;
    let mut y = Vec::with_capacity(m * w.n());
    for r in 0..m {
        for c in 0..w.n() {
            y.push(reference::vec_dot(&blocks[c * nb..(c + 1) * nb], &acts[r * nb..(r + 1) * nb]));
        }
    }
    y
}

#[test]
fn q4_1_matches_candle() {
    check_candle(QuantType::Q4_1, 11);
}
#[test]
fn q5_0_matches_candle() {
    check_candle(QuantType::Q5_0, 12);
}
#[test]
fn q5_1_matches_candle() {
    check_candle(QuantType::Q5_1, 13);
}
#[test]
fn q8_0_matches_candle() {
    check_candle(QuantType::Q8_0, 14);
}

#[test]
fn loader_linear_and_embedding_use_the_matrix() {
    use crate::loader::{Embedding, Linear, LinearWeight};
    use std::sync::Arc;
    let mut rng = Rng(9);
    let (n, k) = (12, 64);
    let w = Arc::new(GgmlMatrix::from_blocks(n, k, &random_blocks::<BlockQ5_0>(&mut rng, n * k / 32)).unwrap());
    let dev = Device::Cpu;
    // Embedding rows are the dequantised matrix rows; the tied head is the same matrix.
    let emb = Embedding::Ggml(w.clone());
    let ids = Tensor::new(&[3u32, 0, 11, 3], &dev).unwrap();
    let rows = emb.forward(&ids).unwrap().to_vec2::<f32>().unwrap();
    let wf = w.dequantize();
    for (row, id) in rows.iter().zip([3usize, 0, 11, 3]) {
        assert_eq!(&row[..], &wf[id * k..(id + 1) * k]);
    }
    assert!(emb.forward(&Tensor::new(&[12u32], &dev).unwrap()).is_err());
    let head = emb.as_linear().unwrap();
    assert!(matches!(head.weight, LinearWeight::Ggml(_)));
    // Linear with a bias: matmul + bias.
    let bias = Tensor::from_vec((0..n).map(|i| i as f32).collect::<Vec<_>>(), n, &dev).unwrap();
    let lin = Linear { weight: LinearWeight::Ggml(w.clone()), bias: Some(bias) };
    let x = Tensor::from_vec(random_x(&mut rng, 3 * k), (3, k), &dev).unwrap();
    let y = lin.forward(&x).unwrap().to_vec2::<f32>().unwrap();
    let y0 = head.forward(&x).unwrap().to_vec2::<f32>().unwrap();
    for (r, (a, b)) in y.iter().zip(&y0).enumerate() {
        for (c, (a, b)) in a.iter().zip(b).enumerate() {
            assert_eq!(*a, b + c as f32, "row {r} col {c}");
        }
    }
}
