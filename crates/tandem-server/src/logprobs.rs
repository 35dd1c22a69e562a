//! Engine log-probabilities in the two OpenAI shapes: the chat form
//! (`{"content":[{token, logprob, bytes, top_logprobs}]}`) and the legacy completions form
//! (`{tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}`).

use std::collections::BTreeMap;

use serde::Serialize;
use tandem_engine::{PositionLogprobs, TokenLogprob};

/// JSON has no -inf; OpenAI reports impossible tokens as -9999.
fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}

/// One alternative in the chat form.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatTopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One generated position in the chat form.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChatLogprobEntry {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// `choice.logprobs` of a chat completion (or of one chunk).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ChatLogprobs {
    pub content: Vec<ChatLogprobEntry>,
}

fn chat_top(t: &TokenLogprob) -> ChatTopLogprob {
    ChatTopLogprob { token: t.text.clone(), logprob: finite(t.logprob), bytes: t.text.as_bytes().to_vec() }
}

impl ChatLogprobEntry {
    pub fn new(p: &PositionLogprobs) -> Self {
        let c = chat_top(&p.chosen);
        Self { token: c.token, logprob: c.logprob, bytes: c.bytes, top_logprobs: p.top.iter().map(chat_top).collect() }
    }
}

impl ChatLogprobs {
    pub fn from_positions<'a>(positions: impl IntoIterator<Item = &'a PositionLogprobs>) -> Self {
        Self { content: positions.into_iter().map(ChatLogprobEntry::new).collect() }
    }
}

/// `choice.logprobs` of a legacy completion (or of one chunk).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct LegacyLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// The top alternatives at each position, always including the chosen token.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Character offset of each token in the generated text.
    pub text_offset: Vec<usize>,
}

impl LegacyLogprobs {
    /// Appends one position whose token starts `offset` characters into the text.
    pub fn push(&mut self, p: &PositionLogprobs, offset: usize) {
        self.tokens.push(p.chosen.text.clone());
        self.token_logprobs.push(finite(p.chosen.logprob));
        let mut top: BTreeMap<String, f32> = p.top.iter().map(|t| (t.text.clone(), finite(t.logprob))).collect();
        top.entry(p.chosen.text.clone()).or_insert(finite(p.chosen.logprob));
        self.top_logprobs.push(top);
        self.text_offset.push(offset);
    }
}

/// Builds [`LegacyLogprobs`] across a stream, tracking character offsets from token texts.
#[derive(Debug, Clone, Default)]
pub struct LegacyOffsets {
    chars: usize,
}

impl LegacyOffsets {
    /// The legacy logprobs of one position, advancing the offset by its token's text.
    pub fn next(&mut self, out: &mut LegacyLogprobs, p: &PositionLogprobs) {
        out.push(p, self.chars);
        self.chars += p.chosen.text.chars().count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tl(id: u32, text: &str, logprob: f32) -> TokenLogprob {
        TokenLogprob { id, text: text.into(), logprob }
    }

    fn pos() -> PositionLogprobs {
        PositionLogprobs { chosen: tl(1, "hé", -0.5), top: vec![tl(1, "hé", -0.5), tl(2, "x", f32::NEG_INFINITY)] }
    }

    #[test]
    fn chat_shape() {
        let l = ChatLogprobs::from_positions([&pos()]);
        let v = serde_json::to_value(&l).unwrap();
        assert_eq!(v["content"][0]["token"], "hé");
        assert_eq!(v["content"][0]["bytes"].as_array().unwrap().len(), 3);
        assert_eq!(v["content"][0]["top_logprobs"][1]["logprob"], -9999.0);
    }

    #[test]
    fn legacy_shape_and_offsets() {
        let mut out = LegacyLogprobs::default();
        let mut offs = LegacyOffsets::default();
        offs.next(&mut out, &pos());
        let only_chosen = PositionLogprobs { chosen: tl(3, "y", -1.0), top: vec![] };
        offs.next(&mut out, &only_chosen);
        assert_eq!(out.text_offset, vec![0, 2]);
        assert_eq!(out.tokens, vec!["hé".to_string(), "y".to_string()]);
        assert_eq!(out.top_logprobs[1].get("y"), Some(&-1.0));
        assert_eq!(out.top_logprobs[0].len(), 2);
        let v = serde_json::to_value(&out).unwrap();
        assert_eq!(v["top_logprobs"][0]["x"], -9999.0);
    }
}
