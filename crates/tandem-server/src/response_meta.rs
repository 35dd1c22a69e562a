//! Metadata every completion object carries: response ids, creation time and the `usage` block.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tandem_engine::Usage;

/// Identity of one response, repeated in each of its stream chunks.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseMeta {
    /// A new id with `prefix` (`chatcmpl`, `cmpl`), created now.
    pub fn new(prefix: &str, model: &str) -> Self {
        Self { id: response_id(prefix), created: unix_now(), model: model.to_string() }
    }
}

/// A fresh response id such as `chatcmpl-3f9c…` (24 hex digits after the prefix).
pub fn response_id(prefix: &str) -> String {
    format!("{prefix}-{:024x}", rand::random::<u128>() >> 32)
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
    /// tandem: of `cached_tokens`, those read back from the prefix cache's disk tier.
    pub disk_cached_tokens: usize,
}

/// tandem's extension of `usage`: speculative decoding numbers of the request (present when
/// it drafted anything).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct SpeculativeUsage {
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
    pub acceptance_rate: f64,
    /// Tokens per verification step (accepted drafts plus the model's own).
    pub mean_accepted_length: f64,
}

/// The OpenAI `usage` object.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct UsageBody {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpeculativeUsage>,
}

impl From<&Usage> for UsageBody {
    fn from(u: &Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: u.cached_tokens,
                disk_cached_tokens: u.disk_cached_tokens,
            },
            speculative: (u.speculative.drafted_tokens > 0).then(|| SpeculativeUsage {
                drafted_tokens: u.speculative.drafted_tokens,
                accepted_tokens: u.speculative.accepted_tokens,
                acceptance_rate: u.speculative.acceptance_rate(),
                mean_accepted_length: u.speculative.mean_accepted_length(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_usage() {
        let id = response_id("chatcmpl");
        assert!(id.starts_with("chatcmpl-") && id.len() == "chatcmpl-".len() + 24, "{id}");
        assert_ne!(id, response_id("chatcmpl"));
        let u =
            UsageBody::from(&Usage { prompt_tokens: 3, completion_tokens: 4, cached_tokens: 1, ..Default::default() });
        let v = serde_json::to_value(u).unwrap();
        assert_eq!(v["total_tokens"], 7);
        assert_eq!(v["prompt_tokens_details"]["cached_tokens"], 1);
        assert!(unix_now() > 1_600_000_000);
    }
}
