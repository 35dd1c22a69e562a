//! The sweep's results file: one record per cell, with its estimate and outcome.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::estimate::MemoryEstimate;
use super::grid::CellSpec;
use crate::machine::MachineInfo;

/// TTFT, prefill and decode at one prompt length.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PromptRun {
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub ttft_s: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// Why this length was not measured (longer than the context).
    pub skipped: Option<String>,
}

/// What a cell's process measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CellMeasurement {
    /// Resident memory before loading the model.
    pub baseline_rss_bytes: u64,
    /// Peak resident memory of the cell's process (`VmHWM`).
    pub peak_rss_bytes: u64,
    pub load_s: f64,
    /// Perplexity of the shipped text, and the tokens scored.
    pub perplexity: Option<f64>,
    pub ppl_tokens: usize,
    pub runs: Vec<PromptRun>,
}

/// How a cell ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CellOutcome {
    Done(CellMeasurement),
    Skipped { reason: String },
    Failed { error: String },
}

/// One cell in the results file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    pub id: String,
    pub spec: CellSpec,
    pub estimate: Option<MemoryEstimate>,
    pub outcome: CellOutcome,
}

/// The whole results file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SweepResults {
    pub model: String,
    pub machine: MachineInfo,
    pub budget_bytes: u64,
    pub cells: Vec<CellRecord>,
}

impl SweepResults {
    /// Reads a results file; a missing file is an empty result.
    pub fn load_or_default(path: &Path) -> anyhow::Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(s) => {
                serde_json::from_str(&s).with_context(|| format!("{} is not a sweep results file", path.display()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    /// Writes the file atomically (temporary file + rename).
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_string_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
    }

    /// The record of a cell, if present.
    pub fn get(&self, id: &str) -> Option<&CellRecord> {
        self.cells.iter().find(|c| c.id == id)
    }

    /// Inserts or replaces a cell's record.
    pub fn put(&mut self, rec: CellRecord) {
        match self.cells.iter_mut().find(|c| c.id == rec.id) {
            Some(c) => *c = rec,
            None => self.cells.push(rec),
        }
    }
}
