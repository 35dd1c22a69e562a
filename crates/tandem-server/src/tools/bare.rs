//! Calls written as plain JSON: many models, asked to use tools, answer with just
//! `{"name": …, "arguments": {…}}` (one object or several), bare or inside a ```json code fence,
//! instead of their template's `<tool_call>` syntax. Such an answer is a call when every object
//! names an offered tool and its arguments fit that tool's parameter schema; anything else
//! stays content (a JSON answer that is not a call must not turn into one). A name that is
//! the `title` of exactly one offered tool's parameter schema names that tool
//! ([`ToolSchemas::resolve`]).

use serde_json::Value;

use super::format::ToolSchemas;
use super::hermes::call_from_object;
use super::RawCall;

/// The calls of a whole answer, or `None` unless the answer is nothing but calls of offered
/// tools with fitting arguments.
pub(crate) fn parse(body: &str, schemas: &ToolSchemas) -> Option<Vec<RawCall>> {
    let text = unfence(body.trim())?;
    let mut calls = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = stream.next()?.ok()?;
        let values = match value {
            Value::Array(items) => items,
            v => vec![v],
        };
        for v in &values {
            let mut call = call_from_object(v)?;
            let (name, schema) = schemas.resolve(&call.name)?;
            call.name = name.to_string();
            let args: Value = serde_json::from_str(&call.arguments).ok()?;
            if !fits(&args, schema) {
                return None;
            }
            calls.push(call);
        }
        rest = rest[stream.byte_offset()..].trim_start();
        rest = rest.strip_prefix([';', ',']).unwrap_or(rest).trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// The text inside one code fence (```json or ``` alone) covering the whole answer, or the
/// answer itself when it is not fenced; `None` for a fence of another language.
fn unfence(text: &str) -> Option<&str> {
    let Some(inner) = text.strip_prefix("```") else { return Some(text) };
    let (lang, body) = inner.split_once('\n')?;
    if !matches!(lang.trim().to_ascii_lowercase().as_str(), "" | "json") {
        return None;
    }
    body.trim_end().strip_suffix("```")
}

/// Whether a fenced answer may still turn out to be a call, from its first line: ``` or
/// ```json (`None` while the line is incomplete).
pub(crate) fn fence_may_hold_call(text: &str) -> Option<bool> {
    let inner = text.strip_prefix("```")?;
    let (lang, _) = inner.split_once('\n')?;
    Some(matches!(lang.trim().to_ascii_lowercase().as_str(), "" | "json"))
}

/// A light check of arguments against a parameter schema: an object, every `required`
/// property present, each property's JSON type as its `type` says (a list of types allowed),
/// no properties beyond `properties` when `additionalProperties` is false. A missing or
/// non-object schema accepts any object.
pub(crate) fn fits(args: &Value, schema: &Value) -> bool {
    let Some(obj) = args.as_object() else { return false };
    let Some(schema) = schema.as_object() else { return true };
    let props = schema.get("properties").and_then(Value::as_object);
    let required = schema.get("required").and_then(Value::as_array).into_iter().flatten();
    if required.filter_map(Value::as_str).any(|r| !obj.contains_key(r)) {
        return false;
    }
    for (k, v) in obj {
        match props.and_then(|p| p.get(k)) {
            Some(p) if !type_fits(v, p.get("type")) => return false,
            Some(_) => {}
            None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => return false,
            None => {}
        }
    }
    true
}

fn type_fits(v: &Value, ty: Option<&Value>) -> bool {
    let one = |t: &str| match t {
        "string" => v.is_string(),
        "integer" => v.as_f64().is_some_and(|x| x.fract() == 0.0),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "null" => v.is_null(),
        _ => true,
    };
    match ty {
        Some(Value::String(t)) => one(t),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).any(one),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schemas() -> ToolSchemas {
        ToolSchemas::from_tools(Some(&json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]}}},
            {"type": "function", "function": {"name": "add", "parameters": {
                "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "additionalProperties": false}}}
        ])))
    }

    #[test]
    fn bare_and_fenced_calls() {
        let s = schemas();
        let one = parse(r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#, &s).unwrap();
        assert_eq!(one, vec![RawCall { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() }]);
        let fenced = "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n```";
        assert_eq!(parse(fenced, &s).unwrap()[0].arguments, r#"{"city":"Paris","days":2}"#);
        assert_eq!(
            parse("```\n{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2.5}}\n```\n", &s).unwrap()[0].name,
            "add"
        );
        let two = parse(
            "{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
            &s,
        )
        .unwrap();
        assert_eq!(two.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["add", "get_weather"]);
        let array = parse(r#"[{"name": "add", "arguments": {}}, {"name": "add", "arguments": {"b": 3}}]"#, &s).unwrap();
        assert_eq!(array.len(), 2);
    }

    #[test]
    fn answers_that_are_not_calls_stay_content() {
        let s = schemas();
        for not_a_call in [
            r#"{"name": "Paris", "population": 2100000}"#, // not an offered tool
            r#"{"name": "get_weather", "arguments": {"days": 2}}"#, // required city missing
            r#"{"name": "get_weather", "arguments": {"city": 7}}"#, // wrong type
            r#"{"name": "get_weather", "arguments": {"city": "x", "days": 1.5}}"#, // not an integer
            r#"{"name": "add", "arguments": {"a": 1, "c": 2}}"#, // additionalProperties: false
            r#"{"name": "add", "arguments": {}} and some text"#, // trailing text
            "```python\n{\"name\": \"add\", \"arguments\": {}}\n```", // another language
            "```json\n{\"name\": \"add\", \"arguments\": {}}", // unclosed fence
            "Sure! {\"name\": \"add\", \"arguments\": {}}", // text first
            "",
        ] {
            assert!(parse(not_a_call, &s).is_none(), "{not_a_call}");
        }
        assert!(parse(r#"{"name": "add", "arguments": {}}"#, &ToolSchemas::default()).is_none(), "no tools offered");
    }

    #[test]
    fn fence_languages() {
        assert_eq!(fence_may_hold_call("```json\n{"), Some(true));
        assert_eq!(fence_may_hold_call("```\n"), Some(true));
        assert_eq!(fence_may_hold_call("```rust\nfn"), Some(false));
        assert_eq!(fence_may_hold_call("```js"), None);
        assert_eq!(fence_may_hold_call("no fence"), None);
    }

    /// A name that is one tool's schema `title` (pydantic's `<function>_args`) names that tool.
    #[test]
    fn a_schema_title_names_its_tool() {
        let tools = serde_json::json!([
            {"type": "function", "function": {"name": "city_population", "parameters": {"title": "city_population_args",
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "multiply", "parameters": {"title": "multiply_args",
                "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
        ]);
        let schemas = ToolSchemas::from_tools(Some(&tools));
        let calls = parse(r#"{"name": "city_population_args", "arguments": {"city": "Paris"}}"#, &schemas).unwrap();
        assert_eq!(calls[0].name, "city_population");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        // Arguments must still fit, and an unknown title stays content.
        assert!(parse(r#"{"name": "multiply_args", "arguments": {"a": "x"}}"#, &schemas).is_none());
        assert!(parse(r#"{"name": "other_args", "arguments": {}}"#, &schemas).is_none());
    }
}
