//! The JSON body extractor of every POST route. Unlike `axum::Json` it answers malformed JSON,
//! wrong types, and oversized bodies with the OpenAI-style JSON error body (naming the field at
//! fault), and it does not insist on a `Content-Type` header.
//!
//! The body is parsed once into a [`Value`]; request types then pick their fields from it with
//! [`from_value`] (a request made of several structs deserialises each from the same value,
//! since `#[serde(flatten)]` would lose the path of a bad field).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;

/// A type built from a parsed JSON request body.
pub trait JsonBody: Sized {
    fn from_json(value: &Value) -> Result<Self, ApiError>;
}

/// A request body parsed as JSON into `T`.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: JsonBody,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large()
            } else {
                ApiError::invalid(format!("Could not read the request body: {}", rejection.body_text()))
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parses `bytes` as one JSON value and builds `T` from it.
pub fn parse_json<T: JsonBody>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| malformed(&e))?;
    T::from_json(&value)
}

/// Deserialises `T` from `value`; a mismatch names the field at fault (`messages[0].role`).
pub fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let param = (path != ".").then_some(path);
        let mut e = ApiError::invalid(match &param {
            Some(p) => format!("Invalid value for `{p}`: {}", strip_position(&inner)),
            None => format!("Invalid request body: {}", strip_position(&inner)),
        });
        e.param = param;
        e
    })
}

fn malformed(e: &serde_json::Error) -> ApiError {
    ApiError::invalid(format!("We could not parse the JSON body of your request: {e}")).with_code("invalid_json")
}

/// serde_json's message without the trailing " at line L column C" (the param names the place).
fn strip_position(e: &serde_json::Error) -> String {
    let full = e.to_string();
    match full.rfind(" at line ") {
        Some(i) => full[..i].to_string(),
        None => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    impl JsonBody for Body {
        fn from_json(value: &Value) -> Result<Self, ApiError> {
            from_value(value)
        }
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Body {
        a: u32,
        #[serde(default)]
        inner: Option<Inner>,
    }
    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        b: Vec<f32>,
    }

    #[test]
    fn malformed_json_is_400_invalid_json() {
        for body in ["", "{", "{\"a\": 1,}", "{\"a\":1} trailing", "nope"] {
            let e = parse_json::<Body>(body.as_bytes()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.code, Some("invalid_json"), "{body}");
        }
    }

    #[test]
    fn wrong_types_name_the_param() {
        let e = parse_json::<Body>(br#"{"a": "x"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("a"));
        assert!(e.code.is_none());
        let e = parse_json::<Body>(br#"{"a": 1, "inner": {"b": [1, "x"]}}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("inner.b[1]"));
        assert!(!e.message.contains("line"), "{}", e.message);
        let e = parse_json::<Body>(br#"5"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse_json::<Body>(br#"{"a": -1}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("a"));
    }

    #[test]
    fn good_json_parses() {
        let b: Body = parse_json(br#"{"a": 3, "unknown": true}"#).unwrap();
        assert_eq!(b.a, 3);
    }
}
