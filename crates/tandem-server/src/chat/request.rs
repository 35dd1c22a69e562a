//! The chat request body and its checks: messages (text or text parts; roles system, developer,
//! user, assistant, tool), log-probability options, tools, `tool_choice`, `parallel_tool_calls`,
//! reasoning switches (`enable_thinking`, `chat_template_kwargs`, `max_thinking_tokens`), plus
//! the shared [`CommonParams`].
//!
//! `tool_choice`: `auto` (default) offers the tools and parses calls; `none` neither offers them
//! to the template nor parses calls; `required` and a named function offer the tools (a named
//! function only that one) and constrain decoding to the model's call format over them
//! ([`crate::tools::force`]), so the answer is always a well-formed call.

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::backend::ChatRenderOptions;
use crate::error::ApiError;
use crate::extract::{from_value, JsonBody};
use crate::params::CommonParams;

/// Largest `top_logprobs` accepted.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// The body of `POST /v1/chat/completions`. Unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatCompletionRequest {
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    /// Deserialised from the same body by [`JsonBody::from_json`].
    #[serde(skip)]
    pub common: CommonParams,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// Passed to the chat template; calls in the output are parsed into `tool_calls`.
    #[serde(default)]
    pub tools: Option<Value>,
    /// `"auto"`, `"none"`, `"required"` or `{"type":"function","function":{"name":…}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// `false` keeps only the first call of an answer.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    /// Extra template variables (e.g. `enable_thinking`).
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Shorthand for `chat_template_kwargs.enable_thinking`.
    #[serde(default)]
    pub enable_thinking: Option<bool>,
    /// Tokens the model may spend inside `<think>…</think>`; `max_tokens` then bounds the answer.
    #[serde(default)]
    pub max_thinking_tokens: Option<u64>,
}

/// The parsed `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Function(String),
}

impl ToolChoice {
    /// Parses OpenAI's `tool_choice` (`param` names the field in errors).
    pub fn parse(value: Option<&Value>, param: &str) -> Result<Self, ApiError> {
        match value {
            None | Some(Value::Null) => Ok(Self::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Ok(Self::Auto),
                "none" => Ok(Self::None),
                "required" | "any" => Ok(Self::Required),
                other => Err(ApiError::invalid_param(
                    param,
                    format!("Unknown tool_choice `{other}`; use auto, none, required or a function."),
                )),
            },
            Some(Value::Object(o)) => {
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .or_else(|| o.get("name"))
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty());
                match name {
                    Some(n) => Ok(Self::Function(n.to_string())),
                    None => Err(ApiError::invalid_param(
                        param,
                        "tool_choice must name a function: {\"type\": \"function\", \"function\": {\"name\": …}}.",
                    )),
                }
            }
            Some(_) => Err(ApiError::invalid_param(param, "tool_choice must be a string or an object.")),
        }
    }

    /// Whether the answer must be a call (`required` or a named function).
    pub fn forces_call(&self) -> bool {
        matches!(self, Self::Required | Self::Function(_))
    }

    /// The tools the template is shown: all, none, or only the named one (which must exist).
    pub fn offered(&self, tools: Option<&Value>, param: &str) -> Result<Option<Value>, ApiError> {
        let Some(Value::Array(list)) = tools else {
            return match self {
                Self::Function(_) | Self::Required => Err(ApiError::invalid_param(param, "tool_choice needs `tools`.")),
                _ => Ok(None),
            };
        };
        match self {
            Self::None => Ok(None),
            Self::Auto | Self::Required => Ok((!list.is_empty()).then(|| Value::Array(list.clone()))),
            Self::Function(name) => {
                let named = |t: &&Value| {
                    t.get("function").unwrap_or(t).get("name").and_then(Value::as_str) == Some(name.as_str())
                };
                match list.iter().find(named) {
                    Some(t) => Ok(Some(Value::Array(vec![t.clone()]))),
                    None => Err(ApiError::invalid_param(
                        param,
                        format!("tool_choice names `{name}`, which is not in tools."),
                    )),
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    /// OpenAI's newer name for system; rendered as `system`.
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    fn template_name(self) -> &'static str {
        match self {
            Role::System | Role::Developer => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message. Fields besides `role` and `content` (`name`, `tool_calls`, `tool_call_id`,
/// `reasoning_content`, ...) are passed to the template untouched.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    #[serde(default)]
    pub content: Option<Value>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// The content as text: a string, or text parts joined with newlines.
    fn text(&self, index: usize) -> Result<String, ApiError> {
        let param = format!("messages[{index}].content");
        match &self.content {
            None | Some(Value::Null) if self.role == Role::Assistant => Ok(String::new()),
            None | Some(Value::Null) => {
                Err(ApiError::invalid_param(&param, format!("{param} is required for this role.")))
            }
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Array(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (j, part) in parts.iter().enumerate() {
                    let kind = part.get("type").and_then(Value::as_str);
                    match (kind, part.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => texts.push(t),
                        (Some("text"), None) => {
                            return Err(ApiError::invalid_param(
                                &format!("{param}[{j}].text"),
                                "A text part needs a string `text`.",
                            ))
                        }
                        (Some(other), _) => {
                            return Err(ApiError::invalid_param(
                                &format!("{param}[{j}].type"),
                                format!("Content parts of type `{other}` are not supported; only `text` is."),
                            ))
                        }
                        (None, _) => {
                            return Err(ApiError::invalid_param(
                                &format!("{param}[{j}]"),
                                "A content part must be an object with a `type`.",
                            ))
                        }
                    }
                }
                Ok(texts.join("\n"))
            }
            Some(_) => {
                Err(ApiError::invalid_param(&param, format!("{param} must be a string or an array of text parts.")))
            }
        }
    }

    /// The message as the chat template sees it.
    fn template_value(&self, index: usize) -> Result<Value, ApiError> {
        let mut obj = self.extra.clone();
        crate::tools::arguments_as_objects(&mut obj);
        obj.insert("role".into(), Value::String(self.role.template_name().into()));
        obj.insert("content".into(), Value::String(self.text(index)?));
        Ok(Value::Object(obj))
    }
}

impl JsonBody for ChatCompletionRequest {
    fn from_json(value: &Value) -> Result<Self, ApiError> {
        let mut req: Self = from_value(value)?;
        req.common = from_value(value)?;
        Ok(req)
    }
}

impl ChatCompletionRequest {
    /// The messages as template input; at least one is required.
    pub fn template_messages(&self) -> Result<Vec<Value>, ApiError> {
        match &self.messages {
            None => Err(ApiError::invalid_param("messages", "messages is required.")),
            Some(m) if m.is_empty() => {
                Err(ApiError::invalid_param("messages", "messages must contain at least one message."))
            }
            Some(m) => m.iter().enumerate().map(|(i, msg)| msg.template_value(i)).collect(),
        }
    }

    /// What the engine is asked for: `None`, or the number of alternatives per position.
    pub fn engine_logprobs(&self) -> Result<Option<usize>, ApiError> {
        let on = self.logprobs.unwrap_or(false);
        match self.top_logprobs {
            Some(k) if k > MAX_TOP_LOGPROBS => Err(ApiError::invalid_param(
                "top_logprobs",
                format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}."),
            )),
            Some(k) if k > 0 && !on => {
                Err(ApiError::invalid_param("top_logprobs", "top_logprobs requires logprobs to be true."))
            }
            k if on => Ok(Some(k.unwrap_or(0) as usize)),
            _ => Ok(None),
        }
    }

    /// Template options: generation prompt on, the tools `tool_choice` offers, kwargs (with
    /// `enable_thinking`) passed through.
    pub fn render_options(&self) -> Result<ChatRenderOptions, ApiError> {
        let tools = match &self.tools {
            None | Some(Value::Null) => None,
            Some(t @ Value::Array(list)) => {
                list.iter().enumerate().try_for_each(|(i, t)| check_tool(i, t))?;
                Some(t)
            }
            Some(_) => return Err(ApiError::invalid_param("tools", "tools must be an array.")),
        };
        let choice = ToolChoice::parse(self.tool_choice.as_ref(), "tool_choice")?;
        let mut extra = self.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(on) = self.enable_thinking {
            extra.insert("enable_thinking".into(), Value::Bool(on));
        }
        Ok(ChatRenderOptions {
            add_generation_prompt: true,
            tools: choice.offered(tools, "tool_choice")?,
            extra,
            force_call: choice.forces_call(),
        })
    }
}

/// An OpenAI tool definition: `{"type": "function", "function": {"name", "description"?,
/// "parameters"?, "strict"?}}`. Anything else is refused rather than handed to the template,
/// which would render it as it pleases (or not at all) and leave the client guessing.
fn check_tool(i: usize, t: &Value) -> Result<(), ApiError> {
    let bad = |field: &str, msg: &str| Err(ApiError::invalid_param(&format!("tools[{i}]{field}"), msg));
    let Some(obj) = t.as_object() else { return bad("", "Each tool must be an object.") };
    match obj.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(other) => return bad(".type", &format!("Unsupported tool type '{other}'; expected 'function'.")),
        None => return bad(".type", "Each tool needs \"type\": \"function\"."),
    }
    let Some(f) = obj.get("function").and_then(Value::as_object) else {
        return bad(".function", "A function tool needs a \"function\" object.");
    };
    match f.get("name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() && n.len() <= 256 => {}
        _ => return bad(".function.name", "A function needs a name: a non-empty string of at most 256 bytes."),
    }
    if f.get("description").is_some_and(|d| !d.is_string() && !d.is_null()) {
        return bad(".function.description", "The description must be a string.");
    }
    if f.get("parameters").is_some_and(|p| !p.is_object() && !p.is_null()) {
        return bad(".function.parameters", "The parameters must be a JSON Schema object.");
    }
    if f.get("strict").is_some_and(|s| !s.is_boolean() && !s.is_null()) {
        return bad(".function.strict", "strict must be a boolean.");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::parse_json;
    use serde_json::json;

    fn req(v: Value) -> Result<ChatCompletionRequest, ApiError> {
        parse_json(v.to_string().as_bytes())
    }

    #[test]
    fn messages_to_template_values() {
        let r = req(json!({
            "model": "m", "temperature": 0.5,
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]},
                {"role": "tool", "content": "42", "tool_call_id": "1"}
            ]
        }))
        .unwrap();
        assert_eq!(r.common.temperature, Some(0.5));
        let m = r.template_messages().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(m[1]["content"], "a\nb");
        assert_eq!(m[2]["content"], "");
        assert_eq!(m[2]["tool_calls"][0]["id"], "1");
        assert_eq!(m[3]["tool_call_id"], "1");
    }

    #[test]
    fn bad_messages() {
        let e = req(json!({})).unwrap().template_messages().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = req(json!({"messages": []})).unwrap().template_messages().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = req(json!({"messages": [{"role": "user"}]})).unwrap().template_messages().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content"));
        let e = req(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}))
            .unwrap()
            .template_messages()
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        let e = req(json!({"messages": [{"role": "user", "content": 5}]})).unwrap().template_messages().unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = req(json!({"messages": [{"role": "wizard", "content": "x"}]})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"), "{}", e.message);
        let e = req(json!({"messages": "hi"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = req(json!({"messages": [], "temperature": "hot"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"), "{}", e.message);
        let e = req(json!({"messages": [], "logprobs": 3})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"));
    }

    #[test]
    fn logprob_options() {
        let lp = |v: Value| req(v).unwrap().engine_logprobs();
        assert_eq!(lp(json!({})).unwrap(), None);
        assert_eq!(lp(json!({"logprobs": true})).unwrap(), Some(0));
        assert_eq!(lp(json!({"logprobs": true, "top_logprobs": 3})).unwrap(), Some(3));
        assert_eq!(lp(json!({"logprobs": false, "top_logprobs": 0})).unwrap(), None);
        assert!(lp(json!({"top_logprobs": 3})).is_err());
        assert!(lp(json!({"logprobs": true, "top_logprobs": 21})).is_err());
    }

    #[test]
    fn render_options() {
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
        let r = req(json!({"tools": [tool], "chat_template_kwargs": {"enable_thinking": false}})).unwrap();
        let o = r.render_options().unwrap();
        assert!(o.add_generation_prompt);
        assert_eq!(o.tools, Some(json!([tool])));
        assert_eq!(o.extra["enable_thinking"], false);
        assert!(req(json!({"tools": {}})).unwrap().render_options().is_err());
    }

    #[test]
    fn malformed_tools_are_refused() {
        let param = |tools: Value| req(json!({ "tools": tools })).unwrap().render_options().unwrap_err().param;
        let f = |function: Value| json!([{"type": "function", "function": function}]);
        assert_eq!(param(json!([1])).as_deref(), Some("tools[0]"));
        assert_eq!(param(json!([{"function": {"name": "f"}}])).as_deref(), Some("tools[0].type"));
        assert_eq!(param(json!([{"type": "web_search"}])).as_deref(), Some("tools[0].type"));
        assert_eq!(param(json!([{"type": "function"}])).as_deref(), Some("tools[0].function"));
        assert_eq!(param(f(json!({}))).as_deref(), Some("tools[0].function.name"));
        assert_eq!(param(f(json!({"name": ""}))).as_deref(), Some("tools[0].function.name"));
        assert_eq!(param(f(json!({"name": 3}))).as_deref(), Some("tools[0].function.name"));
        assert_eq!(param(f(json!({"name": "f", "parameters": "x"}))).as_deref(), Some("tools[0].function.parameters"));
        assert_eq!(param(f(json!({"name": "f", "description": []}))).as_deref(), Some("tools[0].function.description"));
        assert_eq!(param(f(json!({"name": "f", "strict": "yes"}))).as_deref(), Some("tools[0].function.strict"));
        let ok = json!([{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "g", "description": "d", "parameters": {}, "strict": true}}]);
        assert!(req(json!({ "tools": ok })).unwrap().render_options().is_ok());
    }
}
