//! Which tool-call format a model writes (from its chat template or a server flag), the offered
//! tools' parameter schemas, and tool calls in conversation history as templates want them.

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

    /// The parameter schema of offered function `name` (`Null` when it gave none), `None` when
    /// no such function was offered.
    pub fn function(&self, name: &str) -> Option<&Value> {
        self.0.get(name)
    }

    /// Offered function `name`, or else the one offered function whose parameter schema has
    /// `name` as its `title`: small models asked for JSON calls sometimes name the schema
    /// (pydantic's `<function>_args`, as the OpenAI Agents SDK sends) instead of the function.
    /// The function's name and schema.
    pub fn resolve(&self, name: &str) -> Option<(&str, &Value)> {
        if let Some((n, s)) = self.0.get_key_value(name) {
            return Some((n.as_str(), s));
        }
        let mut by_title = self.0.iter().filter(|(_, s)| s.get("title").and_then(Value::as_str) == Some(name));
        let (n, s) = by_title.next()?;
        by_title.next().is_none().then_some((n.as_str(), s))
    }

    /// Whether any tool was offered.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The schema of parameter `param` of function `name`.
    pub fn param(&self, name: &str, param: &str) -> Option<&Value> {
        self.0.get(name)?.get("properties")?.get(param)
    }
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
