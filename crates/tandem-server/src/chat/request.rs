//! The chat request body and its checks: messages (text or text parts; roles system, developer,
//! user, assistant, tool), log-probability options, tools and template kwargs, plus the shared
//! [`CommonParams`].

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
    /// Passed to the chat template; tool-call parsing of the output is not done yet.
    #[serde(default)]
    pub tools: Option<Value>,
    /// Extra template variables (e.g. `enable_thinking`).
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
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
            None | Some(Value::Null) => Err(ApiError::invalid_param(&param, format!("{param} is required for this role."))),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Array(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (j, part) in parts.iter().enumerate() {
                    let kind = part.get("type").and_then(Value::as_str);
                    match (kind, part.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => texts.push(t),
                        (Some("text"), None) => {
                            return Err(ApiError::invalid_param(&format!("{param}[{j}].text"), "A text part needs a string `text`."))
                        }
                        (Some(other), _) => {
                            return Err(ApiError::invalid_param(
                                &format!("{param}[{j}].type"),
                                format!("Content parts of type `{other}` are not supported; only `text` is."),
                            ))
                        }
                        (None, _) => {
                            return Err(ApiError::invalid_param(&format!("{param}[{j}]"), "A content part must be an object with a `type`."))
                        }
                    }
                }
                Ok(texts.join("\n"))
            }
            Some(_) => Err(ApiError::invalid_param(&param, format!("{param} must be a string or an array of text parts."))),
        }
    }

    /// The message as the chat template sees it.
    fn template_value(&self, index: usize) -> Result<Value, ApiError> {
        let mut obj = self.extra.clone();
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
            Some(m) if m.is_empty() => Err(ApiError::invalid_param("messages", "messages must contain at least one message.")),
            Some(m) => m.iter().enumerate().map(|(i, msg)| msg.template_value(i)).collect(),
        }
    }

    /// What the engine is asked for: `None`, or the number of alternatives per position.
    pub fn engine_logprobs(&self) -> Result<Option<usize>, ApiError> {
        let on = self.logprobs.unwrap_or(false);
        match self.top_logprobs {
            Some(k) if k > MAX_TOP_LOGPROBS => {
                Err(ApiError::invalid_param("top_logprobs", format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}.")))
            }
            Some(k) if k > 0 && !on => Err(ApiError::invalid_param("top_logprobs", "top_logprobs requires logprobs to be true.")),
            k if on => Ok(Some(k.unwrap_or(0) as usize)),
            _ => Ok(None),
        }
    }

    /// Template options: generation prompt on, tools and kwargs passed through.
    pub fn render_options(&self) -> Result<ChatRenderOptions, ApiError> {
        let tools = match &self.tools {
            None | Some(Value::Null) => None,
            Some(t @ Value::Array(_)) => Some(t.clone()),
            Some(_) => return Err(ApiError::invalid_param("tools", "tools must be an array.")),
        };
        Ok(ChatRenderOptions {
            add_generation_prompt: true,
            tools,
            extra: self.chat_template_kwargs.clone().unwrap_or_default(),
        })
    }
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
        let r = req(json!({"tools": [{"type": "function"}], "chat_template_kwargs": {"enable_thinking": false}})).unwrap();
        let o = r.render_options().unwrap();
        assert!(o.add_generation_prompt);
        assert_eq!(o.tools, Some(json!([{"type": "function"}])));
        assert_eq!(o.extra["enable_thinking"], false);
        assert!(req(json!({"tools": {}})).unwrap().render_options().is_err());
    }
}
