//! Streaming detokenization: turning generated ids, one at a time, into final text.
//!
//! Same algorithm as HF's `DecodeStream` (and vLLM's detokenizer): keep a small window of
//! ids, decode it, and emit what the decoded text gained beyond the previously emitted
//! prefix — but only when the text does not end in a replacement character (an incomplete
//! UTF-8 sequence from byte-level or byte-fallback tokens). After each emission the window
//! slides so it keeps one chunk of context, which is enough for SentencePiece space rules and
//! byte fallback. Windows are decoded behind the tokenizer's anchor token, so the first
//! generated token keeps its leading space.

use super::Tokenizer;

/// How many ids may wait for the end of a UTF-8 sequence before we emit them lossily
/// (a character has at most 4 bytes; more pending ids means the bytes are simply invalid).
const MAX_PENDING: usize = 8;

/// Streaming detokenizer. Feed ids with [`push`](Self::push); concatenating everything it
/// returns plus [`flush`](Self::flush) gives the decoded text.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    skip_special: bool,
    /// The window: already-emitted context ids followed by pending ids.
    ids: Vec<u32>,
    /// Decoded text of the context part of the window (already emitted).
    prefix: String,
    /// Number of context ids at the start of `ids`.
    prefix_index: usize,
}

impl IncrementalDecoder {
    pub fn new(skip_special: bool) -> Self {
        IncrementalDecoder { skip_special, ids: Vec::new(), prefix: String::new(), prefix_index: 0 }
    }

    /// Adds one id; returns the text that became final (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        self.ids.push(id);
        let text = tok.decode_continuation(&self.ids, self.skip_special);
        let pending = self.ids.len() - self.prefix_index;
        let incomplete = text.ends_with('\u{FFFD}') && pending < MAX_PENDING;
        if text.len() <= self.prefix.len() || incomplete {
            return String::new();
        }
        let new_text = self.new_part(&text);
        // Keep the ids just emitted as context for the next step.
        self.ids.drain(..self.prefix_index);
        self.prefix_index = self.ids.len();
        self.prefix = tok.decode_continuation(&self.ids, self.skip_special);
        new_text
    }

    /// Emits whatever is still held (e.g. an incomplete UTF-8 sequence at the end), lossily,
    /// and resets the decoder.
    pub fn flush(&mut self, tok: &Tokenizer) -> String {
        let out = if self.ids.len() > self.prefix_index {
            let text = tok.decode_continuation(&self.ids, self.skip_special);
            if text.len() > self.prefix.len() {
                self.new_part(&text)
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        *self = IncrementalDecoder::new(self.skip_special);
        out
    }

    /// `text` minus the already-emitted prefix. Should the decoder ever rewrite the prefix,
    /// emit from the end of the longest common prefix (text already sent cannot be retracted).
    fn new_part(&self, text: &str) -> String {
        if let Some(rest) = text.strip_prefix(self.prefix.as_str()) {
            return rest.to_string();
        }
        let mut common = text.bytes().zip(self.prefix.bytes()).take_while(|(a, b)| a == b).count();
        while !text.is_char_boundary(common) {
            common -= 1;
        }
        text[common..].to_string()
    }
}
