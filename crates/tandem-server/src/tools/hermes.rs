//! Hermes / Qwen JSON calls: the text between `<tool_call>` and `</tool_call>` is one JSON object
//! `{"name": "…", "arguments": {…}}` (`parameters` is accepted for `arguments`).

use serde_json::Value;

use super::RawCall;

/// The call in `body`, or `None` when it is not a JSON object with a non-empty string `name`.
pub(crate) fn parse(body: &str) -> Option<Vec<RawCall>> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    call_from_object(&value).map(|c| vec![c])
}

/// `{"name", "arguments" | "parameters"}` as a call; arguments that are a string are kept as
/// given, missing ones become `{}`.
pub(crate) fn call_from_object(value: &Value) -> Option<RawCall> {
    let obj = value.as_object()?;
    let name = obj.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let arguments = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => serde_json::to_string(v).ok()?,
    };
    Some(RawCall { name: name.to_string(), arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let c = parse("\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n").unwrap();
        assert_eq!(c, vec![RawCall { name: "f".into(), arguments: "{\"a\":1}".into() }]);
        assert_eq!(parse(r#"{"name":"f","parameters":{"x":"y"}}"#).unwrap()[0].arguments, r#"{"x":"y"}"#);
        assert_eq!(parse(r#"{"name":"f"}"#).unwrap()[0].arguments, "{}");
        assert_eq!(parse(r#"{"name":"f","arguments":"{\"q\":2}"}"#).unwrap()[0].arguments, r#"{"q":2}"#);
        for bad in ["", "{", "[]", r#"{"name": 3}"#, r#"{"name": ""}"#, r#"{"arguments": {}}"#, "{\"name\":\"f\"} x"] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }
}
