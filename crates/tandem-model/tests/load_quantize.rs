//! Load-time quantisation (`--quantize`, `loader::LoadOptions`): the fixtures loaded from
//! safetensors and from GGUF with their weights quantised on the way in.
//!
//! - Exact: a hybrid GGUF holding f32 weights, quantised to Q8_0 at load, gives bit for bit the
//!   logits of the same checkpoint written as a Q8_0 GGUF by the exporter (the same blocks, the
//!   same kernels).
//! - Close: HF safetensors (Llama family and the hybrid) quantised at load stay within the
//!   stated error of the transformers reference logits, and are not the unquantised bits.

use std::path::PathBuf;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use tandem_model::arch::qwen_hybrid::to_gguf::{export_hf_dir, ExportOptions};
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::SequenceCache;
use tandem_model::loader::{load_with, LoadOptions};

fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(path)
}

fn opts(q: Option<&str>) -> LoadOptions {
    LoadOptions { quantize: q.map(|q| q.parse().expect("type")), ..Default::default() }
}

fn reference(path: &str) -> (Vec<u32>, Tensor) {
    let r = candle_core::safetensors::load(fixture(path).join("reference.safetensors"), &Device::Cpu).unwrap();
    let ids = r["prompt_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect();
    (ids, r["prompt_logits"].clone())
}

fn prompt_logits(model: &dyn CausalLm, prompt: &[u32]) -> Tensor {
    let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
    let mut chunks = [SeqChunk { tokens: prompt, cache: &mut cache, logits: LogitsWanted::All }];
    model.forward(&mut chunks).unwrap().pop().flatten().unwrap()
}

/// max |a - b| / max |b|
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    diff / b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-6)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
}

#[test]
fn gguf_quantised_at_load_equals_the_quantised_gguf() {
    let tmp = tempfile::tempdir().unwrap();
    let (f32_file, q8_file) = (tmp.path().join("f32.gguf"), tmp.path().join("q8.gguf"));
    export_hf_dir(&fixture("hybrid/qwen3_5"), &f32_file, &ExportOptions::default()).unwrap();
    let q8 = ExportOptions { quantize: Some(GgmlDType::Q8_0), ..Default::default() };
    export_hf_dir(&fixture("hybrid/qwen3_5"), &q8_file, &q8).unwrap();
    let (prompt, _) = reference("hybrid/qwen3_5");
    let at_load = load_with(&f32_file, &Device::Cpu, &opts(Some("q8_0"))).unwrap();
    assert_eq!(at_load.summary.quantized_at_load.as_deref(), Some("q8_0"));
    let stored = load_with(&q8_file, &Device::Cpu, &opts(None)).unwrap();
    let plain = load_with(&f32_file, &Device::Cpu, &opts(None)).unwrap();
    let got = prompt_logits(&*at_load.model, &prompt);
    assert_eq!(bits(&got), bits(&prompt_logits(&*stored.model, &prompt)), "the Q8_0 GGUF's bits");
    assert_ne!(bits(&got), bits(&prompt_logits(&*plain.model, &prompt)), "quantised at all");
}

/// A copy of fixture `path` with every linear weight (not the embeddings, not the conv) scaled
/// by `s`: the random fixtures are chaotic (Q8_0 rounding alone moves the hybrids' logits by
/// 20-60 %, see `hybrid_gguf.rs`); scaled down they behave like trained models, so quantisation
/// noise stays small while a wiring mistake would still be O(1).
fn tamed_copy(tmp: &std::path::Path, path: &str, s: f64) -> PathBuf {
    let (src, dir) = (fixture(path), tmp.join(path.replace('/', "-")));
    std::fs::create_dir_all(&dir).unwrap();
    for f in std::fs::read_dir(&src).unwrap().filter_map(|e| e.ok()) {
        let name = f.file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            std::fs::copy(f.path(), dir.join(&name)).unwrap();
        }
    }
    let ts: std::collections::HashMap<String, Tensor> =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)
            .unwrap()
            .into_iter()
            .map(|(k, v)| {
                let linear =
                    v.rank() >= 2 && !k.contains("conv1d") && !k.contains("embed_tokens") && !k.contains("lm_head");
                (k, if linear { v.affine(s, 0.0).unwrap() } else { v })
            })
            .collect();
    candle_core::safetensors::save(&ts, dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn safetensors_quantised_at_load_stay_close() {
    // (fixture, type, bound on the relative error of the prompt logits against the f32 load
    // of the same weights). The fixtures' rows (64 values) fit no K-quant, so q4_k takes
    // Q8_0 for them (the same bits as q8_0).
    let tmp = tempfile::tempdir().unwrap();
    for (path, q, tol) in [
        ("tiny/llama", "q8_0", 3e-2),
        ("tiny/qwen3", "q8_0", 3e-2),
        ("tiny/llama", "q4_0", 0.1),
        ("tiny/llama", "q4_k", 2e-2),
        ("hybrid/qwen3_5", "q8_0", 3e-2),
        ("hybrid/qwen3_5_moe", "q8_0", 3e-2),
        ("hybrid/qwen3_next", "q8_0", 3e-2),
        ("hybrid/qwen3_5", "q5_0", 0.1),
    ] {
        let dir = tamed_copy(tmp.path(), path, 0.2);
        let (prompt, _) = reference(path);
        let plain = load_with(&dir, &Device::Cpu, &opts(None)).unwrap();
        let quant = load_with(&dir, &Device::Cpu, &opts(Some(q))).unwrap();
        let (got, want) = (prompt_logits(&*quant.model, &prompt), prompt_logits(&*plain.model, &prompt));
        let e = rel_err(&got, &want);
        eprintln!("{path} {q} (weights x0.2): prompt logits relative error {e:.2e}");
        assert!(e > 0.0 && e <= tol, "{path} {q}: relative error {e}, bound {tol}");
        let last = |t: &Tensor| t.get(prompt.len() - 1).unwrap().argmax(0).unwrap().to_scalar::<u32>().unwrap();
        assert_eq!(last(&got), last(&want), "{path} {q}: first greedy token");
    }
}

/// Speculation stays lossless on weights quantised at load: a 5-token verify chunk gives
/// each row the bits of decoding those tokens one at a time.
#[test]
fn quantised_at_load_rows_are_invariant() {
    for (path, q) in [("tiny/llama", "q8_0"), ("tiny/llama", "q4_0"), ("tiny/qwen2", "q5_0"), ("tiny/llama", "q4_1")] {
        let model = load_with(&fixture(path), &Device::Cpu, &opts(Some(q))).unwrap().model;
        let prefix: Vec<u32> = (0..8u32).map(|i| 10 + i * 13).collect();
        let chunk: Vec<u32> = vec![41, 7, 99, 3, 250];
        let run = |tokens: &[u32], cache: &mut SequenceCache, logits| {
            let mut chunks = [SeqChunk { tokens, cache, logits }];
            model.forward(&mut chunks).unwrap().pop().flatten()
        };
        let mut a = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
        run(&prefix, &mut a, LogitsWanted::Last);
        let together = run(&chunk, &mut a, LogitsWanted::All).unwrap();
        let mut b = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
        run(&prefix, &mut b, LogitsWanted::Last);
        for (i, &t) in chunk.iter().enumerate() {
            let alone = run(&[t], &mut b, LogitsWanted::Last).unwrap();
            assert_eq!(bits(&alone), bits(&together.get(i).unwrap()), "{path} {q}: row {i}");
        }
    }
}
