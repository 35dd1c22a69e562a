//! `tandem convert` on Llama-family checkpoints (`arch::llama_to_gguf`): the tiny Llama (Llama 3
//! RoPE scaling, tied embeddings), Mistral, Qwen2 (q/k/v biases) and Qwen3 (q/k norms) fixtures
//! written as GGUF give transformers' logits (the fixtures' references) when tandem loads them,
//! as the HF checkpoints do; their tokenizers split text into the same ids; quantised exports
//! load and stay near.

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::SequenceCache;

fn tiny(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny").join(name)
}

/// max |a - b| / max |b|
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    diff / b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-6)
}

fn logits(m: &tandem_model::loader::LoadedModel, ids: &[u32]) -> Tensor {
    let model = &*m.model;
    let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
    let mut chunks = [SeqChunk { tokens: ids, cache: &mut cache, logits: LogitsWanted::All }];
    model.forward(&mut chunks).unwrap().pop().flatten().unwrap()
}

#[test]
fn llama_family_checkpoints_export_to_gguf() {
    let tmp = tempfile::tempdir().unwrap();
    let text = "Hello world! 12345 tokens, and   spaces\nnew lines: café";
    for name in ["llama", "mistral", "qwen2", "qwen3"] {
        let dir = tiny(name);
        let out = tmp.path().join(format!("{name}.gguf"));
        tandem_model::arch::llama_to_gguf::export_llama_dir(&dir, &out, None).unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu).unwrap();
        let ids: Vec<u32> = r["prompt_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect();
        let gguf = tandem_model::loader::load(&out, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        let hf = tandem_model::loader::load(&dir, &Device::Cpu).unwrap();
        let got = logits(&gguf, &ids);
        let e = rel_err(&got, &r["prompt_logits"]);
        let e_hf = rel_err(&logits(&hf, &ids), &r["prompt_logits"]);
        eprintln!("{name} as GGUF: logits relative error against transformers {e:.2e} (the HF checkpoint: {e_hf:.2e})");
        assert!(e <= 1e-4, "{name}: relative error {e}");
        assert_eq!(
            gguf.tokenizer.encode(text, false).unwrap(),
            hf.tokenizer.encode(text, false).unwrap(),
            "{name}: tokenizer"
        );
        let q = tmp.path().join(format!("{name}-q8.gguf"));
        tandem_model::arch::llama_to_gguf::export_llama_dir(&dir, &q, Some(candle_core::quantized::GgmlDType::Q8_0))
            .unwrap();
        let q8 = tandem_model::loader::load(&q, &Device::Cpu).unwrap();
        let e = rel_err(&logits(&q8, &ids), &got);
        eprintln!("{name} as Q8_0 GGUF: logits relative error against the f32 GGUF {e:.2e}");
        assert!(e <= 5e-2, "{name} Q8_0: relative error {e}");
    }
}

/// llama.cpp's q/k permutation: each head's rotate-half pairs (i, i + d/2) become adjacent.
#[test]
fn permute_interleaves_each_heads_halves() {
    let t = Tensor::arange(0f32, 8.0, &Device::Cpu).unwrap().reshape((8, 1)).unwrap();
    let p = tandem_model::arch::llama_to_gguf::permute(&t, 2).unwrap();
    assert_eq!(p.flatten_all().unwrap().to_vec1::<f32>().unwrap(), vec![0., 2., 1., 3., 4., 6., 5., 7.]);
    assert!(tandem_model::arch::llama_to_gguf::permute(&t, 3).is_err());
}
