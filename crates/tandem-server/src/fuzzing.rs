//! The fuzzing entry point shared by the cargo-fuzz target (`fuzz/`) and the in-process fuzz
//! test: arbitrary bytes through request parsing (OpenAI chat, Anthropic messages, OpenAI
//! Responses translated to chat), chat
//! template rendering (the real minijinja sandbox, with tools) and the output parsers. None of
//! it may panic, whatever the input.

use std::sync::OnceLock;

use serde_json::Value;

use crate::anthropic::request::MessagesRequest;
use crate::backend::Backend;
use crate::chat::ChatCompletionRequest;
use crate::extract::JsonBody;
use crate::output::{OutputConfig, Parsed};
use crate::scripted::{Script, ScriptedBackend};
use crate::tools::{ToolFormat, ToolSchemas};

fn backend() -> Option<&'static ScriptedBackend> {
    static B: OnceLock<Option<ScriptedBackend>> = OnceLock::new();
    B.get_or_init(|| {
        let script =
            Script { model: None, context_length: None, chat_template: None, rules: Vec::new(), default_reply: None };
        ScriptedBackend::new(script).ok()
    })
    .as_ref()
}

/// Runs one input through parsing, validation, rendering and output parsing.
pub fn request_and_template(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        output(text);
    }
    let Ok(value) = serde_json::from_slice::<Value>(data) else { return };
    let Some(b) = backend() else { return };
    if let Ok(req) = ChatCompletionRequest::from_json(&value) {
        let _ = req.common.validate(300);
        let _ = req.engine_logprobs();
        if let (Ok(m), Ok(o)) = (req.template_messages(), req.render_options()) {
            let _ = b.render_chat(&m, &o);
        }
    }
    if let Ok(t) = crate::responses::request::translate(&value, Vec::new()) {
        if let Ok(req) = ChatCompletionRequest::from_json(&t.chat) {
            if let (Ok(m), Ok(o)) = (req.template_messages(), req.render_options()) {
                let _ = b.render_chat(&m, &o);
            }
        }
    }
    if let Ok(req) = MessagesRequest::from_json(&value) {
        let _ = req.common(false).map(|c| c.validate(300));
        if let (Ok(m), Ok((_, t))) = (req.template_messages(), req.thinking()) {
            if let Ok((o, _)) = req.render_options(t) {
                let _ = b.render_chat(&m, &o);
            }
        }
    }
}

/// Every output parser configuration over `text`.
fn output(text: &str) {
    for inside in [false, true] {
        for format in [None, Some(ToolFormat::Hermes), Some(ToolFormat::QwenXml), Some(ToolFormat::Llama3)] {
            let cfg = OutputConfig {
                reasoning_inside: inside,
                parse_reasoning: true,
                tools: format.map(|f| (f, ToolSchemas::default(), true)),
            };
            let _ = Parsed::from_text(&cfg, text);
        }
    }
}
