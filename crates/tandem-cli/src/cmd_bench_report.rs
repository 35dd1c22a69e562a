//! `tandem bench report`: redraws the Markdown and charts from raw JSON results, and merges
//! agent runs measured separately (e.g. one system per run) into one report and one chart.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use tandem_bench::report::{self, AgentReport};
use tandem_bench::sweep::SweepResults;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// agent.json files (merged: every system of every file) or one sweep.json.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output directory.
    #[arg(short = 'o', long)]
    pub out: PathBuf,
}

pub fn run(a: ReportArgs) -> anyhow::Result<()> {
    let mut merged: Option<AgentReport> = None;
    for p in &a.inputs {
        let text = std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
        if let Ok(r) = serde_json::from_str::<AgentReport>(&text) {
            match &mut merged {
                None => merged = Some(r),
                Some(m) => m.systems.extend(r.systems),
            }
        } else if let Ok(s) = serde_json::from_str::<SweepResults>(&text) {
            if a.inputs.len() > 1 {
                bail!("give one sweep results file at a time");
            }
            let files = report::write_sweep_report(&a.out, &s)?;
            println!("{}", report::sweep_markdown(&s));
            eprintln!("wrote {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
            return Ok(());
        } else {
            bail!("{} is neither an agent report nor sweep results", p.display());
        }
    }
    let r = merged.context("no input")?;
    let files = report::write_agent_report(&a.out, &r)?;
    println!("{}", report::agent_markdown(&r));
    eprintln!("wrote {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
    Ok(())
}
