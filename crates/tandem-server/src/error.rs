//! API errors: an HTTP status plus the OpenAI-style JSON body
//! `{"error":{"message","type","param","code"}}` or, on the Anthropic routes, Anthropic's
//! `{"type":"error","error":{"type","message"}}` ([`AnthropicError`]), and the mapping of engine
//! refusals onto them.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tandem_engine::SubmitError;

/// An error answered to the client, never a panic.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The OpenAI `type` field (`invalid_request_error`, `server_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, ...).
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        Self::invalid(message).with_param(param)
    }

    /// 404 for a `model` the server does not serve.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("The model `{model}` does not exist."))
            .with_param("model")
            .with_code("model_not_found")
    }

    /// 400 `context_length_exceeded`.
    pub fn context_length(param: &str, message: impl Into<String>) -> Self {
        Self::invalid_param(param, message).with_code("context_length_exceeded")
    }

    /// 404 for an unknown route.
    pub fn route_not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("No route for {path}."))
            .with_code("not_found")
    }

    /// 405 for a known route with the wrong method.
    pub fn method_not_allowed() -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "Method not allowed on this route.")
            .with_code("method_not_allowed")
    }

    /// 413 for a body over the configured limit.
    pub fn payload_too_large() -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", "The request body is too large.")
            .with_code("payload_too_large")
    }

    /// 429 when the server already has its maximum of requests in flight.
    pub fn overloaded() -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "The server is at its limit of concurrent requests; retry shortly.",
            )
            .with_code("server_busy")
        }
    }

    /// 504 when a request ran past `--request-timeout`.
    pub fn timeout() -> Self {
        Self::new(StatusCode::GATEWAY_TIMEOUT, "server_error", "The request timed out.").with_code("timeout")
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "Incorrect or missing API key.")
            .with_code("invalid_api_key")
    }

    /// 500 `server_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 503 when the engine is gone.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).with_code("engine_unavailable")
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body, also sent as an SSE frame when a stream fails midway.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl ApiError {
    /// Anthropic's error `type` for this status.
    pub fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 | 405 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The Anthropic-style body, also sent as an `error` event when a stream fails midway.
    pub fn anthropic_body(&self) -> Value {
        json!({"type": "error", "error": {"type": self.anthropic_type(), "message": self.message}})
    }

    /// The response in the given API's style.
    pub fn into_styled(self, style: ErrorStyle) -> Response {
        match style {
            ErrorStyle::OpenAi => self.into_response(),
            ErrorStyle::Anthropic => AnthropicError(self).into_response(),
        }
    }
}

/// Which API's error shape a response takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorStyle {
    OpenAi,
    Anthropic,
}

impl ErrorStyle {
    /// Anthropic's shape for `/v1/messages…`, OpenAI's elsewhere.
    pub fn for_path(path: &str) -> Self {
        if path.starts_with("/v1/messages") {
            Self::Anthropic
        } else {
            Self::OpenAi
        }
    }
}

/// An [`ApiError`] answered in Anthropic's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl From<SubmitError> for AnthropicError {
    fn from(e: SubmitError) -> Self {
        Self(e.into())
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let e = self.0;
        tracing::debug!(status = e.status.as_u16(), "{}", e.message);
        let mut resp = (e.status, axum::Json(e.anthropic_body())).into_response();
        if let Some(secs) = e.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = self.status.as_u16(), "{}", self.message);
        } else {
            tracing::debug!(status = self.status.as_u16(), "{}", self.message);
        }
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        let msg = e.to_string();
        match e {
            SubmitError::EmptyPrompt => ApiError::invalid_param("prompt", msg),
            SubmitError::PromptTooLong { .. } => ApiError::context_length("messages", msg),
            SubmitError::MaxTokensTooLarge { .. } => ApiError::context_length("max_tokens", msg),
            SubmitError::InvalidToken(_) => ApiError::invalid_param("prompt", msg).with_code("invalid_token"),
            SubmitError::InvalidParam(_) => ApiError::invalid(msg),
            SubmitError::InvalidGrammar(_) => ApiError::invalid(msg).with_code("invalid_grammar"),
            SubmitError::QueueFull => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", msg).with_code("queue_full")
            },
            SubmitError::Stopped => ApiError::unavailable(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_shape() {
        let e = ApiError::model_not_found("x");
        let b = e.body();
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["param"], "model");
        assert_eq!(b["error"]["code"], "model_not_found");
        assert!(b["error"]["message"].as_str().unwrap().contains("`x`"));
        let plain = ApiError::invalid("bad").body();
        assert!(plain["error"]["param"].is_null());
        assert!(plain["error"]["code"].is_null());
    }

    #[test]
    fn submit_errors_map_to_statuses() {
        let cases = [
            (SubmitError::EmptyPrompt, 400),
            (SubmitError::PromptTooLong { prompt: 9, context: 8 }, 400),
            (SubmitError::MaxTokensTooLarge { prompt: 1, max_tokens: 9, context: 8 }, 400),
            (SubmitError::InvalidToken(7), 400),
            (SubmitError::InvalidParam("x".into()), 400),
            (SubmitError::QueueFull, 429),
            (SubmitError::Stopped, 503),
        ];
        for (e, status) in cases {
            assert_eq!(ApiError::from(e).status.as_u16(), status);
        }
        let full = ApiError::from(SubmitError::QueueFull).into_response();
        assert_eq!(full.headers().get(header::RETRY_AFTER).unwrap(), "1");
    }

    #[test]
    fn anthropic_shape() {
        let b = ApiError::invalid("bad").anthropic_body();
        assert_eq!(b, json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}));
        assert_eq!(ApiError::unauthorized().anthropic_type(), "authentication_error");
        assert_eq!(ApiError::overloaded().anthropic_type(), "rate_limit_error");
        assert_eq!(ApiError::internal("x").anthropic_type(), "api_error");
        let r = AnthropicError(ApiError::overloaded()).into_response();
        assert_eq!((r.status().as_u16(), r.headers().get(header::RETRY_AFTER).unwrap().to_str().unwrap()), (429, "1"));
        assert_eq!(ErrorStyle::for_path("/v1/messages/count_tokens"), ErrorStyle::Anthropic);
        assert_eq!(ErrorStyle::for_path("/v1/chat/completions"), ErrorStyle::OpenAi);
    }
}
