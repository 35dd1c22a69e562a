//! The sweep loop: for each cell, resume, check support, estimate memory against the budget,
//! then launch it; the results file is rewritten after every cell.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use tandem_model::loader::ModelSummary;

use super::estimate::estimate;
use super::grid::CellSpec;
use super::results::{CellMeasurement, CellOutcome, CellRecord, SweepResults};
use crate::machine::MachineInfo;

/// Runs cells somewhere (child processes in practice, a recorder in tests).
pub trait CellLauncher {
    /// Resident memory of a cell process before it loads anything.
    fn probe(&mut self) -> anyhow::Result<u64>;
    fn run(&mut self, spec: &CellSpec) -> anyhow::Result<CellMeasurement>;
}

/// Sweep settings.
pub struct SweepOptions {
    pub results_path: PathBuf,
    /// Cells whose estimate times `headroom` exceeds this are skipped.
    pub budget_bytes: u64,
    /// Safety factor on the estimate for what it does not model (allocator retention,
    /// transient buffers of long chunked prefills); 1.0 trusts the estimate as is.
    pub headroom: f64,
    /// The model, described without loading it.
    pub summary: ModelSummary,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// Runs the cells not yet done in the results file and returns the updated results. Failed
/// and skipped cells are tried again; done cells are kept.
pub fn run_sweep(
    cells: &[CellSpec],
    opts: &SweepOptions,
    launcher: &mut dyn CellLauncher,
) -> anyhow::Result<SweepResults> {
    let mut results = SweepResults::load_or_default(&opts.results_path)?;
    results.model = opts.summary.path.clone();
    results.machine = MachineInfo::current();
    results.budget_bytes = opts.budget_bytes;
    let pb = if opts.progress { ProgressBar::new(cells.len() as u64) } else { ProgressBar::hidden() };
    if let Ok(style) = ProgressStyle::with_template("sweep [{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        pb.set_style(style.progress_chars("=> "));
    }
    let mut baseline: Option<u64> = None;
    for spec in cells {
        let id = spec.id();
        pb.set_message(id.clone());
        if matches!(results.get(&id).map(|r| &r.outcome), Some(CellOutcome::Done(_))) {
            pb.inc(1);
            continue;
        }
        let supported = spec.supported().and_then(|()| {
            // The quantised KV formats need head dimensions that are multiples of 32.
            spec.kv_dtype().check_head_dim(opts.summary.head_dim).map_err(|e| e.to_string())
        });
        let rec = match supported {
            Err(reason) => {
                CellRecord { id, spec: spec.clone(), estimate: None, outcome: CellOutcome::Skipped { reason } }
            }
            Ok(()) => {
                let base = match baseline {
                    Some(b) => b,
                    None => {
                        let b = launcher.probe().unwrap_or(0);
                        baseline = Some(b);
                        b
                    }
                };
                let est = estimate(&opts.summary, spec, base);
                let needed = est.total_bytes as f64 * opts.headroom.max(1.0);
                let outcome = if needed > opts.budget_bytes as f64 {
                    CellOutcome::Skipped {
                        reason: format!(
                            "estimated peak {:.1} MiB (x{:.2} headroom) exceeds the memory budget of {:.1} MiB",
                            est.total_bytes as f64 / 1048576.0,
                            opts.headroom.max(1.0),
                            opts.budget_bytes as f64 / 1048576.0
                        ),
                    }
                } else {
                    match launcher.run(spec) {
                        Ok(m) => CellOutcome::Done(m),
                        Err(e) => CellOutcome::Failed { error: format!("{e:#}") },
                    }
                };
                CellRecord { id, spec: spec.clone(), estimate: Some(est), outcome }
            }
        };
        results.put(rec);
        results.save(&opts.results_path)?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(results)
}
