//! Tool calls in model output: the formats the supported models write, and a streaming parser
//! that splits generated text into plain content and OpenAI-style tool calls.
//!
//! Formats ([`ToolFormat`]):
//! - **Hermes / Qwen JSON**: `<tool_call>{"name": …, "arguments": {…}}</tool_call>` ([`hermes`]).
//! - **Qwen3-Coder / Qwen3.5 XML**: `<tool_call><function=NAME><parameter=ARG>VALUE</parameter>…
//!   </function></tool_call>`; values are typed from the tool's JSON schema ([`qwen_xml`]).
//! - **Llama 3 JSON**: the whole answer is `{"name": …, "parameters": {…}}` (several separated by
//!   `;`), optionally after `<|python_tag|>` ([`llama3`]).
//!
//! [`ToolParser`] is fed text deltas and returns [`ToolEvent`]s: content deltas, and for every
//! call a [`ToolEvent::Start`] (index, id, name) followed by its [`ToolEvent::Args`]. A call is
//! held back until its closing tag (or the end of the output) so that it can be checked first:
//! anything that does not parse is passed on as plain content, never as an error. The
//! non-streaming parse ([`ToolParser::parse_all`]) runs the same machine over the whole text, so
//! streamed deltas always concatenate to the non-streaming result.
//!
//! Whitespace: content whitespace directly before a call and after the last one is dropped
//! (so "text\n\n<tool_call>…" gives content "text"); output without calls is passed on exactly.

pub mod hermes;
pub mod llama3;
pub mod qwen_xml;
#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

/// The tool-call syntax a model writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    QwenXml,
    Llama3,
}

impl ToolFormat {
    /// Parses a `--tool-parser` value: `hermes`, `qwen-xml` (or `qwen3-coder`), `llama3`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().replace('_', "-").as_str() {
            "hermes" | "qwen" | "json" => Some(Self::Hermes),
            "qwen-xml" | "qwen3-coder" | "xml" => Some(Self::QwenXml),
            "llama3" | "llama-3" | "llama3-json" => Some(Self::Llama3),
            _ => None,
        }
    }

    /// Picks the format from a chat template's source: `<function=` means the XML format,
    /// `<tool_call>` Hermes JSON, `<|python_tag|>` or `ipython` Llama 3. `None` when the template
    /// shows no tool syntax.
    pub fn detect(template: &str) -> Option<Self> {
        if template.contains("<function=") {
            Some(Self::QwenXml)
        } else if template.contains("<tool_call>") {
            Some(Self::Hermes)
        } else if template.contains("<|python_tag|>") || template.contains("ipython") {
            Some(Self::Llama3)
        } else {
            None
        }
    }
}

/// One complete tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as a JSON text (OpenAI's `function.arguments`).
    pub arguments: String,
}

/// What the parser reports, in output order.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolEvent {
    Content(String),
    /// A call begins: its position among this answer's calls, its id and function name.
    Start { index: usize, id: String, name: String },
    /// A fragment of the arguments of call `index`.
    Args { index: usize, fragment: String },
}

/// JSON schemas of the offered tools' parameters, by function name (for typing XML values).
#[derive(Debug, Clone, Default)]
pub struct ToolSchemas(Map<String, Value>);

impl ToolSchemas {
    /// From an OpenAI `tools` array (`[{"type":"function","function":{"name","parameters"}}]`);
    /// entries of other shapes are skipped.
    pub fn from_tools(tools: Option<&Value>) -> Self {
        let mut map = Map::new();
        for tool in tools.and_then(Value::as_array).into_iter().flatten() {
            let f = tool.get("function").unwrap_or(tool);
            if let Some(name) = f.get("name").and_then(Value::as_str) {
                map.insert(name.to_string(), f.get("parameters").cloned().unwrap_or(Value::Null));
            }
        }
        Self(map)
    }

    /// The schema of parameter `param` of function `name`.
    pub fn param(&self, name: &str, param: &str) -> Option<&Value> {
        self.0.get(name)?.get("properties")?.get(param)
    }
}

/// A call as a format parser found it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawCall {
    pub name: String,
    pub arguments: String,
}

/// Markers: the text that opens a call and the text that closes it (`None`: the end of output).
struct Marker {
    open: &'static str,
    close: Option<&'static str>,
    /// The open marker is part of the call text the format parser sees.
    keep_open: bool,
}

const HERMES_MARKERS: &[Marker] = &[Marker { open: "<tool_call>", close: Some("</tool_call>"), keep_open: false }];
const XML_MARKERS: &[Marker] = &[
    Marker { open: "<tool_call>", close: Some("</tool_call>"), keep_open: false },
    Marker { open: "<function=", close: Some("</function>"), keep_open: true },
];
const LLAMA_MARKERS: &[Marker] = &[Marker { open: "<|python_tag|>", close: None, keep_open: false }];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace seen yet (Llama 3 decides here whether the answer is a call).
    Start,
    Text,
    /// Inside a call opened by `markers[i]`.
    InCall(usize),
}

/// The streaming splitter of one answer.
pub struct ToolParser {
    format: ToolFormat,
    markers: &'static [Marker],
    schemas: ToolSchemas,
    parallel: bool,
    state: State,
    buf: String,
    /// Trailing whitespace of the content, emitted once more content follows.
    held_ws: String,
    /// Whitespace that preceded the call being read (restored if the call does not parse).
    pre_call_ws: String,
    last_was_call: bool,
    calls: usize,
    ids: IdSource,
}

/// Where call ids come from: random `call_…` ids, or `call_N` in tests.
#[derive(Debug, Clone, Copy)]
enum IdSource {
    Random,
    Sequential,
}

impl ToolParser {
    /// `parallel = false` keeps only the first call (later ones are dropped).
    pub fn new(format: ToolFormat, schemas: ToolSchemas, parallel: bool) -> Self {
        let markers = match format {
            ToolFormat::Hermes => HERMES_MARKERS,
            ToolFormat::QwenXml => XML_MARKERS,
            ToolFormat::Llama3 => LLAMA_MARKERS,
        };
        Self {
            format,
            markers,
            schemas,
            parallel,
            state: State::Start,
            buf: String::new(),
            held_ws: String::new(),
            pre_call_ws: String::new(),
            last_was_call: false,
            calls: 0,
            ids: IdSource::Random,
        }
    }

    /// Ids `call_0`, `call_1`, … instead of random ones (for tests).
    pub fn with_sequential_ids(mut self) -> Self {
        self.ids = IdSource::Sequential;
        self
    }

    /// Number of calls reported so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Feeds one text delta.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.run(&mut out, false);
        out
    }

    /// Ends the output: an unclosed call is parsed as it stands, held text is flushed.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.run(&mut out, true);
        match self.state {
            State::InCall(i) => {
                let body = std::mem::take(&mut self.buf);
                self.close_call(i, &body, None, &mut out);
            }
            State::Start | State::Text => {
                let rest = std::mem::take(&mut self.buf);
                self.content(&rest, &mut out);
            }
        }
        self.state = State::Text;
        if self.calls == 0 && !self.held_ws.is_empty() {
            out.push(ToolEvent::Content(std::mem::take(&mut self.held_ws)));
        }
        self.held_ws.clear();
        merge(out)
    }

    /// Parses a whole answer at once.
    pub fn parse_all(mut self, text: &str) -> (String, Vec<ToolCall>) {
        let mut events = self.push(text);
        events.extend(self.finish());
        assemble(&events)
    }

    fn run(&mut self, out: &mut Vec<ToolEvent>, at_end: bool) {
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.buf.trim_start();
                    if trimmed.is_empty() {
                        return;
                    }
                    if self.format == ToolFormat::Llama3 && trimmed.starts_with('{') {
                        // The whole answer is the call; parsed at the end.
                        let lead = self.buf.len() - trimmed.len();
                        self.pre_call_ws = self.buf.drain(..lead).collect();
                        self.state = State::InCall(usize::MAX);
                        continue;
                    }
                    if !at_end && self.markers.iter().any(|m| m.open.starts_with(trimmed) && m.open != trimmed) {
                        return; // could still become a marker
                    }
                    self.state = State::Text;
                }
                State::Text => match self.find_open() {
                    Some((pos, i)) => {
                        let before: String = self.buf[..pos].to_string();
                        self.content(&before, out);
                        self.pre_call_ws = std::mem::take(&mut self.held_ws);
                        let skip = if self.markers[i].keep_open { pos } else { pos + self.markers[i].open.len() };
                        self.buf.drain(..skip);
                        self.state = State::InCall(i);
                    }
                    None => {
                        let keep = if at_end { 0 } else { self.partial_open_len() };
                        let cut = self.buf.len() - keep;
                        let text: String = self.buf.drain(..cut).collect();
                        self.content(&text, out);
                        return;
                    }
                },
                State::InCall(i) => {
                    let Some(close) = self.markers.get(i).and_then(|m| m.close) else { return };
                    let Some(pos) = self.buf.find(close) else { return };
                    let body: String = self.buf[..pos].to_string();
                    self.buf.drain(..pos + close.len());
                    self.close_call(i, &body, Some(close), out);
                    self.state = State::Text;
                }
            }
        }
    }

    /// The earliest complete open marker in the buffer.
    fn find_open(&self) -> Option<(usize, usize)> {
        self.markers
            .iter()
            .enumerate()
            .filter_map(|(i, m)| self.buf.find(m.open).map(|p| (p, i)))
            .min_by_key(|&(p, i)| (p, i))
    }

    /// Length of the longest buffer suffix that is a proper prefix of an open marker.
    fn partial_open_len(&self) -> usize {
        let mut best = 0;
        for m in self.markers {
            for n in (1..m.open.len()).rev() {
                if n <= best {
                    break;
                }
                if self.buf.len() >= n && self.buf.is_char_boundary(self.buf.len() - n) && self.buf.ends_with(&m.open[..n]) {
                    best = n;
                    break;
                }
            }
        }
        best
    }

    /// Emits content, holding back trailing whitespace.
    fn content(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        if text.is_empty() {
            return;
        }
        let core_len = text.trim_end().len();
        if core_len == 0 {
            self.held_ws.push_str(text);
            return;
        }
        let s = if self.last_was_call {
            // Whitespace right after a call is dropped.
            self.held_ws.clear();
            text[..core_len].trim_start().to_string()
        } else {
            std::mem::take(&mut self.held_ws) + &text[..core_len]
        };
        out.push(ToolEvent::Content(s));
        self.held_ws = text[core_len..].to_string();
        self.last_was_call = false;
    }

    /// A call's text is complete: report it, or pass it on as content when it does not parse.
    fn close_call(&mut self, marker: usize, body: &str, close: Option<&str>, out: &mut Vec<ToolEvent>) {
        let parsed = match self.format {
            ToolFormat::Hermes => hermes::parse(body),
            ToolFormat::QwenXml => qwen_xml::parse(body, &self.schemas),
            ToolFormat::Llama3 => llama3::parse(body),
        };
        match parsed {
            Some(calls) if !calls.is_empty() => {
                for c in calls {
                    if !self.parallel && self.calls > 0 {
                        continue;
                    }
                    let index = self.calls;
                    self.calls += 1;
                    out.push(ToolEvent::Start { index, id: self.next_id(index), name: c.name });
                    out.push(ToolEvent::Args { index, fragment: c.arguments });
                }
                self.pre_call_ws.clear();
                self.last_was_call = true;
            }
            _ => {
                let open = match self.markers.get(marker) {
                    Some(m) if !m.keep_open => m.open,
                    _ => "",
                };
                let ws = std::mem::take(&mut self.pre_call_ws);
                let raw = format!("{ws}{open}{body}{}", close.unwrap_or(""));
                self.content(&raw, out);
            }
        }
    }

    fn next_id(&self, index: usize) -> String {
        match self.ids {
            IdSource::Sequential => format!("call_{index}"),
            IdSource::Random => random_call_id(),
        }
    }
}

/// `call_` plus 24 random alphanumerics, like OpenAI's ids.
pub fn random_call_id() -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    let s: String = (0..24).map(|_| CHARS[rng.random_range(0..CHARS.len())] as char).collect();
    format!("call_{s}")
}

/// Joins adjacent content events.
fn merge(events: Vec<ToolEvent>) -> Vec<ToolEvent> {
    let mut out: Vec<ToolEvent> = Vec::with_capacity(events.len());
    for e in events {
        match (out.last_mut(), e) {
            (Some(ToolEvent::Content(a)), ToolEvent::Content(b)) => a.push_str(&b),
            (_, e) => out.push(e),
        }
    }
    out
}

/// Content and calls of a sequence of events (the non-streaming view).
pub fn assemble(events: &[ToolEvent]) -> (String, Vec<ToolCall>) {
    let mut content = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(s) => content.push_str(s),
            ToolEvent::Start { id, name, .. } => calls.push(ToolCall { id: id.clone(), name: name.clone(), arguments: String::new() }),
            ToolEvent::Args { index, fragment } => {
                if let Some(c) = calls.get_mut(*index) {
                    c.arguments.push_str(fragment);
                }
            }
        }
    }
    (content, calls)
}

/// OpenAI assistant `tool_calls` as the chat templates want them: `arguments` given as an object
/// (when it parses as JSON) rather than a JSON string, as Hugging Face's pipelines do.
pub fn arguments_as_objects(message: &mut Map<String, Value>) {
    let Some(Value::Array(calls)) = message.get_mut("tool_calls") else { return };
    for call in calls {
        let Some(f) = call.get_mut("function").and_then(Value::as_object_mut) else { continue };
        if let Some(Value::String(s)) = f.get("arguments") {
            if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                f.insert("arguments".into(), v);
            }
        }
    }
}
