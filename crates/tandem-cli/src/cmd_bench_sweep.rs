//! `tandem bench sweep`: the weight × KV × prefill-chunk matrix (see `tandem_bench::sweep`),
//! each cell in a child `tandem bench cell` process; and `tandem bench cell`, that child.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tandem_bench::sweep::{self, CellSpec, ChildLauncher, GridAxes, SweepOptions};
use tandem_engine::MemoryBudget;

use crate::args::ModelArgs;

#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Weight precisions: native (the checkpoint's own), f16, bf16, q8_0, q4_0, q2_k. Those
    /// tandem cannot load yet are recorded as skipped with the reason.
    #[arg(long, value_delimiter = ',', default_value = "native,f16,q8_0,q4_0,q2_k")]
    pub weights: Vec<String>,
    /// KV-cache precisions: f32, f16, q8_0, q4_0 (q8_0 and q4_0 need head dimensions that
    /// are multiples of 32).
    #[arg(long, value_delimiter = ',', default_value = "f32,f16,q8_0,q4_0")]
    pub kv: Vec<String>,
    /// Prefill chunk sizes.
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    pub chunks: Vec<usize>,
    /// Prompt lengths for TTFT, prefill and decode speed.
    #[arg(long, value_delimiter = ',', default_value = "512,4096")]
    pub prompts: Vec<usize>,
    /// Tokens decoded after each prompt.
    #[arg(long, default_value_t = 64)]
    pub gen: usize,
    /// Tokens of the shipped text scored for perplexity (0 = skip).
    #[arg(long, default_value_t = 1024)]
    pub ppl_tokens: usize,
    /// Tokens per perplexity forward pass.
    #[arg(long, default_value_t = 64)]
    pub ppl_window: usize,
    /// Memory a cell may use (8GiB, 512MiB, 0.5 = half of RAM); default 90% of the memory
    /// available now. Cells whose estimate is larger are skipped.
    #[arg(long)]
    pub memory_budget: Option<MemoryBudget>,
    /// Safety factor on the memory estimate before comparing it with the budget.
    #[arg(long, default_value_t = 1.5)]
    pub headroom: f64,
    /// Output directory: sweep.json (results, resumable), sweep.md, charts.
    #[arg(short = 'o', long, default_value = "bench-results/sweep")]
    pub out: PathBuf,
    /// Start over instead of resuming from the results file.
    #[arg(long)]
    pub fresh: bool,
}

/// The hidden child command: one cell (spec JSON) or `probe`.
#[derive(Args, Debug)]
pub struct CellArgs {
    /// `probe`, or a cell spec as JSON.
    pub spec: String,
}

pub fn run(a: SweepArgs) -> anyhow::Result<()> {
    let path = a.model.resolve()?;
    let summary = tandem_model::loader::summarize(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let budget = match &a.memory_budget {
        Some(b) => b.bytes()?,
        None => tandem_bench::machine::mem_available_bytes().map(|b| b / 10 * 9).unwrap_or(4 << 30),
    };
    let template = CellSpec {
        model: path.display().to_string(),
        weights: "native".into(),
        kv: "f32".into(),
        prefill_chunk: 512,
        prompt_lens: a.prompts.clone(),
        gen_tokens: a.gen,
        ppl_tokens: a.ppl_tokens,
        ppl_window: a.ppl_window,
        threads: a.model.threads,
        kv_block_size: 16,
    };
    let cells =
        sweep::grid(&GridAxes { weights: a.weights.clone(), kv: a.kv.clone(), chunks: a.chunks.clone() }, &template);
    let results_path = a.out.join("sweep.json");
    if a.fresh && results_path.exists() {
        std::fs::remove_file(&results_path).with_context(|| format!("cannot remove {}", results_path.display()))?;
    }
    let mut env = Vec::new();
    if a.model.threads > 0 {
        env.push(("RAYON_NUM_THREADS".to_string(), a.model.threads.to_string()));
    }
    let mut launcher = ChildLauncher {
        program: std::env::current_exe().context("cannot find the tandem executable")?,
        args: vec!["bench".into(), "cell".into()],
        env,
    };
    let opts = SweepOptions {
        results_path: results_path.clone(),
        budget_bytes: budget,
        headroom: a.headroom,
        summary,
        progress: true,
    };
    let results = sweep::run_sweep(&cells, &opts, &mut launcher)?;
    let files = tandem_bench::report::write_sweep_report(&a.out, &results)?;
    println!("{}", tandem_bench::report::sweep_markdown(&results));
    eprintln!(
        "wrote {} and {}",
        results_path.display(),
        files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

pub fn run_cell(a: CellArgs) -> anyhow::Result<()> {
    if let Ok(spec) = serde_json::from_str::<CellSpec>(&a.spec) {
        crate::args::set_threads(spec.threads);
    }
    println!("{}", sweep::child_main(&a.spec));
    Ok(())
}
