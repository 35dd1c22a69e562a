//! `tandem bench sweep`: a matrix over weight precision × KV-cache precision × prefill chunk.
//!
//! Each cell runs in its own process (so its peak resident memory is its own), after a
//! memory estimate says it fits the budget; cells that cannot run (unsupported precision,
//! estimate over budget) are recorded as skipped with the reason, never attempted. Results go
//! to a JSON file after every cell, and a rerun skips the cells already done (resumable).

mod cell;
mod child;
mod estimate;
mod grid;
mod results;
mod runner;

pub use cell::{run_cell, run_probe, synthetic_prompt};
pub use child::{child_main, parse_child_output, ChildLauncher};
pub use estimate::{estimate, MemoryEstimate};
pub use grid::{grid, CellSpec, GridAxes, KV_PRECISIONS, WEIGHT_PRECISIONS};
pub use results::{CellMeasurement, CellOutcome, CellRecord, PromptRun, SweepResults};
pub use runner::{run_sweep, CellLauncher, SweepOptions};
