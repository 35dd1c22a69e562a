//! Speed of the row-invariant dense f32 matmul (`ops::quant::dense`) against candle's own f32
//! matmul, at the random `0.8b` hybrid's shapes (hidden 1024, MLP 3584, vocabulary 248 320).
//!
//! `cargo run --release --example dense_bench`; threads from `RAYON_NUM_THREADS`; `DB_M=1`
//! (or 128) runs only that row count.

use candle_core::quantized::QMatMul;
use candle_core::{Device, Module, Tensor};
use tandem_model::ops::quant::row_stable;

mod common;
use common::time;

fn main() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let only_m: Option<usize> = std::env::var("DB_M").ok().and_then(|v| v.parse().ok());
    println!("threads {}", candle_core::utils::get_num_threads());
    for (n, k) in [(1024, 1024), (3584, 1024), (1024, 3584), (8192, 1024), (248_320, 1024)] {
        let w = QMatMul::Tensor(Tensor::randn(0f32, 0.05, (n, k), &dev)?);
        for m in [1usize, 4, 128].into_iter().filter(|m| only_m.is_none_or(|o| o == *m)) {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
            let ours = time(|| drop(row_stable::forward(&w, &x).unwrap()));
            let candle = time(|| drop(w.forward(&x).unwrap()));
            let gflop = 2.0 * (m * n * k) as f64 / 1e9;
            println!(
                "n={n:6} k={k:5} m={m:4}: ours {:9.1} µs ({:6.1} GFLOP/s)  candle {:9.1} µs ({:6.1} GFLOP/s)",
                ours * 1e6,
                gflop / ours,
                candle * 1e6,
                gflop / candle
            );
        }
    }
    Ok(())
}
