//! The legacy completion request body: `prompt` (parsed in `prompt.rs`), integer `logprobs`,
//! unsupported options refused explicitly, plus the shared [`CommonParams`].

use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::extract::{from_value, JsonBody};
use crate::params::CommonParams;

/// Largest legacy `logprobs` accepted.
pub const MAX_LOGPROBS: u32 = 20;

/// The body of `POST /v1/completions`. Unknown fields are ignored.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CompletionRequest {
    /// A string, an array of token ids, or a one-element array of either (`Null` when absent).
    #[serde(default)]
    pub prompt: Value,
    /// Deserialised from the same body by [`JsonBody::from_json`].
    #[serde(skip)]
    pub common: CommonParams,
    /// Number of top alternatives to report per token (legacy format).
    #[serde(default)]
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub best_of: Option<u64>,
}

impl JsonBody for CompletionRequest {
    fn from_json(value: &Value) -> Result<Self, ApiError> {
        let mut req: Self = from_value(value)?;
        req.common = from_value(value)?;
        Ok(req)
    }
}

impl CompletionRequest {
    /// Refuses options this server does not implement.
    pub fn check_supported(&self) -> Result<(), ApiError> {
        if self.echo == Some(true) {
            return Err(ApiError::invalid_param("echo", "echo is not supported."));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid_param("suffix", "suffix is not supported."));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(ApiError::invalid_param("best_of", "best_of must be 1."));
        }
        Ok(())
    }

    /// What the engine is asked for: `None`, or the number of alternatives per position.
    pub fn engine_logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.logprobs {
            Some(n) if n > MAX_LOGPROBS => {
                Err(ApiError::invalid_param("logprobs", format!("logprobs must be at most {MAX_LOGPROBS}.")))
            }
            n => Ok(n.map(|n| n as usize)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::parse_json;
    use serde_json::json;

    fn req(v: Value) -> Result<CompletionRequest, ApiError> {
        parse_json(v.to_string().as_bytes())
    }

    #[test]
    fn parses_and_checks() {
        let r = req(json!({"prompt": "hi", "max_tokens": 4, "logprobs": 2})).unwrap();
        assert_eq!(r.prompt, json!("hi"));
        assert_eq!(r.common.max_tokens, Some(4));
        assert_eq!(r.engine_logprobs().unwrap(), Some(2));
        assert!(r.check_supported().is_ok());
        assert_eq!(req(json!({})).unwrap().prompt, Value::Null);
        assert!(req(json!({"echo": true})).unwrap().check_supported().is_err());
        assert!(req(json!({"best_of": 2})).unwrap().check_supported().is_err());
        assert!(req(json!({"suffix": "x"})).unwrap().check_supported().is_err());
        assert!(req(json!({"logprobs": 21})).unwrap().engine_logprobs().is_err());
        let e = req(json!({"logprobs": true})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"));
        let e = req(json!({"max_tokens": "many"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
    }
}
