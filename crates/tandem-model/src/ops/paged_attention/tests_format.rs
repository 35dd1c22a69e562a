//! The kernel on f16, q8_0 and q4_0 pools: bit for bit the f32 kernel run on the decoded
//! pools (a format changes the values the kernel sees, never its arithmetic), hence also the
//! f64 reference on those values; decode rows equal chunk rows in every format; plus the
//! timing of decode at depth per format (ignored).

use half::f16;

use super::format::{F16Rows, F32Rows, Q4Rows, Q8Rows};
use super::kernel::{run, Dims, SEGMENT_KEYS};
use super::reference::paged_attention_reference;
use super::tests_kernel::{builds, on_cpu_ns, rel_err, table, Rng};
use crate::kv::KvDtype;

/// A pool encoded in one format, and the f32 values it decodes to.
struct Pool {
    dtype: KvDtype,
    f16: Vec<f16>,
    bytes: Vec<u8>,
    f32: Vec<f32>,
    decoded: Vec<f32>,
}

impl Pool {
    fn new(dtype: KvDtype, values: Vec<f32>, hd: usize) -> Pool {
        let (mut f16s, mut bytes) = (Vec::new(), Vec::new());
        let decoded = match dtype {
            KvDtype::F32 => values.clone(),
            KvDtype::F16 => {
                f16s = values.iter().map(|&x| f16::from_f32(x)).collect();
                f16s.iter().map(|x| x.to_f32()).collect()
            }
            KvDtype::Q8_0 | KvDtype::Q4_0 => {
                bytes = dtype.quantize_rows(&values, hd).unwrap();
                let mut out = vec![0f32; values.len()];
                let row = dtype.row_elems(hd);
                for (src, dst) in bytes.chunks_exact(row).zip(out.chunks_exact_mut(hd)) {
                    dtype.dequantize_row(src, dst);
                }
                out
            }
        };
        Pool { dtype, f16: f16s, bytes, f32: values, decoded }
    }
}

/// The kernel on pools `k`, `v` in their own format.
fn run_pool(q: &[f32], k: &Pool, v: &Pool, blocks: &[u32], d: Dims, scale: f32, simd: bool) -> Vec<f32> {
    match k.dtype {
        KvDtype::F32 => run::<F32Rows>(q, &k.f32, &v.f32, blocks, d, scale, simd),
        KvDtype::F16 => run::<F16Rows>(q, &k.f16, &v.f16, blocks, d, scale, simd),
        KvDtype::Q8_0 => run::<Q8Rows>(q, &k.bytes, &v.bytes, blocks, d, scale, simd),
        KvDtype::Q4_0 => run::<Q4Rows>(q, &k.bytes, &v.bytes, blocks, d, scale, simd),
    }
}

#[test]
fn formats_equal_the_f32_kernel_on_decoded_values() {
    let mut rng = Rng(0x5eed);
    for dtype in KvDtype::ALL {
        // Decode, GQA 3 and 4, a multi-tile chunk across a segment boundary, blocks of 5.
        for (n_heads, n_kv, hd, t, past, bs) in
            [(9, 3, 64, 1, 700, 16), (8, 2, 128, 1, 40, 16), (4, 4, 32, 37, SEGMENT_KEYS - 20, 5), (6, 2, 64, 3, 0, 16)]
        {
            let d = Dims { n_heads, n_kv, t, hd, past, block_size: bs, window: 0 };
            let len = past + t;
            let n_blocks = len.div_ceil(bs) + 3;
            let rows = n_blocks * bs * n_kv * hd;
            let k = Pool::new(dtype, rng.vec(rows, 2.5), hd);
            let v = Pool::new(dtype, rng.vec(rows, 1.0), hd);
            let q = rng.vec(n_heads * t * hd, 1.0);
            let blocks = table(&mut rng, n_blocks, len, bs);
            let want = paged_attention_reference(&q, &k.decoded, &v.decoded, &blocks, d, 0.15);
            for simd in builds() {
                let got = run_pool(&q, &k, &v, &blocks, d, 0.15, simd);
                let f32_kernel = run::<F32Rows>(&q, &k.decoded, &v.decoded, &blocks, d, 0.15, simd);
                assert!(got == f32_kernel, "{dtype} {d:?} simd={simd}: differs from the f32 kernel");
                let e = rel_err(&got, &want);
                assert!(e < 1e-5, "{dtype} {d:?} simd={simd}: relative error {e}");
            }
        }
    }
}

/// Decoding row by row equals one chunk's rows, bit for bit, in every format.
#[test]
fn decode_rows_equal_chunk_rows_in_every_format() {
    let mut rng = Rng(41);
    let (n_heads, n_kv, hd, bs, len) = (9, 3, 64, 16, SEGMENT_KEYS + 30);
    let n_blocks = len.div_ceil(bs);
    let blocks = table(&mut rng, n_blocks, len, bs);
    let (t, past) = (20, len - 20);
    let q = rng.vec(n_heads * t * hd, 1.0);
    for dtype in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        let k = Pool::new(dtype, rng.vec(n_blocks * bs * n_kv * hd, 2.0), hd);
        let v = Pool::new(dtype, rng.vec(n_blocks * bs * n_kv * hd, 1.0), hd);
        for simd in builds() {
            let whole = run_pool(
                &q,
                &k,
                &v,
                &blocks,
                Dims { n_heads, n_kv, t, hd, past, block_size: bs, window: 0 },
                0.2,
                simd,
            );
            for i in 0..t {
                let qi: Vec<f32> = (0..n_heads).flat_map(|h| q[(h * t + i) * hd..][..hd].to_vec()).collect();
                let d = Dims { n_heads, n_kv, t: 1, hd, past: past + i, block_size: bs, window: 0 };
                let one = run_pool(&qi, &k, &v, &blocks, d, 0.2, simd);
                for h in 0..n_heads {
                    let (a, b) = (&one[h * hd..][..hd], &whole[(h * t + i) * hd..][..hd]);
                    assert_eq!(a, b, "{dtype} row {i} head {h} simd={simd}");
                }
            }
        }
    }
}

/// Timing, not a check: one layer's attention at SmolLM2-135M's shape (9 query heads, 3 KV
/// heads of 64, blocks of 16) at several depths, plain and AVX2 builds: the best wall time and
/// the calling thread's time on CPU per call (the whole cost when `CANDLE_NUM_THREADS=1`, and
/// robust to other load), with the KV bytes read (`cargo test --release -p tandem-model --lib
/// timing_at_depth -- --ignored --nocapture`; `PA_LENS=512,3200` and `PA_T=512` pick contexts
/// and query chunk, `PA_KV=f32,f16,q8_0,q4_0` the cache formats).
#[test]
#[ignore]
fn timing_at_depth() {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    let lens: Vec<usize> = env("PA_LENS", "512,3200,6000").split(',').map(|x| x.parse().unwrap()).collect();
    let dtypes: Vec<KvDtype> = env("PA_KV", "f32,f16,q8_0,q4_0").split(',').map(|x| x.parse().unwrap()).collect();
    let t: usize = env("PA_T", "1").parse().unwrap();
    let mut rng = Rng(3);
    let (n_heads, n_kv, hd, bs) = (9, 3, 64, 16);
    for len in lens {
        let n_blocks = len.div_ceil(bs);
        let (kf, vf) = (rng.vec(n_blocks * bs * n_kv * hd, 1.0), rng.vec(n_blocks * bs * n_kv * hd, 1.0));
        let blocks: Vec<u32> = (0..n_blocks as u32).collect();
        let q = rng.vec(n_heads * t * hd, 1.0);
        let d = Dims { n_heads, n_kv, t, hd, past: len - t, block_size: bs, window: 0 };
        let reps = (400_000 / (len * t)).max(2);
        for &dtype in &dtypes {
            let (k, v) = (Pool::new(dtype, kf.clone(), hd), Pool::new(dtype, vf.clone(), hd));
            for simd in builds() {
                let (mut wall, mut cpu) = (f64::MAX, f64::MAX);
                for _ in 0..5 {
                    let (s, c0) = (std::time::Instant::now(), on_cpu_ns());
                    for _ in 0..reps {
                        std::hint::black_box(run_pool(&q, &k, &v, &blocks, d, 0.125, simd));
                    }
                    cpu = cpu.min((on_cpu_ns() - c0) as f64 / 1e3 / reps as f64);
                    wall = wall.min(s.elapsed().as_secs_f64() * 1e6 / reps as f64);
                }
                let gbs = (2 * len * n_kv * dtype.row_bytes(hd)) as f64 / wall / 1e3;
                eprintln!(
                    "t={t} len={len:>5} {dtype:<4} simd={simd:<5}: wall {wall:>8.1} µs ({gbs:>5.1} GB/s of KV), on CPU \
                     {cpu:>8.1} µs"
                );
            }
        }
    }
}
