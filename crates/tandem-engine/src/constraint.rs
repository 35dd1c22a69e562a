//! Constrained decoding (structured output) on `llguidance`: a [`Grammar`] a request asks for
//! (a JSON schema, any JSON object, a Lark grammar, a regular expression, a choice of strings)
//! becomes a per-sequence [`Constraint`] that masks the logits of every step to the tokens the
//! grammar allows next, and consumes each token the sequence keeps.
//!
//! [`Grammars`] is built once per model from its tokenizer (each token's bytes, a token trie)
//! and compiles requests' grammars; a grammar that does not compile is a [`SubmitError`]
//! naming the problem. Masking composes with everything else a sequence does: penalties and
//! sampling see only allowed tokens, speculative drafts are verified against masked logits
//! (a draft the grammar forbids has probability 0 and ends the accepted run), and the prefix
//! cache never sees the grammar at all. When the grammar is complete only the model's
//! end-of-generation tokens stay allowed.
//!
//! [`SubmitError`]: crate::request::SubmitError

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tandem_model::tokenizer::Tokenizer;

pub mod gbnf;

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum Grammar {
    /// Any JSON object (OpenAI `response_format: {type: "json_object"}`).
    JsonObject,
    /// A value valid under this JSON schema.
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect (which also embeds JSON schemas: `%json {...}`).
    Lark(String),
    /// A grammar in llama.cpp's GBNF.
    Gbnf(String),
    /// A whole-output regular expression.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Free text up to and including `close`, then `inner` (optionally after whitespace): the
    /// answer of a model whose prompt opened a reasoning block (`</think>` closes it).
    AfterText { close: String, inner: Box<Grammar> },
}

/// Whitespace a JSON value may have between its tokens unless the schema says otherwise
/// (`x-guidance`): enough for pretty-printed output (a newline and 31 blanks of indentation),
/// bounded so that a small model cannot spend its whole budget on blank lines.
const JSON_WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{0,32}";

/// `schema` with the default JSON layout options added where it sets none.
pub fn with_json_defaults(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(o) = &mut s {
        o.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    s
}

impl Grammar {
    /// The JSON schema a `JsonObject` / `JsonSchema` stands for.
    fn schema(&self) -> Option<Result<Value, String>> {
        match self {
            Grammar::JsonObject => Some(Ok(with_json_defaults(&serde_json::json!({"type": "object"})))),
            Grammar::JsonSchema(s) if s.is_object() => Some(Ok(with_json_defaults(s))),
            Grammar::JsonSchema(s) if s.is_boolean() => Some(Ok(s.clone())),
            Grammar::JsonSchema(_) => Some(Err("a JSON schema must be an object (or true / false)".into())),
            _ => None,
        }
    }

    fn top_level(&self) -> Result<TopLevelGrammar, String> {
        if let Some(schema) = self.schema() {
            return Ok(TopLevelGrammar::from_json_schema(schema?));
        }
        Ok(match self {
            Grammar::Regex(r) => TopLevelGrammar::from_regex(r),
            Grammar::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            _ => TopLevelGrammar::from_lark(self.lark()?),
        })
    }

    /// The grammar as a whole Lark grammar.
    fn lark(&self) -> Result<String, String> {
        Ok(match self {
            Grammar::Lark(g) => g.clone(),
            Grammar::Gbnf(g) => gbnf::gbnf_to_lark(g).map_err(|e| format!("GBNF: {e}"))?,
            Grammar::AfterText { close, inner } => {
                if matches!(**inner, Grammar::AfterText { .. }) {
                    return Err("nested free-text prefixes are not supported".into());
                }
                format!(
                    "start: free_text_ /[ \\t\\r\\n]*/ answer_\nfree_text_[suffix={}]: /(.|\\n)*/\nanswer_: {}\n",
                    lark_string(close),
                    inner.lark_expr()?
                )
            }
            _ => format!("start: {}\n", self.lark_expr()?),
        })
    }

    /// The grammar as one Lark expression (to embed in another grammar).
    fn lark_expr(&self) -> Result<String, String> {
        if let Some(schema) = self.schema() {
            return Ok(format!("%json {}", schema?));
        }
        Ok(match self {
            Grammar::Regex(r) => format!("/{}/", r.replace('/', "\\/")),
            Grammar::Choice(options) => {
                if options.is_empty() {
                    return Err("a choice needs at least one option".into());
                }
                let alts: Vec<String> = options.iter().map(|o| lark_string(o)).collect();
                format!("({})", alts.join(" | "))
            }
            Grammar::Lark(_) | Grammar::Gbnf(_) | Grammar::AfterText { .. } => {
                format!("%lark {{\n{}\n}}", self.lark()?)
            }
            Grammar::JsonObject | Grammar::JsonSchema(_) => return Err("a JSON schema that is not an object".into()),
        })
    }

    /// The part of the grammar that applies once a reasoning block is closed (a continuation
    /// that starts after `</think>`).
    pub fn answer_part(&self) -> Grammar {
        match self {
            Grammar::AfterText { inner, .. } => (**inner).clone(),
            g => g.clone(),
        }
    }
}

/// `text` as a Lark string literal.
pub fn lark_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// A model's token environment for llguidance: each token's bytes in a trie, and the model's
/// tokenizer for the strings a grammar forces.
struct Env {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tokenizer.encode(&String::from_utf8_lossy(s), false).unwrap_or_default()
    }
}

/// Compiles grammars for one model (shared by every request; building it reads the whole
/// vocabulary once).
pub struct Grammars {
    factory: ParserFactory,
    vocab: usize,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("vocab", &self.vocab).finish()
    }
}

impl Grammars {
    /// From the model's tokenizer. `vocab` is the width of the model's logits (it may exceed
    /// the tokenizer's vocabulary; the extra ids are never allowed). The tokenizer's
    /// end-of-generation ids are what a finished grammar allows.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize) -> Result<Self, String> {
        let json = tokenizer.hf_json().map_err(|e| e.to_string())?;
        let json: Value = serde_json::from_str(&json).map_err(|e| format!("tokenizer json: {e}"))?;
        // llguidance asserts on vocabularies it does not understand; that must not take the
        // server down, so a panic here means "no constrained decoding for this model".
        let mut words = catch_unwind(AssertUnwindSafe(|| llguidance::token_bytes_from_tokenizer_json(&json)))
            .map_err(|_| "the tokenizer's vocabulary could not be read for constrained decoding".to_string())?
            .map_err(|e| format!("the tokenizer's vocabulary could not be read for constrained decoding: {e}"))?;
        if words.len() > vocab {
            return Err(format!("the tokenizer has {} tokens, more than the model's {vocab} logits", words.len()));
        }
        words.resize(vocab, Vec::new());
        let eos = tokenizer.eos_ids().to_vec();
        let Some(&first_eos) = eos.first() else {
            return Err("the model has no end-of-generation token, which constrained decoding needs".into());
        };
        let info = TokRxInfo::new(vocab as u32, first_eos);
        let trie = catch_unwind(AssertUnwindSafe(|| TokTrie::from(&info, &words).with_eos_tokens(&eos)))
            .map_err(|_| "building the token trie failed".to_string())?;
        let env: TokEnv = Arc::new(Env { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Self { factory, vocab })
    }

    /// A fresh constraint for one sequence; the error names what is wrong with the grammar.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, String> {
        let top = grammar.top_level()?;
        let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(top)))
            .map_err(|_| "the grammar could not be compiled".to_string())?
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(Constraint { matcher, vocab: self.vocab, pending: None })
    }

    /// The Lark expression for the single token whose text is `text` when the vocabulary has
    /// one that is special (its bytes are not plain text, so a string literal would spell it
    /// out in pieces), else the string literal.
    pub fn token_or_literal(&self, tokenizer: &Tokenizer, text: &str) -> String {
        let trie = self.factory.tok_env().tok_trie();
        match tokenizer.token_to_id(text) {
            Some(id) if (id as usize) < self.vocab && trie.is_special_token(id) => format!("<[{id}]>"),
            _ => lark_string(text),
        }
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    matcher: Matcher,
    vocab: usize,
    /// The mask for the current state, when computed ahead (beside the forward pass).
    pending: Option<SimpleVob>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Self { matcher: self.matcher.deep_clone(), vocab: self.vocab, pending: self.pending.clone() }
    }
}

impl Constraint {
    /// Computes the current state's mask now, so that [`Self::apply`] finds it ready (the
    /// scheduler calls this on another thread while the model runs).
    pub fn prepare(&mut self) {
        if self.pending.is_none() {
            self.pending = self.matcher.compute_mask_or_eos().ok();
        }
    }

    /// Sets every logit the grammar does not allow next to `-inf` (and allowed `-inf` ones to
    /// the lowest finite value, so that an allowed token always wins an argmax). Errors when
    /// the grammar is in an error state or allows nothing.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let mask = match self.pending.take() {
            Some(m) => m,
            None => self.matcher.compute_mask_or_eos().map_err(|e| format!("grammar: {e}"))?,
        };
        if mask.is_zero() {
            return Err("the grammar allows no token here".into());
        }
        let n = logits.len().min(self.vocab);
        for (i, l) in logits.iter_mut().enumerate() {
            if i < n && mask.is_allowed(i as u32) {
                if !(*l > f32::MIN) {
                    *l = f32::MIN;
                }
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Whether the grammar allows `token` next (computing the mask if need be).
    pub fn allows(&mut self, token: u32) -> bool {
        if self.pending.is_none() {
            self.prepare();
        }
        self.pending.as_ref().is_some_and(|m| (token as usize) < self.vocab && m.is_allowed(token))
    }

    /// Advances the grammar by a token the sequence keeps. End-of-generation tokens of a
    /// finished grammar are accepted without advancing it.
    pub fn consume(&mut self, token: u32) -> Result<(), String> {
        self.pending = None;
        if self.matcher.is_stopped() {
            return if self.matcher.is_error() {
                Err(format!("grammar: {}", self.matcher.get_error().unwrap_or_default()))
            } else {
                Ok(())
            };
        }
        self.matcher.consume_token(token).map_err(|e| format!("grammar rejected token {token}: {e}"))
    }

    /// Whether the output so far is a complete match (the grammar would allow ending here).
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error() || self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
