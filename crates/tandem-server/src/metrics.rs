//! `GET /metrics`: the engine's counters in the Prometheus text format (version 0.0.4):
//! running and waiting requests, KV blocks used and free, state slots, recurrent-state
//! checkpoints held, prefix-cache hit tokens and ratio, preemptions. A backend without engine
//! stats (test fakes) reports only `tandem_up`.

use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use tandem_engine::EngineStats;

use crate::state::AppState;

pub async fn metrics(State(state): State<AppState>) -> Response {
    let body = render(state.backend.stats());
    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

enum Kind {
    Gauge,
    Counter,
}

fn metric(out: &mut String, name: &str, kind: Kind, help: &str, value: f64) {
    let kind = match kind {
        Kind::Gauge => "gauge",
        Kind::Counter => "counter",
    };
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
}

/// The exposition text for `stats`.
pub fn render(stats: Option<&EngineStats>) -> String {
    use Kind::{Counter, Gauge};
    let mut out = String::new();
    metric(&mut out, "tandem_up", Gauge, "1 while the server runs.", 1.0);
    let Some(s) = stats else { return out };
    let v = |a: &AtomicUsize| a.load(Ordering::Relaxed) as f64;
    let rows: [(&str, Kind, &str, f64); 17] = [
        ("tandem_requests_running", Gauge, "Requests admitted and generating.", v(&s.running)),
        ("tandem_requests_waiting", Gauge, "Requests queued or preempted, waiting for admission.", v(&s.waiting)),
        ("tandem_requests_finished_total", Counter, "Requests that finished or failed.", v(&s.finished)),
        ("tandem_requests_cancelled_total", Counter, "Requests cancelled by their client.", v(&s.cancelled)),
        ("tandem_kv_blocks_total", Gauge, "KV blocks in the paged pool.", v(&s.kv_blocks_total)),
        (
            "tandem_kv_blocks_used",
            Gauge,
            "KV blocks in use (live sequences and prefix cache).",
            s.kv_blocks_used() as f64,
        ),
        ("tandem_kv_blocks_free", Gauge, "KV blocks on the free list.", v(&s.kv_blocks_free)),
        ("tandem_kv_block_bytes", Gauge, "Bytes of one KV block over all attention layers.", v(&s.kv_block_bytes)),
        ("tandem_kv_live_bytes", Gauge, "Bytes of KV and recurrent state held by live sequences.", v(&s.kv_bytes)),
        ("tandem_prefix_cache_blocks", Gauge, "KV blocks referenced by the prefix cache.", v(&s.prefix_cache_blocks)),
        ("tandem_state_slots_total", Gauge, "Recurrent-state slots.", v(&s.state_slots_total)),
        ("tandem_state_slots_free", Gauge, "Recurrent-state slots free.", v(&s.state_slots_free)),
        ("tandem_checkpoints", Gauge, "Recurrent-state checkpoints held by the prefix cache.", v(&s.checkpoints)),
        ("tandem_checkpoint_bytes", Gauge, "Bytes of recurrent-state checkpoints held.", v(&s.checkpoint_bytes)),
        ("tandem_prompt_tokens_total", Counter, "Prompt tokens of admitted requests.", v(&s.prompt_tokens)),
        (
            "tandem_prefix_hit_tokens_total",
            Counter,
            "Prompt tokens served from the prefix cache.",
            v(&s.prefix_hit_tokens),
        ),
        (
            "tandem_preemptions_total",
            Counter,
            "Sequences preempted for recompute when KV blocks ran out.",
            v(&s.preemptions),
        ),
    ];
    for (name, kind, help, value) in rows {
        metric(&mut out, name, kind, help, value);
    }
    metric(
        &mut out,
        "tandem_prefix_hit_ratio",
        Gauge,
        "Share of admitted prompt tokens served from the prefix cache.",
        s.prefix_hit_ratio(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_once_with_type_and_value() {
        let s = EngineStats::default();
        s.running.store(3, Ordering::Relaxed);
        s.kv_blocks_total.store(100, Ordering::Relaxed);
        s.kv_blocks_free.store(60, Ordering::Relaxed);
        s.prompt_tokens.store(200, Ordering::Relaxed);
        s.prefix_hit_tokens.store(50, Ordering::Relaxed);
        s.preemptions.store(2, Ordering::Relaxed);
        let text = render(Some(&s));
        for line in [
            "tandem_requests_running 3",
            "tandem_kv_blocks_used 40",
            "tandem_kv_blocks_free 60",
            "tandem_prefix_hit_ratio 0.25",
            "tandem_preemptions_total 2",
            "# TYPE tandem_preemptions_total counter",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in\n{text}");
        }
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(samples.len(), 19);
        for l in &samples {
            let (name, value) = l.split_once(' ').unwrap();
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{name}");
            value.parse::<f64>().unwrap();
            assert_eq!(text.matches(&format!("# TYPE {name} ")).count(), 1);
        }
        assert_eq!(render(None).lines().filter(|l| !l.starts_with('#')).count(), 1);
    }
}
