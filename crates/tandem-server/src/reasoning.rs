//! Reasoning in model output: text inside `<think>…</think>` is split from the answer.
//!
//! The block is recognised when the output opens with `<think>` (after whitespace), or when the
//! prompt itself already opened it (templates such as Qwen3.5's end the generation prompt with
//! `<think>\n`, so the output starts inside the block; see [`prompt_opens_reasoning`]). Whitespace
//! at the start and end of the reasoning and at the start of the answer is dropped. A `</think>`
//! that never comes leaves everything in the reasoning. Streaming and whole-text parsing go
//! through the same [`ReasoningParser`], so deltas concatenate to the non-streaming split.

pub const OPEN: &str = "<think>";
pub const CLOSE: &str = "</think>";

/// Whether a rendered prompt ends inside an open reasoning block.
pub fn prompt_opens_reasoning(prompt: &str) -> bool {
    prompt.trim_end().ends_with(OPEN)
}

/// A piece of output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting to see whether the output opens with `<think>`.
    Start,
    Reasoning,
    /// After `</think>`, before the first non-whitespace of the answer.
    AnswerStart,
    Content,
}

/// Splits a stream of text deltas into reasoning and content.
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    state: State,
    buf: String,
    /// Trailing whitespace of the reasoning, emitted once more reasoning follows.
    held_ws: String,
    reasoning_started: bool,
}

impl ReasoningParser {
    /// `inside`: the prompt opened the block, so output starts as reasoning.
    pub fn new(inside: bool) -> Self {
        let state = if inside { State::Reasoning } else { State::Start };
        Self { state, buf: String::new(), held_ws: String::new(), reasoning_started: false }
    }

    /// Whether the output is currently inside the reasoning block.
    pub fn in_reasoning(&self) -> bool {
        self.state == State::Reasoning
    }

    /// Whether the reasoning block has been closed (the answer has begun).
    pub fn answered(&self) -> bool {
        matches!(self.state, State::AnswerStart | State::Content)
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.run(&mut out, false);
        out
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        self.run(&mut out, true);
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Reasoning => self.reasoning(&rest, &mut out),
            State::Start | State::Content => push_content(&mut out, rest),
            State::AnswerStart => push_content(&mut out, rest.trim_start().to_string()),
        }
        out
    }

    fn run(&mut self, out: &mut Vec<Piece>, at_end: bool) {
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.state = State::Reasoning;
                    } else if !at_end && (t.is_empty() || OPEN.starts_with(t)) {
                        return;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning => match self.buf.find(CLOSE) {
                    Some(pos) => {
                        let before = self.buf[..pos].to_string();
                        self.reasoning(&before, out);
                        self.held_ws.clear();
                        self.buf.drain(..pos + CLOSE.len());
                        self.state = State::AnswerStart;
                    }
                    None => {
                        let keep = if at_end { 0 } else { partial_suffix(&self.buf, CLOSE) };
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.reasoning(&text, out);
                        return;
                    }
                },
                State::AnswerStart => {
                    let lead = self.buf.len() - self.buf.trim_start().len();
                    self.buf.drain(..lead);
                    if self.buf.is_empty() {
                        return;
                    }
                    self.state = State::Content;
                }
                State::Content => {
                    let text = std::mem::take(&mut self.buf);
                    push_content(out, text);
                    return;
                }
            }
        }
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<Piece>) {
        let text = if self.reasoning_started { text } else { text.trim_start() };
        let core = text.trim_end();
        if core.is_empty() {
            if self.reasoning_started {
                self.held_ws.push_str(text);
            }
            return;
        }
        self.reasoning_started = true;
        let s = std::mem::take(&mut self.held_ws) + core;
        out.push(Piece::Reasoning(s));
        self.held_ws = text[core.len()..].to_string();
    }
}

fn push_content(out: &mut Vec<Piece>, text: String) {
    if !text.is_empty() {
        out.push(Piece::Content(text));
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of `tag`.
pub fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && s.ends_with(&tag[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(inside: bool, deltas: &[&str]) -> (String, String) {
        let mut p = ReasoningParser::new(inside);
        let mut pieces = Vec::new();
        for d in deltas {
            pieces.extend(p.push(d));
        }
        pieces.extend(p.finish());
        let (mut r, mut c) = (String::new(), String::new());
        for piece in pieces {
            match piece {
                Piece::Reasoning(s) => r.push_str(&s),
                Piece::Content(s) => c.push_str(&s),
            }
        }
        (r, c)
    }

    fn every_cut(inside: bool, text: &str) -> (String, String) {
        let whole = split(inside, &[text]);
        for i in 0..=text.len() {
            if text.is_char_boundary(i) {
                assert_eq!(split(inside, &[&text[..i], &text[i..]]), whole, "cut at {i} of {text:?}");
            }
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split(inside, &refs), whole, "char by char: {text:?}");
        whole
    }

    #[test]
    fn splits() {
        let r = |a: &str, b: &str| (a.to_string(), b.to_string());
        assert_eq!(every_cut(false, "<think>\nhmm, 2+2\n</think>\n\nIt is 4."), r("hmm, 2+2", "It is 4."));
        assert_eq!(every_cut(true, "\nhmm\n\nmore\n</think>\n\nIt is 4."), r("hmm\n\nmore", "It is 4."));
        assert_eq!(every_cut(false, "  Just an answer <think> not here"), r("", "  Just an answer <think> not here"));
        assert_eq!(every_cut(false, "<thin"), r("", "<thin"));
        assert_eq!(every_cut(true, "thinking forever</thi"), r("thinking forever</thi", ""));
        assert_eq!(every_cut(false, "<think>\n\n</think>\n\nAnswer ü"), r("", "Answer ü"));
        assert_eq!(every_cut(true, "é</think>"), r("é", ""));
    }

    #[test]
    fn state_queries_and_prompt_check() {
        let mut p = ReasoningParser::new(false);
        p.push("<think>");
        assert!(p.in_reasoning());
        p.push("x</think>");
        assert!(p.answered() && !p.in_reasoning());
        assert!(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
        assert_eq!(partial_suffix("abc</th", CLOSE), 4);
        assert_eq!(partial_suffix("é", CLOSE), 0);
    }
}
