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
//! call a [`ToolEvent::Start`] (index, id, name) as soon as the name is complete, followed by
//! [`ToolEvent::Args`] fragments while the arguments are generated (Hermes: the JSON text as it
//! comes, checked by a strict incremental JSON scanner; XML: one fragment per completed
//! parameter). A call whose header does not have the streaming shape (other key order, string
//! arguments, Llama 3) is held back to its end and parsed whole. Anything that is not a call
//! stays plain content, never an error; arguments that break off (invalid JSON, end of output)
//! end the call where they break. The non-streaming parse ([`ToolParser::parse_all`]) runs the
//! same machine over the whole text, so streamed deltas always concatenate to the non-streaming
//! result.
//!
//! - **Plain JSON** (any format, when tools are offered): an answer that is only
//!   `{"name": …, "arguments": {…}}` objects, bare or in a ```json fence, naming offered tools
//!   with arguments that fit their schemas ([`bare`]); such an answer is held back to its end
//!   and parsed whole, and stays content when it is not such a call.
//!
//! Whitespace: content whitespace directly before a call is dropped, and so is whitespace after
//! a call when no content came before it (so "text\n\n<tool_call>…" gives content "text");
//! output without calls is passed on exactly.

mod bare;
pub mod force;
mod format;
pub mod hermes;
pub mod llama3;
pub mod qwen_xml;
mod scan;
#[cfg(test)]
mod tests;
mod xml_stream;

use crate::reasoning::partial_suffix;
pub use format::{arguments_as_objects, ToolFormat, ToolSchemas};
use scan::{Feed, Header, JsonScan};

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
    Start {
        index: usize,
        id: String,
        name: String,
    },
    /// A fragment of the arguments of call `index`.
    Args {
        index: usize,
        fragment: String,
    },
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
    /// Inside a call opened by `markers[i]` (`usize::MAX`: a bare Llama 3 answer).
    InCall(usize),
}

/// Progress inside one call.
#[derive(Debug, Clone)]
enum Phase {
    /// Waiting for the call's header (its function name); nothing emitted yet.
    Header,
    /// The header does not fit the streaming grammar: the call is parsed whole at its end.
    Buffered,
    /// Hermes arguments streaming through the JSON scanner (`index` is `None` for a call
    /// dropped by `parallel_tool_calls: false`).
    JsonArgs { index: Option<usize>, scan: JsonScan },
    /// XML parameters of a call; `count` parameters emitted so far.
    XmlParams { index: Option<usize>, name: String, count: usize },
    /// The call's content is complete; waiting for the closing tag.
    Tail,
}

/// Whether [`ToolParser::step`] made progress.
enum Progress {
    Continue,
    Wait,
}

/// The streaming splitter of one answer.
pub struct ToolParser {
    format: ToolFormat,
    markers: &'static [Marker],
    schemas: ToolSchemas,
    parallel: bool,
    state: State,
    phase: Phase,
    buf: String,
    /// Trailing whitespace of the content, emitted once more content follows.
    held_ws: String,
    /// Whitespace that preceded the call being read (restored if the call does not parse).
    pre_call_ws: String,
    last_was_call: bool,
    emitted_content: bool,
    calls: usize,
    ids: IdSource,
}

/// Where call ids come from: random `call_…` ids, or `call_N` in tests.
#[derive(Debug, Clone, Copy)]
enum IdSource {
    Random,
    Sequential,
}

const FUNC: &str = "<function=";
const FUNC_END: &str = "</function>";
const PARAM: &str = "<parameter=";
const PARAM_END: &str = "</parameter>";
const CALL_END: &str = "</tool_call>";

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
            phase: Phase::Header,
            buf: String::new(),
            held_ws: String::new(),
            pre_call_ws: String::new(),
            last_was_call: false,
            emitted_content: false,
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
        merge(out)
    }

    /// Ends the output: an unclosed call is completed as it stands, held text is flushed.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.run(&mut out, true);
        match self.state {
            State::InCall(i) => match std::mem::replace(&mut self.phase, Phase::Header) {
                Phase::Buffered | Phase::Header => {
                    let body = std::mem::take(&mut self.buf);
                    self.close_buffered(i, &body, None, &mut out);
                }
                Phase::XmlParams { index, count, .. } => args(&mut out, index, if count == 0 { "{}" } else { "}" }),
                Phase::JsonArgs { .. } | Phase::Tail => {}
            },
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
                        self.enter_call(usize::MAX);
                        continue;
                    }
                    if self.format != ToolFormat::Llama3 && !self.schemas.is_empty() {
                        match bare_start(trimmed) {
                            Some(true) => {
                                // Maybe a call written as plain JSON: parsed whole at the end.
                                let lead = self.buf.len() - trimmed.len();
                                self.pre_call_ws = self.buf.drain(..lead).collect();
                                self.enter_call(usize::MAX);
                                continue;
                            }
                            None if !at_end => return, // too early to tell
                            _ => {}
                        }
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
                        self.enter_call(i);
                    }
                    None => {
                        let keep = if at_end { 0 } else { self.partial_open_len() };
                        let cut = self.buf.len() - keep;
                        let text: String = self.buf.drain(..cut).collect();
                        self.content(&text, out);
                        return;
                    }
                },
                State::InCall(i) => match self.step(i, out, at_end) {
                    Progress::Continue => {}
                    Progress::Wait => return,
                },
            }
        }
    }

    fn enter_call(&mut self, marker: usize) {
        self.state = State::InCall(marker);
        // Llama 3 calls and plain-JSON answers (marker usize::MAX) are parsed whole.
        self.phase =
            if self.format == ToolFormat::Llama3 || marker == usize::MAX { Phase::Buffered } else { Phase::Header };
    }

    /// The call is over: back to content.
    fn end_call(&mut self) {
        self.state = State::Text;
        self.phase = Phase::Header;
        self.last_was_call = true;
    }

    /// One step inside call `marker`.
    fn step(&mut self, marker: usize, out: &mut Vec<ToolEvent>, at_end: bool) -> Progress {
        let close = self.markers.get(marker).and_then(|m| m.close);
        match std::mem::replace(&mut self.phase, Phase::Buffered) {
            Phase::Buffered => {
                let Some(close) = close else { return Progress::Wait };
                let Some(pos) = self.buf.find(close) else { return Progress::Wait };
                let body: String = self.buf[..pos].to_string();
                self.buf.drain(..pos + close.len());
                self.close_buffered(marker, &body, Some(close), out);
                Progress::Continue
            }
            Phase::Header if self.format == ToolFormat::Hermes => match scan::hermes_header(&self.buf) {
                Header::Match { name, consumed } => {
                    self.buf.drain(..consumed);
                    let index = self.start_call(name, out);
                    self.phase = Phase::JsonArgs { index, scan: JsonScan::new() };
                    Progress::Continue
                }
                Header::Incomplete if !at_end && !close.is_some_and(|c| self.buf.contains(c)) => {
                    self.phase = Phase::Header;
                    Progress::Wait
                }
                _ => Progress::Continue, // Buffered
            },
            Phase::Header => self.xml_header(marker, at_end, out),
            Phase::JsonArgs { index, mut scan } => {
                let mut taken = 0;
                let mut finished = false;
                for (k, c) in self.buf.char_indices() {
                    match scan.feed(c) {
                        Feed::More => taken = k + c.len_utf8(),
                        Feed::Done => {
                            taken = k + c.len_utf8();
                            finished = true;
                            break;
                        }
                        Feed::Reject => {
                            finished = true;
                            break;
                        }
                    }
                }
                let fragment: String = self.buf.drain(..taken).collect();
                if !fragment.is_empty() {
                    args(out, index, &fragment);
                }
                self.phase = if finished { Phase::Tail } else { Phase::JsonArgs { index, scan } };
                if finished {
                    Progress::Continue
                } else {
                    Progress::Wait
                }
            }
            Phase::XmlParams { index, name, count } => self.xml_params(marker, index, name, count, at_end, out),
            Phase::Tail => self.tail(marker, at_end),
        }
    }

    /// After a call's content: skip to the closing tag (Qwen XML may open another function).
    fn tail(&mut self, marker: usize, at_end: bool) -> Progress {
        let close = self.markers.get(marker).and_then(|m| m.close).unwrap_or(CALL_END);
        let func = if self.format == ToolFormat::QwenXml { self.buf.find(FUNC) } else { None };
        match (func, self.buf.find(close)) {
            (Some(f), c) if c.is_none_or(|c| f < c) => {
                self.buf.drain(..f);
                self.phase = Phase::Header;
                return Progress::Continue;
            }
            (_, Some(pos)) => {
                self.buf.drain(..pos + close.len());
                self.end_call();
                return Progress::Continue;
            }
            _ => {}
        }
        if at_end {
            self.buf.clear();
            self.end_call();
            return Progress::Continue;
        }
        // Drop what cannot begin the closing tag (or another function).
        let keep = partial_suffix(&self.buf, close).max(partial_suffix(&self.buf, FUNC));
        let cut = self.buf.len() - keep;
        self.buf.drain(..cut);
        self.phase = Phase::Tail;
        Progress::Wait
    }

    /// Reports the start of a call; `None` when `parallel_tool_calls: false` drops it.
    fn start_call(&mut self, name: String, out: &mut Vec<ToolEvent>) -> Option<usize> {
        self.pre_call_ws.clear();
        self.held_ws.clear();
        if !self.parallel && self.calls > 0 {
            return None;
        }
        let index = self.calls;
        self.calls += 1;
        out.push(ToolEvent::Start { index, id: self.next_id(index), name });
        Some(index)
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
        self.markers.iter().map(|m| partial_suffix(&self.buf, m.open)).max().unwrap_or(0)
    }

    /// Emits content, holding back trailing whitespace; whitespace right after a call is
    /// dropped unless content came before the call.
    fn content(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        if text.is_empty() {
            return;
        }
        let core_len = text.trim_end().len();
        if core_len == 0 {
            self.held_ws.push_str(text);
            return;
        }
        let mut s = std::mem::take(&mut self.held_ws) + &text[..core_len];
        if self.last_was_call && !self.emitted_content {
            s = s.trim_start().to_string();
        }
        out.push(ToolEvent::Content(s));
        self.emitted_content = true;
        self.held_ws = text[core_len..].to_string();
        self.last_was_call = false;
    }

    /// A whole call's text (the buffered path): report it, or pass it on as content when it
    /// does not parse.
    fn close_buffered(&mut self, marker: usize, body: &str, close: Option<&str>, out: &mut Vec<ToolEvent>) {
        let parsed = match self.format {
            _ if marker == usize::MAX && self.format != ToolFormat::Llama3 => bare::parse(body, &self.schemas),
            ToolFormat::Hermes => hermes::parse(body),
            ToolFormat::QwenXml => qwen_xml::parse(body, &self.schemas),
            ToolFormat::Llama3 => llama3::parse(body),
        };
        match parsed {
            Some(calls) if !calls.is_empty() => {
                for c in calls {
                    let index = self.start_call(c.name, out);
                    args(out, index, &c.arguments);
                }
                self.end_call();
            }
            _ => {
                let open = match self.markers.get(marker) {
                    Some(m) if !m.keep_open => m.open,
                    _ => "",
                };
                let ws = std::mem::take(&mut self.pre_call_ws);
                let raw = format!("{ws}{open}{body}{}", close.unwrap_or(""));
                self.state = State::Text;
                self.phase = Phase::Header;
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

/// Whether an answer beginning with `t` (trimmed, non-empty) may be a call written as plain
/// JSON: `{`, `[` then `{`, or a ``` / ```json fence; `None` while that cannot be told yet.
fn bare_start(t: &str) -> Option<bool> {
    if t.starts_with('{') {
        return Some(true);
    }
    if let Some(rest) = t.strip_prefix('[') {
        let rest = rest.trim_start();
        return if rest.is_empty() { None } else { Some(rest.starts_with('{')) };
    }
    if t.starts_with("```") {
        return bare::fence_may_hold_call(t);
    }
    if "```".starts_with(t) {
        return None;
    }
    Some(false)
}

/// An arguments fragment of call `index` (nothing for a dropped call).
fn args(out: &mut Vec<ToolEvent>, index: Option<usize>, fragment: &str) {
    if let Some(index) = index {
        out.push(ToolEvent::Args { index, fragment: fragment.to_string() });
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
            (Some(ToolEvent::Args { index: i, fragment: a }), ToolEvent::Args { index: j, fragment: b }) if *i == j => {
                a.push_str(&b)
            }
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
            ToolEvent::Start { id, name, .. } => {
                calls.push(ToolCall { id: id.clone(), name: name.clone(), arguments: String::new() })
            }
            ToolEvent::Args { index, fragment } => {
                if let Some(c) = calls.get_mut(*index) {
                    c.arguments.push_str(fragment);
                }
            }
        }
    }
    (content, calls)
}
