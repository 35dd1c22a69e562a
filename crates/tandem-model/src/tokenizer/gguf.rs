//! Building the tokenizer from GGUF metadata (`tokenizer.ggml.*`).
//!
//! Two vocabulary kinds are supported, both turned into a Hugging Face `tokenizers` pipeline:
//!
//! - `gpt2`: byte-level BPE with explicit merges; the split regexes come from
//!   `tokenizer.ggml.pre` (see [`super::pretok`]), matching llama.cpp.
//! - `llama`: SentencePiece (tokens + scores). We build the equivalent BPE the way HF's
//!   `LlamaConverter` does: every split `a + b` of a vocabulary piece whose halves are both
//!   pieces becomes a merge, ranked by the merged piece's score (highest first), so BPE applies
//!   merges in SentencePiece order. Spaces become `▁`, a `▁` is prepended when
//!   `tokenizer.ggml.add_space_prefix` (default true) and characters outside the vocabulary
//!   fall back to `<0xNN>` byte tokens.
//!
//! Token types (`tokenizer.ggml.token_type`) decide what is special: control (3) and unknown (2)
//! tokens become special added tokens (parsed in text, dropped by `skip_special`), user-defined
//! (4) tokens become non-special added tokens (always parsed, always printed), like llama.cpp.

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormSequence};
use tokenizers::AddedToken;

use super::{pretok, Tokenizer};
use crate::error::{ModelError, Result};

const TYPE_NORMAL: i32 = 1;
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;

fn err(msg: impl Into<String>) -> ModelError {
    ModelError::Tokenizer(msg.into())
}

fn as_i64(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => *x as i64,
        Value::I8(x) => *x as i64,
        Value::U16(x) => *x as i64,
        Value::I16(x) => *x as i64,
        Value::U32(x) => *x as i64,
        Value::I32(x) => *x as i64,
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        _ => return None,
    })
}

fn meta_u32(c: &Content, key: &str) -> Option<u32> {
    c.metadata.get(key).and_then(as_i64).and_then(|x| u32::try_from(x).ok())
}

fn meta_bool(c: &Content, key: &str) -> Option<bool> {
    match c.metadata.get(key)? {
        Value::Bool(b) => Some(*b),
        v => as_i64(v).map(|x| x != 0),
    }
}

pub(super) fn meta_str<'a>(c: &'a Content, key: &str) -> Option<&'a str> {
    match c.metadata.get(key)? {
        Value::String(s) => Some(s.as_str()),
        _ => None,
    }
}

fn meta_array<'a>(c: &'a Content, key: &str) -> Result<Option<&'a [Value]>> {
    match c.metadata.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a.as_slice())),
        Some(_) => Err(err(format!("GGUF metadata `{key}` is not an array"))),
    }
}

fn string_array(c: &Content, key: &str) -> Result<Vec<String>> {
    let arr = meta_array(c, key)?.ok_or_else(|| err(format!("GGUF has no `{key}`")))?;
    arr.iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(err(format!("`{key}` holds a non-string element"))),
        })
        .collect()
}

/// The optional per-token array `key`, checked to have one entry per token.
fn per_token<T>(c: &Content, key: &str, n: usize, f: impl Fn(&Value) -> Option<T>) -> Result<Option<Vec<T>>> {
    let Some(arr) = meta_array(c, key)? else { return Ok(None) };
    if arr.len() != n {
        return Err(err(format!("`{key}` has {} entries for {n} tokens", arr.len())));
    }
    arr.iter()
        .map(|v| f(v).ok_or_else(|| err(format!("`{key}` holds an element of the wrong type"))))
        .collect::<Result<Vec<T>>>()
        .map(Some)
}

/// A vocabulary map keeping the first id of duplicated strings.
fn vocab_of(tokens: &[String]) -> Vocab {
    let mut vocab = Vocab::default();
    for (i, t) in tokens.iter().enumerate() {
        vocab.entry(t.clone()).or_insert(i as u32);
    }
    vocab
}

pub(super) fn from_gguf(c: &Content) -> Result<Tokenizer> {
    let model = meta_str(c, "tokenizer.ggml.model").ok_or_else(|| err("GGUF has no `tokenizer.ggml.model`"))?;
    let tokens = string_array(c, "tokenizer.ggml.tokens")?;
    let n = tokens.len();
    if n == 0 || n > u32::MAX as usize {
        return Err(err(format!("GGUF vocabulary has {n} tokens")));
    }
    let types = per_token(c, "tokenizer.ggml.token_type", n, |v| as_i64(v).map(|x| x as i32))?
        .unwrap_or_else(|| vec![TYPE_NORMAL; n]);
    let valid = |id: Option<u32>| id.filter(|&i| (i as usize) < n);

    let (mut inner, add_bos_default, bos_default) = match model {
        "gpt2" => {
            let pre = meta_str(c, "tokenizer.ggml.pre").unwrap_or("default");
            let spec = pretok::spec_for(pre);
            if !spec.known {
                tracing::warn!("unknown GGUF pre-tokenizer `{pre}`, using GPT-2's split rules");
            }
            let merges = string_array(c, "tokenizer.ggml.merges")?;
            (build_byte_level(&tokens, merges, &spec)?, spec.add_bos_default, None)
        }
        "llama" => {
            let scores = per_token(c, "tokenizer.ggml.scores", n, |v| match v {
                Value::F32(x) => Some(*x),
                Value::F64(x) => Some(*x as f32),
                _ => None,
            })?
            .ok_or_else(|| err("SentencePiece GGUF has no `tokenizer.ggml.scores`"))?;
            let add_prefix = meta_bool(c, "tokenizer.ggml.add_space_prefix").unwrap_or(true);
            let unk = valid(meta_u32(c, "tokenizer.ggml.unknown_token_id")).or(Some(0));
            (build_sentencepiece(&tokens, &scores, &types, unk, add_prefix)?, true, Some(1))
        }
        other => {
            return Err(ModelError::Unsupported(format!("GGUF tokenizer model `{other}`")));
        }
    };
    add_typed_tokens(&mut inner, &tokens, &types);

    let bos_id = valid(meta_u32(c, "tokenizer.ggml.bos_token_id").or(bos_default));
    let add_bos = meta_bool(c, "tokenizer.ggml.add_bos_token").unwrap_or(add_bos_default);
    let eos_id =
        valid(meta_u32(c, "tokenizer.ggml.eos_token_id")).or_else(|| valid(Some(2)).filter(|_| model == "llama"));
    let extra_eos: Vec<u32> = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
        .iter()
        .filter_map(|k| valid(meta_u32(c, k)))
        .collect();
    Ok(Tokenizer::assemble(inner, bos_id, add_bos, eos_id, extra_eos, n))
}

/// Byte-level BPE (`tokenizer.ggml.model` = `gpt2`).
fn build_byte_level(
    tokens: &[String],
    merges: Vec<String>,
    spec: &pretok::PreTokenizerSpec,
) -> Result<tokenizers::Tokenizer> {
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| err(format!("invalid merge `{m}`")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_of(tokens), merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| err(format!("building BPE: {e}")))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    let pre = spec.pre_tokenizer().map_err(|e| err(format!("pre-tokenizer regex: {e}")))?;
    tok.with_pre_tokenizer(Some(pre));
    tok.with_decoder(Some(ByteLevel::default()));
    Ok(tok)
}

/// The BPE merges equivalent to SentencePiece's score-ordered merging (HF `LlamaConverter`).
fn sentencepiece_merges(tokens: &[String], scores: &[f32], types: &[i32]) -> Vec<(String, String)> {
    let mergeable = |i: usize| types.get(i).copied().unwrap_or(TYPE_NORMAL) == TYPE_NORMAL;
    let mut ids: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        if mergeable(i) {
            ids.entry(t.as_str()).or_insert(i as u32);
        }
    }
    // (score of the merged piece, id of the merged piece, left id, right id)
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (i, piece) in tokens.iter().enumerate() {
        if !mergeable(i) || ids.get(piece.as_str()) != Some(&(i as u32)) {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            if let (Some(&l), Some(&r)) = (ids.get(&piece[..at]), ids.get(&piece[at..])) {
                ranked.push((scores[i], i as u32, l, r));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then((a.2, a.3).cmp(&(b.2, b.3))));
    ranked.into_iter().map(|(_, _, l, r)| (tokens[l as usize].clone(), tokens[r as usize].clone())).collect()
}

/// SentencePiece vocabulary (`tokenizer.ggml.model` = `llama`) as an equivalent BPE.
pub(super) fn build_sentencepiece(
    tokens: &[String],
    scores: &[f32],
    types: &[i32],
    unk_id: Option<u32>,
    add_space_prefix: bool,
) -> Result<tokenizers::Tokenizer> {
    let merges = sentencepiece_merges(tokens, scores, types);
    let mut builder = BPE::builder().vocab_and_merges(vocab_of(tokens), merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = unk_id.and_then(|i| tokens.get(i as usize)) {
        builder = builder.unk_token(unk.clone());
    }
    let bpe = builder.build().map_err(|e| err(format!("building SentencePiece BPE: {e}")))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);

    let replace = |from: &str, to: &str| Replace::new(from, to).map_err(|e| err(format!("replace pattern: {e}")));
    let mut norms: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        norms.push(Prepend::new("▁".to_string()).into());
    }
    norms.push(replace(" ", "▁")?.into());
    tok.with_normalizer(Some(NormSequence::new(norms)));

    let mut decoders: Vec<DecoderWrapper> =
        vec![replace("▁", " ")?.into(), ByteFallback::new().into(), Fuse::new().into()];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tok)
}

/// Registers control/unknown tokens as special and user-defined tokens as plain added tokens.
pub(super) fn add_typed_tokens(tok: &mut tokenizers::Tokenizer, tokens: &[String], types: &[i32]) {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (t, &ty) in tokens.iter().zip(types) {
        if t.is_empty() {
            continue;
        }
        match ty {
            TYPE_CONTROL | TYPE_UNKNOWN => special.push(AddedToken::from(t.clone(), true)),
            TYPE_USER_DEFINED => user.push(AddedToken::from(t.clone(), false).normalized(false)),
            _ => {}
        }
    }
    tok.add_special_tokens(&special);
    tok.add_tokens(&user);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::IncrementalDecoder;
    use candle_core::quantized::gguf_file::VersionedMagic;
    use std::collections::HashMap;

    /// A tiny SentencePiece GGUF: <unk>, <s>, </s>, 256 byte tokens, then scored pieces.
    fn tiny_spm(add_space_prefix: bool) -> Content {
        let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
        let mut scores = vec![0.0f32; 3];
        let mut types = vec![TYPE_UNKNOWN, TYPE_CONTROL, TYPE_CONTROL];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(6);
        }
        let pieces: [(&str, f32); 9] = [
            ("▁", -10.0),
            ("a", -10.0),
            ("b", -10.0),
            ("c", -10.0),
            ("d", -10.0),
            ("ab", -5.0),
            ("bc", -2.0),
            ("cd", -1.0),
            ("▁a", -3.0),
        ];
        for (p, s) in pieces {
            tokens.push(p.to_string());
            scores.push(s);
            types.push(TYPE_NORMAL);
        }
        let mut md = HashMap::new();
        md.insert("tokenizer.ggml.model".to_string(), Value::String("llama".into()));
        md.insert("tokenizer.ggml.tokens".to_string(), Value::Array(tokens.into_iter().map(Value::String).collect()));
        md.insert("tokenizer.ggml.scores".to_string(), Value::Array(scores.into_iter().map(Value::F32).collect()));
        md.insert("tokenizer.ggml.token_type".to_string(), Value::Array(types.into_iter().map(Value::I32).collect()));
        md.insert("tokenizer.ggml.bos_token_id".to_string(), Value::U32(1));
        md.insert("tokenizer.ggml.eos_token_id".to_string(), Value::U32(2));
        md.insert("tokenizer.ggml.add_space_prefix".to_string(), Value::Bool(add_space_prefix));
        Content { magic: VersionedMagic::GgufV3, metadata: md, tensor_infos: HashMap::new(), tensor_data_offset: 0 }
    }

    fn id(t: &Tokenizer, s: &str) -> u32 {
        t.token_to_id(s).unwrap_or_else(|| panic!("no token {s}"))
    }

    #[test]
    fn sentencepiece_merges_highest_score_first() {
        let t = Tokenizer::from_gguf(&tiny_spm(true)).unwrap();
        // "▁abcd": cd (-1) first, then ▁a (-3); "ab" (-5) never gets its chance.
        let ids = t.encode("abcd", false).unwrap();
        assert_eq!(ids, vec![id(&t, "▁a"), id(&t, "b"), id(&t, "cd")]);
        assert_eq!(t.decode(&ids, false), "abcd");
        // Without the dummy prefix: bc (-2) beats ab (-5).
        let t2 = Tokenizer::from_gguf(&tiny_spm(false)).unwrap();
        assert_eq!(t2.encode("abc", false).unwrap(), vec![id(&t2, "a"), id(&t2, "bc")]);
        assert_eq!(t2.encode("a b", false).unwrap(), vec![id(&t2, "a"), id(&t2, "▁"), id(&t2, "b")]);
    }

    #[test]
    fn sentencepiece_byte_fallback_and_specials() {
        let t = Tokenizer::from_gguf(&tiny_spm(true)).unwrap();
        let ids = t.encode("aé", true).unwrap();
        assert_eq!(ids, vec![1, id(&t, "▁a"), id(&t, "<0xC3>"), id(&t, "<0xA9>")]);
        assert_eq!(t.decode(&ids, true), "aé");
        assert_eq!(t.decode(&ids, false), "<s> aé"); // like HF and llama.cpp
                                                     // Literal control tokens are parsed; text after them gets the dummy prefix again.
        let ids = t.encode("<s>ab</s>", false).unwrap();
        assert_eq!(ids, vec![1, id(&t, "▁a"), id(&t, "b"), 2]);
        assert_eq!(t.bos_id(), Some(1));
        assert!(t.add_bos_by_default());
        assert_eq!(t.eos_ids(), &[2]);
        assert_eq!(t.bos_token().as_deref(), Some("<s>"));
        assert_eq!(t.eos_token().as_deref(), Some("</s>"));
        assert_eq!(t.vocab_size(), 3 + 256 + 9);
    }

    #[test]
    fn sentencepiece_streaming_keeps_leading_space_and_joins_bytes() {
        let t = Tokenizer::from_gguf(&tiny_spm(true)).unwrap();
        assert_eq!(t.token_text(id(&t, "▁a")), " a");
        let ids = [id(&t, "▁a"), id(&t, "<0xC3>"), id(&t, "<0xA9>"), id(&t, "▁"), id(&t, "cd"), 2];
        let mut dec = IncrementalDecoder::new(true);
        let pieces: Vec<String> = ids.iter().map(|&i| dec.push(&t, i)).collect();
        assert_eq!(pieces, vec![" a", "", "é", " ", "cd", ""]);
        assert_eq!(dec.flush(&t), "");
    }

    #[test]
    fn merges_follow_merged_piece_score() {
        let toks: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"].iter().map(|s| s.to_string()).collect();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let types = [1; 6];
        let m = sentencepiece_merges(&toks, &scores, &types);
        let pairs: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(pairs, vec![("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]);
    }
}
