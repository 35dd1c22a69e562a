//! Settings of the HTTP server: where it listens and the limits it applies to every request.

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
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self { host: "127.0.0.1".into(), port: 8080, max_body_bytes: 4 << 20, default_max_tokens: 4096 }
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
    }
}
