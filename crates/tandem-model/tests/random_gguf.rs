//! `random_gguf::export_random`: a random-weight preset written as GGUF (the file tandem and
//! llama.cpp are both measured on) and loaded back through the GGUF path must be the model
//! built in memory: the same logits for a prompt and for decode steps, f32, f16, bf16 and Q8_0 weights,
//! dense (V heads reordered to the tiled order, MTP head as `nextn` blocks) and MoE.

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use tandem_model::arch::qwen_hybrid::gguf::HybridGgufSource;
use tandem_model::arch::qwen_hybrid::random::{preset, random_model};
use tandem_model::arch::qwen_hybrid::random_gguf::export_random;
use tandem_model::arch::qwen_hybrid::{HybridConfig, QwenHybrid};
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::SequenceCache;

fn logits(m: &QwenHybrid, cache: &mut SequenceCache, tokens: &[u32]) -> Vec<f32> {
    let mut chunks = [SeqChunk { tokens, cache, logits: LogitsWanted::Last }];
    let t: Tensor = m.forward(&mut chunks).expect("forward").pop().flatten().expect("logits");
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Prompt logits and three decode steps of `a` and `b`: max |a - b| / max |a|.
fn max_rel_diff(a: &QwenHybrid, b: &QwenHybrid) -> f32 {
    let (mut ca, mut cb) =
        (SequenceCache::new(&a.cache_spec(), &Device::Cpu), SequenceCache::new(&b.cache_spec(), &Device::Cpu));
    let prompt: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % 500).collect();
    let mut worst = 0f32;
    let mut step = prompt.clone();
    for _ in 0..4 {
        let (x, y) = (logits(a, &mut ca, &step), logits(b, &mut cb, &step));
        assert_eq!(x.len(), y.len());
        let scale = x.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let d = x.iter().zip(&y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        worst = worst.max(d / scale);
        let next = x.iter().enumerate().fold((0, f32::MIN), |m, (i, &v)| if v > m.1 { (i, v) } else { m }).0;
        step = vec![next as u32];
    }
    worst
}

fn round_trip(cfg: &HybridConfig, dt: GgmlDType, tol: f32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("random.gguf");
    let mut calls = 0;
    let report = export_random(cfg, dt, &path, |_, _| calls += 1).expect("export");
    assert!(calls > 0 && report.tensors > 0 && report.bytes > 0);
    let src = HybridGgufSource::open(&path, &Device::Cpu).expect("open the written GGUF");
    assert_eq!(src.config.num_layers(), cfg.num_layers());
    assert_eq!(src.config.mtp_layers, cfg.mtp_layers);
    let from_file = QwenHybrid::load(&src.config, &src).expect("load the written GGUF");
    assert_eq!(from_file.mtp().is_some(), cfg.mtp_layers > 0);
    let in_memory = random_model(cfg, dt, &Device::Cpu).expect("random model");
    let d = max_rel_diff(&in_memory, &from_file);
    assert!(
        d <= tol,
        "{} {dt:?}: GGUF logits differ from the in-memory model by {d:e} (tolerance {tol:e})",
        cfg.model_type
    );
}

/// The `tiny` preset as a dense Qwen3.5 model with an MTP head (2 key heads, 4 value heads:
/// the V-head reordering applies).
fn dense_tiny() -> HybridConfig {
    HybridConfig {
        model_type: "qwen3_5_text".into(),
        moe: None,
        intermediate_size: 96,
        mtp_layers: 1,
        ..preset("tiny").unwrap()
    }
}

#[test]
fn dense_preset_round_trips_through_gguf() {
    round_trip(&dense_tiny(), GgmlDType::F32, 1e-5);
    round_trip(&dense_tiny(), GgmlDType::Q8_0, 1e-4);
    // 16-bit matrices stay 16-bit from the file, as in memory (the writer keeps a few small
    // tensors in other types than the in-memory model does, hence not bit for bit).
    round_trip(&dense_tiny(), GgmlDType::F16, 1e-5);
    round_trip(&dense_tiny(), GgmlDType::BF16, 1e-5);
}

/// Q4_K matrices (k a multiple of 256) load from the file as our packed Q4K kernel's matrices
/// on AVX-512 VNNI CPUs, in memory as candle's QMatMul: the same weights, so the same logits
/// but for activation rounding order.
#[test]
fn q4k_preset_round_trips_through_gguf() {
    let cfg = HybridConfig { hidden_size: 256, intermediate_size: 256, ..dense_tiny() };
    round_trip(&cfg, GgmlDType::Q4K, 1e-3);
}

#[test]
fn moe_preset_round_trips_through_gguf() {
    round_trip(&preset("tiny").unwrap(), GgmlDType::F32, 1e-5);
}

#[test]
fn random_weights_do_not_depend_on_the_run() {
    // Two builds of the same preset are the same model (seeded by tensor name).
    let a = random_model(&dense_tiny(), GgmlDType::F32, &Device::Cpu).unwrap();
    let b = random_model(&dense_tiny(), GgmlDType::F32, &Device::Cpu).unwrap();
    assert_eq!(max_rel_diff(&a, &b), 0.0);
}
