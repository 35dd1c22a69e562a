//! A config that disagrees with the tensors its checkpoint holds is an error at load, naming
//! the tensor, before anything (KV pool, recurrent state) is sized from it: the tiny Qwen2
//! fixture with one size changed at a time, and the Qwen3.5 hybrid fixture likewise.

use std::path::{Path, PathBuf};

use candle_core::Device;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A copy of fixture `src` with `edit` applied to its config.json.
fn with_config(src: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dir = root().join("target/test-config-vs-tensors").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

fn load_err(dir: &Path) -> String {
    match tandem_model::loader::load(dir, &Device::Cpu) {
        Ok(_) => panic!("{} loaded although its config does not fit its tensors", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn llama_family_sizes_are_checked_against_the_tensors() {
    let src = root().join("fixtures/tiny/qwen2");
    assert!(tandem_model::loader::load(&src, &Device::Cpu).is_ok());
    for (key, value, tensor) in [
        ("intermediate_size", 256, "ffn_gate"),
        ("num_key_value_heads", 4, "attn_k"),
        ("vocab_size", 100_000, "token_embd"),
        ("hidden_size", 32, "token_embd"),
    ] {
        let dir = with_config(&src, &format!("llama-{key}"), |c| c[key] = value.into());
        let e = load_err(&dir);
        assert!(e.contains(tensor) && e.contains("does not fit the config"), "{key}: {e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn moe_expert_sizes_are_checked_against_the_tensors() {
    // Qwen3-Next stores its experts one by one: each is checked at load.
    let src = root().join("fixtures/hybrid/qwen3_next");
    assert!(tandem_model::loader::load(&src, &Device::Cpu).is_ok());
    let dir = with_config(&src, "moe-moe_intermediate_size", |c| {
        let t = if c.get("text_config").is_some() { &mut c["text_config"] } else { c };
        t["moe_intermediate_size"] = 32.into();
    });
    let e = load_err(&dir);
    assert!(e.contains("experts.0.gate_proj") && e.contains("does not fit the config"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hybrid_sizes_are_checked_against_the_tensors() {
    let src = root().join("fixtures/hybrid/qwen3_5");
    assert!(tandem_model::loader::load(&src, &Device::Cpu).is_ok());
    fn text(c: &mut serde_json::Value) -> &mut serde_json::Value {
        if c.get("text_config").is_some() {
            &mut c["text_config"]
        } else {
            c
        }
    }
    for (key, value) in [("num_key_value_heads", 2u64), ("linear_value_head_dim", 64), ("vocab_size", 100_000)] {
        let dir = with_config(&src, &format!("hybrid-{key}"), |c| text(c)[key] = value.into());
        let e = load_err(&dir);
        assert!(e.contains("does not fit the config") || e.contains("expected"), "{key}: {e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
