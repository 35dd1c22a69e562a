//! Unit tests: the SIMD quantiser and matmul against the plain reference and against ggml's
//! accumulation order, the reference against a float computation (candle comparisons are in
//! `tests_candle.rs`).

use candle_core::{Device, Tensor};
use half::f16;

use super::activation::{quantize_row, quantize_row_scalar};
use super::*;

pub(super) const MS: [usize; 5] = [1, 3, 4, 5, 17];
pub(super) const KS: [usize; 4] = [32, 64, 576, 1536];
/// Not a multiple of 4 or 2, and more columns than one task and one tile at k = 1536.
pub(super) const N: usize = 67;

/// xorshift64*: deterministic, no dependency.
pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub(super) fn f32(&mut self) -> f32 {
        (self.u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(super) fn bytes(&mut self, out: &mut Vec<u8>, n: usize) {
        out.extend((0..n).map(|_| (self.u64() >> 56) as u8));
    }
}

/// Activations with a few larger values per row, like a transformer's hidden state.
pub(super) fn random_x(rng: &mut Rng, len: usize) -> Vec<f32> {
    (0..len).map(|i| rng.f32() * if i % 37 == 5 { 8.0 } else { 1.0 }).collect()
}

/// Blocks from random bytes with sane f16 scales: `d` in [0.002, 0.02], and for the types with
/// a minimum `m ≈ -d · levels / 2` so the weights are roughly centred on 0.
pub(super) fn random_blocks<B: WeightBlock>(rng: &mut Rng, count: usize) -> Vec<B> {
    let mut bytes = Vec::new();
    for _ in 0..count {
        let d = 0.011 + 0.009 * rng.f32();
        bytes.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
        if B::HAS_MIN {
            let levels = if B::TYPE == QuantType::Q4_1 { 16.0 } else { 32.0 };
            let m = -d * levels / 2.0 * (1.0 + 0.3 * rng.f32());
            bytes.extend_from_slice(&f16::from_f32(m).to_bits().to_le_bytes());
        }
        rng.bytes(&mut bytes, B::BYTES - if B::HAS_MIN { 4 } else { 2 });
    }
    bytes.chunks_exact(B::BYTES).map(B::parse).collect()
}

/// max |a - b| / max |b|
pub(super) fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    diff / b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-30)
}

pub(super) fn quantize_rows(x: &[f32], k: usize) -> Vec<Q8Block> {
    let mut acts = vec![Q8Block::ZERO; x.len() / 32];
    for (a, x) in acts.chunks_mut(k / 32).zip(x.chunks(k)) {
        quantize_row_scalar(x, a);
    }
    acts
}

#[test]
fn simd_quantisers_are_bit_identical() {
    let kernels: Vec<_> = Kernel::SIMD.into_iter().filter(|k| k.available()).collect();
    if kernels.is_empty() {
        eprintln!("no SIMD kernel here: skipped");
        return;
    }
    let mut rng = Rng(7);
    let mut rows: Vec<Vec<f32>> = (0..200).map(|_| random_x(&mut rng, 256)).collect();
    rows.push(vec![0.0; 64]);
    rows.push((0..64).map(|i| (i as f32 - 32.0) * 1e-30).collect());
    // amax = 127: x · id is x itself, so the halves test round-half-to-even.
    rows.push((0..64).map(|i| if i == 0 { 127.0 } else { (i as f32 - 32.0) + 0.5 }).collect());
    // NaN and infinities (a broken model's activations): no panic, and with an infinity in
    // the block the same (infinite) scale. The integers differ (x86's conversion gives
    // i32::MIN for NaN, as ggml's does, the scalar and NEON ones 0), and a block of NaN only
    // gets scale 0 or NaN depending on the max instruction; every product with such blocks is
    // NaN or infinite anyway.
    for (x, same_scale) in
        [((0..64).map(|i| [f32::NAN, 1.0, f32::INFINITY, -2.0][i % 4]).collect(), true), (vec![f32::NAN; 32], false)]
    {
        let mut a = vec![Q8Block::ZERO; x.len() / 32];
        quantize_row(Kernel::Reference, &x, &mut a);
        for &kernel in &kernels {
            let mut b = vec![Q8Block::ZERO; x.len() / 32];
            quantize_row(kernel, &x, &mut b);
            let scales = |v: &[Q8Block]| v.iter().map(|q| q.d.to_bits()).collect::<Vec<_>>();
            if same_scale {
                assert_eq!(scales(&a), scales(&b), "{kernel:?}");
            }
        }
    }
    for x in &rows {
        let mut a = vec![Q8Block::ZERO; x.len() / 32];
        quantize_row(Kernel::Reference, x, &mut a);
        for &kernel in &kernels {
            let mut b = vec![Q8Block::ZERO; x.len() / 32];
            quantize_row(kernel, x, &mut b);
            // Compared as bits: NaN scales must match too.
            let bits = |v: &[Q8Block]| v.iter().map(|q| (q.qs, q.d.to_bits(), q.s.to_bits())).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{kernel:?}");
        }
    }
}

#[test]
fn quantiser_follows_ggml() {
    // amax = 127 so d = 1: halves round to even, s = Σq.
    let mut x: Vec<f32> = (0..32).map(|i| i as f32 - 16.5).collect();
    x[31] = 127.0;
    let mut a = [Q8Block::ZERO];
    quantize_row_scalar(&x, &mut a);
    assert_eq!(a[0].d, 1.0);
    assert_eq!(&a[0].qs[..4], &[-16, -16, -14, -14]); // -16.5 -15.5 -14.5 -13.5
    let sum: i32 = a[0].qs.iter().map(|&q| q as i32).sum();
    assert_eq!(a[0].s, sum as f32);
    // Any row: within half a step of the input (plus the f16 rounding of d, up to
    // 127 · 2^-11 steps), d and s exactly f16 values.
    let mut rng = Rng(3);
    let x = random_x(&mut rng, 1024);
    let acts = quantize_rows(&x, 1024);
    let mut back = vec![0f32; 1024];
    for (a, o) in acts.iter().zip(back.chunks_mut(32)) {
        a.dequantize(o);
        assert_eq!(f16::from_f32(a.d).to_f32(), a.d);
        assert_eq!(f16::from_f32(a.s).to_f32(), a.s);
    }
    for (i, (&v, &q)) in x.iter().zip(&back).enumerate() {
        assert!((v - q).abs() <= acts[i / 32].d * (0.5 + 127.0 / 2048.0) + 1e-6, "{i}: {v} vs {q}");
    }
}

fn check_type<B: WeightBlock>(seed: u64) {
    let mut rng = Rng(seed);
    let mut worst = [0f32; 3]; // vs ggml-formula float, vs plain float, AVX2 vs reference
    for k in KS {
        let blocks: Vec<B> = random_blocks(&mut rng, N * k / 32);
        let w = GgmlMatrix::from_blocks(N, k, &blocks).unwrap();
        assert_eq!(w.to_bytes().len(), N * k / 32 * B::BYTES);
        let wf = w.dequantize();
        for m in MS {
            let x = random_x(&mut rng, m * k);
            let mut y_ref = vec![0f32; m * N];
            w.matmul_with(Kernel::Reference, &x, m, &mut y_ref);

            // The reference against floats: dequantised W · dequantised activations, plus
            // ggml's `m_w · s_a` (the activation sum rounded through f16, as ggml stores it).
            let acts = quantize_rows(&x, k);
            let (mut y_ggml, mut y_float) = (vec![0f32; m * N], vec![0f32; m * N]);
            let mut xa = vec![0f32; k];
            for r in 0..m {
                for (a, o) in acts[r * k / 32..(r + 1) * k / 32].iter().zip(xa.chunks_mut(32)) {
                    a.dequantize(o);
                }
                for c in 0..N {
                    let (mut exact, mut float) = (0f64, 0f64);
                    for b in 0..k / 32 {
                        let (wb, ab) = (&blocks[c * k / 32 + b], &acts[r * k / 32 + b]);
                        for j in 0..32 {
                            let (wv, av) = (wf[c * k + b * 32 + j] as f64, xa[b * 32 + j] as f64);
                            exact += (wv - wb.m() as f64) * av;
                            float += wv * av;
                        }
                        exact += wb.m() as f64 * ab.s as f64;
                    }
                    y_ggml[r * N + c] = exact as f32;
                    y_float[r * N + c] = float as f32;
                }
            }
            let e = rel_err(&y_ref, &y_ggml);
            worst[0] = worst[0].max(e);
            assert!(e <= 1e-5, "{:?} m={m} k={k}: reference vs float (ggml's s) rel err {e}", B::TYPE);
            // Without the f16 rounding of s the sums differ by up to 2^-11 of the m·s terms.
            let e = rel_err(&y_ref, &y_float);
            worst[1] = worst[1].max(e);
            let tol = if B::HAS_MIN { 2e-3 } else { 1e-5 };
            assert!(e <= tol, "{:?} m={m} k={k}: reference vs dequantised float rel err {e}", B::TYPE);

            let mut simd_results: Vec<Vec<f32>> = Vec::new();
            for kernel in Kernel::SIMD.into_iter().filter(|k| k.available()) {
                let mut y_simd = vec![f32::NAN; m * N];
                w.matmul_with(kernel, &x, m, &mut y_simd);
                let e = rel_err(&y_simd, &y_ref);
                worst[2] = worst[2].max(e);
                assert!(e <= 1e-5, "{:?} m={m} k={k}: {kernel:?} vs reference rel err {e}", B::TYPE);
                if matches!(kernel, Kernel::Neon | Kernel::NeonDot) {
                    // The NEON kernels sum in the reference's order.
                    assert_eq!(y_simd, y_ref, "{:?} m={m} k={k}: {kernel:?} is not the reference's bits", B::TYPE);
                }
                simd_results.push(y_simd);
            }
            // The SIMD kernels of one architecture only differ in how they form the exact
            // integer sums.
            for (i, r) in simd_results.iter().enumerate().skip(1) {
                assert_eq!(r, &simd_results[0], "{:?} m={m} k={k}: SIMD kernel {i} differs from the first", B::TYPE);
            }
        }
    }
    let simd: Vec<_> = Kernel::SIMD.into_iter().filter(|k| k.available()).collect();
    eprintln!(
        "{:?}: max rel err reference vs float {:.1e} (plain float {:.1e}), {simd:?} vs reference {:.1e}",
        B::TYPE,
        worst[0],
        worst[1],
        worst[2]
    );
}

/// ggml's AVX2 `ggml_vec_dot_*` written out in scalar code: 8 lanes of 4-product integer
/// sums, `acc[l] = fma(d_w·d_a, sum[l], acc[l])` per block, `summs = fma(m_w, s_a, summs)`, and
/// `hsum_float_8(acc) + summs`. The SIMD kernels must equal it bit for bit.
fn ggml_avx2_dot<B: WeightBlock>(w: &[B], a: &[Q8Block]) -> f32 {
    let (mut acc, mut summs) = ([0f32; 8], 0f32);
    for (wb, ab) in w.iter().zip(a) {
        let q = wb.ints();
        let dd = wb.d() * ab.d;
        for (l, acc) in acc.iter_mut().enumerate() {
            let sum: i32 = (4 * l..4 * l + 4).map(|j| q[j] * ab.qs[j] as i32).sum();
            *acc = dd.mul_add(sum as f32, *acc);
        }
        if B::HAS_MIN {
            summs = wb.m().mul_add(ab.s, summs);
        }
    }
    let r = [acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]];
    ((r[0] + r[2]) + (r[1] + r[3])) + summs
}

#[test]
fn simd_equals_ggml_order_bit_for_bit() {
    let kernels: Vec<_> =
        [Kernel::Avx2, Kernel::AvxVnni, Kernel::Avx512Vnni].into_iter().filter(|k| k.available()).collect();
    if kernels.is_empty() {
        eprintln!("no AVX2 here: skipped");
        return;
    }
    fn check<B: WeightBlock>(kernels: &[Kernel], seed: u64) {
        let mut rng = Rng(seed);
        let (m, k) = (13, 576);
        let blocks: Vec<B> = random_blocks(&mut rng, N * k / 32);
        let w = GgmlMatrix::from_blocks(N, k, &blocks).unwrap();
        let x = random_x(&mut rng, m * k);
        let acts = quantize_rows(&x, k);
        let nb = k / 32;
        let want: Vec<f32> =
            (0..m * N).map(|i| ggml_avx2_dot(&blocks[i % N * nb..][..nb], &acts[i / N * nb..][..nb])).collect();
        for &kernel in kernels {
            let mut y = vec![0f32; m * N];
            w.matmul_with(kernel, &x, m, &mut y);
            assert_eq!(y, want, "{:?} {kernel:?}", B::TYPE);
        }
    }
    check::<BlockQ4_1>(&kernels, 21);
    check::<BlockQ5_0>(&kernels, 22);
    check::<BlockQ5_1>(&kernels, 23);
    check::<BlockQ8_0>(&kernels, 24);
}

/// The NEON kernels against the reference, bit for bit, over row blocks (70 rows: 64 + 4 + 2),
/// a column tail (13 = 3 tiles + 1) and every type.
#[test]
fn neon_kernels_give_the_references_bits() {
    let kernels: Vec<_> = [Kernel::Neon, Kernel::NeonDot].into_iter().filter(|k| k.available()).collect();
    if kernels.is_empty() {
        eprintln!("not an aarch64 CPU: skipped (make test-neon runs it under qemu)");
        return;
    }
    fn check<B: WeightBlock>(kernels: &[Kernel], seed: u64) {
        let mut rng = Rng(seed);
        let (n, k) = (13, 96);
        let w = GgmlMatrix::from_blocks(n, k, &random_blocks::<B>(&mut rng, n * k / 32)).unwrap();
        for m in [1, 2, 70] {
            let x = random_x(&mut rng, m * k);
            let mut want = vec![0f32; m * n];
            w.matmul_with(Kernel::Reference, &x, m, &mut want);
            for &kernel in kernels {
                let mut y = vec![f32::NAN; m * n];
                w.matmul_with(kernel, &x, m, &mut y);
                assert_eq!(y, want, "{:?} {kernel:?} m={m}", B::TYPE);
            }
        }
    }
    check::<BlockQ4_1>(&kernels, 31);
    check::<BlockQ5_0>(&kernels, 32);
    check::<BlockQ5_1>(&kernels, 33);
    check::<BlockQ8_0>(&kernels, 34);
}

#[test]
fn q4_1_matmul() {
    check_type::<BlockQ4_1>(1);
}
#[test]
fn q5_0_matmul() {
    check_type::<BlockQ5_0>(2);
}
#[test]
fn q5_1_matmul() {
    check_type::<BlockQ5_1>(3);
}
#[test]
fn q8_0_matmul() {
    check_type::<BlockQ8_0>(4);
}

#[test]
fn forward_takes_any_layout() {
    let mut rng = Rng(5);
    let (n, k) = (40, 64);
    let w = GgmlMatrix::from_blocks(n, k, &random_blocks::<BlockQ4_1>(&mut rng, n * k / 32)).unwrap();
    let x = Tensor::from_vec(random_x(&mut rng, 6 * k), (k, 6), &Device::Cpu).unwrap().t().unwrap();
    assert!(!x.is_contiguous());
    let y = w.forward(&x).unwrap();
    let y_c = w.forward(&x.contiguous().unwrap()).unwrap();
    assert_eq!(y.dims(), &[6, n]);
    assert_eq!(y.to_vec2::<f32>().unwrap(), y_c.to_vec2::<f32>().unwrap());
    // Leading dims are kept.
    let y3 = w.forward(&x.contiguous().unwrap().reshape((2, 3, k)).unwrap()).unwrap();
    assert_eq!(y3.dims(), &[2, 3, n]);
    assert_eq!(
        y3.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        y_c.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    );
    assert!(w.forward(&Tensor::zeros((2, 32), candle_core::DType::F32, &Device::Cpu).unwrap()).is_err());
}

#[test]
fn from_bytes_checks_sizes() {
    assert!(GgmlMatrix::from_bytes(QuantType::Q4_1, 2, 48, &[0; 40]).is_err());
    assert!(GgmlMatrix::from_bytes(QuantType::Q5_0, 2, 32, &[0; 43]).is_err());
    let w = GgmlMatrix::from_bytes(QuantType::Q5_1, 2, 32, &[0; 48]).unwrap();
    assert_eq!((w.n(), w.k(), w.quant_type()), (2, 32, QuantType::Q5_1));
}
