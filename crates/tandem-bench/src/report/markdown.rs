//! Markdown tables of agent and sweep results.

use std::fmt::Write;

use super::AgentReport;
use crate::stats::Summary;
use crate::sweep::{CellOutcome, SweepResults};

fn f(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "–".into(),
    }
}

fn pick(s: &Option<Summary>, g: fn(&Summary) -> f64) -> Option<f64> {
    s.as_ref().map(g)
}

/// The agent report as Markdown: workload, an overall table, and a per-turn table.
pub fn agent_markdown(r: &AgentReport) -> String {
    let mut s = String::from("# Agent-session benchmark\n\n");
    let _ = writeln!(s, "Machine: {}.\n", r.machine.describe());
    if let Some(w) = &r.workload {
        let mode = if w.single_turn { "single-turn" } else { "multi-turn" };
        let _ = writeln!(
            s,
            "Workload ({mode}, seed {}): {} session(s), shared prefix {} tokens, session context {} tokens, \
             {}–{} turns, tool results {}–{} tokens, {} generated tokens per turn, think time {} ms. \
             Token counts: {}{}.\n",
            w.seed,
            w.sessions,
            r.shared_prefix_tokens,
            w.session_context_tokens,
            w.turns_min,
            w.turns_max,
            w.tool_result_tokens_min,
            w.tool_result_tokens_max,
            w.max_tokens,
            w.think_time_ms,
            r.counter,
            if r.exact_counts { "" } else { " (approximate)" }
        );
    }
    s.push_str("## Overall\n\n");
    s.push_str(
        "| system | requests | errors | TTFT p50 / p90 / p99 (ms) | TPOT p50 (ms) | ITL p50 / p90 / p99 (ms) \
         | decode tok/s (mean) | e2e p50 (s) | session wall (s, mean) | cached / prompt tokens | output tok/s |\n",
    );
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for sys in &r.systems {
        let o = &sys.overall;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} / {} / {} | {} | {} / {} / {} | {} | {} | {} | {} / {} | {} |",
            sys.label,
            o.requests,
            o.errors,
            f(pick(&o.ttft_ms, |x| x.p50), 0),
            f(pick(&o.ttft_ms, |x| x.p90), 0),
            f(pick(&o.ttft_ms, |x| x.p99), 0),
            f(pick(&o.tpot_ms, |x| x.p50), 1),
            f(pick(&o.itl_ms, |x| x.p50), 1),
            f(pick(&o.itl_ms, |x| x.p90), 1),
            f(pick(&o.itl_ms, |x| x.p99), 1),
            f(pick(&o.decode_tok_s, |x| x.mean), 1),
            f(pick(&o.e2e_ms, |x| x.p50 / 1e3), 2),
            f(pick(&o.session_wall_s, |x| x.mean), 1),
            o.cached_tokens,
            o.prompt_tokens,
            f(Some(o.output_tok_per_s), 1),
        );
    }
    s.push_str("\n## Per turn (mean over sessions)\n\n");
    s.push_str(
        "| system | turn | history tokens | prompt tokens | cached tokens | TTFT (ms) | decode tok/s \
         | ITL p50 / p99 (ms) | e2e (s) |\n",
    );
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for sys in &r.systems {
        let max_turn = sys.turns.iter().map(|t| t.turn).max().unwrap_or(0);
        for n in 1..=max_turn {
            let ts: Vec<_> = sys.turns.iter().filter(|t| t.turn == n && t.error.is_none()).collect();
            if ts.is_empty() {
                continue;
            }
            let mean = |g: &dyn Fn(&crate::agent::TurnResult) -> Option<f64>| {
                crate::stats::mean(&ts.iter().filter_map(|t| g(t)).collect::<Vec<_>>())
            };
            let _ = writeln!(
                s,
                "| {} | {n} | {} | {} | {} | {} | {} | {} / {} | {} |",
                sys.label,
                f(mean(&|t| Some(t.history_tokens as f64)), 0),
                f(mean(&|t| t.prompt_tokens.map(|v| v as f64)), 0),
                f(mean(&|t| t.cached_tokens.map(|v| v as f64)), 0),
                f(mean(&|t| t.ttft_s.map(|v| v * 1e3)), 0),
                f(mean(&|t| t.decode_tok_s), 1),
                f(mean(&|t| t.itl_s.map(|v| v.p50 * 1e3)), 1),
                f(mean(&|t| t.itl_s.map(|v| v.p99 * 1e3)), 1),
                f(mean(&|t| Some(t.e2e_s)), 2),
            );
        }
    }
    let errors: Vec<_> =
        r.systems.iter().flat_map(|s| s.turns.iter().map(move |t| (s, t))).filter(|(_, t)| t.error.is_some()).collect();
    if !errors.is_empty() {
        s.push_str("\n## Errors\n\n");
        for (sys, t) in errors {
            let _ = writeln!(
                s,
                "- {} session {} turn {}: {}",
                sys.label,
                t.session,
                t.turn,
                t.error.as_deref().unwrap_or("")
            );
        }
    }
    s
}

/// The sweep as Markdown: one row per cell, with its outcome or the reason it was skipped.
pub fn sweep_markdown(r: &SweepResults) -> String {
    let mut s = String::from("# Sweep\n\n");
    let _ = writeln!(
        s,
        "Model: `{}`. Machine: {}. Memory budget: {:.0} MiB.\n",
        r.model,
        r.machine.describe(),
        r.budget_bytes as f64 / 1048576.0
    );
    let mut lens: Vec<usize> = r.cells.iter().flat_map(|c| c.spec.prompt_lens.iter().copied()).collect();
    lens.sort_unstable();
    lens.dedup();
    s.push_str("| weights | KV | chunk | status | estimate (MiB) | peak (MiB) | load (s) | perplexity |");
    for n in &lens {
        let _ = write!(s, " TTFT@{n} (ms) | prefill@{n} tok/s | decode@{n} tok/s |");
    }
    s.push_str("\n|---|---|---:|---|---:|---:|---:|---:|");
    s.push_str(&"---:|---:|---:|".repeat(lens.len()));
    s.push('\n');
    let mib = |b: u64| format!("{:.1}", b as f64 / 1048576.0);
    let mut notes = Vec::new();
    for c in &r.cells {
        let est = c.estimate.map(|e| mib(e.total_bytes)).unwrap_or_else(|| "–".into());
        let _ = write!(s, "| {} | {} | {} |", c.spec.weights, c.spec.kv, c.spec.prefill_chunk);
        match &c.outcome {
            CellOutcome::Done(m) => {
                let _ =
                    write!(s, " done | {est} | {} | {:.2} | {} |", mib(m.peak_rss_bytes), m.load_s, f(m.perplexity, 2));
                for n in &lens {
                    match m.runs.iter().find(|p| p.prompt_tokens == *n && p.skipped.is_none()) {
                        Some(p) => {
                            let _ =
                                write!(s, " {:.0} | {:.1} | {:.1} |", p.ttft_s * 1e3, p.prefill_tok_s, p.decode_tok_s);
                        }
                        None => s.push_str(" – | – | – |"),
                    }
                }
            }
            CellOutcome::Skipped { reason } => {
                notes.push(format!("{}: skipped: {reason}", c.id));
                let _ = write!(s, " skipped | {est} | – | – | – |");
                s.push_str(&" – | – | – |".repeat(lens.len()));
            }
            CellOutcome::Failed { error } => {
                notes.push(format!("{}: failed: {error}", c.id));
                let _ = write!(s, " failed | {est} | – | – | – |");
                s.push_str(&" – | – | – |".repeat(lens.len()));
            }
        }
        s.push('\n');
    }
    if !notes.is_empty() {
        s.push_str("\nNotes:\n\n");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}
