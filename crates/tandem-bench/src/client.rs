//! A streaming OpenAI chat-completions client that timestamps every chunk. Works with any
//! OpenAI-compatible server (tandem, llama.cpp's `llama-server`, vLLM, ...) over plain HTTP.
//!
//! Cached prompt tokens are read from `usage.prompt_tokens_details.cached_tokens` (OpenAI,
//! vLLM, tandem) or from llama.cpp's `timings.cache_n`.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::sse::SseParser;
use crate::timing::ChunkArrival;

/// A chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
}

/// Token counts the server reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportedUsage {
    pub prompt_tokens: Option<usize>,
    pub completion_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
}

/// What one streamed request returned, with its chunk timestamps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamedTurn {
    /// Output text (content; reasoning is timed but not kept).
    pub text: String,
    pub arrivals: Vec<ChunkArrival>,
    pub usage: ReportedUsage,
    /// Seconds from sending the request until the stream ended.
    pub end_s: f64,
    pub finish_reason: Option<String>,
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Base URL including `/v1`, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    pub api_key: Option<String>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Extra fields merged into every request body (e.g. `{"cache_prompt": true}`).
    pub extra_body: Value,
}

/// The client.
#[derive(Clone)]
pub struct ChatClient {
    http: reqwest::Client,
    cfg: ClientConfig,
}

/// Normalises an endpoint to a base URL ending in `/v1` (accepts `host:port`, `http://host:port`
/// or a URL that already ends in `/v1`).
pub fn normalize_base_url(endpoint: &str) -> String {
    let mut s = endpoint.trim().trim_end_matches('/').to_string();
    if !s.starts_with("http://") && !s.starts_with("https://") {
        s = format!("http://{s}");
    }
    if !s.ends_with("/v1") {
        s.push_str("/v1");
    }
    s
}

impl ChatClient {
    pub fn new(mut cfg: ClientConfig) -> anyhow::Result<Self> {
        cfg.base_url = normalize_base_url(&cfg.base_url);
        let http = reqwest::Client::builder().timeout(cfg.timeout).build().context("building the HTTP client")?;
        Ok(Self { http, cfg })
    }

    pub fn base_url(&self) -> &str {
        &self.cfg.base_url
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.cfg.api_key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    /// The first model the server lists at `GET /v1/models`.
    pub async fn first_model(&self) -> anyhow::Result<String> {
        let url = format!("{}/models", self.cfg.base_url);
        let resp = self.auth(self.http.get(&url)).send().await.with_context(|| format!("GET {url}"))?;
        let status = resp.status();
        let body: Value = resp.json().await.with_context(|| format!("GET {url}: not JSON"))?;
        if !status.is_success() {
            bail!("GET {url}: {status}: {body}");
        }
        body["data"][0]["id"].as_str().map(str::to_string).ok_or_else(|| anyhow!("GET {url}: no model listed"))
    }

    /// Streams one chat completion, greedy, at most `max_tokens` tokens (EOS ignored where
    /// the server supports `ignore_eos`, so every system generates the same amount).
    pub async fn stream_chat(
        &self,
        model: &str,
        messages: &[Message],
        max_tokens: usize,
    ) -> anyhow::Result<StreamedTurn> {
        let mut body = json!({
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": true,
            "stream_options": {"include_usage": true},
            "ignore_eos": true,
        });
        if let (Some(b), Some(extra)) = (body.as_object_mut(), self.cfg.extra_body.as_object()) {
            for (k, v) in extra {
                b.insert(k.clone(), v.clone());
            }
        }
        let url = format!("{}/chat/completions", self.cfg.base_url);
        let t0 = Instant::now();
        let resp = self.auth(self.http.post(&url)).json(&body).send().await.with_context(|| format!("POST {url}"))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            bail!("POST {url}: {status}: {}", text.chars().take(500).collect::<String>());
        }
        let mut out = StreamedTurn::default();
        let mut parser = SseParser::new();
        let mut stream = resp.bytes_stream();
        let mut done = false;
        while let Some(piece) = stream.next().await {
            let piece = piece.with_context(|| format!("reading the stream of POST {url}"))?;
            let now = t0.elapsed().as_secs_f64();
            for data in parser.feed(&piece) {
                done |= apply_event(&data, now, &mut out)?;
            }
            if done {
                break;
            }
        }
        let now = t0.elapsed().as_secs_f64();
        for data in parser.finish() {
            apply_event(&data, now, &mut out)?;
        }
        out.end_s = t0.elapsed().as_secs_f64();
        Ok(out)
    }
}

/// Applies one SSE `data` payload received at `now`; returns true on `[DONE]`.
pub fn apply_event(data: &str, now: f64, out: &mut StreamedTurn) -> anyhow::Result<bool> {
    let data = data.trim();
    if data == "[DONE]" {
        return Ok(true);
    }
    let v: Value = serde_json::from_str(data).with_context(|| format!("stream chunk is not JSON: {data:.200}"))?;
    if let Some(err) = v.get("error") {
        bail!("the server reported an error mid-stream: {err}");
    }
    if let Some(choice) = v["choices"].get(0) {
        let delta = &choice["delta"];
        let content = delta["content"].as_str().unwrap_or("");
        let reasoning = delta["reasoning_content"].as_str().unwrap_or("");
        let tool = delta.get("tool_calls").is_some_and(|t| !t.is_null());
        let ids = v["token_ids"].as_array().or_else(|| choice["token_ids"].as_array()).map(|a| a.len());
        if !content.is_empty() || !reasoning.is_empty() || tool || ids.is_some_and(|n| n > 0) {
            out.arrivals.push(ChunkArrival { at_s: now, tokens: ids.filter(|&n| n > 0).unwrap_or(1) });
        }
        out.text.push_str(content);
        if let Some(r) = choice["finish_reason"].as_str() {
            out.finish_reason = Some(r.to_string());
        }
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let n = |x: &Value| x.as_u64().map(|n| n as usize);
        out.usage.prompt_tokens = n(&u["prompt_tokens"]).or(out.usage.prompt_tokens);
        out.usage.completion_tokens = n(&u["completion_tokens"]).or(out.usage.completion_tokens);
        out.usage.cached_tokens = n(&u["prompt_tokens_details"]["cached_tokens"]).or(out.usage.cached_tokens);
    }
    if let Some(t) = v.get("timings").filter(|t| t.is_object()) {
        // llama.cpp: prompt tokens taken from its cache, and those it processed.
        if let Some(c) = t["cache_n"].as_u64() {
            out.usage.cached_tokens = Some(c as usize);
            if out.usage.prompt_tokens.is_none() {
                out.usage.prompt_tokens = t["prompt_n"].as_u64().map(|p| (p + c) as usize);
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(normalize_base_url("127.0.0.1:8080"), "http://127.0.0.1:8080/v1");
        assert_eq!(normalize_base_url("http://h:1/v1/"), "http://h:1/v1");
    }

    #[test]
    fn events_update_the_turn() {
        let mut t = StreamedTurn::default();
        apply_event(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, 0.1, &mut t).unwrap();
        apply_event(r#"{"choices":[{"delta":{"content":"Hi"}}]}"#, 0.2, &mut t).unwrap();
        apply_event(
            r#"{"choices":[{"delta":{"content":"!"},"finish_reason":"length"}],"timings":{"cache_n":7,"prompt_n":3}}"#,
            0.3,
            &mut t,
        )
        .unwrap();
        apply_event(r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2}}"#, 0.4, &mut t).unwrap();
        assert!(apply_event("[DONE]", 0.5, &mut t).unwrap());
        assert_eq!(t.text, "Hi!");
        assert_eq!(t.arrivals.len(), 2);
        assert_eq!(
            t.usage,
            ReportedUsage { prompt_tokens: Some(10), completion_tokens: Some(2), cached_tokens: Some(7) }
        );
        assert!(apply_event("{not json", 0.6, &mut t).is_err());
        assert!(apply_event(r#"{"error":{"message":"x"}}"#, 0.6, &mut t).is_err());
    }
}
