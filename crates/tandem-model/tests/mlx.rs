//! MLX-quantised checkpoints (`loader/mlx.rs`): `fixtures/mlx/*`, the tiny Llama fixture
//! converted by mlx-lm's own converter (`scripts/gen_mlx_fixtures.py`: 4 bits in groups of 32
//! and 64, 8 bits in groups of 64, 2, 3, 5 and 6 bits, f16 scales; and the fp modes mxfp4,
//! nvfp4, mxfp8), must give mlx-lm's logits for the reference
//! prompt, and the weights tandem reads must be mlx's own dequantisation of them. mlx-lm runs
//! the f16 model in f16 (activations too), tandem in f32 over the same weight values (8-bit
//! activations in the Q4_1 kernels), so the logits agree to those precisions, not bit for bit.

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::SequenceCache;

/// `fixtures/mlx/NAME`, or `$TANDEM_MLX_FIXTURES/NAME` (`make test-mlx`: converted by mlx-lm
/// during the test run instead of the committed results).
fn fixture(name: &str) -> PathBuf {
    match std::env::var_os("TANDEM_MLX_FIXTURES") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/mlx").join(name),
    }
}

/// max |a - b| / max |b|
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    diff / b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-6)
}

#[test]
fn mlx_checkpoints_give_mlx_lm_logits() {
    for name in [
        "llama-q4-g32",
        "llama-q4-g64",
        "llama-q8-g64",
        "llama-q2-g64",
        "llama-q3-g32",
        "llama-q5-g64",
        "llama-q6-g32",
        "llama-mxfp4",
        "llama-nvfp4",
        "llama-mxfp8",
    ] {
        let dir = fixture(name);
        let r = candle_core::safetensors::load(dir.join("mlx_reference.safetensors"), &Device::Cpu).unwrap();
        let ids: Vec<u32> = r["prompt_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect();
        let loaded = tandem_model::loader::load(&dir, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        let model = &*loaded.model;
        let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
        let mut chunks = [SeqChunk { tokens: &ids, cache: &mut cache, logits: LogitsWanted::All }];
        let got = model.forward(&mut chunks).unwrap().pop().flatten().unwrap();
        let want = &r["prompt_logits"];
        let e = rel_err(&got, want);
        eprintln!("{name}: logits relative error against mlx-lm {e:.2e}");
        // Every width runs on our block kernels (2-4 bits as Q4_1, 5 as Q5_1, 6 and 8 as Q8_0
        // plus group biases), which quantise activations to 8 bits (as ggml's do); mlx-lm runs
        // f16. Measured: 2.7e-2 / 3.0e-2 (4-bit, groups of 32 / 64), 2.5e-2 (8-bit), 2.8e-2 /
        // 2.8e-2 / 2.5e-2 / 2.9e-2 (2, 3, 5, 6 bits); mxfp4 (Q5_0) 2.9e-2, nvfp4 and mxfp8 (bf16
        // matrices, f32 activations) 5.5e-7 and 7.8e-7.
        let tol = 5e-2;
        assert!(e <= tol, "{name}: relative error {e}, bound {tol}");
        // The weights themselves: what tandem reads equals mlx's own dequantisation.
        let src = tandem_model::loader::safetensors::SafetensorsSource::open(&dir, &Device::Cpu).unwrap();
        for (gguf, hf) in
            [("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj"), ("token_embd.weight", "model.embed_tokens")]
        {
            use tandem_model::loader::WeightSource;
            let ours = src.tensor_f32(gguf).unwrap();
            let e = rel_err(&ours, &r[&format!("dequant.{hf}")]);
            assert!(e <= 1e-6, "{name} {hf}: dequantised weights differ from mlx's by {e}");
        }
        // Greedy choices agree at every position where mlx-lm's top two are apart.
        let (g, w) = (got.to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            let mut sorted = b.clone();
            sorted.sort_by(|x, y| y.total_cmp(x));
            let argmax = |v: &[f32]| v.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)).unwrap().0;
            if sorted[0] - sorted[1] > 0.05 {
                assert_eq!(argmax(a), argmax(b), "{name}: greedy token at position {i}");
            }
        }
        assert!(loaded.summary.format.contains("MLX"), "{}", loaded.summary.format);
        // `inspect`: the unpacked parameter count of the model converted, and what each
        // quantised weight runs as.
        let plain = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/llama");
        let plain = tandem_model::loader::load(&plain, &Device::Cpu).unwrap().summary.parameters;
        assert_eq!(loaded.summary.parameters, plain, "{name}");
        let types = &loaded.summary.tensor_types;
        assert!(types.keys().any(|k| k.starts_with("MLX ") && k.contains(" -> ")), "{name}: {types:?}");
    }
}

/// A `quantization` block that disagrees with the tensors, or an unknown mode, is an error
/// naming the tensor (or the mode), never a panic.
#[test]
fn bad_mlx_checkpoints_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixture("llama-q4-g64");
    let copy = |edit: &dyn Fn(&mut serde_json::Value)| -> PathBuf {
        let dir = tmp.path().join(format!("c{}", std::fs::read_dir(tmp.path()).unwrap().count()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in std::fs::read_dir(&src).unwrap().filter_map(|e| e.ok()) {
            std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
        }
        let p = dir.join("config.json");
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(&p, v.to_string()).unwrap();
        dir
    };
    let err = |dir: PathBuf| match tandem_model::loader::load(&dir, &Device::Cpu) {
        Ok(_) => panic!("{}: loaded", dir.display()),
        Err(e) => e.to_string(),
    };
    let e = err(copy(&|v| v["quantization"]["bits"] = 8.into()));
    assert!(e.contains("model.embed_tokens") || e.contains("model.layers"), "{e}");
    let e = err(copy(&|v| v["quantization"]["group_size"] = 32.into()));
    assert!(e.contains("do not fit"), "{e}");
    let e = err(copy(&|v| v["quantization"]["mode"] = "mxfp4".into()));
    assert!(e.contains("mxfp4"), "{e}");
    let e = err(copy(&|v| v["quantization"]["bits"] = 7.into()));
    assert!(e.contains("7 bits"), "{e}");
}

/// The Qwen3.5 hybrid fixture, tamed (linear weights x0.2) and converted by mlx-lm (f16, 8-bit
/// and 4-bit in groups of 32; its layout: `language_model.model.*`, norms stored as 1 + w, the
/// conv as `[C, K, 1]`), and the Qwen3.5-MoE and Qwen3-Next fixtures at 4 bits (experts stacked
/// as `switch_mlp`; mlx-lm's logits from the f16 values in f32): tandem gives mlx-lm's logits,
/// and reports the MTP head mlx-lm dropped.
#[test]
fn mlx_hybrid_checkpoints_give_mlx_lm_logits() {
    for (name, tol) in [
        ("qwen3_5-f16", 1e-2),
        ("qwen3_5-q8-g32", 1e-2),
        ("qwen3_5-q4-g32", 2e-2),
        // mlx-lm's stacked experts (`switch_mlp`): gate / up 4-bit, down (16 wide, below a
        // group) f16, the routers 8-bit in groups of 64 (its quant predicate).
        ("qwen3_5_moe-q4-g32", 3e-2),
        ("qwen3_next-q4-g32", 3e-2),
    ] {
        let dir = fixture(name);
        let r = candle_core::safetensors::load(dir.join("mlx_reference.safetensors"), &Device::Cpu).unwrap();
        let ids: Vec<u32> = r["prompt_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect();
        let loaded = tandem_model::loader::load(&dir, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(loaded.model.mtp().is_none(), "{name}: mlx-lm dropped the head");
        assert!(loaded.summary.architecture.contains("MTP head: dropped"), "{}", loaded.summary.architecture);
        let model = &*loaded.model;
        let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
        let mut chunks = [SeqChunk { tokens: &ids, cache: &mut cache, logits: LogitsWanted::All }];
        let got = model.forward(&mut chunks).unwrap().pop().flatten().unwrap();
        let e = rel_err(&got, &r["prompt_logits"]);
        eprintln!("{name}: logits relative error against mlx-lm {e:.2e}");
        assert!(e <= tol, "{name}: relative error {e}, bound {tol}");
    }
}

/// The tamed Qwen3.5 HF fixture (what the MLX fixtures were converted from), rebuilt here.
fn tamed_hf(tmp: &std::path::Path) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hybrid/qwen3_5");
    let dir = tmp.join("qwen3_5-tamed");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let ts: std::collections::HashMap<String, Tensor> =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)
            .unwrap()
            .into_iter()
            .map(|(k, v)| {
                let linear =
                    v.rank() >= 2 && !k.contains("conv1d") && !k.contains("embed_tokens") && !k.contains("lm_head");
                (k, if linear { v.affine(0.2, 0.0).unwrap() } else { v })
            })
            .collect();
    candle_core::safetensors::save(&ts, dir.join("model.safetensors")).unwrap();
    dir
}

/// The MLX checkpoint that lost its MTP head, grafted with the HF checkpoint's head
/// (`--mtp-from`), drafts what the HF checkpoint drafts.
#[test]
fn mlx_hybrid_with_grafted_head_drafts_like_the_hf_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tamed_hf(tmp.path());
    let opts = tandem_model::loader::LoadOptions { mtp_from: Some(hf.clone()), ..Default::default() };
    let grafted = tandem_model::loader::load_with(&fixture("qwen3_5-f16"), &Device::Cpu, &opts).unwrap();
    let original = tandem_model::loader::load(&hf, &Device::Cpu).unwrap();
    let ids: Vec<u32> = (0..48u32).map(|i| 7 + (i * 29) % 360).collect();
    let drafts = |m: &tandem_model::loader::LoadedModel| -> Vec<Vec<f32>> {
        let model = &*m.model;
        let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
        let mut chunks = [SeqChunk { tokens: &ids, cache: &mut cache, logits: LogitsWanted::Last }];
        let (_, hidden) = model.forward_with_hidden(&mut chunks).unwrap();
        let hidden = hidden.unwrap();
        let mtp = model.mtp().expect("MTP head");
        let n = ids.len() - 1;
        let y = mtp.mtp_forward(&hidden.narrow(0, 0, n).unwrap(), &ids[1..], &mut cache, 0).unwrap();
        mtp.mtp_logits(&y).unwrap().to_vec2::<f32>().unwrap()
    };
    let (got, want) = (drafts(&grafted), drafts(&original));
    let argmax = |v: &[f32]| v.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)).unwrap().0;
    let mut compared = 0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let mut s = w.clone();
        s.sort_by(|x, y| y.total_cmp(x));
        if s[0] - s[1] > 0.05 {
            assert_eq!(argmax(g), argmax(w), "draft at position {i}");
            compared += 1;
        }
    }
    assert!(compared > ids.len() / 2, "only {compared} positions had a clear draft");
    let e =
        rel_err(&Tensor::new(got.concat(), &Device::Cpu).unwrap(), &Tensor::new(want.concat(), &Device::Cpu).unwrap());
    eprintln!("grafted MTP logits against the HF checkpoint's: relative error {e:.2e}");
    assert!(e <= 2e-2, "grafted MTP logits: relative error {e}");
}
