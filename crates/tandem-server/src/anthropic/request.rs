//! The Anthropic Messages request body and its translation into what the chat pipeline takes:
//! OpenAI-style template messages (system prompt, `tool_use` blocks as assistant `tool_calls`,
//! `tool_result` blocks as `role: tool` messages, `thinking` blocks as `reasoning_content`),
//! OpenAI-style tool definitions, the tool choice, and the shared sampling parameters.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::backend::ChatRenderOptions;
use crate::chat::ToolChoice;
use crate::error::ApiError;
use crate::extract::{from_value, JsonBody};
use crate::params::{CommonParams, StopField};

/// The body of `POST /v1/messages` (and, without `max_tokens`, of `count_tokens`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub messages: Option<Vec<InputMessage>>,
    #[serde(default)]
    pub system: Option<Value>,
    #[serde(default)]
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub tools: Option<Vec<ToolDef>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub thinking: Option<Thinking>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputRole {
    User,
    Assistant,
}

#[derive(Debug, Clone, Deserialize)]
pub struct InputMessage {
    pub role: InputRole,
    pub content: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolDef {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` or `{"type": "disabled"}`.
#[derive(Debug, Clone, Deserialize)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub budget_tokens: Option<u64>,
}

impl JsonBody for MessagesRequest {
    fn from_json(value: &Value) -> Result<Self, ApiError> {
        from_value(value)
    }
}

impl MessagesRequest {
    /// The shared parameters; `max_tokens` is required unless `counting`.
    pub fn common(&self, counting: bool) -> Result<CommonParams, ApiError> {
        if self.max_tokens.is_none() && !counting {
            return Err(ApiError::invalid_param("max_tokens", "max_tokens: Field required"));
        }
        Ok(CommonParams {
            model: self.model.clone(),
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop_sequences.clone().map(StopField::Many),
            stream: self.stream,
            ..CommonParams::default()
        })
    }

    /// The thinking budget (`Some` when thinking is enabled) and the `enable_thinking` switch.
    pub fn thinking(&self) -> Result<(Option<usize>, Option<bool>), ApiError> {
        match &self.thinking {
            None => Ok((None, None)),
            Some(t) if t.kind == "enabled" => match t.budget_tokens {
                Some(b) if b >= 1 => Ok((Some(usize::try_from(b).unwrap_or(usize::MAX)), Some(true))),
                _ => Err(ApiError::invalid_param(
                    "thinking.budget_tokens",
                    "thinking.budget_tokens must be a positive integer.",
                )),
            },
            Some(t) if t.kind == "disabled" => Ok((None, Some(false))),
            Some(t) => Err(ApiError::invalid_param("thinking.type", format!("Unknown thinking type `{}`.", t.kind))),
        }
    }

    /// Template options and whether several tool calls are allowed.
    pub fn render_options(&self, enable_thinking: Option<bool>) -> Result<(ChatRenderOptions, bool), ApiError> {
        let tools: Option<Value> = self.tools.as_ref().filter(|t| !t.is_empty()).map(|list| {
            Value::Array(
                list.iter()
                    .map(|t| {
                        json!({"type": "function", "function": {
                            "name": t.name,
                            "description": t.description.clone().unwrap_or_default(),
                            "parameters": t.input_schema.clone().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                        }})
                    })
                    .collect(),
            )
        });
        let (choice, parallel) = match &self.tool_choice {
            None | Some(Value::Null) => (ToolChoice::Auto, true),
            Some(Value::Object(o)) => {
                let parallel = !o.get("disable_parallel_tool_use").and_then(Value::as_bool).unwrap_or(false);
                let choice = match o.get("type").and_then(Value::as_str) {
                    Some("auto") => ToolChoice::Auto,
                    Some("any") => ToolChoice::Required,
                    Some("none") => ToolChoice::None,
                    Some("tool") => match o.get("name").and_then(Value::as_str) {
                        Some(n) if !n.is_empty() => ToolChoice::Function(n.to_string()),
                        _ => {
                            return Err(ApiError::invalid_param(
                                "tool_choice.name",
                                "tool_choice of type `tool` needs a `name`.",
                            ))
                        }
                    },
                    _ => {
                        return Err(ApiError::invalid_param(
                            "tool_choice.type",
                            "tool_choice.type must be auto, any, tool or none.",
                        ))
                    }
                };
                (choice, parallel)
            }
            Some(_) => return Err(ApiError::invalid_param("tool_choice", "tool_choice must be an object.")),
        };
        let mut extra = Map::new();
        if let Some(on) = enable_thinking {
            extra.insert("enable_thinking".into(), Value::Bool(on));
        }
        let opts = ChatRenderOptions {
            add_generation_prompt: true,
            tools: choice.offered(tools.as_ref(), "tool_choice")?,
            extra,
            force_call: choice.forces_call(),
        };
        Ok((opts, parallel))
    }

    /// The conversation as OpenAI-style template messages.
    pub fn template_messages(&self) -> Result<Vec<Value>, ApiError> {
        let mut out = Vec::new();
        match &self.system {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => out.push(json!({"role": "system", "content": s})),
            Some(Value::Array(blocks)) => {
                out.push(json!({"role": "system", "content": block_texts(blocks, "system")?}))
            }
            Some(_) => {
                return Err(ApiError::invalid_param("system", "system must be a string or an array of text blocks."))
            }
        }
        let messages = match &self.messages {
            None => return Err(ApiError::invalid_param("messages", "messages: Field required")),
            Some(m) if m.is_empty() => {
                return Err(ApiError::invalid_param("messages", "messages: at least one message is required"))
            }
            Some(m) => m,
        };
        for (i, m) in messages.iter().enumerate() {
            convert(m, i, &mut out)?;
        }
        Ok(out)
    }
}

/// The texts of `text` blocks joined with newlines; other block types are refused.
fn block_texts(blocks: &[Value], param: &str) -> Result<String, ApiError> {
    let mut texts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => texts.push(t),
            _ => return Err(ApiError::invalid_param(&format!("{param}[{j}]"), "Expected a text block.")),
        }
    }
    Ok(texts.join("\n"))
}

fn convert(m: &InputMessage, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let role = match m.role {
        InputRole::User => "user",
        InputRole::Assistant => "assistant",
    };
    let blocks = match &m.content {
        Value::String(s) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Value::Array(b) => b,
        _ => {
            return Err(ApiError::invalid_param(
                &format!("messages[{i}].content"),
                "content must be a string or an array of blocks.",
            ))
        }
    };
    let (mut texts, mut reasoning, mut calls, mut results) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let param = format!("messages[{i}].content[{j}]");
        let field = |k: &str| b.get(k).and_then(Value::as_str);
        match (b.get("type").and_then(Value::as_str), m.role) {
            (Some("text"), _) => texts.push(
                field("text").ok_or_else(|| ApiError::invalid_param(&param, "A text block needs `text`."))?.to_string(),
            ),
            (Some("thinking"), InputRole::Assistant) => reasoning.push(field("thinking").unwrap_or("").to_string()),
            (Some("redacted_thinking"), InputRole::Assistant) => {}
            (Some("tool_use"), InputRole::Assistant) => {
                let (Some(id), Some(name)) = (field("id"), field("name")) else {
                    return Err(ApiError::invalid_param(&param, "A tool_use block needs `id` and `name`."));
                };
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
            }
            (Some("tool_result"), InputRole::User) => {
                let id = field("tool_use_id")
                    .ok_or_else(|| ApiError::invalid_param(&param, "A tool_result block needs `tool_use_id`."))?;
                let mut content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => block_texts(parts, &format!("{param}.content"))?,
                    Some(_) => {
                        return Err(ApiError::invalid_param(
                            &format!("{param}.content"),
                            "content must be a string or text blocks.",
                        ))
                    }
                };
                if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                    content = format!("Error: {content}");
                }
                results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            (Some(kind), _) => {
                return Err(ApiError::invalid_param(
                    &param,
                    format!("Content blocks of type `{kind}` are not supported in {role} messages."),
                ))
            }
            (None, _) => {
                return Err(ApiError::invalid_param(&param, "A content block must be an object with a `type`."))
            }
        }
    }
    let has_results = !results.is_empty();
    out.extend(results);
    let mut msg = Map::new();
    msg.insert("role".into(), json!(role));
    msg.insert("content".into(), json!(texts.join("\n")));
    if !calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(calls));
    }
    if !reasoning.is_empty() {
        msg.insert("reasoning_content".into(), json!(reasoning.join("\n")));
    }
    if !(has_results && texts.is_empty() && m.role == InputRole::User) {
        out.push(Value::Object(msg));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::parse_json;

    fn req(v: Value) -> MessagesRequest {
        parse_json(v.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn conversation_translation() {
        let r = req(json!({
            "max_tokens": 10, "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "need a tool", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "22C"}]}]}
            ]
        }));
        let m = r.template_messages().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1], json!({"role": "user", "content": "weather?"}));
        assert_eq!(m[2]["reasoning_content"], "need a tool");
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(m[2]["tool_calls"][0]["function"], json!({"name": "get_weather", "arguments": {"city": "Paris"}}));
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "toolu_1", "content": "22C"}));
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn options_and_refusals() {
        let r = req(json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 64}, "stop_sequences": ["END"]}));
        let (budget, on) = r.thinking().unwrap();
        assert_eq!((budget, on), (Some(64), Some(true)));
        let (opts, parallel) = r.render_options(on).unwrap();
        assert!(!parallel);
        assert_eq!(opts.tools.unwrap()[0]["function"]["name"], "f");
        assert_eq!(opts.extra["enable_thinking"], true);
        assert_eq!(r.common(false).unwrap().stop, Some(StopField::Many(vec!["END".into()])));
        let e = req(json!({"messages": []})).common(false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(req(json!({"messages": []})).common(true).is_ok());
        let bad = req(json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}));
        assert_eq!(bad.template_messages().unwrap_err().param.as_deref(), Some("messages[0].content[0]"));
        let e = req(json!({"thinking": {"type": "enabled"}})).thinking().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("thinking.budget_tokens"));
        let e = req(json!({"tool_choice": {"type": "tool", "name": "g"}, "tools": [{"name": "f"}]}))
            .render_options(None)
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
    }
}
