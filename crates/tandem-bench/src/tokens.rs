//! Counting tokens: with the model's own tokenizer (a GGUF file or a Hugging Face directory,
//! loaded through tandem-model without the weights), or, when none is given, an approximation
//! of one token per four characters that reports say is approximate.

use std::path::Path;

use anyhow::Context;

/// Something that says how many tokens a text is.
pub trait TokenCounter: Send + Sync {
    fn count(&self, text: &str) -> usize;
    /// What counts: the tokenizer's source, or `approx`.
    fn name(&self) -> String;
    /// Whether counts are exact for the served model.
    fn exact(&self) -> bool;
}

/// The model's tokenizer.
pub struct ModelTokenizer {
    tok: tandem_model::tokenizer::Tokenizer,
    source: String,
}

impl ModelTokenizer {
    /// Loads the tokenizer of a GGUF file or a Hugging Face model directory (no weights).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let tok = if path.is_dir() {
            tandem_model::tokenizer::Tokenizer::from_hf_dir(path)?
        } else {
            let mut f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            let content = candle_core::quantized::gguf_file::Content::read(&mut f)
                .map_err(|e| anyhow::anyhow!("{} is not a GGUF file: {e}", path.display()))?;
            tandem_model::tokenizer::Tokenizer::from_gguf(&content)?
        };
        Ok(Self { tok, source: path.display().to_string() })
    }

    /// Wraps an already loaded tokenizer.
    pub fn from_tokenizer(tok: tandem_model::tokenizer::Tokenizer, source: impl Into<String>) -> Self {
        Self { tok, source: source.into() }
    }

    /// The tokenizer itself.
    pub fn inner(&self) -> &tandem_model::tokenizer::Tokenizer {
        &self.tok
    }
}

impl TokenCounter for ModelTokenizer {
    fn count(&self, text: &str) -> usize {
        self.tok.encode(text, false).map(|ids| ids.len()).unwrap_or_else(|_| ApproxCounter.count(text))
    }
    fn name(&self) -> String {
        format!("tokenizer of {}", self.source)
    }
    fn exact(&self) -> bool {
        true
    }
}

/// One token per four characters (rounded up), the usual rule of thumb for English and code.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApproxCounter;

impl TokenCounter for ApproxCounter {
    fn count(&self, text: &str) -> usize {
        text.chars().count().div_ceil(4)
    }
    fn name(&self) -> String {
        "approx (4 chars/token)".into()
    }
    fn exact(&self) -> bool {
        false
    }
}
