//! Running cells in child processes: `PROGRAM ARGS... <spec JSON>` prints one JSON line with
//! the [`CellMeasurement`] (or `{"error": ...}`) as the last line of its stdout.
//! `tandem bench cell` is such a program; so is the test helper binary of this crate.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Context};

use super::grid::CellSpec;
use super::results::CellMeasurement;
use super::runner::CellLauncher;

/// Spawns `program args... <spec-json>` per cell, and `program args... probe` for the baseline.
#[derive(Debug, Clone)]
pub struct ChildLauncher {
    pub program: PathBuf,
    pub args: Vec<String>,
    /// Extra environment for the child (e.g. `RAYON_NUM_THREADS`).
    pub env: Vec<(String, String)>,
}

impl ChildLauncher {
    fn call(&self, last_arg: &str) -> anyhow::Result<CellMeasurement> {
        let out = Command::new(&self.program)
            .args(&self.args)
            .arg(last_arg)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("cannot start {}", self.program.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().rev().find(|l| l.trim_start().starts_with('{'));
        let Some(line) = line else {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: String =
                stderr.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
            bail!("the cell process exited with {} and no result ({tail})", out.status);
        };
        parse_child_output(line)
    }
}

/// Parses the child's result line.
pub fn parse_child_output(line: &str) -> anyhow::Result<CellMeasurement> {
    let v: serde_json::Value = serde_json::from_str(line).context("the cell process printed invalid JSON")?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(anyhow!("{e}"));
    }
    serde_json::from_value(v).context("the cell process printed an unexpected result")
}

/// What a child prints for a result: the measurement, or `{"error": ...}`.
pub fn child_output(result: &anyhow::Result<CellMeasurement>) -> String {
    match result {
        Ok(m) => serde_json::to_string(m).unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }).to_string()),
        Err(e) => serde_json::json!({ "error": format!("{e:#}") }).to_string(),
    }
}

impl CellLauncher for ChildLauncher {
    fn probe(&mut self) -> anyhow::Result<u64> {
        Ok(self.call("probe")?.baseline_rss_bytes)
    }

    fn run(&mut self, spec: &CellSpec) -> anyhow::Result<CellMeasurement> {
        self.call(&serde_json::to_string(spec)?)
    }
}

/// The child side: runs `arg` (`probe` or a spec JSON) here and returns the line to print.
pub fn child_main(arg: &str) -> String {
    let result = if arg == "probe" {
        super::cell::run_probe()
    } else {
        serde_json::from_str::<CellSpec>(arg)
            .map_err(|e| anyhow!("invalid cell spec: {e}"))
            .and_then(|spec| super::cell::run_cell(&spec))
    };
    child_output(&result)
}
