//! Text ⇄ token ids: the [`Tokenizer`] and the streaming [`IncrementalDecoder`].
//!
//! A [`Tokenizer`] is built either from GGUF metadata ([`Tokenizer::from_gguf`], see
//! [`gguf`] for the vocabulary kinds) or from a Hugging Face model directory
//! ([`Tokenizer::from_hf_dir`], see [`hf`]). Both end up as a Hugging Face `tokenizers`
//! pipeline plus what the engine needs around it: the BOS policy and every id that ends
//! generation.
//!
//! Encoding always parses special tokens written literally in the text (llama.cpp's
//! `parse_special = true`), because chat templates render them as text. Decoding of generated
//! text for streaming goes through [`IncrementalDecoder`], which never splits a UTF-8 character
//! and keeps SentencePiece leading spaces.

mod gguf;
mod hf;
mod pretok;
mod stream;

pub use stream::IncrementalDecoder;

use crate::error::{ModelError, Result};

/// Token strings that end generation when the vocabulary has them as added/control tokens.
const END_OF_GENERATION_TOKENS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<end_of_turn>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
];

/// A loaded tokenizer. `Send + Sync`; share it behind an `Arc`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    add_bos: bool,
    eos_id: Option<u32>,
    eos_ids: Vec<u32>,
    vocab_size: usize,
    /// A plain token decoded in front of every streaming window (and its text), so that the
    /// decoder's "first token" rules (SentencePiece strips the leading space of the first
    /// token) never apply to generated text.
    anchor: Option<(u32, String)>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size)
            .field("bos_id", &self.bos_id)
            .field("add_bos", &self.add_bos)
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(content: &candle_core::quantized::gguf_file::Content) -> Result<Self> {
        crate::loader::contain(|| gguf::from_gguf(content)).map_err(ModelError::Tokenizer)?
    }

    /// Loads a Hugging Face model directory: `tokenizer.json`, plus `tokenizer_config.json`
    /// (bos/eos tokens, `add_bos_token`) and the eos ids of `generation_config.json` and
    /// `config.json` when present.
    pub fn from_hf_dir(dir: &std::path::Path) -> Result<Self> {
        hf::from_hf_dir(dir)
    }

    /// A stand-in vocabulary of `vocab_size` word-level tokens `t0 t1 ...` (no special tokens):
    /// for random-weight models in benchmarks, which need ids, not text.
    pub fn placeholder(vocab_size: usize) -> Result<Self> {
        use tokenizers::models::wordlevel::WordLevel;
        let vocab = (0..vocab_size.max(1) as u32).map(|i| (format!("t{i}"), i)).collect();
        let model = WordLevel::builder()
            .vocab(vocab)
            .unk_token("t0".into())
            .build()
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::new(model);
        inner.with_pre_tokenizer(Some(tokenizers::pre_tokenizers::whitespace::WhitespaceSplit));
        Ok(Self::assemble(inner, None, false, None, Vec::new(), vocab_size))
    }

    /// Puts the pieces together: collects end-of-generation ids and picks the stream anchor.
    fn assemble(
        inner: tokenizers::Tokenizer,
        bos_id: Option<u32>,
        add_bos: bool,
        eos_id: Option<u32>,
        extra_eos: Vec<u32>,
        vocab_size: usize,
    ) -> Self {
        let added = inner.get_added_tokens_decoder();
        let mut eos_ids: Vec<u32> = Vec::new();
        let mut push = |id: u32| {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        };
        eos_id.into_iter().chain(extra_eos).for_each(&mut push);
        let has_return = inner.token_to_id("<|return|>").is_some();
        for name in END_OF_GENERATION_TOKENS {
            // gpt-oss ends a message (not the generation) with <|end|>.
            if *name == "<|end|>" && has_return {
                continue;
            }
            if let Some(id) = inner.token_to_id(name).filter(|id| added.contains_key(id)) {
                push(id);
            }
        }
        let mut tok = Tokenizer { inner, bos_id, add_bos, eos_id, eos_ids, vocab_size, anchor: None };
        tok.anchor = tok.find_anchor();
        tok
    }

    /// A non-special token whose text is stable and non-empty, used as decoding context.
    fn find_anchor(&self) -> Option<(u32, String)> {
        let added = self.inner.get_added_tokens_decoder();
        let good = |id: u32| -> Option<(u32, String)> {
            if added.contains_key(&id) {
                return None;
            }
            let text = self.inner.decode(&[id], false).ok()?;
            let ok = !text.is_empty() && !text.contains('\u{FFFD}') && text.chars().all(|c| c.is_alphanumeric());
            ok.then_some((id, text))
        };
        ["a", "▁a", "Ġa", "the", "▁the", "x"]
            .iter()
            .filter_map(|s| self.inner.token_to_id(s))
            .chain(0..self.vocab_size.min(4096) as u32)
            .find_map(good)
    }

    /// The tokenizer as Hugging Face `tokenizer.json` text (also for one built from GGUF
    /// metadata): what constrained decoding reads each token's bytes from.
    pub fn hf_json(&self) -> Result<String> {
        self.inner.to_string(false).map_err(|e| ModelError::Tokenizer(format!("serialise: {e}")))
    }

    /// Encodes `text`. Special tokens written literally (e.g. `<|im_start|>`) are parsed as
    /// special tokens; `add_bos` prepends BOS when the model has one.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode_fast(text, false).map_err(|e| ModelError::Tokenizer(format!("encode: {e}")))?;
        let ids = enc.get_ids();
        let mut out = Vec::with_capacity(ids.len() + 1);
        if add_bos {
            out.extend(self.bos_id);
        }
        out.extend_from_slice(ids);
        Ok(out)
    }

    /// Decodes ids to text; `skip_special` drops control tokens (BOS/EOS/…). Unknown ids are
    /// ignored. Follows the tokenizer's own decoder, so a SentencePiece model drops the dummy
    /// leading space of the first token (use [`IncrementalDecoder`] for generated text).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        self.inner.decode(ids, skip_special).unwrap_or_else(|e| {
            tracing::warn!("decode failed: {e}");
            String::new()
        })
    }

    /// Decodes `ids` as a continuation: the anchor token goes in front and its text is removed,
    /// so leading spaces survive.
    fn decode_continuation(&self, ids: &[u32], skip_special: bool) -> String {
        let Some((anchor, anchor_text)) = &self.anchor else {
            return self.decode(ids, skip_special);
        };
        let mut window = Vec::with_capacity(ids.len() + 1);
        window.push(*anchor);
        window.extend_from_slice(ids);
        let text = self.decode(&window, skip_special);
        match text.strip_prefix(anchor_text.as_str()) {
            Some(rest) => rest.to_string(),
            None => text,
        }
    }

    /// The text of one token as it appears in generated output (for logprobs); lossy for
    /// tokens that hold part of a UTF-8 character.
    pub fn token_text(&self, id: u32) -> String {
        self.decode_continuation(&[id], false)
    }

    /// Number of token ids (including added tokens).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Whether prompts get a BOS by default.
    pub fn add_bos_by_default(&self) -> bool {
        self.add_bos && self.bos_id.is_some()
    }

    /// Every id that ends generation: eos, eot/eom, and end-of-turn tokens such as
    /// `<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, `<end_of_turn>` when the vocabulary has
    /// them as added/control tokens. The model's own eos comes first.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// BOS as a string, for chat templates.
    pub fn bos_token(&self) -> Option<String> {
        self.bos_id.and_then(|id| self.inner.id_to_token(id))
    }

    /// EOS as a string, for chat templates.
    pub fn eos_token(&self) -> Option<String> {
        self.eos_id.and_then(|id| self.inner.id_to_token(id))
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
        check::<IncrementalDecoder>();
    }
}
