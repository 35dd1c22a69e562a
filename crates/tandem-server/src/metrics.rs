//! `GET /metrics`: the engine's counters in the Prometheus text format (version 0.0.4):
//! running and waiting requests, KV blocks used and free, state slots, recurrent-state
//! checkpoints held, prefix-cache hit tokens and ratio, preemptions, speculative decoding
//! (drafted/accepted tokens, acceptance per draft position), the prefix cache's disk tier
//! (entries, bytes, hits, reads, writes, evictions, refused entries). A backend without engine
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
    let rows: [(&str, Kind, &str, f64); 21] = [
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
        (
            "tandem_kv_block_bytes",
            Gauge,
            "Bytes of one KV block over the paged attention layers.",
            v(&s.kv_block_bytes),
        ),
        (
            "tandem_kv_ring_bytes",
            Gauge,
            "Bytes of the sliding-window rings one running sequence holds, whatever its length.",
            v(&s.kv_ring_bytes),
        ),
        ("tandem_kv_live_bytes", Gauge, "Bytes of KV and recurrent state held by live sequences.", v(&s.kv_bytes)),
        (
            "tandem_kv_live_bytes_peak",
            Gauge,
            "The most bytes of KV and recurrent state live sequences have held since the start.",
            v(&s.kv_bytes_peak),
        ),
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
        (
            "tandem_batch_fallbacks_total",
            Counter,
            "Forward passes that failed for a batch and were rerun one sequence at a time.",
            v(&s.batch_fallbacks),
        ),
        (
            "tandem_step_rows_trimmed_total",
            Counter,
            "Prompt tokens moved to the next step so a step filled whole GEMM row tiles.",
            v(&s.step_rows_trimmed),
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
    speculative(&mut out, s);
    disk(&mut out, s);
    out
}

/// The prefix cache's disk tier.
fn disk(out: &mut String, s: &EngineStats) {
    use Kind::{Counter, Gauge};
    let d = &s.disk;
    let v = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64;
    let rows: [(&str, Kind, &str, f64); 10] = [
        ("tandem_disk_cache_enabled", Gauge, "1 while the prefix cache's disk tier is on.", v(&d.enabled)),
        ("tandem_disk_cache_entries", Gauge, "KV blocks and checkpoints on disk.", v(&d.entries)),
        ("tandem_disk_cache_bytes", Gauge, "Bytes of entries on disk.", v(&d.bytes)),
        ("tandem_disk_cache_hit_tokens_total", Counter, "Prompt tokens served from the disk tier.", v(&d.hit_tokens)),
        ("tandem_disk_cache_read_bytes_total", Counter, "Bytes read from the disk tier.", v(&d.read_bytes)),
        ("tandem_disk_cache_written_bytes_total", Counter, "Bytes written to the disk tier.", v(&d.written_bytes)),
        ("tandem_disk_cache_evictions_total", Counter, "Entries evicted to stay within the budget.", v(&d.evictions)),
        (
            "tandem_disk_cache_rejected_total",
            Counter,
            "Entries refused by a check (checksum, truncated, foreign, renamed) and deleted.",
            v(&d.rejected),
        ),
        (
            "tandem_disk_cache_dropped_writes_total",
            Counter,
            "Entries not written: the writer's queue was full.",
            v(&d.dropped_writes),
        ),
        ("tandem_disk_cache_writes_total", Counter, "Entries written.", v(&d.writes)),
    ];
    for (name, kind, help, value) in rows {
        metric(out, name, kind, help, value);
    }
}

/// Speculative decoding: drafted/accepted counters, acceptance rate, mean accepted length and
/// acceptance per draft position (a `position` label, 0 = the first draft).
fn speculative(out: &mut String, s: &EngineStats) {
    use Kind::{Counter, Gauge};
    let v = |a: &AtomicUsize| a.load(Ordering::Relaxed) as f64;
    metric(out, "tandem_spec_steps_total", Counter, "Verification steps that carried drafts.", v(&s.spec_steps));
    metric(out, "tandem_spec_drafted_tokens_total", Counter, "Tokens drafted for speculation.", v(&s.spec_drafted));
    metric(out, "tandem_spec_accepted_tokens_total", Counter, "Drafted tokens accepted.", v(&s.spec_accepted));
    metric(out, "tandem_spec_acceptance_rate", Gauge, "Accepted share of drafted tokens.", s.spec_acceptance_rate());
    metric(
        out,
        "tandem_spec_mean_accepted_length",
        Gauge,
        "Tokens per verification step (accepted drafts plus the model's own).",
        s.spec_mean_accepted_length(),
    );
    let name = "tandem_spec_position_acceptance_rate";
    out.push_str(&format!("# HELP {name} Share of drafts at each draft position that were accepted.\n"));
    out.push_str(&format!("# TYPE {name} gauge\n"));
    for (i, (d, a)) in s.spec_drafted_at.iter().zip(&s.spec_accepted_at).enumerate() {
        let d = v(d);
        if d > 0.0 {
            out.push_str(&format!("{name}{{position=\"{i}\"}} {}\n", v(a) / d));
        }
    }
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
        s.batch_fallbacks.store(1, Ordering::Relaxed);
        s.step_rows_trimmed.store(7, Ordering::Relaxed);
        s.spec_steps.store(4, Ordering::Relaxed);
        s.spec_drafted.store(10, Ordering::Relaxed);
        s.spec_accepted.store(6, Ordering::Relaxed);
        s.spec_drafted_at[0].store(4, Ordering::Relaxed);
        s.spec_accepted_at[0].store(3, Ordering::Relaxed);
        s.disk.hit_tokens.store(12, Ordering::Relaxed);
        s.disk.enabled.store(1, Ordering::Relaxed);
        s.kv_ring_bytes.store(4096, Ordering::Relaxed);
        s.kv_bytes_peak.store(8192, Ordering::Relaxed);
        let text = render(Some(&s));
        for line in [
            "tandem_spec_drafted_tokens_total 10",
            "tandem_spec_accepted_tokens_total 6",
            "tandem_spec_acceptance_rate 0.6",
            "tandem_spec_mean_accepted_length 2.5",
            "tandem_spec_position_acceptance_rate{position=\"0\"} 0.75",
            "tandem_requests_running 3",
            "tandem_kv_blocks_used 40",
            "tandem_kv_blocks_free 60",
            "tandem_prefix_hit_ratio 0.25",
            "tandem_preemptions_total 2",
            "# TYPE tandem_preemptions_total counter",
            "tandem_batch_fallbacks_total 1",
            "tandem_step_rows_trimmed_total 7",
            "tandem_disk_cache_hit_tokens_total 12",
            "tandem_disk_cache_enabled 1",
            "tandem_kv_ring_bytes 4096",
            "tandem_kv_live_bytes_peak 8192",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in\n{text}");
        }
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        // 29 engine and speculation samples, 10 of the disk tier.
        assert_eq!(samples.len(), 39);
        for l in &samples {
            let (name, value) = l.split_once(' ').unwrap();
            // One labelled family: acceptance per draft position.
            let name = name.strip_suffix("{position=\"0\"}").unwrap_or(name);
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{name}");
            value.parse::<f64>().unwrap();
            assert_eq!(text.matches(&format!("# TYPE {name} ")).count(), 1);
        }
        assert_eq!(render(None).lines().filter(|l| !l.starts_with('#')).count(), 1);
    }
}
