//! The optional API key: every route but `/health` then needs `Authorization: Bearer KEY` (the
//! OpenAI clients) or `x-api-key: KEY` (the Anthropic clients). Keys are compared in constant
//! time; a missing or wrong key gets 401 in the style of the API the path belongs to.

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;

use crate::error::{ApiError, ErrorStyle};
use crate::state::AppState;

/// Middleware enforcing `cfg.api_key` when it is set.
pub async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(key) = state.cfg.api_key.as_deref() else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/health"
        || presented(req.headers()).is_some_and(|given| constant_time_eq(given.as_bytes(), key.as_bytes()))
    {
        return next.run(req).await;
    }
    let style = ErrorStyle::for_path(path);
    ApiError::unauthorized().into_styled(style)
}

/// The key the client sent, from `Authorization: Bearer …` or `x-api-key`.
fn presented(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim))
}

/// Equality whose running time depends only on the lengths, not on where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u64;
    let n = a.len().max(b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= u64::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn header_forms() {
        let mut h = HeaderMap::new();
        assert_eq!(presented(&h), None);
        h.insert("x-api-key", "k1".parse().unwrap());
        assert_eq!(presented(&h), Some("k1"));
        h.insert("authorization", "Bearer k2".parse().unwrap());
        assert_eq!(presented(&h), Some("k2"));
    }
}
