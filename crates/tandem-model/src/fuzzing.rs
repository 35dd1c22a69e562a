//! The fuzzing entry point for model files (`fuzz/fuzz_targets/model_files.rs`): arbitrary
//! bytes as a GGUF file, as a Hugging Face directory (`config.json` + `model.safetensors`), as
//! a `tokenizer.json`, or as a chat template, each through the real loader. None of it may
//! panic, abort or allocate without bound, whatever the input; a load may only fail with an
//! error.
//!
//! The first byte picks the kind. For a directory the rest is `config.json`, a 0xFF byte, then
//! `model.safetensors` (a fixed small `tokenizer.json` is added so loading gets past it).

use std::cell::RefCell;
use std::path::PathBuf;

use candle_core::Device;

use crate::chat_template::{ChatTemplate, RenderOptions};

/// A small, valid tokenizer (the tiny Qwen2 fixture's) for the directory case.
const TOKENIZER: &[u8] = include_bytes!("../../../fixtures/tiny/qwen2/tokenizer.json");

thread_local! {
    static SCRATCH: RefCell<Option<tempfile::TempDir>> = const { RefCell::new(None) };
}

/// A scratch directory for this thread, emptied of the files the cases write.
fn scratch() -> Option<PathBuf> {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.is_none() {
            *s = tempfile::tempdir().ok();
        }
        let dir = s.as_ref()?.path().to_path_buf();
        for f in ["model.gguf", "config.json", "model.safetensors", "tokenizer.json"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
        Some(dir)
    })
}

/// Panics inside [`crate::loader::contain`] (a library's, on a hostile file) are errors the
/// loader returns, not crashes: the harness's panic hook (libFuzzer's aborts on any panic) is
/// wrapped once to let those unwind. Every other panic still aborts.
fn contain_library_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !crate::loader::panic_is_contained() {
                prev(info)
            }
        }));
    });
}

/// Runs one input through the loader it selects.
pub fn model_files(data: &[u8]) {
    contain_library_panics();
    // The harness's self-check (fuzz/run.sh): with TANDEM_FUZZ_PLANT set, this input crashes.
    if data.starts_with(b"PLANTED") && std::env::var_os("TANDEM_FUZZ_PLANT").is_some() {
        panic!("planted crash");
    }
    let Some((&kind, rest)) = data.split_first() else { return };
    let Some(dir) = scratch() else { return };
    match kind % 4 {
        0 => {
            let path = dir.join("model.gguf");
            if std::fs::write(&path, rest).is_ok() {
                let _ = crate::loader::summarize(&path);
                if let Ok(m) = crate::loader::load(&path, &Device::Cpu) {
                    let _ = m.tokenizer.encode("hello world", true);
                }
            }
        }
        1 => {
            let (config, weights) = match rest.iter().position(|&b| b == 0xFF) {
                Some(i) => (&rest[..i], &rest[i + 1..]),
                None => (rest, &[][..]),
            };
            let ok = std::fs::write(dir.join("config.json"), config).is_ok()
                && std::fs::write(dir.join("model.safetensors"), weights).is_ok()
                && std::fs::write(dir.join("tokenizer.json"), TOKENIZER).is_ok();
            if ok {
                let _ = crate::loader::summarize(&dir);
                let _ = crate::loader::load(&dir, &Device::Cpu);
            }
        }
        2 => {
            if std::fs::write(dir.join("tokenizer.json"), rest).is_ok() {
                if let Ok(t) = crate::tokenizer::Tokenizer::from_hf_dir(&dir) {
                    if let Ok(ids) = t.encode("Hello, world! 123 <|im_start|>", true) {
                        let _ = t.decode(&ids, true);
                    }
                }
            }
        }
        _ => {
            let Ok(src) = std::str::from_utf8(rest) else { return };
            if let Ok(t) = ChatTemplate::new(src, Some("<s>".into()), Some("</s>".into())) {
                let msgs = [
                    serde_json::json!({"role": "system", "content": "s"}),
                    serde_json::json!({"role": "user", "content": "u"}),
                    serde_json::json!({"role": "assistant", "content": "a", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}),
                ];
                let opts = RenderOptions { add_generation_prompt: true, ..Default::default() };
                let _ = t.render_local(&msgs, &opts);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    /// A few fixed inputs of each kind (the seeds' shapes) run without panicking; the fuzz
    /// target runs many more in `make test-fuzz`.
    #[test]
    fn fixed_inputs_of_every_kind_are_handled() {
        let cfg = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tiny/qwen2/config.json")).unwrap();
        let st =
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures/tiny/qwen2/model.safetensors")).unwrap();
        let mut dir = vec![1u8];
        dir.extend(&cfg);
        dir.push(0xFF);
        dir.extend(&st);
        for input in [
            vec![0u8],
            b"\x00GGUF\x03\x00\x00\x00".to_vec(),
            dir.clone(),
            dir[..dir.len() / 2].to_vec(),
            [&[2u8][..], super::TOKENIZER].concat(),
            b"\x02{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [\"a b\"]}}".to_vec(),
            b"\x03{% for m in messages %}{{ m.content }}{% endfor %}".to_vec(),
            b"\x03{{ raise_exception('x') }}".to_vec(),
        ] {
            super::model_files(&input);
        }
    }
}
