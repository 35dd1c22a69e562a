//! Tokenizer and chat template against real references: SmolLM2-135M-Instruct's GGUF with
//! ids from llama.cpp (`fixtures/smollm2-llamacpp-greedy.json`), and the tiny Hugging Face
//! tokenizers in `fixtures/tiny/*` with ids from `transformers`.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tandem_model::chat_template::{gguf_chat_template, hf_chat_template, ChatTemplate, RenderOptions};
use tandem_model::tokenizer::{IncrementalDecoder, Tokenizer};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn smollm2_path() -> PathBuf {
    let path = std::env::var_os("TANDEM_TEST_MODEL_SMOLLM2")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models/smollm2-135m.gguf"));
    assert!(
        path.exists(),
        "test model {} is missing: run `make models` in the workspace root (or set \
         TANDEM_TEST_MODEL_SMOLLM2 to SmolLM2-135M-Instruct.Q4_1.gguf)",
        path.display()
    );
    path
}

fn smollm2_gguf() -> candle_core::quantized::gguf_file::Content {
    let path = smollm2_path();
    let mut f = std::fs::File::open(&path).expect("open the SmolLM2 GGUF");
    candle_core::quantized::gguf_file::Content::read(&mut f).expect("read GGUF metadata")
}

fn smollm2() -> Tokenizer {
    Tokenizer::from_gguf(&smollm2_gguf()).expect("SmolLM2 tokenizer")
}

fn fixture() -> Value {
    let path = workspace().join("fixtures/smollm2-llamacpp-greedy.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> (Vec<String>, String) {
    let mut dec = IncrementalDecoder::new(skip_special);
    let pieces: Vec<String> = ids.iter().map(|&id| dec.push(tok, id)).collect();
    let mut all: String = pieces.concat();
    all.push_str(&dec.flush(tok));
    (pieces, all)
}

#[test]
fn smollm2_tokenizer_cases_match_llamacpp() {
    let tok = smollm2();
    let fx = fixture();
    let cases = fx["tokenizer_cases"].as_array().expect("tokenizer_cases");
    assert!(!cases.is_empty());
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), want, "encoding {text:?}");
        assert_eq!(tok.decode(&want, false), text, "round trip of {text:?}");
    }
}

#[test]
fn smollm2_prompts_and_greedy_outputs_match_llamacpp() {
    let tok = smollm2();
    let fx = fixture();
    for case in fx["cases"].as_array().expect("cases") {
        let prompt = case["prompt"].as_str().expect("prompt");
        assert_eq!(tok.encode(prompt, false).unwrap(), ids(&case["prompt_ids"]), "prompt {prompt:?}");
        assert_eq!(tok.decode(&ids(&case["prompt_ids"]), false), prompt);
        let greedy = ids(&case["greedy_ids"]);
        let want = case["detokenized"].as_str().expect("detokenized");
        assert_eq!(tok.decode(&greedy, false), want);
        assert_eq!(tok.decode(&greedy, true), want);
        let (_, streamed) = stream(&tok, &greedy, true);
        assert_eq!(streamed, want, "streamed decode of {prompt:?}");
    }
}

#[test]
fn smollm2_vocabulary_facts() {
    let tok = smollm2();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_id(), Some(1));
    assert!(!tok.add_bos_by_default());
    assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"));
    assert_eq!(tok.bos_token().as_deref(), Some("<|im_start|>"));
    assert_eq!(tok.eos_ids().first(), Some(&2));
    assert!(tok.eos_ids().contains(&0), "<|endoftext|> ends generation: {:?}", tok.eos_ids());
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.encode("Hi", true).unwrap()[0], 1);
    assert_eq!(tok.token_text(7042), " Paris");
    assert_eq!(tok.token_text(198), "\n");
    assert_eq!(tok.token_text(2), "<|im_end|>");
    assert_eq!(tok.decode(&[1, 4093, 198, 6004, 2], true), "user\nhi");
    assert_eq!(tok.decode(&[u32::MAX, 6004], false), "hi", "unknown ids are ignored");
}

#[test]
fn smollm2_streaming_never_splits_utf8() {
    let tok = smollm2();
    let text = "naïve café — ünïcödé ✓ 你好";
    let ids = tok.encode(text, false).unwrap();
    let (pieces, all) = stream(&tok, &ids, false);
    assert_eq!(all, text);
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    // Some tokens hold partial characters, so some pushes must have returned nothing.
    assert!(pieces.iter().any(String::is_empty));

    // A dangling partial character is released by flush, lossily.
    let mut dec = IncrementalDecoder::new(false);
    let partial = &ids[..ids.len() - 1];
    let mut out: String = partial.iter().map(|&id| dec.push(&tok, id)).collect();
    out.push_str(&dec.flush(&tok));
    assert!(out.starts_with("naïve café — ünïcödé ✓ 你"));
    assert!(out.ends_with('\u{FFFD}'));

    // Special tokens are skipped or kept on request.
    let chat = [1, 4093, 198, 6004, 2];
    assert_eq!(stream(&tok, &chat, true).1, "user\nhi");
    assert_eq!(stream(&tok, &chat, false).1, "<|im_start|>user\nhi<|im_end|>");
}

#[test]
fn smollm2_chat_template_renders_the_fixture_prompt() {
    let content = smollm2_gguf();
    let tok = Tokenizer::from_gguf(&content).unwrap();
    let source = gguf_chat_template(&content).expect("SmolLM2 ships a chat template");
    let tmpl = ChatTemplate::new(&source, tok.bos_token(), tok.eos_token()).unwrap();
    let messages = [
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "What is 2+2?"}),
    ];
    let opts = RenderOptions { add_generation_prompt: true, ..Default::default() };
    let r = tmpl.render(&messages, &opts).unwrap();
    let fx = fixture();
    let case = &fx["cases"][2];
    assert_eq!(r.text, case["prompt"].as_str().unwrap());
    assert_eq!(tok.encode(&r.text, false).unwrap(), ids(&case["prompt_ids"]));
    assert_eq!(&r.text[..r.message_ends[0]], "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
    assert_eq!(r.message_ends[1], r.text.len() - "<|im_start|>assistant\n".len());

    // Without a system message the template inserts its default one.
    let r = tmpl.render(&messages[1..], &opts).unwrap();
    assert!(r.text.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"));
}

#[test]
fn hf_tiny_tokenizers_match_transformers() {
    for name in ["llama", "qwen2", "qwen3", "mistral"] {
        let dir = workspace().join("fixtures/tiny").join(name);
        let tok = Tokenizer::from_hf_dir(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let case: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("tokenizer_case.json")).expect("tokenizer_case.json"),
        )
        .expect("tokenizer_case JSON");
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), want, "{name}");
        assert_eq!(tok.decode(&want, false), text, "{name} round trip");
        assert_eq!(stream(&tok, &want, true).1, text, "{name} streaming");
        assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"), "{name}");
        assert_eq!(tok.eos_ids().first(), Some(&2), "{name}");
        assert!(tok.eos_ids().contains(&0), "{name}: <|endoftext|> {:?}", tok.eos_ids());
        assert_eq!(tok.bos_id(), None, "{name}: tokenizer_config says bos_token: null");
        assert!(!tok.add_bos_by_default(), "{name}");
        assert_eq!(tok.encode("<|im_start|>user", false).unwrap()[0], 1, "{name}");

        let source = hf_chat_template(&dir).unwrap().expect("chat_template");
        let tmpl = ChatTemplate::new(&source, tok.bos_token(), tok.eos_token()).unwrap();
        let r = tmpl
            .render(
                &[json!({"role": "user", "content": text})],
                &RenderOptions { add_generation_prompt: true, ..Default::default() },
            )
            .unwrap();
        assert_eq!(r.text, format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"));
    }
}

#[test]
fn missing_hf_dir_is_an_error() {
    let err = Tokenizer::from_hf_dir(&workspace().join("fixtures/does-not-exist")).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}
