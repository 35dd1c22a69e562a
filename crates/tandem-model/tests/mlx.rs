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
/// conv as `[C, K, 1]`; also 4-bit in groups of 64), and the Qwen3.5-MoE and Qwen3-Next
/// fixtures at 4 and 8 bits in groups of 32 and 4 bits in groups of 64 (experts stacked as
/// `switch_mlp`; mlx-lm's logits from the f16 values in f32): tandem gives mlx-lm's logits, and
/// reports the MTP head mlx-lm dropped.
#[test]
fn mlx_hybrid_checkpoints_give_mlx_lm_logits() {
    for (name, tol) in [
        ("qwen3_5-f16", 1e-2),
        ("qwen3_5-q8-g32", 1e-2),
        ("qwen3_5-q4-g32", 2e-2),
        // mlx-lm's stacked experts (`switch_mlp`): gate / up 4-bit, down (16 wide, below a
        // group) f16, the routers 8-bit in groups of 64 (its quant predicate).
        ("qwen3_5-q4-g64", 2e-2),
        ("qwen3_5_moe-q4-g32", 3e-2),
        ("qwen3_5_moe-q8-g32", 3e-2),
        ("qwen3_5_moe-q4-g64", 3e-2),
        ("qwen3_next-q4-g32", 3e-2),
        ("qwen3_next-q8-g32", 3e-2),
        ("qwen3_next-q4-g64", 3e-2),
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
    let (got, want) = (mtp_drafts(&grafted, &ids), mtp_drafts(&original, &ids));
    let e = compare_drafts(&got, &want, ids.len() / 2 + 1, 0.05);
    eprintln!("grafted MTP logits against the HF checkpoint's: relative error {e:.2e}");
    assert!(e <= 2e-2, "grafted MTP logits: relative error {e}");
}

/// The MTP head's logits at every position of `ids` after the trunk's forward.
fn mtp_drafts(m: &tandem_model::loader::LoadedModel, ids: &[u32]) -> Vec<Vec<f32>> {
    let model = &*m.model;
    let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
    let mut chunks = [SeqChunk { tokens: ids, cache: &mut cache, logits: LogitsWanted::Last }];
    let (_, hidden) = model.forward_with_hidden(&mut chunks).unwrap();
    let hidden = hidden.unwrap();
    let mtp = model.mtp().expect("MTP head");
    let n = ids.len() - 1;
    let y = mtp.mtp_forward(&hidden.narrow(0, 0, n).unwrap(), &ids[1..], &mut cache, 0).unwrap();
    mtp.mtp_logits(&y).unwrap().to_vec2::<f32>().unwrap()
}

/// Asserts the drafts (argmax) agree wherever `want`'s top two differ by `margin`, at least at
/// `min_clear` positions, and returns the logits' relative error.
fn compare_drafts(got: &[Vec<f32>], want: &[Vec<f32>], min_clear: usize, margin: f32) -> f32 {
    let argmax = |v: &[f32]| v.iter().enumerate().max_by(|x, y| x.1.total_cmp(y.1)).unwrap().0;
    let mut compared = 0;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let mut s = w.clone();
        s.sort_by(|x, y| y.total_cmp(x));
        if s[0] - s[1] > margin {
            assert_eq!(argmax(g), argmax(w), "draft at position {i}");
            compared += 1;
        }
    }
    assert!(compared >= min_clear, "only {compared} positions had a clear draft");
    rel_err(&Tensor::new(got.concat(), &Device::Cpu).unwrap(), &Tensor::new(want.concat(), &Device::Cpu).unwrap())
}

/// Logits of every position of `ids`.
fn logits(m: &tandem_model::loader::LoadedModel, ids: &[u32]) -> Tensor {
    let model = &*m.model;
    let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
    let mut chunks = [SeqChunk { tokens: ids, cache: &mut cache, logits: LogitsWanted::All }];
    model.forward(&mut chunks).unwrap().pop().flatten().unwrap()
}

/// Checkpoints `tandem convert --mlx` wrote (4 bits; the Llama fixture and the tamed hybrids,
/// `scripts/gen_mlx_fixtures.py` with TANDEM_BIN) load in mlx-lm, and tandem's logits on them
/// are mlx-lm's (run in f32 by `scripts/mlx_reference.py`); the hybrids keep their MTP head.
#[test]
fn tandem_written_mlx_checkpoints_give_mlx_lm_logits() {
    for (name, hybrid) in [
        ("tandem-llama-q4-g64", false),
        ("tandem-qwen3_5-q4-g32", true),
        ("tandem-qwen3_5_moe-q4-g32", true),
        ("tandem-qwen3_next-q4-g32", true),
    ] {
        let dir = fixture(name);
        let r = candle_core::safetensors::load(dir.join("mlx_reference.safetensors"), &Device::Cpu).unwrap();
        let ids: Vec<u32> = r["prompt_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect();
        let loaded = tandem_model::loader::load(&dir, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(loaded.model.mtp().is_some(), hybrid, "{name}: the MTP head is kept");
        let e = rel_err(&logits(&loaded, &ids), &r["prompt_logits"]);
        eprintln!("{name}: logits relative error against mlx-lm {e:.2e}");
        assert!(e <= 3e-2, "{name}: relative error {e}");
    }
}

/// `loader::mlx_write` on the tamed Qwen3.5 HF fixture at 4 and 8 bits (groups of 32): the
/// 4-bit checkpoint it writes is the committed one (the same logits, bit for bit); both are no
/// further from the HF checkpoint's logits than mlx-lm's own conversions at those widths, and
/// their MTP heads draft what the HF checkpoint's head drafts.
#[test]
fn mlx_writer_keeps_the_model_and_its_mtp_head() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tamed_hf(tmp.path());
    let original = tandem_model::loader::load(&hf, &Device::Cpu).unwrap();
    let ids: Vec<u32> = (0..48u32).map(|i| 7 + (i * 29) % 360).collect();
    let want = logits(&original, &ids);
    // (bits, mlx-lm's conversion, draft margin, clear drafts, MTP logits bound): 4-bit weights
    // move the trunk's logits by ~7% of their range and the head compounds it.
    for (bits, theirs, margin, clear, mtp_tol) in
        [(4, "qwen3_5-q4-g32", 0.5, 8, 2e-1), (8, "qwen3_5-q8-g32", 0.05, ids.len() / 2 + 1, 2e-2)]
    {
        let out = tmp.path().join(format!("mlx{bits}"));
        let opts = tandem_model::loader::mlx_write::MlxWriteOptions { bits, group: 32 };
        let s = tandem_model::loader::mlx_write::write_mlx(&hf, &out, &opts).unwrap();
        assert!(s.quantised > 20 && s.mtp_tensors > 0, "{s:?}");
        assert!(out.join("mtp.safetensors").is_file() && out.join("model.safetensors.index.json").is_file());
        let written = tandem_model::loader::load(&out, &Device::Cpu).unwrap();
        let got = logits(&written, &ids);
        if bits == 4 {
            let committed = tandem_model::loader::load(&fixture("tandem-qwen3_5-q4-g32"), &Device::Cpu).unwrap();
            assert_eq!(
                got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                logits(&committed, &ids).flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                "the writer's output changed"
            );
        }
        let mlx_lm = tandem_model::loader::load(&fixture(theirs), &Device::Cpu).unwrap();
        let (e, theirs) = (rel_err(&got, &want), rel_err(&logits(&mlx_lm, &ids), &want));
        eprintln!("{bits}-bit MLX against the HF checkpoint, logits relative error: tandem's writer {e:.2e}, mlx-lm's {theirs:.2e}");
        assert!(e <= 1.25 * theirs, "{bits} bits: relative error {e} (mlx-lm's conversion: {theirs})");
        let e = compare_drafts(&mtp_drafts(&written, &ids), &mtp_drafts(&original, &ids), clear, margin);
        eprintln!("{bits}-bit MLX MTP logits against the HF checkpoint's: relative error {e:.2e}");
        assert!(e <= mtp_tol, "{bits} bits: MTP logits relative error {e}");
    }
}

/// Bad writer settings are errors, and an MLX checkpoint is not written again.
#[test]
fn mlx_writer_refuses_bad_settings() {
    let tmp = tempfile::tempdir().unwrap();
    let hf = tamed_hf(tmp.path());
    let w = |bits, group, input: &std::path::Path| {
        let opts = tandem_model::loader::mlx_write::MlxWriteOptions { bits, group };
        tandem_model::loader::mlx_write::write_mlx(input, &tmp.path().join("out"), &opts)
    };
    assert!(w(7, 32, &hf).unwrap_err().to_string().contains("7 / 32"));
    assert!(w(4, 48, &hf).is_err());
    assert!(w(4, 32, &fixture("qwen3_5-q4-g32")).unwrap_err().to_string().contains("already MLX-quantised"));
}

/// `tandem convert` from MLX checkpoints (`loader::mlx_to_hf`: dequantised, mlx-lm's layout
/// undone) to GGUF, unquantised: the GGUF's f32 weights are the MLX values, so tandem's logits
/// on it are mlx-lm's f32 logits on the MLX checkpoint (the tandem-written ones; mlx-lm's own
/// conversion was run in f16), and the MTP head tandem wrote into the MLX checkpoint survives.
#[test]
fn mlx_checkpoints_convert_to_gguf() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, tol, mtp) in [
        ("tandem-qwen3_5-q4-g32", 1e-5, true),
        ("tandem-qwen3_5_moe-q4-g32", 1e-5, true),
        ("tandem-qwen3_next-q4-g32", 1e-5, true),
        ("qwen3_5-q4-g32", 1e-2, false),
    ] {
        let dir = fixture(name);
        let out = tmp.path().join(format!("{name}.gguf"));
        let opts =
            tandem_model::arch::qwen_hybrid::to_gguf::ExportOptions { qwen3next_mtp: true, ..Default::default() };
        tandem_model::arch::qwen_hybrid::to_gguf::export_hf_dir(&dir, &out, &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = candle_core::safetensors::load(dir.join("mlx_reference.safetensors"), &Device::Cpu).unwrap();
        let ids: Vec<u32> = r["prompt_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect();
        let loaded = tandem_model::loader::load(&out, &Device::Cpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(loaded.model.mtp().is_some(), mtp, "{name}: MTP head");
        let e = rel_err(&logits(&loaded, &ids), &r["prompt_logits"]);
        eprintln!("{name} as GGUF: logits relative error against mlx-lm {e:.2e}");
        assert!(e <= tol, "{name}: relative error {e}, bound {tol}");
    }
}
