//! `tandem check-device`: every op on the selected device (`--device`) against the CPU
//! reference over several shapes and formats, then the fixture models end to end; prints a
//! table and exits non-zero on any failed check (see `tandem_model::conformance`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tandem_model::conformance;

#[derive(Args, Debug)]
pub struct CheckDeviceArgs {
    /// The fixture models' folder (the repository's `fixtures/`); without it only ops run.
    #[arg(long)]
    pub fixtures: Option<PathBuf>,
    /// Skip the fixture models even when `fixtures/` is found.
    #[arg(long)]
    pub ops_only: bool,
    /// Also write the table (Markdown) to this file.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Run only the check groups whose name contains one of these (comma-separated; e.g.
    /// `paged_attention`, `quantised`, `attn`, `models`; the groups: `tandem_model::conformance::GROUPS`).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

pub fn run(a: CheckDeviceArgs) -> anyhow::Result<()> {
    let dev = tandem_model::device::default_device()?;
    let fixtures = if a.ops_only {
        None
    } else {
        a.fixtures.clone().or_else(|| {
            let here = PathBuf::from("fixtures");
            here.join("tiny").exists().then_some(here)
        })
    };
    eprintln!(
        "checking {} against the CPU references{}",
        tandem_model::device::name(&dev),
        match &fixtures {
            Some(p) => format!(" (models from {})", p.display()),
            None => " (ops only; --fixtures DIR adds the models)".into(),
        }
    );
    if let Some(bad) = a.only.iter().find(|o| !conformance::GROUPS.iter().any(|g| g.contains(o.as_str()))) {
        anyhow::bail!("--only {bad}: no check group by that name (groups: {})", conformance::GROUPS.join(", "));
    }
    let checks = conformance::run_selected(&dev, fixtures.as_deref(), &a.only);
    let table = conformance::table(&checks);
    println!("{table}");
    let failed = checks.iter().filter(|c| !c.pass).count();
    let summary = format!("{} passed, {failed} failed", checks.len() - failed);
    println!("{summary}");
    // Which form of tandem's kernels ran (the build's SASS or the driver's JIT of the PTX).
    let kernels = tandem_model::device::kernel_forms().map(|k| format!("kernel modules: {k}\n")).unwrap_or_default();
    eprint!("{kernels}");
    if let Some(p) = &a.output {
        std::fs::write(p, format!("device: {}\n{kernels}\n{table}\n{summary}\n", tandem_model::device::name(&dev)))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed on {}", tandem_model::device::name(&dev));
    }
    Ok(())
}
