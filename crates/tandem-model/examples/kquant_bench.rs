//! Decode speed of the K-quant kernels as weight bytes streamed per second: a stack of random
//! `n x k` matrices larger than the caches (so every call reads its weights from memory, as a
//! decode step does), one activation row (or `KB_M` rows) at a time, against candle's
//! `QMatMul` of the same blocks.
//!
//! `cargo run --release --example kquant_bench`; threads from `RAYON_NUM_THREADS`;
//! `KB_TYPES=q4_k,q6_k`, `KB_SHAPE=8960x1536` (n x k), `KB_MB=512` (total weight megabytes),
//! `KB_M=1`, `KB_CANDLE=0` to skip candle's.

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use tandem_model::ops::quant::KQuantMatrix;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::Cpu;
    let (n, k) = std::env::var("KB_SHAPE")
        .ok()
        .and_then(|s| {
            let (a, b) = s.split_once('x')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .unwrap_or((8960usize, 1536usize));
    let m: usize = env("KB_M", 1);
    let total_mb: usize = env("KB_MB", 512);
    let candle = env("KB_CANDLE", 1) != 0;
    let types: Vec<GgmlDType> = std::env::var("KB_TYPES")
        .unwrap_or_else(|_| "q4_k,q6_k".into())
        .split(',')
        .filter_map(|t| match t.trim() {
            "q2_k" => Some(GgmlDType::Q2K),
            "q3_k" => Some(GgmlDType::Q3K),
            "q4_k" => Some(GgmlDType::Q4K),
            "q5_k" => Some(GgmlDType::Q5K),
            "q6_k" => Some(GgmlDType::Q6K),
            _ => None,
        })
        .collect();
    println!("threads {}, [{n} x {k}], {m} row(s)", rayon::current_num_threads());
    let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    for dt in types {
        let w = Tensor::randn(0f32, 0.05, (n, k), &dev)?;
        let q = QTensor::quantize(&w, dt)?;
        let bytes = q.data()?.to_vec();
        let count = (total_mb << 20).div_ceil(bytes.len()).max(2);
        let ours: Vec<KQuantMatrix> =
            (0..count).map(|_| KQuantMatrix::from_bytes(dt, n, k, &bytes)).collect::<Result<_, _>>()?;
        let mut y = vec![0f32; m * n];
        let gbs = |secs: f64| (count * bytes.len()) as f64 / secs / 1e9;
        for _ in 0..env("KB_ROUNDS", 4) {
            let t = Instant::now();
            for w in &ours {
                w.matmul(&xs, m, &mut y);
            }
            let ours_s = t.elapsed().as_secs_f64();
            print!("{dt:?}: ours {:.1} GB/s", gbs(ours_s));
            if candle {
                let theirs: Vec<QMatMul> = (0..count)
                    .map(|_| QMatMul::from_qtensor(QTensor::quantize(&w, dt)?))
                    .collect::<candle_core::Result<_>>()?;
                let t = Instant::now();
                for w in &theirs {
                    std::hint::black_box(w.forward(&x)?);
                }
                print!(", candle {:.1} GB/s", gbs(t.elapsed().as_secs_f64()));
            }
            println!(" ({count} matrices of {:.1} MB)", bytes.len() as f64 / 1e6);
        }
    }
    Ok(())
}
