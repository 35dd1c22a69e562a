//! The GGUF path of the hybrid models: the `fixtures/hybrid` checkpoints are converted with our
//! own writer (`arch::qwen_hybrid::to_gguf`, llama.cpp's transforms: +1 norms, ssm_a =
//! −exp(A_log), squeezed conv, de-interleaved qkvz, tiled V heads for qwen35*, nextn MTP
//! blocks, gpt2 tokenizer metadata) into a temporary directory, loaded back, and must give the
//! transformers reference logits (f32: 1e-4 for the prompt, every decode step and the MTP head;
//! Q8_0 weights: close, same first greedy token).

use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use tandem_model::arch::qwen_hybrid::gguf::HybridGgufSource;
use tandem_model::arch::qwen_hybrid::to_gguf::{export_hf_dir, ExportOptions};
use tandem_model::arch::qwen_hybrid::QwenHybrid;
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::{KvBuffer, SequenceCache};

const VARIANTS: [&str; 3] = ["qwen3_next", "qwen3_5", "qwen3_5_moe"];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hybrid").join(name)
}

fn export(tmp: &Path, name: &str, opts: &ExportOptions) -> PathBuf {
    let out = tmp.join(format!("{name}-{}.gguf", rand_tag(opts)));
    export_hf_dir(&fixture(name), &out, opts).expect("export");
    out
}

fn rand_tag(o: &ExportOptions) -> String {
    format!("{:?}{}{}{}", o.quantize, o.fused_gate_up as u8, o.qwen3next_mtp as u8, o.legacy_ssm_in as u8)
}

fn load(path: &Path) -> QwenHybrid {
    let src = HybridGgufSource::open(path, &Device::Cpu).expect("open gguf");
    QwenHybrid::load(&src.config, &src).expect("load gguf")
}

struct Reference {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    margins: Vec<f32>,
    r: std::collections::HashMap<String, Tensor>,
}

fn reference(name: &str) -> Reference {
    let r =
        candle_core::safetensors::load(fixture(name).join("reference.safetensors"), &Device::Cpu).expect("reference");
    let ids = |k: &str| r[k].to_vec1::<i64>().expect("ids").into_iter().map(|x| x as u32).collect::<Vec<_>>();
    Reference {
        prompt: ids("prompt_ids"),
        greedy: ids("greedy_ids"),
        margins: r["margins"].to_vec1::<f32>().unwrap(),
        r,
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

fn fwd(m: &QwenHybrid, cache: &mut SequenceCache, tokens: &[u32], logits: LogitsWanted) -> Tensor {
    let mut chunks = [SeqChunk { tokens, cache, logits }];
    m.forward(&mut chunks).expect("forward").pop().flatten().expect("logits")
}

fn argmax(t: &Tensor) -> u32 {
    t.flatten_all().unwrap().argmax(0).unwrap().to_scalar::<u32>().unwrap()
}

/// Prompt and decode logits against the reference, within `tol`; greedy tokens must agree
/// wherever the reference margin is clear.
fn check_logits(m: &QwenHybrid, name: &str, what: &str, tol: f32) {
    let r = reference(name);
    let mut cache = SequenceCache::new(&m.cache_spec(), &Device::Cpu);
    let logits = fwd(m, &mut cache, &r.prompt, LogitsWanted::All);
    let e = rel_err(&logits, &r.r["prompt_logits"]);
    eprintln!("{name} {what}: prompt logits relative error {e:.2e}");
    assert!(e <= tol, "{name} {what}: prompt logits relative error {e}");
    let mut last = logits.narrow(0, r.prompt.len() - 1, 1).unwrap();
    let mut agree = true;
    for (i, &tok) in r.greedy.iter().enumerate() {
        let e = rel_err(&last, &r.r["decode_logits"].narrow(0, i, 1).unwrap());
        assert!(e <= tol, "{name} {what}: decode step {i} relative error {e}");
        agree &= r.margins[i] >= 1e-3;
        if agree {
            assert_eq!(argmax(&last), tok, "{name} {what}: greedy token at step {i}");
        }
        last = fwd(m, &mut cache, &[tok], LogitsWanted::Last);
    }
}

fn check_mtp(m: &QwenHybrid, name: &str, what: &str) {
    let r = reference(name);
    let mtp = m.mtp().unwrap_or_else(|| panic!("{name} {what}: no MTP head"));
    let t = r.prompt.len();
    let mut cache = SequenceCache::new(&m.cache_spec(), &Device::Cpu);
    let hidden = {
        let mut chunks = [SeqChunk { tokens: &r.prompt, cache: &mut cache, logits: LogitsWanted::All }];
        m.forward_hidden(&mut chunks).unwrap()
    };
    let mut next: Vec<u32> = r.prompt[1..].to_vec();
    next.push(r.greedy[0]);
    let mut kv = KvBuffer::new(m.config().num_kv_heads, m.config().head_dim);
    let (logits, _) = mtp.forward(m, &hidden, &next, &mut kv).unwrap();
    let start = r.r["mtp_tail_start"].to_vec1::<i64>().unwrap()[0] as usize;
    let e = rel_err(&logits.narrow(0, start, t - start).unwrap(), &r.r["mtp_logits_tail"]);
    eprintln!("{name} {what}: MTP logits relative error {e:.2e}");
    assert!(e <= 1e-4, "{name} {what}: MTP logits relative error {e}");
    let mut kv = KvBuffer::new(m.config().num_kv_heads, m.config().head_dim);
    mtp.forward(m, &hidden.narrow(0, 0, t - 1).unwrap(), &next[..t - 1], &mut kv).unwrap();
    let d = mtp.draft(m, &hidden.narrow(0, t - 1, 1).unwrap(), &next[t - 1..], &mut kv, 2).unwrap();
    let want: Vec<u32> = r.r["mtp_draft_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect();
    assert!(rel_err(&d.logits, &r.r["mtp_draft_logits"]) <= 1e-4, "{name} {what}: draft logits");
    assert_eq!(d.tokens, want, "{name} {what}: drafted tokens");
}

#[test]
fn f32_gguf_matches_transformers_with_mtp() {
    let tmp = tempfile::tempdir().unwrap();
    for name in VARIANTS {
        let path = export(tmp.path(), name, &ExportOptions::default());
        let m = load(&path);
        check_logits(&m, name, "gguf f32", 1e-4);
        if name == "qwen3_next" {
            // llama.cpp's converter drops Qwen3-Next's MTP head; so does ours by default.
            assert!(m.mtp().is_none());
        } else {
            check_mtp(&m, name, "gguf f32");
        }
    }
}

#[test]
fn gguf_layout_options_load_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    // Qwen3-Next with its MTP head kept as nextn blocks, and with the legacy grouped ssm_in.
    let o = ExportOptions { qwen3next_mtp: true, legacy_ssm_in: true, ..Default::default() };
    let m = load(&export(tmp.path(), "qwen3_next", &o));
    check_logits(&m, "qwen3_next", "gguf ssm_in + nextn", 1e-4);
    check_mtp(&m, "qwen3_next", "gguf ssm_in + nextn");
    // Qwen3.5-MoE with fused ffn_gate_up_exps.
    let o = ExportOptions { fused_gate_up: true, ..Default::default() };
    let m = load(&export(tmp.path(), "qwen3_5_moe", &o));
    check_logits(&m, "qwen3_5_moe", "gguf gate_up_exps", 1e-4);
    check_mtp(&m, "qwen3_5_moe", "gguf gate_up_exps");
}

#[test]
fn tiled_v_heads_are_undone() {
    // The fixtures have nk = 2, nv = 4: reading a qwen35 GGUF as if its V heads were grouped
    // must give clearly wrong logits, which shows the reordering is real and undone.
    let tmp = tempfile::tempdir().unwrap();
    let path = export(tmp.path(), "qwen3_5", &ExportOptions::default());
    let mut src = HybridGgufSource::open(&path, &Device::Cpu).unwrap();
    assert!(src.config.v_heads_tiled);
    src.config.v_heads_tiled = false;
    let wrong = QwenHybrid::load(&src.config, &src).unwrap();
    let r = reference("qwen3_5");
    let logits = fwd(&wrong, &mut SequenceCache::new(&wrong.cache_spec(), &Device::Cpu), &r.prompt, LogitsWanted::All);
    let e = rel_err(&logits, &r.r["prompt_logits"]);
    assert!(e > 1e-2, "ignoring the V-head order should break the model (error {e})");
}

/// A copy of fixture `name` with every linear weight (not the embeddings) scaled by `s`. The
/// fixtures' random weights (initializer_range 0.15) make them chaotic: Q8_0 rounding alone
/// (weights dequantised back to f32) already moves their logits by 20-60 % over the prompt.
/// Scaled down they behave like trained models (the residual stream dominates), so Q8_0 noise
/// stays small while any wiring mistake in the quantised path would still be O(1).
fn tamed_copy(tmp: &Path, name: &str, s: f64) -> PathBuf {
    let (src, dir) = (fixture(name), tmp.join(format!("tamed-{name}")));
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
                let v = if linear { v.affine(s, 0.0).unwrap() } else { v };
                (k, v)
            })
            .collect();
    candle_core::safetensors::save(&ts, dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn q8_0_gguf_stays_quantised_and_close() {
    let tmp = tempfile::tempdir().unwrap();
    for name in VARIANTS {
        let dir = tamed_copy(tmp.path(), name, 0.2);
        let (fp, qp) = (tmp.path().join(format!("{name}-f32.gguf")), tmp.path().join(format!("{name}-q8.gguf")));
        export_hf_dir(&dir, &fp, &ExportOptions::default()).unwrap();
        export_hf_dir(&dir, &qp, &ExportOptions { quantize: Some(GgmlDType::Q8_0), ..Default::default() }).unwrap();
        let src = HybridGgufSource::open(&qp, &Device::Cpu).unwrap();
        let types = src.summary(&qp).tensor_types;
        assert!(types.get("Q8_0").copied().unwrap_or(0) >= 20, "{name}: tensor types {types:?}");
        let q_model = QwenHybrid::load(&src.config, &src).unwrap();
        let f_model = load(&fp);
        let prompt = reference(name).prompt;
        let run =
            |m: &QwenHybrid| fwd(m, &mut SequenceCache::new(&m.cache_spec(), &Device::Cpu), &prompt, LogitsWanted::All);
        let (q, f) = (run(&q_model), run(&f_model));
        let e = rel_err(&q, &f);
        eprintln!("{name} (weights x0.2): Q8_0 vs f32 prompt logits relative error {e:.2e}");
        assert!(e > 0.0 && e < 5e-2, "{name}: Q8_0 relative error {e}");
        let last = |t: &Tensor| argmax(&t.narrow(0, prompt.len() - 1, 1).unwrap());
        assert_eq!(last(&q), last(&f), "{name}: first greedy token with Q8_0 weights");
        // Decoding from the quantised prefill keeps going through the quantised kernels.
        let mut cache = SequenceCache::new(&q_model.cache_spec(), &Device::Cpu);
        fwd(&q_model, &mut cache, &prompt, LogitsWanted::Last);
        let step = fwd(&q_model, &mut cache, &[last(&q)], LogitsWanted::Last);
        assert!(step.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|x| x.is_finite()));
    }
}

#[test]
fn gguf_tokenizer_summary_and_generic_loader() {
    let tmp = tempfile::tempdir().unwrap();
    let path = export(tmp.path(), "qwen3_5_moe", &ExportOptions::default());
    let s = tandem_model::loader::summarize(&path).unwrap();
    assert_eq!((s.format.as_str(), s.num_layers, s.hidden_size, s.vocab_size), ("gguf", 4, 64, 384));
    assert!(s.architecture.contains("qwen35moe") && s.architecture.contains("GGAG"), "{}", s.architecture);
    assert!(s.architecture.contains("MTP head: yes"), "{}", s.architecture);
    assert!(s.chat_template.as_deref().is_some_and(|t| t.contains("<|im_start|>")));
    let loaded = tandem_model::loader::load(&path, &Device::Cpu).unwrap();
    let hf = tandem_model::tokenizer::Tokenizer::from_hf_dir(&fixture("qwen3_5_moe")).unwrap();
    for text in ["Hello world, this is a test.", "  spaces\tand\nnewlines 12345 ", "<|im_start|>user\nhi<|im_end|>"] {
        assert_eq!(loaded.tokenizer.encode(text, false).unwrap(), hf.encode(text, false).unwrap(), "{text:?}");
    }
    assert_eq!(loaded.tokenizer.eos_ids(), hf.eos_ids());
    let r = reference("qwen3_5_moe");
    let mut cache = SequenceCache::new(&loaded.model.cache_spec(), &Device::Cpu);
    let mut chunks = [SeqChunk { tokens: &r.prompt, cache: &mut cache, logits: LogitsWanted::All }];
    let logits = loaded.model.forward(&mut chunks).unwrap().pop().flatten().unwrap();
    assert!(rel_err(&logits, &r.r["prompt_logits"]) <= 1e-4);
}
