//! `tandem pull`: fetch catalogue models.

use clap::Args;
use tandem_model::catalogue;

#[derive(Args, Debug)]
pub struct PullArgs {
    /// Catalogue alias (e.g. smollm2-135m).
    #[arg(required_unless_present = "list")]
    pub alias: Option<String>,
    /// List the catalogue and what is already downloaded.
    #[arg(long)]
    pub list: bool,
}

pub fn run(a: PullArgs) -> anyhow::Result<()> {
    if a.list {
        for e in catalogue::catalogue() {
            let path = catalogue::model_path(e);
            let state = if path.is_file() { "downloaded" } else { "-" };
            println!("{:<22} {:>8.0} MB  {:<11} {}", e.alias, e.size_bytes as f64 / 1e6, state, e.description);
        }
        return Ok(());
    }
    let alias = a.alias.unwrap_or_default();
    let entry = catalogue::lookup(&alias)
        .ok_or_else(|| anyhow::anyhow!("unknown alias `{alias}`; known: {}", catalogue::aliases()))?;
    let reporter = crate::progress::pull_reporter();
    let path = catalogue::pull(entry, &reporter)?;
    println!("{}", path.display());
    Ok(())
}
