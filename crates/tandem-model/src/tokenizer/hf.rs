//! Loading the tokenizer of a Hugging Face model directory.
//!
//! `tokenizer.json` is the pipeline. Around it:
//! - `tokenizer_config.json`: `bos_token` / `eos_token` (a string or an `{"content": …}`
//!   object; an explicit `null` means "none") and `add_bos_token`;
//! - `generation_config.json` and `config.json`: `eos_token_id` (one id or a list), and
//!   `bos_token_id` when `tokenizer_config.json` does not mention a BOS.
//!
//! When `add_bos_token` is not given, we ask the pipeline itself: if its post-processor puts
//! the BOS in front of an encoding (Llama 3 style `TemplateProcessing`), prompts get a BOS.
//! Encoding never runs the post-processor; the BOS is added by [`super::Tokenizer::encode`].

use std::path::Path;

use serde_json::Value;

use super::Tokenizer;
use crate::error::{ModelError, Result};

/// Reads an optional JSON file: `Ok(None)` when it does not exist.
fn read_json(path: &Path) -> Result<Option<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ModelError::io(path, e)),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))
}

/// A special-token entry: `"<s>"` or `{"content": "<s>", …}`.
fn token_string(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// `eos_token_id`-style fields: one id or a list of ids.
fn ids_of(v: Option<&Value>) -> Vec<u32> {
    let one = |v: &Value| v.as_u64().and_then(|x| u32::try_from(x).ok());
    match v {
        Some(Value::Array(a)) => a.iter().filter_map(one).collect(),
        Some(v) => one(v).into_iter().collect(),
        None => Vec::new(),
    }
}

pub(super) fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
    let path = dir.join("tokenizer.json");
    let bytes = std::fs::read(&path).map_err(|e| ModelError::io(&path, e))?;
    // tokenizers may panic on a hostile file rather than return an error: caught here.
    let inner = crate::loader::contain(|| tokenizers::Tokenizer::from_bytes(&bytes))
        .map_err(|p| ModelError::Tokenizer(format!("{}: {p}", path.display())))?
        .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
    let tok_cfg = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let gen_cfg = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);
    let model_cfg = read_json(&dir.join("config.json"))?.unwrap_or(Value::Null);
    let vocab_size = inner.get_vocab_size(true);
    let valid = |id: u32| ((id as usize) < vocab_size).then_some(id);

    let bos_id = match tok_cfg.get("bos_token") {
        Some(v) => token_string(v).and_then(|s| inner.token_to_id(&s)),
        None => {
            ids_of(gen_cfg.get("bos_token_id")).into_iter().chain(ids_of(model_cfg.get("bos_token_id"))).find_map(valid)
        }
    };
    let add_bos = match tok_cfg.get("add_bos_token").and_then(Value::as_bool) {
        Some(b) => b,
        None => bos_id.is_some_and(|bos| {
            inner.encode_fast("a", true).map(|e| e.get_ids().first() == Some(&bos)).unwrap_or(false)
        }),
    };

    let eos_id = tok_cfg.get("eos_token").and_then(token_string).and_then(|s| inner.token_to_id(&s));
    let mut from_configs = ids_of(gen_cfg.get("eos_token_id"));
    from_configs.extend(ids_of(model_cfg.get("eos_token_id")));
    let from_configs: Vec<u32> = from_configs.into_iter().filter_map(valid).collect();
    let eos_id = eos_id.or_else(|| from_configs.first().copied());
    Ok(Tokenizer::assemble(inner, bos_id, add_bos, eos_id, from_configs, vocab_size))
}
