//! Test helpers: start a server on 127.0.0.1:0 and read its responses (JSON bodies, SSE frames).

#![allow(dead_code)]

pub mod fake;

use serde_json::Value;
use tandem_server::{Backend, ServerConfig};

/// A running server and a client for it.
pub struct Server {
    pub base: String,
    pub client: reqwest::Client,
}

impl Server {
    /// Serves `backend` on a free port of 127.0.0.1.
    pub async fn start<B: Backend>(backend: B, cfg: ServerConfig) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            if let Err(e) = tandem_server::serve_on(listener, backend, cfg).await {
                eprintln!("server failed: {e}");
            }
        });
        Self { base, client: reqwest::Client::new() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// POSTs `body` (sent verbatim) and returns the status and parsed JSON body.
    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let resp = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("send");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("non-JSON body ({e}): {text:?}"));
        (status, json)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self.client.get(self.url(path)).send().await.expect("send");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("json"))
    }

    /// POSTs a streaming request and returns the status, content type and `data:` payloads.
    pub async fn stream(&self, path: &str, body: &Value) -> (u16, String, Vec<String>) {
        let resp = self.client.post(self.url(path)).json(body).send().await.expect("send");
        let status = resp.status().as_u16();
        let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let text = resp.text().await.expect("body");
        (status, ctype, sse_data(&text))
    }
}

/// The `data:` payloads of an SSE body, in order (comments and other fields skipped).
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|frame| {
            let lines: Vec<&str> = frame
                .lines()
                .filter_map(|l| l.strip_prefix("data:").map(|d| d.strip_prefix(' ').unwrap_or(d)))
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        })
        .collect()
}

/// Asserts an OpenAI-style error body with the given status.
pub fn assert_error(status: u16, body: &Value, want_status: u16, what: &str) {
    assert_eq!(status, want_status, "{what}: {body}");
    let err = &body["error"];
    assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {body}");
    assert!(err["type"].is_string(), "{what}: {body}");
    assert!(err.get("param").is_some() && err.get("code").is_some(), "{what}: {body}");
}

/// The JSON chunks of a stream that must end with `[DONE]`.
pub fn chunks(data: &[String]) -> Vec<Value> {
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "stream must end with [DONE]: {data:?}");
    data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).expect("chunk JSON")).collect()
}
