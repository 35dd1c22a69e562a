//! Qwen3-Coder / Qwen3.5 XML calls:
//!
//! ```text
//! <tool_call>
//! <function=get_weather>
//! <parameter=city>
//! Paris
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! A value loses one leading and one trailing newline and is typed from the tool's JSON schema:
//! `string` stays text, `integer`/`number`/`boolean`/`null` are parsed, `object`/`array` are
//! parsed as JSON; a value that does not fit its type, or has no schema, stays a string (an
//! untyped value that is a JSON object or array is kept as such).

use serde_json::{Map, Number, Value};

use super::{RawCall, ToolSchemas};

const FUNC: &str = "<function=";
const FUNC_END: &str = "</function>";
const PARAM: &str = "<parameter=";
const PARAM_END: &str = "</parameter>";

/// The calls in `body` (one or more `<function=…>` elements), or `None` when there is none or
/// a name is malformed.
pub(crate) fn parse(body: &str, schemas: &ToolSchemas) -> Option<Vec<RawCall>> {
    let mut calls = Vec::new();
    let mut rest = body;
    while let Some(start) = rest.find(FUNC) {
        if !rest[..start].trim().is_empty() {
            return None;
        }
        let after = &rest[start + FUNC.len()..];
        let gt = after.find('>')?;
        let name = after[..gt].trim();
        if name.is_empty() || name.contains(['<', '\n']) {
            return None;
        }
        let inner_all = &after[gt + 1..];
        let (inner, next) = match inner_all.find(FUNC_END) {
            Some(e) => (&inner_all[..e], &inner_all[e + FUNC_END.len()..]),
            None => (inner_all, ""),
        };
        let args = parameters(name, inner, schemas)?;
        calls.push(RawCall { name: name.to_string(), arguments: serde_json::to_string(&Value::Object(args)).ok()? });
        rest = next;
    }
    (!calls.is_empty() && rest.trim().is_empty()).then_some(calls)
}

fn parameters(func: &str, inner: &str, schemas: &ToolSchemas) -> Option<Map<String, Value>> {
    let mut args = Map::new();
    let mut rest = inner;
    loop {
        let Some(start) = rest.find(PARAM) else {
            return rest.trim().is_empty().then_some(args);
        };
        if !rest[..start].trim().is_empty() {
            return None;
        }
        let after = &rest[start + PARAM.len()..];
        let gt = after.find('>')?;
        let pname = after[..gt].trim();
        if pname.is_empty() || pname.contains(['<', '\n']) {
            return None;
        }
        let value_all = &after[gt + 1..];
        // The value ends at `</parameter>`, or (tolerated) at the next parameter or the end.
        let (value, next) = match (value_all.find(PARAM_END), value_all.find(PARAM)) {
            (Some(e), Some(p)) if p < e => (&value_all[..p], &value_all[p..]),
            (Some(e), _) => (&value_all[..e], &value_all[e + PARAM_END.len()..]),
            (None, Some(p)) => (&value_all[..p], &value_all[p..]),
            (None, None) => (value_all, ""),
        };
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        args.insert(pname.to_string(), typed(value, schemas.param(func, pname)));
        rest = next;
    }
}

/// The schema's type name (the first non-`null` one of a list).
fn type_name(schema: Option<&Value>) -> Option<&str> {
    match schema?.get("type")? {
        Value::String(s) => Some(s.as_str()),
        Value::Array(list) => list.iter().filter_map(Value::as_str).find(|t| *t != "null").or(Some("null")),
        _ => None,
    }
}

/// `value` converted to the JSON type its schema names.
pub fn typed(value: &str, schema: Option<&Value>) -> Value {
    let text = || Value::String(value.to_string());
    let t = value.trim();
    match type_name(schema) {
        Some("string") => text(),
        Some("integer") => t.parse::<i64>().map(Value::from).ok().or_else(|| number(t)).unwrap_or_else(text),
        Some("number") => number(t).unwrap_or_else(text),
        Some("boolean") => match t.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => text(),
        },
        Some("null") if t == "null" || t.eq_ignore_ascii_case("none") => Value::Null,
        Some("object") => serde_json::from_str::<Value>(t).ok().filter(Value::is_object).unwrap_or_else(text),
        Some("array") => serde_json::from_str::<Value>(t).ok().filter(Value::is_array).unwrap_or_else(text),
        _ => serde_json::from_str::<Value>(t).ok().filter(|v| v.is_object() || v.is_array()).unwrap_or_else(text),
    }
}

fn number(t: &str) -> Option<Value> {
    if let Ok(i) = t.parse::<i64>() {
        return Some(Value::from(i));
    }
    let f: f64 = t.parse().ok()?;
    Number::from_f64(f).map(Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schemas() -> ToolSchemas {
        ToolSchemas::from_tools(Some(
            &json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
                "s": {"type": "string"}, "i": {"type": "integer"}, "n": {"type": "number"}, "b": {"type": "boolean"},
                "o": {"type": "object"}, "a": {"type": "array"}, "opt": {"type": ["integer", "null"]}
            }}}}]),
        ))
    }

    #[test]
    fn typed_values() {
        let body = "\n<function=f>\n<parameter=s>\n 42 \n</parameter>\n<parameter=i>\n7\n</parameter>\n<parameter=n>\n2.5\n</parameter>\n\
                    <parameter=b>\nTrue\n</parameter>\n<parameter=o>\n{\"k\": [1]}\n</parameter>\n<parameter=a>\n[1, 2]\n</parameter>\n\
                    <parameter=opt>\n3\n</parameter>\n<parameter=extra>\nline1\nline2\n</parameter>\n</function>\n";
        let c = parse(body, &schemas()).unwrap();
        let args: Value = serde_json::from_str(&c[0].arguments).unwrap();
        assert_eq!(
            args,
            json!({"s": " 42 ", "i": 7, "n": 2.5, "b": true, "o": {"k": [1]}, "a": [1, 2], "opt": 3, "extra": "line1\nline2"})
        );
        // Values that do not fit their type stay strings.
        let c =
            parse("<function=f><parameter=i>seven</parameter><parameter=b>maybe</parameter></function>", &schemas())
                .unwrap();
        assert_eq!(serde_json::from_str::<Value>(&c[0].arguments).unwrap(), json!({"i": "seven", "b": "maybe"}));
    }

    #[test]
    fn tolerant_and_strict_parts() {
        let none = ToolSchemas::default();
        // Missing </parameter> and </function>.
        let c = parse("<function=g>\n<parameter=x>\n1\n<parameter=y>\n{\"a\":1}\n", &none).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&c[0].arguments).unwrap(), json!({"x": "1", "y": {"a": 1}}));
        let two = parse("<function=a>\n</function>\n<function=b>\n</function>", &none).unwrap();
        assert_eq!((two[0].name.as_str(), two[1].name.as_str(), two[0].arguments.as_str()), ("a", "b", "{}"));
        for bad in [
            "",
            "text",
            "<function=>x</function>",
            "junk<function=f></function>",
            "<function=f><parameter=>1</parameter></function>",
            "<function=f",
            "<function=f>junk</function>",
        ] {
            assert!(parse(bad, &none).is_none(), "{bad}");
        }
    }
}
