//! Responses API output: the response object and its streaming events. One writer turns the
//! parsed answer ([`OutEvent`]s: reasoning, text, tool calls) into output items (`reasoning`,
//! `message` with `output_text`, `function_call`) and, when streaming, into the event sequence
//! (`response.created`, `response.output_item.added`, `response.output_text.delta`,
//! `response.function_call_arguments.delta`, ... `response.completed`); the whole answer runs
//! through the same writer, so a stream always adds up to the response object.

use serde_json::{json, Map, Value};
use tandem_engine::{FinishReason, Usage};

use crate::output::OutEvent;
/// A Responses-style id: `prefix_` and 24 hex digits (`resp_…`, `msg_…`, `fc_…`, `rs_…`).
pub fn new_id(prefix: &str) -> String {
    crate::response_meta::response_id(prefix).replacen('-', "_", 1)
}

/// A named server-sent event.
pub type Event = (&'static str, Value);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    None,
    Reasoning,
    Message,
    Call,
}

/// Builds output items and events for one response.
pub struct Writer {
    id: String,
    created: u64,
    model: String,
    echo: Map<String, Value>,
    items: Vec<Value>,
    open: Open,
    /// Accumulated text of the open item (reasoning, message text or call arguments).
    text: String,
    seq: u64,
}

impl Writer {
    pub fn new(id: &str, model: &str, echo: Map<String, Value>) -> Self {
        Self {
            id: id.to_string(),
            created: crate::response_meta::unix_now(),
            model: model.to_string(),
            echo,
            items: Vec::new(),
            open: Open::None,
            text: String::new(),
            seq: 0,
        }
    }

    fn ev(&mut self, name: &'static str, mut data: Value) -> Event {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        (name, data)
    }

    /// The response object in its current state.
    pub fn response(&self, status: &str, finish: Option<FinishReason>, usage: Option<&Usage>) -> Value {
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "model": self.model, "output": self.items, "error": null,
            "incomplete_details": if finish == Some(FinishReason::Length) { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "usage": usage.map(|u| json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            })),
        });
        if let Some(o) = r.as_object_mut() {
            for (k, v) in &self.echo {
                o.insert(k.clone(), v.clone());
            }
            if o.get("parallel_tool_calls").is_none_or(Value::is_null) {
                o.insert("parallel_tool_calls".into(), Value::Bool(true));
            }
            if o.get("tool_choice").is_none_or(Value::is_null) {
                o.insert("tool_choice".into(), json!("auto"));
            }
            if o.get("tools").is_none_or(Value::is_null) {
                o.insert("tools".into(), json!([]));
            }
        }
        r
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<Event> {
        let r = self.response("in_progress", None, None);
        vec![
            self.ev("response.created", json!({"response": r})),
            self.ev("response.in_progress", json!({"response": r})),
        ]
    }

    /// The events of parsed output.
    pub fn push(&mut self, events: Vec<OutEvent>) -> Vec<Event> {
        let mut out = Vec::new();
        for e in events {
            match e {
                OutEvent::Reasoning(s) => {
                    if self.open != Open::Reasoning {
                        self.close(&mut out);
                        self.open_item(
                            Open::Reasoning,
                            json!({"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []}),
                            &mut out,
                        );
                    }
                    self.text.push_str(&s);
                    let (item_id, index) = self.current();
                    out.push(self.ev(
                        "response.reasoning_text.delta",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": s}),
                    ));
                }
                OutEvent::Content(s) => {
                    if self.open != Open::Message {
                        self.close(&mut out);
                        let item = json!({"type": "message", "id": new_id("msg"), "status": "in_progress",
                            "role": "assistant", "content": []});
                        self.open_item(Open::Message, item, &mut out);
                        let (item_id, index) = self.current();
                        out.push(self.ev(
                            "response.content_part.added",
                            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                                "part": {"type": "output_text", "text": "", "annotations": []}}),
                        ));
                    }
                    self.text.push_str(&s);
                    let (item_id, index) = self.current();
                    out.push(self.ev(
                        "response.output_text.delta",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": s, "logprobs": []}),
                    ));
                }
                OutEvent::ToolStart { id, name, .. } => {
                    self.close(&mut out);
                    let item = json!({"type": "function_call", "id": new_id("fc"), "call_id": id, "name": name,
                        "arguments": "", "status": "in_progress"});
                    self.open_item(Open::Call, item, &mut out);
                }
                OutEvent::ToolArgs { fragment, .. } => {
                    if self.open == Open::Call {
                        self.text.push_str(&fragment);
                        let (item_id, index) = self.current();
                        out.push(self.ev(
                            "response.function_call_arguments.delta",
                            json!({"item_id": item_id, "output_index": index, "delta": fragment}),
                        ));
                    }
                }
            }
        }
        out
    }

    /// Closes the open item and ends the response: `response.completed` (or `incomplete` when
    /// the token limit cut it).
    pub fn finish(&mut self, reason: FinishReason, usage: &Usage) -> (Vec<Event>, Value) {
        let mut out = Vec::new();
        self.close(&mut out);
        let status = if reason == FinishReason::Length { "incomplete" } else { "completed" };
        let r = self.response(status, Some(reason), Some(usage));
        let name = if status == "completed" { "response.completed" } else { "response.incomplete" };
        out.push(self.ev(name, json!({"response": r})));
        (out, r)
    }

    /// The output items so far.
    pub fn items(&self) -> &[Value] {
        &self.items
    }

    fn current(&self) -> (Value, usize) {
        let i = self.items.len() - 1;
        (self.items[i]["id"].clone(), i)
    }

    fn open_item(&mut self, kind: Open, item: Value, out: &mut Vec<Event>) {
        self.items.push(item.clone());
        self.open = kind;
        self.text.clear();
        let index = self.items.len() - 1;
        out.push(self.ev("response.output_item.added", json!({"output_index": index, "item": item})));
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        if self.open == Open::None {
            return;
        }
        let (item_id, index) = self.current();
        let text = std::mem::take(&mut self.text);
        match self.open {
            Open::Reasoning => {
                self.items[index]["content"] = json!([{"type": "reasoning_text", "text": text}]);
                out.push(self.ev(
                    "response.reasoning_text.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
                ));
            }
            Open::Message => {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                self.items[index]["content"] = json!([part]);
                self.items[index]["status"] = json!("completed");
                out.push(self.ev(
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                ));
                out.push(self.ev(
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
                ));
            }
            Open::Call => {
                self.items[index]["arguments"] = json!(text);
                self.items[index]["status"] = json!("completed");
                out.push(self.ev(
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": index, "arguments": text}),
                ));
            }
            Open::None => {}
        }
        let item = self.items[index].clone();
        out.push(self.ev("response.output_item.done", json!({"output_index": index, "item": item})));
        self.open = Open::None;
    }
}

/// The assistant turn of a response's output as a chat message (for the stored conversation).
pub fn assistant_message(items: &[Value]) -> Value {
    let mut content = String::new();
    let mut calls = Vec::new();
    for it in items {
        match it["type"].as_str() {
            Some("message") => {
                for p in it["content"].as_array().into_iter().flatten() {
                    content.push_str(p["text"].as_str().unwrap_or(""));
                }
            }
            Some("function_call") => calls.push(json!({"id": it["call_id"], "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]}})),
            _ => {}
        }
    }
    let mut m = json!({"role": "assistant", "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { json!(content) }});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_add_up_to_the_response() {
        let mut w = Writer::new("resp_1", "m", Map::new());
        let mut events = w.start();
        events.extend(w.push(vec![
            OutEvent::Reasoning("think".into()),
            OutEvent::Content("Let me ".into()),
            OutEvent::Content("check.".into()),
            OutEvent::ToolStart { index: 0, id: "call_a".into(), name: "f".into() },
            OutEvent::ToolArgs { index: 0, fragment: "{\"x\":".into() },
            OutEvent::ToolArgs { index: 0, fragment: "1}".into() },
        ]));
        let usage = Usage { prompt_tokens: 5, completion_tokens: 7, ..Usage::default() };
        let (end, r) = w.finish(FinishReason::Stop, &usage);
        events.extend(end);
        let seqs: Vec<u64> = events.iter().map(|(_, d)| d["sequence_number"].as_u64().unwrap()).collect();
        assert_eq!(seqs, (0..events.len() as u64).collect::<Vec<_>>());
        let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.first(), Some(&"response.created"));
        assert_eq!(names.last(), Some(&"response.completed"));
        assert_eq!(names.iter().filter(|n| **n == "response.output_item.added").count(), 3);
        assert_eq!(names.iter().filter(|n| **n == "response.output_item.done").count(), 3);
        let out = r["output"].as_array().unwrap();
        assert_eq!(out[0]["content"][0]["text"], "think");
        assert_eq!(out[1]["content"][0]["text"], "Let me check.");
        assert_eq!((&out[2]["call_id"], &out[2]["arguments"]), (&json!("call_a"), &json!("{\"x\":1}")));
        assert_eq!(r["status"], "completed");
        assert_eq!(r["usage"]["total_tokens"], 12);
        let text: String = events
            .iter()
            .filter(|(n, _)| *n == "response.output_text.delta")
            .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(text, "Let me check.");
        let m = assistant_message(w.items());
        assert_eq!(m["content"], "Let me check.");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"x\":1}");
        // Cut by the token limit: incomplete.
        let mut w = Writer::new("resp_2", "m", Map::new());
        w.push(vec![OutEvent::Content("partial".into())]);
        let (end, r) = w.finish(FinishReason::Length, &usage);
        assert_eq!(end.last().unwrap().0, "response.incomplete");
        assert_eq!(
            (r["status"].as_str(), r["incomplete_details"]["reason"].as_str()),
            (Some("incomplete"), Some("max_output_tokens"))
        );
    }
}
