//! 16-bit Hugging Face checkpoints keep their matrices 16-bit on the CPU: a bf16 (or f16) copy
//! of a fixture gives logits bit for bit equal to an f32 copy holding the same values widened
//! (the dense kernels read 16-bit rows and widen them exactly), for a prompt and decode steps,
//! on a Llama-family and a hybrid fixture.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::SequenceCache;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(rel)
}

/// A copy of `src` with every 2-D weight rounded to `dt`; `widen`: stored back as f32.
fn copy_as(src: &Path, dst: &Path, dt: DType, widen: bool) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name == "model.safetensors" {
            let ts = candle_core::safetensors::load(&p, &Device::Cpu).unwrap();
            let out: HashMap<String, Tensor> = ts
                .into_iter()
                .map(|(k, t)| {
                    let t = if t.rank() == 2 && t.dtype() == DType::F32 {
                        let r = t.to_dtype(dt).unwrap();
                        if widen {
                            r.to_dtype(DType::F32).unwrap()
                        } else {
                            r
                        }
                    } else {
                        t
                    };
                    (k, t)
                })
                .collect();
            candle_core::safetensors::save(&out, dst.join(&name)).unwrap();
        } else if p.is_file() && name != "reference.safetensors" {
            std::fs::copy(&p, dst.join(&name)).unwrap();
        }
    }
}

/// Logits of the prompt's last position and of `steps` greedy decode steps, as bits.
fn run(model: &dyn CausalLm, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
    let mut bits = Vec::new();
    let mut tokens = prompt.to_vec();
    for _ in 0..=steps {
        let mut chunks = [SeqChunk { tokens: &tokens, cache: &mut cache, logits: LogitsWanted::Last }];
        let l = model.forward(&mut chunks).unwrap().remove(0).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        bits.extend(l.iter().map(|v| v.to_bits()));
        let next = l.iter().enumerate().fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0;
        tokens = vec![next as u32];
    }
    bits
}

fn check(rel: &str, dt: DType) {
    let dir = tempfile::tempdir().unwrap();
    let (narrow, wide) = (dir.path().join("narrow"), dir.path().join("wide"));
    copy_as(&fixture(rel), &narrow, dt, false);
    copy_as(&fixture(rel), &wide, dt, true);
    let a = tandem_model::loader::load(&narrow, &Device::Cpu).unwrap();
    let b = tandem_model::loader::load(&wide, &Device::Cpu).unwrap();
    let prompt: Vec<u32> = (0..11).map(|i| 3 + (i * 7) % 50).collect();
    let (x, y) = (run(a.model.as_ref(), &prompt, 4), run(b.model.as_ref(), &prompt, 4));
    assert_eq!(x.len(), y.len());
    let differ = x.iter().zip(&y).filter(|(p, q)| p != q).count();
    assert_eq!(differ, 0, "{rel} as {dt:?}: {differ} of {} logits differ from the widened f32 copy", x.len());
}

#[test]
fn bf16_llama_equals_its_f32_widening() {
    check("tiny/llama", DType::BF16);
}

#[test]
fn f16_llama_equals_its_f32_widening() {
    check("tiny/llama", DType::F16);
}

#[test]
fn bf16_hybrid_equals_its_f32_widening() {
    check("hybrid/qwen3_5", DType::BF16);
}
