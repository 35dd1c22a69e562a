//! Settings of the HTTP server: where it listens, the limits it applies to every request, the
//! API key, and how model output is parsed (tool-call format, reasoning, thinking budget).

use std::time::Duration;

use crate::tools::ToolFormat;

/// Which tool-call format to parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolParserChoice {
    /// From the chat template's source (Hermes JSON when it shows no tool syntax).
    #[default]
    Auto,
    /// Never parse tool calls.
    Off,
    Fixed(ToolFormat),
}

impl ToolParserChoice {
    /// `auto`, `none`, or a [`ToolFormat`] name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "auto" => Some(Self::Auto),
            "none" | "off" => Some(Self::Off),
            other => ToolFormat::from_name(other).map(Self::Fixed),
        }
    }
}

/// How the server listens and which limits it enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Interface to bind (default `127.0.0.1`).
    pub host: String,
    /// TCP port (default 8080; 0 picks a free one).
    pub port: u16,
    /// Largest accepted request body; larger bodies get 413 (default 4 MiB).
    pub max_body_bytes: usize,
    /// `max_tokens` used when a request gives none, capped by the room left in the context
    /// (0 = no cap besides the context).
    pub default_max_tokens: usize,
    /// Largest prompt in tokens (0 = the context length is the only limit).
    pub max_prompt_tokens: usize,
    /// Generation requests in flight (streaming or not) before new ones get 429 (0 = no limit
    /// besides the engine's queue).
    pub max_concurrent_requests: usize,
    /// Wall-clock limit of one request; a stream past it ends with an error event.
    pub request_timeout: Option<Duration>,
    /// When set, every `/v1` route needs `Authorization: Bearer KEY` or `x-api-key: KEY`.
    pub api_key: Option<String>,
    pub tool_parser: ToolParserChoice,
    /// Split `<think>…</think>` into `reasoning_content` / thinking blocks.
    pub parse_reasoning: bool,
    /// Thinking budget of requests that set none (0 = unlimited).
    pub default_max_thinking_tokens: usize,
    /// Loop detector inside the reasoning block: n-gram length (0 = off) and the number of
    /// occurrences of one n-gram that counts as a loop.
    pub thinking_loop_ngram: usize,
    pub thinking_loop_repeats: usize,
    /// Open connections at most (keep it below the process's file-descriptor limit). At the
    /// limit a new connection displaces the oldest one that has not sent a request yet, or,
    /// when every connection is serving, is answered 503 at once.
    pub max_connections: usize,
    /// A connection must send a request's headers within this time of connecting or of its
    /// previous response (keep-alive), or it is closed.
    pub header_read_timeout: Duration,
    /// A request body must arrive within this time (slow bodies get 408).
    pub body_read_timeout: Duration,
    /// Other names the model answers to besides its id (`--served-model-name`, the catalogue
    /// alias, the file name); `GET /v1/models` lists them after the id.
    pub model_aliases: Vec<String>,
    /// Accept any `model` name (for clients that insist on their own); off by default, so a
    /// misdirected request gets 404 rather than another model's answer.
    pub any_model: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            max_body_bytes: 4 << 20,
            default_max_tokens: 4096,
            max_prompt_tokens: 0,
            max_concurrent_requests: 256,
            request_timeout: None,
            api_key: None,
            tool_parser: ToolParserChoice::Auto,
            parse_reasoning: true,
            default_max_thinking_tokens: 0,
            thinking_loop_ngram: 32,
            thinking_loop_repeats: 8,
            max_connections: 512,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            model_aliases: Vec::new(),
            any_model: false,
        }
    }
}

impl ServerConfig {
    /// `host:port`, as passed to the listener.
    pub fn addr(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_addr() {
        let cfg = ServerConfig::default();
        assert_eq!(cfg.addr(), "127.0.0.1:8080");
        assert_eq!(cfg.max_body_bytes, 4 * 1024 * 1024);
        let v6 = ServerConfig { host: "::1".into(), port: 9, ..cfg };
        assert_eq!(v6.addr(), "[::1]:9");
        assert_eq!(ToolParserChoice::from_name("none"), Some(ToolParserChoice::Off));
        assert_eq!(ToolParserChoice::from_name("hermes"), Some(ToolParserChoice::Fixed(ToolFormat::Hermes)));
        assert_eq!(ToolParserChoice::from_name("?"), None);
    }
}
