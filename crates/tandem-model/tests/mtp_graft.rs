//! `--mtp-from` (`LoadOptions::mtp_from`, `loader/graft.rs`): a hybrid checkpoint whose MTP
//! head was dropped (as mlx-lm's converter does) reports the head as dropped and has none;
//! grafted from the original checkpoint (HF, or a GGUF of it) its head drafts exactly what the
//! original's does; donors that are not the same kind of model, or have no head, are refused.

use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use tandem_model::arch::qwen_hybrid::to_gguf::{export_hf_dir, ExportOptions};
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::SequenceCache;
use tandem_model::loader::{load_with, LoadOptions, LoadedModel};

fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(path)
}

/// A copy of the qwen3_5 fixture without its `mtp.*` weights (the config still declares the
/// head, as in a converted checkpoint).
fn without_head(tmp: &Path) -> PathBuf {
    let (src, dir) = (fixture("hybrid/qwen3_5"), tmp.join("no-mtp"));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let ts: std::collections::HashMap<String, Tensor> =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)
            .unwrap()
            .into_iter()
            .filter(|(k, _)| !k.starts_with("mtp."))
            .collect();
    candle_core::safetensors::save(&ts, dir.join("model.safetensors")).unwrap();
    dir
}

fn load(path: &Path, mtp_from: Option<&Path>, quantize: Option<&str>) -> tandem_model::Result<LoadedModel> {
    let opts = LoadOptions {
        mtp_from: mtp_from.map(Path::to_path_buf),
        quantize: quantize.map(|q| q.parse().unwrap()),
        ..Default::default()
    };
    load_with(path, &Device::Cpu, &opts)
}

/// The head's logits for the prompt's positions (each drafting the token after the next).
fn mtp_logits(m: &LoadedModel, prompt: &[u32]) -> Tensor {
    let model = &*m.model;
    let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
    let (_, hidden) = {
        let mut chunks = [SeqChunk { tokens: prompt, cache: &mut cache, logits: LogitsWanted::Last }];
        model.forward_with_hidden(&mut chunks).unwrap()
    };
    let hidden = hidden.expect("hidden states");
    let mtp = model.mtp().expect("an MTP head");
    let n = prompt.len() - 1;
    let y = mtp.mtp_forward(&hidden.narrow(0, 0, n).unwrap(), &prompt[1..], &mut cache, 0).unwrap();
    mtp.mtp_logits(&y).unwrap()
}

fn prompt() -> Vec<u32> {
    (0..40u32).map(|i| 5 + (i * 37) % 300).collect()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
}

#[test]
fn a_dropped_head_is_reported_and_grafted_back_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let stripped = without_head(tmp.path());
    let bare = load(&stripped, None, None).unwrap();
    assert!(bare.model.mtp().is_none(), "the stripped checkpoint has no head");
    assert!(bare.summary.architecture.contains("MTP head: dropped"), "{}", bare.summary.architecture);

    let original = load(&fixture("hybrid/qwen3_5"), None, None).unwrap();
    let grafted = load(&stripped, Some(&fixture("hybrid/qwen3_5")), None).unwrap();
    assert!(grafted.summary.architecture.contains("MTP head: grafted from"), "{}", grafted.summary.architecture);
    let p = prompt();
    let want = mtp_logits(&original, &p);
    assert_eq!(bits(&mtp_logits(&grafted, &p)), bits(&want), "grafted from the HF original");

    // From a GGUF of the original (llama.cpp's layout: nextn block, +1 norms undone at load).
    let gguf = tmp.path().join("orig.gguf");
    export_hf_dir(&fixture("hybrid/qwen3_5"), &gguf, &ExportOptions::default()).unwrap();
    let from_gguf = load(&stripped, Some(&gguf), None).unwrap();
    let got = mtp_logits(&from_gguf, &p);
    let (a, b) =
        (got.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let err = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale;
    assert!(err <= 1e-5, "grafted from a GGUF: relative error {err}");

    // Quantised at load, the grafted head is quantised with the rest and still drafts.
    let q = load(&stripped, Some(&fixture("hybrid/qwen3_5")), Some("q8_0")).unwrap();
    assert!(mtp_logits(&q, &p).flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite()));
}

#[test]
fn donors_that_do_not_fit_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let stripped = without_head(tmp.path());
    let err = |r: tandem_model::Result<LoadedModel>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let e = err(load(&stripped, Some(&fixture("tiny/llama")), None));
    assert!(e.contains("not a hybrid"), "{e}");
    let e = err(load(&stripped, Some(&stripped), None));
    assert!(e.contains("no MTP head"), "{e}");
    let e = err(load(&fixture("tiny/llama"), Some(&fixture("hybrid/qwen3_5")), None));
    assert!(e.contains("only those have MTP heads"), "{e}");
}
