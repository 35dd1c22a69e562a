//! Turning a streamed response's chunk timestamps into latency metrics.
//!
//! Definitions (all times in seconds from the moment the request was sent):
//! * **TTFT**: arrival of the first chunk that carries output (content, reasoning or a tool
//!   call);
//! * **ITL** (inter-token latency): the gaps between consecutive output chunks; a chunk that
//!   carries several tokens counts as one gap (servers that batch tokens into chunks show
//!   fewer, longer gaps);
//! * **TPOT** (time per output token): `(last - first) / (tokens - 1)`, with `tokens` the
//!   server's `completion_tokens` when reported, else the number of output tokens counted in
//!   the stream; decode tok/s is its inverse;
//! * **end-to-end**: until the stream closed.

use serde::{Deserialize, Serialize};

/// When each output chunk arrived and how many tokens it carried.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ChunkArrival {
    /// Seconds since the request was sent.
    pub at_s: f64,
    pub tokens: usize,
}

/// Latency metrics of one request.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnTiming {
    pub ttft_s: Option<f64>,
    /// `None` with fewer than two output tokens.
    pub tpot_s: Option<f64>,
    pub decode_tok_s: Option<f64>,
    /// Gaps between consecutive output chunks.
    pub itl_s: Vec<f64>,
    pub e2e_s: f64,
    /// Output tokens: the server's count when reported, else the stream's.
    pub output_tokens: usize,
}

/// Computes the metrics of one request from its chunk arrivals (in arrival order), the
/// server-reported completion tokens (if any) and the time the stream ended.
pub fn turn_timing(arrivals: &[ChunkArrival], reported_tokens: Option<usize>, end_s: f64) -> TurnTiming {
    let streamed: usize = arrivals.iter().map(|a| a.tokens).sum();
    let output_tokens = reported_tokens.unwrap_or(streamed);
    let ttft_s = arrivals.first().map(|a| a.at_s);
    let itl_s: Vec<f64> = arrivals.windows(2).map(|w| w[1].at_s - w[0].at_s).collect();
    let tpot_s = match (arrivals.first(), arrivals.last()) {
        (Some(f), Some(l)) if output_tokens > 1 && l.at_s > f.at_s => {
            Some((l.at_s - f.at_s) / (output_tokens - 1) as f64)
        }
        _ => None,
    };
    TurnTiming { ttft_s, tpot_s, decode_tok_s: tpot_s.map(|t| 1.0 / t), itl_s, e2e_s: end_s, output_tokens }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripted_arrivals() {
        let a = |at_s, tokens| ChunkArrival { at_s, tokens };
        let t = turn_timing(&[a(0.5, 1), a(0.6, 1), a(0.8, 2)], None, 1.0);
        assert_eq!(t.ttft_s, Some(0.5));
        assert_eq!(t.output_tokens, 4);
        assert!((t.tpot_s.unwrap() - 0.1).abs() < 1e-12);
        assert!((t.itl_s[0] - 0.1).abs() < 1e-12 && (t.itl_s[1] - 0.2).abs() < 1e-12);
        let empty = turn_timing(&[], Some(0), 0.2);
        assert_eq!((empty.ttft_s, empty.tpot_s, empty.e2e_s), (None, None, 0.2));
    }
}
