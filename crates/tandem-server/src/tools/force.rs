//! Grammars that make an answer tool calls, in the model's own call format, when the client
//! requires a call (`tool_choice: "required"` or a named function; Anthropic `any` / `tool`):
//!
//! * Hermes: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, the JSON object
//!   constrained to an offered tool's name and its parameter schema;
//! * Qwen XML: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>`
//!   over the offered names and each one's parameters (required ones first, in order; values
//!   free text up to their closing tag);
//! * Llama 3: `{"name": …, "parameters": {…}}`.
//!
//! Several calls (newline-separated) are allowed when `parallel_tool_calls` is on. The tag
//! texts come through `literal`, which references a special token by id where the vocabulary
//! has one (so the model writes its own tag token rather than spelling it out).

use serde_json::{json, Map, Value};
use tandem_engine::constraint::lark_string;
use tandem_engine::Grammar;

use super::ToolFormat;

/// (name, parameter schema) of each offered tool.
fn offered(tools: &Value) -> Vec<(String, Value)> {
    tools
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name")?.as_str()?.to_string();
            let params =
                f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object"}));
            Some((name, params))
        })
        .collect()
}

/// A JSON schema for one call object: `{"<name_key>": const name, "<args_key>": parameters}`
/// for any offered tool.
fn call_schema(tools: &[(String, Value)], args_key: &str) -> Value {
    let one = |(name, params): &(String, Value)| {
        let mut props = Map::new();
        props.insert("name".into(), json!({"const": name}));
        props.insert(args_key.into(), params.clone());
        json!({"type": "object", "properties": props, "required": ["name", args_key], "additionalProperties": false})
    };
    let mut schema = match tools {
        [t] => one(t),
        _ => json!({"anyOf": tools.iter().map(one).collect::<Vec<_>>()}),
    };
    // One line, as the templates show calls: `{"name": "f", "arguments": {"a": 1}}`.
    schema["x-guidance"] = json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "});
    schema
}

/// The Lark expression of one XML parameter value and its closing tag: typed where the
/// schema says integer, number, boolean or an enum of strings, free text (lazily up to the
/// closing tag) otherwise.
fn xml_value(schema: &Value) -> String {
    let close = lark_string("\n</parameter>\n");
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        let alts: Vec<String> = options.iter().filter_map(Value::as_str).map(lark_string).collect();
        if !alts.is_empty() && alts.len() == options.len() {
            return format!("({}) {close}", alts.join(" | "));
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("integer") => format!("/-?[0-9]{{1,15}}/ {close}"),
        Some("number") => format!("/-?[0-9]{{1,15}}(\\.[0-9]{{1,15}})?([eE][-+]?[0-9]{{1,3}})?/ {close}"),
        Some("boolean") => format!("(\"true\" | \"false\") {close}"),
        _ => "value_".into(),
    }
}

/// The grammar that makes the answer calls of the offered `tools` (OpenAI tool objects) in
/// `format`. Errors when no tool is offered.
pub fn forced_calls(
    format: ToolFormat,
    tools: &Value,
    parallel: bool,
    literal: impl Fn(&str) -> String,
) -> Result<Grammar, String> {
    let tools = offered(tools);
    if tools.is_empty() {
        return Err("tool_choice requires a call, but no function tool is offered".into());
    }
    let more = if parallel { " (\"\\n\" call_)*" } else { "" };
    let lark = match format {
        ToolFormat::Hermes => format!(
            "start: call_{more}\ncall_: {} \"\\n\" %json {} \"\\n\" {}\n",
            literal("<tool_call>"),
            call_schema(&tools, "arguments"),
            literal("</tool_call>")
        ),
        ToolFormat::Llama3 => format!("start: call_{more}\ncall_: %json {}\n", call_schema(&tools, "parameters")),
        ToolFormat::QwenXml => {
            let mut rules = String::new();
            let mut alts = Vec::new();
            for (i, (name, params)) in tools.iter().enumerate() {
                let props: Vec<&String> =
                    params.get("properties").and_then(Value::as_object).map(|m| m.keys().collect()).unwrap_or_default();
                let required: Vec<&str> = params
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let param = |p: &str| {
                    let value =
                        params.get("properties").and_then(|m| m.get(p)).map_or_else(|| "value_".into(), xml_value);
                    format!("{} {value}", lark_string(&format!("<parameter={p}>\n")))
                };
                let mut body: Vec<String> = required.iter().map(|p| param(p)).collect();
                body.extend(
                    props.iter().filter(|p| !required.contains(&p.as_str())).map(|p| format!("({})?", param(p))),
                );
                rules.push_str(&format!(
                    "fn_{i}: {} {} {}\n",
                    lark_string(&format!("<function={name}>\n")),
                    body.join(" "),
                    lark_string("</function>")
                ));
                alts.push(format!("fn_{i}"));
            }
            format!(
                "start: call_{more}\ncall_: {} \"\\n\" ({}) \"\\n\" {}\n{rules}value_[suffix={}]: /(.|\\n)*/\n",
                literal("<tool_call>"),
                alts.join(" | "),
                literal("</tool_call>"),
                lark_string("\n</parameter>\n")
            )
        }
    };
    Ok(Grammar::Lark(lark))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"]}}},
            {"type": "function", "function": {"name": "now"}}
        ])
    }

    #[test]
    fn grammars_name_every_offered_tool_in_the_format() {
        let lit = |t: &str| lark_string(t);
        let Grammar::Lark(h) = forced_calls(ToolFormat::Hermes, &tools(), true, lit).unwrap() else { panic!() };
        assert!(
            h.contains("\"<tool_call>\"") && h.contains("\"const\":\"get_weather\"") && h.contains("\"const\":\"now\"")
        );
        assert!(h.contains("(\"\\n\" call_)*"), "parallel calls allowed: {h}");
        let Grammar::Lark(x) = forced_calls(ToolFormat::QwenXml, &tools(), false, lit).unwrap() else { panic!() };
        assert!(
            x.contains("\"<function=get_weather>\\n\" \"<parameter=city>\\n\" value_ (\"<parameter=unit>\\n\" (\"c\" | \"f\") \"\\n</parameter>\\n\")?"),
            "{x}"
        );
        assert!(!x.contains("call_)*"));
        let Grammar::Lark(l) = forced_calls(ToolFormat::Llama3, &tools(), false, lit).unwrap() else { panic!() };
        assert!(l.contains("\"parameters\""));
        assert!(forced_calls(ToolFormat::Hermes, &json!([]), true, lit).is_err());
    }
}
