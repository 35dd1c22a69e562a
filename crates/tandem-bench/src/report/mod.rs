//! Reports: every run writes its raw JSON, a Markdown summary and PNG + SVG charts into one
//! directory. Agent runs with several systems put all of them on the same charts.

pub mod chart;
mod markdown;

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

pub use markdown::{agent_markdown, sweep_markdown};

use crate::agent::SystemResult;
use crate::machine::MachineInfo;
use crate::sweep::{CellOutcome, SweepResults};
use crate::workload::WorkloadConfig;
use chart::{BarChart, LineChart};

/// The raw result of `tandem bench agent`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentReport {
    /// Seconds since the Unix epoch when the run started.
    pub created_unix: u64,
    pub machine: MachineInfo,
    pub workload: Option<WorkloadConfig>,
    /// What counted the workload's tokens, and whether that is the model's tokenizer.
    pub counter: String,
    pub exact_counts: bool,
    pub shared_prefix_tokens: usize,
    pub systems: Vec<SystemResult>,
}

fn write(path: &Path, text: &str) -> anyhow::Result<PathBuf> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path.to_path_buf())
}

/// Writes `agent.json`, `agent.md`, `agent_ttft_per_turn.{png,svg}` and
/// `agent_decode_per_turn.{png,svg}` into `dir`; returns the files written.
pub fn write_agent_report(dir: &Path, r: &AgentReport) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut files = vec![
        write(&dir.join("agent.json"), &serde_json::to_string_pretty(r)?)?,
        write(&dir.join("agent.md"), &agent_markdown(r))?,
    ];
    let series = |f: &dyn Fn(&crate::agent::TurnResult) -> Option<f64>| {
        r.systems
            .iter()
            .map(|s| (s.label.clone(), s.per_turn_mean(f).into_iter().map(|(t, v)| (t as f64, v)).collect()))
            .collect::<Vec<_>>()
    };
    files.extend(chart::line_chart(
        &dir.join("agent_ttft_per_turn"),
        &LineChart {
            title: "Time to first token per turn (mean over sessions)",
            x_label: "turn",
            y_label: "TTFT (ms)",
            series: series(&|t| t.ttft_s.map(|s| s * 1e3)),
        },
    )?);
    files.extend(chart::line_chart(
        &dir.join("agent_decode_per_turn"),
        &LineChart {
            title: "Decode speed per turn (mean over sessions)",
            x_label: "turn",
            y_label: "decode tok/s",
            series: series(&|t| t.decode_tok_s),
        },
    )?);
    Ok(files)
}

/// Writes `sweep.md`, `sweep_memory.{png,svg}` and `sweep_decode.{png,svg}` into `dir` (the
/// JSON is the results file the sweep keeps); returns the files written.
pub fn write_sweep_report(dir: &Path, r: &SweepResults) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut files = vec![write(&dir.join("sweep.md"), &sweep_markdown(r))?];
    let mib = |b: u64| b as f64 / 1048576.0;
    let done: Vec<_> = r
        .cells
        .iter()
        .filter_map(|c| match &c.outcome {
            CellOutcome::Done(m) => Some((c, m)),
            _ => None,
        })
        .collect();
    let short = |c: &crate::sweep::CellRecord| format!("{}/{}/{}", c.spec.weights, c.spec.kv, c.spec.prefill_chunk);
    files.extend(chart::bar_chart(
        &dir.join("sweep_memory"),
        &BarChart {
            title: "Peak memory per sweep cell (weights/KV/chunk)",
            y_label: "MiB",
            bar_name: "measured peak RSS",
            marker_name: "estimate",
            bars: done
                .iter()
                .map(|(c, m)| (short(c), mib(m.peak_rss_bytes), c.estimate.map(|e| mib(e.total_bytes))))
                .collect(),
        },
    )?);
    // Decode speed at the longest measured prompt of each cell.
    files.extend(chart::bar_chart(
        &dir.join("sweep_decode"),
        &BarChart {
            title: "Decode tok/s per sweep cell, at the longest prompt",
            y_label: "tok/s",
            bar_name: "decode tok/s",
            marker_name: "",
            bars: done
                .iter()
                .map(|(c, m)| {
                    let v = m.runs.iter().rev().find(|p| p.skipped.is_none()).map_or(0.0, |p| p.decode_tok_s);
                    (short(c), v, None)
                })
                .collect(),
        },
    )?);
    Ok(files)
}
