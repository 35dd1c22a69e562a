//! Anthropic response shapes: the whole `message` object and the streaming events
//! (`message_start`, `content_block_start` / `_delta` / `_stop` with `text_delta`,
//! `thinking_delta` and `input_json_delta`, `message_delta` with the stop reason and usage,
//! `message_stop`, `ping`). Text goes through the shared [`OutputParser`], as for OpenAI.
//! `stop_reason` is `stop_sequence`, with the matched string in `stop_sequence`, when one of
//! the request's `stop_sequences` ended the answer (the engine reports which).

use serde_json::{json, Value};
use tandem_engine::{FinishReason, Usage};

use crate::output::{OutEvent, OutputConfig, OutputParser, Parsed};
use crate::response_meta::response_id;

/// `msg_…` ids.
pub fn message_id() -> String {
    response_id("msg").replacen("msg-", "msg_", 1)
}

/// Tool-use ids in Anthropic's `toolu_` form.
fn tool_id(id: &str) -> String {
    match id.strip_prefix("call_") {
        Some(rest) => format!("toolu_{rest}"),
        None => id.to_string(),
    }
}

/// `stop_reason` and `stop_sequence` of an answer: `tool_use` when it made calls, else
/// `stop_sequence` and the matched string when `stop` (one of the request's `stop_sequences`)
/// ended it, `max_tokens`, or `end_turn`. `stop_sequence` is `null` unless it is the reason.
pub fn stop_fields(reason: FinishReason, stop: Option<&str>, made_calls: bool) -> (&'static str, Value) {
    match (made_calls, reason, stop) {
        (_, FinishReason::Length, _) => ("max_tokens", Value::Null),
        (true, _, _) => ("tool_use", Value::Null),
        (false, FinishReason::Stop, Some(s)) => ("stop_sequence", json!(s)),
        (false, FinishReason::Stop, None) => ("end_turn", Value::Null),
    }
}

fn usage_body(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// Tool arguments as the `input` object (`{}` when they are not a JSON object).
fn input_object(args: &str) -> Value {
    serde_json::from_str::<Value>(args).ok().filter(Value::is_object).unwrap_or_else(|| json!({}))
}

/// The whole `message` object.
pub fn whole_message(
    id: &str,
    model: &str,
    output: &OutputConfig,
    text: &str,
    reason: FinishReason,
    stop: Option<&str>,
    usage: &Usage,
) -> Value {
    let p = Parsed::from_text(output, text);
    let mut content = Vec::new();
    if !p.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": p.reasoning, "signature": ""}));
    }
    if !p.content.is_empty() || (p.calls.is_empty() && content.is_empty()) {
        content.push(json!({"type": "text", "text": p.content}));
    }
    for c in &p.calls {
        content.push(
            json!({"type": "tool_use", "id": tool_id(&c.id), "name": c.name, "input": input_object(&c.arguments)}),
        );
    }
    let (stop_reason, stop_sequence) = stop_fields(reason, stop, !p.calls.is_empty());
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage_body(usage),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    Tool,
}

/// Turns generated text into Anthropic stream events (`(event name, data)` pairs).
pub struct EventWriter {
    parser: OutputParser,
    open: Option<Block>,
    /// Index of the open block, or of the next one.
    index: usize,
}

pub type Event = (&'static str, Value);

impl EventWriter {
    pub fn new(output: &OutputConfig) -> Self {
        Self { parser: OutputParser::new(output), open: None, index: 0 }
    }

    /// `message_start` and a `ping`.
    pub fn start(id: &str, model: &str, input_tokens: usize) -> Vec<Event> {
        vec![
            (
                "message_start",
                json!({"type": "message_start", "message": {
                    "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                    "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": input_tokens, "output_tokens": 0}
                }}),
            ),
            ("ping", json!({"type": "ping"})),
        ]
    }

    /// Events for one text delta.
    pub fn text(&mut self, text: &str) -> Vec<Event> {
        let events = self.parser.push(text);
        self.blocks(events)
    }

    /// The closing events: the last block's stop, `message_delta` and `message_stop`. `stop` is
    /// the stop sequence that ended generation, if one did.
    pub fn finish(&mut self, reason: FinishReason, stop: Option<&str>, tail: &str, usage: &Usage) -> Vec<Event> {
        let mut events = self.parser.push(tail);
        events.extend(self.parser.finish());
        let mut out = self.blocks(events);
        if self.open.is_none() && self.index == 0 {
            // An empty answer still has one (empty) text block.
            out.extend(self.open_block(Block::Text, json!({"type": "text", "text": ""})));
        }
        out.extend(self.close());
        let (stop_reason, stop_sequence) = stop_fields(reason, stop, self.parser.made_calls());
        out.push((
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": usage.completion_tokens}}),
        ));
        out.push(("message_stop", json!({"type": "message_stop"})));
        out
    }

    fn blocks(&mut self, events: Vec<OutEvent>) -> Vec<Event> {
        let mut out = Vec::new();
        for e in events {
            match e {
                OutEvent::Reasoning(s) => {
                    if self.open != Some(Block::Thinking) {
                        out.extend(
                            self.open_block(
                                Block::Thinking,
                                json!({"type": "thinking", "thinking": "", "signature": ""}),
                            ),
                        );
                    }
                    out.push(self.delta(json!({"type": "thinking_delta", "thinking": s})));
                }
                OutEvent::Content(s) => {
                    if self.open != Some(Block::Text) {
                        out.extend(self.open_block(Block::Text, json!({"type": "text", "text": ""})));
                    }
                    out.push(self.delta(json!({"type": "text_delta", "text": s})));
                }
                OutEvent::ToolStart { id, name, .. } => {
                    out.extend(self.open_block(
                        Block::Tool,
                        json!({"type": "tool_use", "id": tool_id(&id), "name": name, "input": {}}),
                    ));
                }
                OutEvent::ToolArgs { fragment, .. } => {
                    if self.open == Some(Block::Tool) {
                        out.push(self.delta(json!({"type": "input_json_delta", "partial_json": fragment})));
                    }
                }
            }
        }
        out
    }

    fn open_block(&mut self, kind: Block, block: Value) -> Vec<Event> {
        let mut out = self.close();
        self.open = Some(kind);
        out.push((
            "content_block_start",
            json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
        out
    }

    fn delta(&self, delta: Value) -> Event {
        ("content_block_delta", json!({"type": "content_block_delta", "index": self.index, "delta": delta}))
    }

    fn close(&mut self) -> Vec<Event> {
        match self.open.take() {
            Some(_) => {
                let e = ("content_block_stop", json!({"type": "content_block_stop", "index": self.index}));
                self.index += 1;
                vec![e]
            }
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{ToolFormat, ToolSchemas};

    fn cfg() -> OutputConfig {
        OutputConfig {
            reasoning_inside: true,
            parse_reasoning: true,
            tools: Some((ToolFormat::Hermes, ToolSchemas::default(), true)),
        }
    }

    const TEXT: &str = "hmm\n</think>\n\nOk.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";

    #[test]
    fn whole() {
        let usage = Usage { prompt_tokens: 3, completion_tokens: 9, cached_tokens: 0, ..Default::default() };
        let m = whole_message("msg_1", "m", &cfg(), TEXT, FinishReason::Stop, None, &usage);
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(m["content"][0], json!({"type": "thinking", "thinking": "hmm", "signature": ""}));
        assert_eq!(m["content"][1], json!({"type": "text", "text": "Ok."}));
        assert_eq!(m["content"][2]["input"], json!({"a": 1}));
        assert!(m["content"][2]["id"].as_str().unwrap().starts_with("toolu_"));
        assert_eq!(m["usage"]["input_tokens"], 3);
        let empty = whole_message("msg_2", "m", &OutputConfig::default(), "", FinishReason::Length, None, &usage);
        assert_eq!(empty["content"], json!([{"type": "text", "text": ""}]));
        assert_eq!(empty["stop_reason"], "max_tokens");
        assert_eq!(empty["stop_sequence"], Value::Null);
        let stopped = whole_message("msg_3", "m", &cfg(), "hmm</think>Ok", FinishReason::Stop, Some("\n\nH"), &usage);
        assert_eq!((&stopped["stop_reason"], &stopped["stop_sequence"]), (&json!("stop_sequence"), &json!("\n\nH")));
        assert_eq!(stopped["content"][1], json!({"type": "text", "text": "Ok"}));
        let plain = whole_message("msg_4", "m", &cfg(), "hmm</think>Ok", FinishReason::Stop, None, &usage);
        assert_eq!((&plain["stop_reason"], &plain["stop_sequence"]), (&json!("end_turn"), &Value::Null));
    }

    #[test]
    fn stream_events() {
        let mut w = EventWriter::new(&cfg());
        let mut events = EventWriter::start("msg_1", "m", 3);
        for ch in TEXT.chars() {
            events.extend(w.text(&ch.to_string()));
        }
        events.extend(w.finish(FinishReason::Stop, None, "", &Usage::default()));
        let names: Vec<&str> = events.iter().map(|e| e.0).collect();
        let mut dedup = names.clone();
        dedup.dedup();
        assert_eq!(
            dedup,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (name, data) in &events {
            assert_eq!(data["type"], *name);
        }
        let json: String = events.iter().filter_map(|e| e.1["delta"]["partial_json"].as_str()).collect();
        assert_eq!(json, "{\"a\": 1}");
        let last_delta = &events[events.len() - 2].1;
        assert_eq!(last_delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(last_delta["delta"]["stop_sequence"], Value::Null);

        // A stop sequence ended the answer: `message_delta` names it.
        let mut w = EventWriter::new(&OutputConfig::default());
        let mut events = w.text("The answer is 4");
        events.extend(w.finish(FinishReason::Stop, Some("2."), "", &Usage::default()));
        let delta = &events[events.len() - 2];
        assert_eq!(delta.0, "message_delta");
        assert_eq!(delta.1["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": "2."}));
    }
}
