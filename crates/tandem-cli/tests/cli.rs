//! The `tandem` binary end to end on the tiny fixture and on SmolLM2: `inspect`, `run`
//! (greedy output equals the engine's reference tokens), `--help` on every subcommand, and
//! clean errors for bad arguments.

mod common;

use common::{root, tandem};

#[test]
fn inspect_describes_a_checkpoint() {
    let dir = root().join("fixtures/tiny/qwen2");
    let out = tandem(&["inspect", "--json", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["architecture"], "qwen2");
    assert_eq!(v["num_layers"], 2);
    assert_eq!(v["num_kv_heads"], 2);
    assert_eq!(v["vocab_size"], 384);
    assert_eq!(v["tie_word_embeddings"], false);
    assert!(v["chat_template"].as_str().unwrap().contains("im_start"));
    assert_eq!(
        v["tensor_types"]["F32"],
        v["tensor_types"].as_object().unwrap().values().map(|x| x.as_u64().unwrap()).sum::<u64>()
    );
}

#[test]
fn inspect_gguf_and_run_smollm2_greedy() {
    let model = root().join("models/smollm2-135m.gguf");
    assert!(model.exists(), "{} missing: run `make models`", model.display());
    let out = tandem(&["inspect", model.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("architecture:    llama"), "{text}");
    assert!(text.contains("Q4_1"), "{text}");
    assert!(text.contains("context length:  8192"), "{text}");
    // Greedy continuation equals llama.cpp's first tokens (" Paris.\n\nThe", all decided by a
    // log-prob margin above 0.5; see tandem-model/tests/smollm2.rs for why closer calls differ).
    let out = tandem(&["run", "-m", model.to_str().unwrap(), "-n", "5", "--print-ids", "The capital of France is"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with(" Paris.\n\nThe"), "{stdout}");
    assert!(stdout.contains("[7042, 30, 198, 198, 504]"), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("prompt tokens: 5") && stderr.contains("TTFT") && stderr.contains("decode"), "{stderr}");
}

#[test]
fn every_subcommand_has_help() {
    for cmd in ["run", "chat", "serve", "inspect", "pull", "bench"] {
        let out = tandem(&[cmd, "--help"]);
        assert!(out.status.success(), "{cmd} --help");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"), "{cmd}");
    }
}

#[test]
fn bad_arguments_fail_cleanly() {
    let out = tandem(&["run", "-m", "/nonexistent/model.gguf", "hi"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error:") && !err.contains("panicked"), "{err}");
    let out = tandem(&["run", "-m", "no-such-alias", "--no-pull", "hi"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("smollm2-135m"), "the error lists the aliases");
    // A file that is not a GGUF.
    let bogus = root().join("target/not-a-model.gguf");
    std::fs::write(&bogus, b"definitely not gguf").unwrap();
    let out = tandem(&["inspect", bogus.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn inspect_hybrid_gguf_and_bench_hybrid_kernels() {
    use tandem_model::arch::qwen_hybrid::to_gguf::{export_hf_dir, ExportOptions};
    let dir = std::env::temp_dir().join(format!("tandem-cli-hybrid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = dir.join("qwen3_5.gguf");
    export_hf_dir(&root().join("fixtures/hybrid/qwen3_5"), &gguf, &ExportOptions::default()).unwrap();
    let out = tandem(&["inspect", gguf.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("qwen35 (layers GGAG") && text.contains("MTP head: yes"), "{text}");
    let out = tandem(&[
        "bench",
        "kernels",
        "--heads",
        "4",
        "--key-heads",
        "2",
        "--head-dim",
        "32",
        "--tokens",
        "70",
        "--min-seconds",
        "0.01",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("chunked prefill") && text.contains("GFLOP/s"), "{text}");
    let out = tandem(&["bench", "--random-hybrid", "tiny", "-p", "70", "-g", "2", "-r", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("pp70") && text.contains("tg2"), "{text}");
    // Verify steps (recurrent states per position, one kept) beside the decode steps.
    let out = tandem(&["bench", "--random-hybrid", "tiny", "-p", "0", "-g", "3", "-r", "1", "--verify", "4"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("| tv4 ") && text.contains("tv4 / tg"), "{text}");
}

/// `--save-gguf` writes the random preset as a GGUF that `inspect` and `bench -m` read back.
#[test]
fn random_preset_saved_as_gguf_loads_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("tiny.gguf");
    let g = gguf.to_str().unwrap();
    let out = tandem(&["bench", "--random-hybrid", "tiny", "--random-dtype", "q8_0", "--save-gguf", g]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("qwen35moe"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let out = tandem(&["inspect", g]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("qwen35moe (layers GGGA") && text.contains("Q8_0"), "{text}");
    let out = tandem(&["bench", "-m", g, "-p", "20", "-g", "2", "-r", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("pp20") && text.contains("tg2"), "{text}");
    // --save-gguf needs a preset.
    let out = tandem(&["bench", "--save-gguf", g]);
    assert!(!out.status.success());
}

/// `tandem convert` writes a hybrid HF checkpoint as GGUF keeping its MTP head (Qwen3-Next's
/// too, which llama.cpp drops), quantised when asked; `--quantize` and `--mtp-from` load;
/// non-hybrid inputs are refused with the reason.
#[test]
fn convert_quantize_and_graft_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = dir.path().join("qn.gguf");
    let g = gguf.to_str().unwrap();
    let qn = root().join("fixtures/hybrid/qwen3_next");
    let out = tandem(&["convert", qn.to_str().unwrap(), g, "--quantize", "q8_0"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("qwen3next") && text.contains("MTP head: yes"), "{text}");
    let out = tandem(&["inspect", g]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("Q8_0"), "{text}");
    // Llama-family checkpoints convert too; other architectures are refused with the reason.
    let llama = root().join("fixtures/tiny/llama");
    let lg = dir.path().join("llama.gguf");
    let out = tandem(&["convert", llama.to_str().unwrap(), lg.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("llama"), "{text}");
    let neox = dir.path().join("neox");
    std::fs::create_dir_all(&neox).unwrap();
    for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(llama.join(f), neox.join(f)).unwrap();
    }
    let cfg = std::fs::read_to_string(llama.join("config.json")).unwrap().replace("\"llama\"", "\"gpt_neox\"");
    std::fs::write(neox.join("config.json"), cfg).unwrap();
    let out = tandem(&["convert", neox.to_str().unwrap(), lg.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("gpt_neox") && err.contains("supported"), "{err}");
    // Load-time quantisation and a grafted head from the command line (from a GGUF of the
    // same model; the Qwen3-Next one is refused: its head is MoE).
    let q35 = root().join("fixtures/hybrid/qwen3_5");
    let out = tandem(&["bench", "-m", q35.to_str().unwrap(), "--mtp-from", g, "-p", "8", "-g", "2", "-r", "1"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not the same model"));
    let q35_gguf = dir.path().join("q35.gguf");
    let g = q35_gguf.to_str().unwrap();
    assert!(tandem(&["convert", q35.to_str().unwrap(), g]).status.success());
    let out = tandem(&[
        "bench",
        "-m",
        q35.to_str().unwrap(),
        "--quantize",
        "q4_0",
        "--mtp-from",
        g,
        "-p",
        "8",
        "-g",
        "2",
        "-r",
        "1",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("tg2"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let out = tandem(&["bench", "-m", q35.to_str().unwrap(), "--quantize", "q9"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unknown --quantize type"));
}

/// `tandem cache stats|ls|clear` over a cache directory holding one namespace.
#[test]
fn cache_stats_ls_and_clear() {
    let dir = tempfile::tempdir().unwrap();
    let ns = "0123456789abcdef0123456789abcdef";
    let sub = dir.path().join(ns).join("ab");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(dir.path().join(ns).join("meta.json"), r#"{"model":"tiny","hits":3}"#).unwrap();
    std::fs::write(sub.join("ab0000000000000000000000000000ff.kvb"), vec![0u8; 1000]).unwrap();
    std::fs::write(sub.join("ab0000000000000000000000000000fe.ckp"), vec![0u8; 500]).unwrap();
    let d = dir.path().to_str().unwrap();
    let out = tandem(&["cache", "--cache-dir", d, "stats", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["namespace"], ns);
    assert_eq!(v[0]["model"], "tiny");
    assert_eq!((v[0]["blocks"].as_u64(), v[0]["checkpoints"].as_u64()), (Some(1), Some(1)));
    assert_eq!((v[0]["bytes"].as_u64(), v[0]["hits"].as_u64()), (Some(1500), Some(3)));
    let ls = tandem(&["cache", "--cache-dir", d, "ls"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains(ns));
    let wrong = tandem(&["cache", "--cache-dir", d, "clear", "--namespace", "feed"]);
    assert!(!wrong.status.success());
    assert!(dir.path().join(ns).exists());
    assert!(tandem(&["cache", "--cache-dir", d, "clear"]).status.success());
    assert!(!dir.path().join(ns).exists());
}
