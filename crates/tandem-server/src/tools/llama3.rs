//! Llama 3 JSON calls: the answer is one or more JSON objects `{"name": …, "parameters": {…}}`
//! (separated by `;` or whitespace), either bare or after `<|python_tag|>`.

use serde_json::Value;

use super::hermes::call_from_object;
use super::RawCall;

/// All calls of `body`, or `None` unless the whole body is calls.
pub(crate) fn parse(body: &str) -> Option<Vec<RawCall>> {
    let mut calls = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = stream.next()?.ok()?;
        calls.push(call_from_object(&value)?);
        rest = rest[stream.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let c = parse(r#"{"name": "f", "parameters": {"a": 1}}"#).unwrap();
        assert_eq!(c[0].name, "f");
        assert_eq!(c[0].arguments, r#"{"a":1}"#);
        let two = parse(r#"{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"b": [1]}}"#).unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[1].name, "g");
        for bad in ["", "hello", r#"{"name": "f"} trailing"#, r#"{"name": "f""#, "[1]"] {
            assert!(parse(bad).is_none(), "{bad}");
        }
    }
}
