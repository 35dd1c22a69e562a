//! A Responses API request (`POST /v1/responses`) translated into a chat-completions request,
//! so that validation, templates, tools and sampling are the chat route's own: `instructions`
//! become the system message, the stored conversation of `previous_response_id` comes next,
//! then the `input` (a string, or message / `function_call` / `function_call_output` items);
//! function `tools`, `tool_choice`, `max_output_tokens` and `text.format` map to their chat
//! counterparts. Tool types other than functions and `item_reference` inputs are refused.

use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// What the route needs besides the chat request.
pub struct Translated {
    /// The chat-completions body.
    pub chat: Value,
    /// The conversation without instructions: the stored history plus this input (the
    /// response's output is appended when it is stored).
    pub conversation: Vec<Value>,
    pub store: bool,
    pub stream: bool,
    /// Echoed in the response object.
    pub echo: Map<String, Value>,
}

fn bad(param: &str, msg: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// `body` as a chat request after `history` (the stored conversation of
/// `previous_response_id`, already looked up).
pub fn translate(body: &Value, history: Vec<Value>) -> Result<Translated, ApiError> {
    let obj = body.as_object().ok_or_else(|| ApiError::invalid("The request body must be a JSON object."))?;
    let mut conversation = history;
    match obj.get("input") {
        Some(Value::String(s)) => conversation.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                push_item(&mut conversation, item).map_err(|e| bad(&format!("input[{i}]"), e))?;
            }
        }
        None | Some(Value::Null) => return Err(bad("input", "input is required.")),
        Some(_) => return Err(bad("input", "input must be a string or an array of items.")),
    }
    let mut messages = Vec::new();
    match obj.get("instructions") {
        Some(Value::String(s)) if !s.is_empty() => messages.push(json!({"role": "system", "content": s})),
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(_) => return Err(bad("instructions", "instructions must be a string.")),
    }
    messages.extend(conversation.iter().cloned());

    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    for key in ["model", "temperature", "top_p", "parallel_tool_calls", "seed", "top_k", "min_p"] {
        if let Some(v) = obj.get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(v) = obj.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".into(), v.clone());
    }
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), tools_to_chat(tools)?);
    }
    if let Some(tc) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        let tc = match tc {
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                json!({"type": "function", "function": {"name": o.get("name").cloned().unwrap_or(Value::Null)}})
            }
            other => other.clone(),
        };
        chat.insert("tool_choice".into(), tc);
    }
    if let Some(fmt) = obj.get("text").and_then(|t| t.get("format")).filter(|v| !v.is_null()) {
        // Passed on as `response_format`: the chat route refuses what it cannot honour.
        let rf = match fmt.get("type").and_then(Value::as_str) {
            Some("json_schema") => json!({"type": "json_schema", "json_schema": fmt}),
            _ => fmt.clone(),
        };
        chat.insert("response_format".into(), rf);
    }
    if let Some(effort) = obj.get("reasoning").and_then(|r| r.get("effort")).and_then(Value::as_str) {
        // "none" / "minimal" turn a reasoning model's thinking off; other efforts keep it.
        if matches!(effort, "none" | "minimal") {
            chat.insert("enable_thinking".into(), Value::Bool(false));
        }
    }
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    chat.insert("stream".into(), Value::Bool(stream));
    let store = obj.get("store").and_then(Value::as_bool).unwrap_or(true);
    let mut echo = Map::new();
    for key in [
        "instructions",
        "max_output_tokens",
        "metadata",
        "parallel_tool_calls",
        "previous_response_id",
        "temperature",
        "tool_choice",
        "tools",
        "top_p",
    ] {
        echo.insert(key.into(), obj.get(key).cloned().unwrap_or(Value::Null));
    }
    echo.insert("text".into(), obj.get("text").cloned().unwrap_or_else(|| json!({"format": {"type": "text"}})));
    echo.insert("store".into(), Value::Bool(store));
    Ok(Translated { chat: Value::Object(chat), conversation, store, stream, echo })
}

/// One input item appended to the chat conversation.
fn push_item(conv: &mut Vec<Value>, item: &Value) -> Result<(), String> {
    let obj = item.as_object().ok_or("an input item must be an object")?;
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or("message");
    match kind {
        "message" => {
            let role = match obj.get("role").and_then(Value::as_str) {
                Some("user") => "user",
                Some("assistant") => "assistant",
                Some("system") | Some("developer") => "system",
                Some(r) => return Err(format!("unknown role `{r}`")),
                None => return Err("a message item needs a role".into()),
            };
            conv.push(json!({"role": role, "content": text_of(obj.get("content"))?}));
        }
        "function_call" => {
            let call_id = obj.get("call_id").and_then(Value::as_str).ok_or("a function_call item needs call_id")?;
            let name = obj.get("name").and_then(Value::as_str).ok_or("a function_call item needs name")?;
            let arguments = match obj.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => "{}".into(),
                Some(v) => v.to_string(),
            };
            let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
            // Consecutive calls belong to one assistant turn.
            match conv.last_mut() {
                Some(Value::Object(last))
                    if last.get("role").and_then(Value::as_str) == Some("assistant")
                        && last.contains_key("tool_calls") =>
                {
                    if let Some(Value::Array(calls)) = last.get_mut("tool_calls") {
                        calls.push(call);
                    }
                }
                _ => conv.push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
            }
        }
        "function_call_output" => {
            let call_id =
                obj.get("call_id").and_then(Value::as_str).ok_or("a function_call_output item needs call_id")?;
            let output = match obj.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(v @ Value::Array(_)) => text_of(Some(v))?,
                Some(v) => v.to_string(),
                None => String::new(),
            };
            conv.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
        }
        // Earlier reasoning is not shown to the model again (as chat templates drop it).
        "reasoning" => {}
        other => return Err(format!("input items of type `{other}` are not supported")),
    }
    Ok(())
}

/// Message content as text: a string, or the text of `input_text` / `output_text` / `text`
/// parts joined.
fn text_of(content: Option<&Value>) -> Result<String, String> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        out.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some(t) => return Err(format!("content parts of type `{t}` are not supported (text only)")),
                    None => return Err("a content part needs a type".into()),
                }
            }
            Ok(out)
        }
        None | Some(Value::Null) => Ok(String::new()),
        Some(_) => Err("content must be a string or an array of parts".into()),
    }
}

/// Responses function tools (`{type, name, description, parameters}`) as chat tools.
fn tools_to_chat(tools: &Value) -> Result<Value, ApiError> {
    let arr = tools.as_array().ok_or_else(|| bad("tools", "tools must be an array."))?;
    let mut out = Vec::with_capacity(arr.len());
    for (i, t) in arr.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut f = Map::new();
                for key in ["name", "description", "parameters", "strict"] {
                    if let Some(v) = t.get(key) {
                        f.insert(key.into(), v.clone());
                    }
                }
                out.push(json!({"type": "function", "function": f}));
            }
            Some(other) => {
                return Err(bad(
                    &format!("tools[{i}]"),
                    format!("Tools of type `{other}` are not supported (function only)."),
                ))
            }
            None => return Err(bad(&format!("tools[{i}]"), "A tool needs a type.")),
        }
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_items_become_a_chat_conversation() {
        let body = json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 50,
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "22C"},
                {"type": "reasoning", "id": "rs_1", "summary": []}
            ],
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_weather"}
        });
        let history = vec![json!({"role": "user", "content": "hi"}), json!({"role": "assistant", "content": "hello"})];
        let t = translate(&body, history).unwrap();
        let msgs = t.chat["messages"].as_array().unwrap();
        assert_eq!(msgs[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(msgs[1]["content"], "hi");
        assert_eq!(msgs[3], json!({"role": "user", "content": "Weather in Paris?"}));
        assert_eq!(msgs[4]["tool_calls"].as_array().unwrap().len(), 2, "consecutive calls share a turn");
        assert_eq!(msgs[5], json!({"role": "tool", "tool_call_id": "c1", "content": "22C"}));
        assert_eq!(msgs.len(), 6);
        assert_eq!(t.conversation.len(), 5, "instructions are not part of the stored conversation");
        assert_eq!(t.chat["max_tokens"], 50);
        assert_eq!(t.chat["tools"][0]["function"]["name"], "get_weather");
        assert_eq!(t.chat["tool_choice"], json!({"type": "function", "function": {"name": "get_weather"}}));
        assert!(t.store && !t.stream);
    }

    #[test]
    fn refusals_name_the_parameter() {
        for (body, param) in [
            (json!({}), "input"),
            (json!({"input": 3}), "input"),
            (json!({"input": [{"type": "item_reference", "id": "x"}]}), "input[0]"),
            (json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}), "input[0]"),
            (json!({"input": "x", "tools": [{"type": "web_search"}]}), "tools[0]"),
            (json!({"input": "x", "instructions": 5}), "instructions"),
        ] {
            let Err(e) = translate(&body, Vec::new()) else { panic!("{body} accepted") };
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }
}
