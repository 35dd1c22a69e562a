//! Structured output requests: the one grammar a request asks for, from OpenAI's
//! `response_format`, vLLM's `guided_json` / `guided_regex` / `guided_choice` /
//! `guided_grammar`, or llama.cpp's `grammar` (GBNF) / `json_schema`. The engine compiles it
//! (a grammar that does not compile is a 400 naming the problem) and masks every step with it.

use serde_json::Value;
use tandem_engine::Grammar;

use crate::error::ApiError;
use crate::params::CommonParams;

/// The request's grammar, `None` for free text; more than one source is a 400.
pub fn grammar_of(p: &CommonParams) -> Result<Option<Grammar>, ApiError> {
    let mut found: Vec<(&str, Grammar)> = Vec::new();
    if let Some(rf) = p.response_format.as_ref().filter(|v| !v.is_null()) {
        if let Some(g) = response_format(rf)? {
            found.push(("response_format", g));
        }
    }
    if let Some(v) = p.guided_json.as_ref().filter(|v| !v.is_null()) {
        found.push(("guided_json", Grammar::JsonSchema(schema_value(v, "guided_json")?)));
    }
    if let Some(r) = &p.guided_regex {
        found.push(("guided_regex", Grammar::Regex(r.clone())));
    }
    if let Some(c) = &p.guided_choice {
        if c.is_empty() {
            return Err(ApiError::invalid_param("guided_choice", "guided_choice needs at least one string."));
        }
        found.push(("guided_choice", Grammar::Choice(c.clone())));
    }
    if let Some(g) = &p.guided_grammar {
        found.push(("guided_grammar", text_grammar(g)));
    }
    if let Some(g) = &p.grammar {
        found.push(("grammar", text_grammar(g)));
    }
    if let Some(v) = p.json_schema.as_ref().filter(|v| !v.is_null()) {
        found.push(("json_schema", Grammar::JsonSchema(schema_value(v, "json_schema")?)));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.0).collect();
        return Err(ApiError::invalid_param(
            names[names.len() - 1],
            format!("Give at most one output constraint; this request has {}.", names.join(", ")),
        ));
    }
    Ok(found.pop().map(|f| f.1))
}

/// A grammar given as text: GBNF when it defines rules with `::=`, else llguidance's Lark.
fn text_grammar(g: &str) -> Grammar {
    if g.contains("::=") {
        Grammar::Gbnf(g.to_string())
    } else {
        Grammar::Lark(g.to_string())
    }
}

/// A schema given as an object (or `true`) or as JSON text.
fn schema_value(v: &Value, param: &str) -> Result<Value, ApiError> {
    let v = match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::invalid_param(param, format!("{param} is not valid JSON: {e}.")))?,
        v => v.clone(),
    };
    if !(v.is_object() || v.is_boolean()) {
        return Err(ApiError::invalid_param(param, format!("{param} must be a JSON schema object.")));
    }
    Ok(v)
}

/// OpenAI's `response_format` (also the Responses API's `text.format`, passed on as one).
fn response_format(rf: &Value) -> Result<Option<Grammar>, ApiError> {
    const P: &str = "response_format";
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::JsonObject)),
        Some("json_schema") => {
            // {"json_schema": {"name", "schema", "strict"}}; some clients put "schema" at the top.
            let schema =
                rf.get("json_schema").and_then(|j| j.get("schema")).or_else(|| rf.get("schema")).ok_or_else(|| {
                    ApiError::invalid_param(P, "response_format json_schema needs json_schema.schema.")
                })?;
            Ok(Some(Grammar::JsonSchema(schema_value(schema, P)?)))
        }
        Some(other) => Err(ApiError::invalid_param(
            P,
            format!("Unknown response_format type `{other}`; use text, json_object or json_schema."),
        )),
        None => Err(ApiError::invalid_param(P, "response_format needs a `type`.")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> CommonParams {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn every_source_maps_to_its_grammar() {
        let s = json!({"type": "object"});
        let cases = [
            (json!({"response_format": {"type": "json_object"}}), Some(Grammar::JsonObject)),
            (json!({"response_format": {"type": "text"}}), None),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": true}}}),
                Some(Grammar::JsonSchema(s.clone())),
            ),
            (json!({"response_format": {"type": "json_schema", "schema": s}}), Some(Grammar::JsonSchema(s.clone()))),
            (json!({"guided_json": "{\"type\": \"object\"}"}), Some(Grammar::JsonSchema(s.clone()))),
            (json!({"guided_regex": "a+"}), Some(Grammar::Regex("a+".into()))),
            (json!({"guided_choice": ["x", "y"]}), Some(Grammar::Choice(vec!["x".into(), "y".into()]))),
            (json!({"guided_grammar": "start: \"a\""}), Some(Grammar::Lark("start: \"a\"".into()))),
            (json!({"grammar": "root ::= \"a\""}), Some(Grammar::Gbnf("root ::= \"a\"".into()))),
            (json!({"json_schema": s}), Some(Grammar::JsonSchema(s.clone()))),
            (json!({}), None),
        ];
        for (body, want) in cases {
            assert_eq!(grammar_of(&params(body.clone())).unwrap(), want, "{body}");
        }
    }
}
