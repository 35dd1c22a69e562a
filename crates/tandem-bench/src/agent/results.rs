//! What the agent benchmark records: per turn, per session, and overall per system.

use serde::{Deserialize, Serialize};

use crate::stats::Summary;

/// One request of one session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnResult {
    pub session: usize,
    /// 1-based.
    pub turn: usize,
    /// Seconds from the start of the run until the request was sent.
    pub sent_at_s: f64,
    /// Tokens of the messages' contents, counted with the workload's counter (no template).
    pub history_tokens: usize,
    /// As the server reported them.
    pub prompt_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
    pub completion_tokens: usize,
    pub ttft_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub decode_tok_s: Option<f64>,
    /// Inter-token latencies of this turn, summarised.
    pub itl_s: Option<Summary>,
    /// Every inter-token gap of this turn, in arrival order (raw).
    pub itl_raw_s: Vec<f64>,
    pub e2e_s: f64,
    pub error: Option<String>,
}

/// One session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionResult {
    pub id: usize,
    pub turns_done: usize,
    pub turns_planned: usize,
    /// From the first request to the end of the last answer, think time included.
    pub wall_s: f64,
    pub error: Option<String>,
}

/// Aggregates over every turn of every session (latencies in milliseconds).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Overall {
    pub requests: usize,
    pub errors: usize,
    pub ttft_ms: Option<Summary>,
    pub tpot_ms: Option<Summary>,
    /// Every inter-token gap of every turn.
    pub itl_ms: Option<Summary>,
    pub e2e_ms: Option<Summary>,
    pub decode_tok_s: Option<Summary>,
    pub session_wall_s: Option<Summary>,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub output_tokens: usize,
    /// Output tokens of all sessions over the run's wall time.
    pub output_tok_per_s: f64,
}

/// Everything measured against one endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemResult {
    pub label: String,
    pub endpoint: String,
    pub model: String,
    pub wall_s: f64,
    pub turns: Vec<TurnResult>,
    pub sessions: Vec<SessionResult>,
    pub overall: Overall,
}

impl SystemResult {
    /// Mean of `f` over the sessions' turn number `turn` (1-based), for per-turn charts.
    pub fn per_turn_mean(&self, f: impl Fn(&TurnResult) -> Option<f64>) -> Vec<(usize, f64)> {
        let max_turn = self.turns.iter().map(|t| t.turn).max().unwrap_or(0);
        (1..=max_turn)
            .filter_map(|n| {
                let v: Vec<f64> =
                    self.turns.iter().filter(|t| t.turn == n && t.error.is_none()).filter_map(&f).collect();
                crate::stats::mean(&v).map(|m| (n, m))
            })
            .collect()
    }
}
