//! The generated text of a chat answer split into reasoning, content and tool calls: the
//! [`reasoning`](crate::reasoning) splitter first, then the [`tools`](crate::tools) parser on
//! the content. Both API styles (OpenAI chat, Anthropic messages) and both delivery modes
//! (whole, streamed) use this one pipeline, so a stream always adds up to the whole answer.

use crate::reasoning::{Piece, ReasoningParser};
use crate::tools::{ToolCall, ToolEvent, ToolFormat, ToolParser, ToolSchemas};

/// How to read one answer.
#[derive(Debug, Clone, Default)]
pub struct OutputConfig {
    /// The prompt opened a `<think>` block, so the output starts inside it.
    pub reasoning_inside: bool,
    /// Split `<think>…</think>` off at all.
    pub parse_reasoning: bool,
    /// Tool-call parsing: the format, the offered tools' schemas and whether several calls are
    /// allowed. `None` when no tools were offered (or `tool_choice` is `none`).
    pub tools: Option<(ToolFormat, ToolSchemas, bool)>,
}

/// One step of the parsed output.
#[derive(Debug, Clone, PartialEq)]
pub enum OutEvent {
    Reasoning(String),
    Content(String),
    ToolStart { index: usize, id: String, name: String },
    ToolArgs { index: usize, fragment: String },
}

/// The streaming parser of one answer.
pub struct OutputParser {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolParser>,
}

impl OutputParser {
    pub fn new(cfg: &OutputConfig) -> Self {
        Self {
            reasoning: cfg.parse_reasoning.then(|| ReasoningParser::new(cfg.reasoning_inside)),
            tools: cfg.tools.as_ref().map(|(f, s, parallel)| ToolParser::new(*f, s.clone(), *parallel)),
        }
    }

    /// Whether at least one tool call has been reported.
    pub fn made_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| t.calls() > 0)
    }

    pub fn push(&mut self, text: &str) -> Vec<OutEvent> {
        let pieces = match &mut self.reasoning {
            Some(r) => r.push(text),
            None => vec![Piece::Content(text.to_string())],
        };
        let mut out = Vec::new();
        self.route(pieces, &mut out);
        out
    }

    pub fn finish(&mut self) -> Vec<OutEvent> {
        let pieces = self.reasoning.as_mut().map(ReasoningParser::finish).unwrap_or_default();
        let mut out = Vec::new();
        self.route(pieces, &mut out);
        if let Some(t) = &mut self.tools {
            out.extend(t.finish().into_iter().map(from_tool));
        }
        out
    }

    fn route(&mut self, pieces: Vec<Piece>, out: &mut Vec<OutEvent>) {
        for p in pieces {
            match (p, &mut self.tools) {
                (Piece::Reasoning(s), _) => out.push(OutEvent::Reasoning(s)),
                (Piece::Content(s), Some(t)) => out.extend(t.push(&s).into_iter().map(from_tool)),
                (Piece::Content(s), None) => {
                    if !s.is_empty() {
                        out.push(OutEvent::Content(s))
                    }
                }
            }
        }
    }
}

fn from_tool(e: ToolEvent) -> OutEvent {
    match e {
        ToolEvent::Content(s) => OutEvent::Content(s),
        ToolEvent::Start { index, id, name } => OutEvent::ToolStart { index, id, name },
        ToolEvent::Args { index, fragment } => OutEvent::ToolArgs { index, fragment },
    }
}

/// A whole parsed answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl Parsed {
    /// Adds events in order.
    pub fn extend(&mut self, events: impl IntoIterator<Item = OutEvent>) {
        for e in events {
            match e {
                OutEvent::Reasoning(s) => self.reasoning.push_str(&s),
                OutEvent::Content(s) => self.content.push_str(&s),
                OutEvent::ToolStart { id, name, .. } => {
                    self.calls.push(ToolCall { id, name, arguments: String::new() })
                }
                OutEvent::ToolArgs { index, fragment } => {
                    if let Some(c) = self.calls.get_mut(index) {
                        c.arguments.push_str(&fragment);
                    }
                }
            }
        }
    }

    /// Parses a whole answer.
    pub fn from_text(cfg: &OutputConfig, text: &str) -> Self {
        let mut p = OutputParser::new(cfg);
        let mut out = Self::default();
        out.extend(p.push(text));
        out.extend(p.finish());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_then_calls() {
        let cfg = OutputConfig {
            reasoning_inside: true,
            parse_reasoning: true,
            tools: Some((ToolFormat::Hermes, ToolSchemas::default(), true)),
        };
        let text = "I should call f.\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let whole = Parsed::from_text(&cfg, text);
        assert_eq!(whole.reasoning, "I should call f.");
        assert_eq!(whole.content, "Sure.");
        assert_eq!((whole.calls[0].name.as_str(), whole.calls[0].arguments.as_str()), ("f", "{\"a\": 1}"));
        // Byte by byte gives the same (ids aside).
        let mut p = OutputParser::new(&cfg);
        let mut streamed = Parsed::default();
        for ch in text.chars() {
            streamed.extend(p.push(&ch.to_string()));
        }
        streamed.extend(p.finish());
        assert!(p.made_calls());
        streamed.calls[0].id = whole.calls[0].id.clone();
        assert_eq!(streamed, whole);
    }

    #[test]
    fn nothing_parsed_when_off() {
        let cfg = OutputConfig::default();
        let text = "<think>x</think><tool_call>{\"name\":\"f\"}</tool_call>";
        assert_eq!(Parsed::from_text(&cfg, text), Parsed { content: text.into(), ..Parsed::default() });
    }
}
