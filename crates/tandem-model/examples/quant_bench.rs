//! Speed of the Q4_1/Q5_0/Q5_1 matmul (ours vs candle's `QMatMul`) at SmolLM2-135M shapes,
//! and optionally of a whole model (prefill and decode, as `tandem bench` measures them).
//!
//! `cargo run --example quant_bench [-- MODEL.gguf [PROMPT_TOKENS GEN_TOKENS]]`; threads from
//! `RAYON_NUM_THREADS`, `TANDEM_QUANT_KERNEL=reference|candle` to compare; `QB_M=1` (or 512)
//! runs only that row count, `QB_CANDLE=0` skips candle's matmul, `QB_SHAPES=896x896,4864x896`
//! (n x k) and `QB_TYPES=q5_0,q8_0` pick other shapes and types.

use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::SequenceCache;
use tandem_model::ops::quant::GgmlMatrix;

mod common;
use common::time;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::Cpu;
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("threads {}", rayon::current_num_threads());
    let shapes: Vec<(usize, usize)> = match std::env::var("QB_SHAPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|s| s.split_once('x'))
            .filter_map(|(n, k)| Some((n.trim().parse().ok()?, k.trim().parse().ok()?)))
            .collect(),
        Err(_) => vec![(576, 576), (1536, 576), (576, 1536)],
    };
    let types: Vec<GgmlDType> = match std::env::var("QB_TYPES") {
        Ok(v) => v
            .split(',')
            .filter_map(|t| match t.trim().to_ascii_lowercase().as_str() {
                "q4_1" => Some(GgmlDType::Q4_1),
                "q5_0" => Some(GgmlDType::Q5_0),
                "q5_1" => Some(GgmlDType::Q5_1),
                "q8_0" => Some(GgmlDType::Q8_0),
                _ => None,
            })
            .collect(),
        Err(_) => vec![GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q5_1],
    };
    for &ty in &types {
        for &(n, k) in &shapes {
            let w = Tensor::randn(0f32, 0.05, (n, k), &dev)?;
            let q = QTensor::quantize(&w, ty)?;
            let ours = GgmlMatrix::from_qtensor(&q)?.expect("supported");
            let theirs = QMatMul::from_qtensor(q)?;
            let only_m: Option<usize> = std::env::var("QB_M").ok().and_then(|v| v.parse().ok());
            let with_candle = std::env::var("QB_CANDLE").map_or(true, |v| v != "0");
            for m in [1usize, 512].into_iter().filter(|m| only_m.is_none_or(|o| o == *m)) {
                let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
                let t_ours = time(|| drop(ours.forward(&x).unwrap()));
                let t_candle =
                    if m == 1 && with_candle { time(|| drop(theirs.forward(&x).unwrap())) } else { f64::NAN };
                let gmac = (m * n * k) as f64 / 1e9;
                println!(
                    "{ty:?} n={n:5} k={k:5} m={m:4}: ours {:8.1} µs ({:5.1} GMAC/s)  candle {:8.1} µs",
                    t_ours * 1e6,
                    gmac / t_ours,
                    t_candle * 1e6
                );
            }
        }
    }
    if let Some(path) = args.first() {
        let pp: usize = args.get(1).map_or(Ok(512), |s| s.parse())?;
        let tg: usize = args.get(2).map_or(Ok(128), |s| s.parse())?;
        let model = tandem_model::loader::load(std::path::Path::new(path), &dev)?.model;
        let vocab = model.vocab_size() as u32;
        let prompt: Vec<u32> = (0..pp as u32).map(|i| 100 + (i * 7919 + 13) % (vocab - 200)).collect();
        let mut cache = SequenceCache::new(&model.cache_spec(), &dev);
        let t = Instant::now();
        model.forward(&mut [SeqChunk { tokens: &prompt, cache: &mut cache, logits: LogitsWanted::Last }])?;
        let pp_s = t.elapsed().as_secs_f64();
        let mut cache = SequenceCache::new(&model.cache_spec(), &dev);
        let t = Instant::now();
        for _ in 0..tg {
            let out = model.forward(&mut [SeqChunk { tokens: &[1], cache: &mut cache, logits: LogitsWanted::Last }])?;
            let _ = out.into_iter().next().flatten().expect("logits").flatten_all()?.to_vec1::<f32>()?;
        }
        let tg_s = t.elapsed().as_secs_f64();
        println!("pp{pp}: {:.1} tok/s   tg{tg}: {:.1} tok/s", pp as f64 / pp_s, tg as f64 / tg_s);
    }
    Ok(())
}
