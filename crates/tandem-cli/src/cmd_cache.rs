//! `tandem cache stats|ls|clear`: the prefix cache's disk tier as it lies on disk, one
//! namespace per model and cache format (see `tandem-engine`'s `cache/disk`).

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Args)]
pub struct CacheArgs {
    /// The disk tier's directory (default: $TANDEM_HOME/prefix-cache).
    #[arg(long, env = "TANDEM_CACHE_DIR", global = true)]
    pub cache_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: CacheCommand,
}

#[derive(Subcommand)]
pub enum CacheCommand {
    /// Entries, bytes and hits per namespace, and the totals.
    Stats {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The namespaces (fingerprint and model).
    Ls,
    /// Deletes every namespace, or the one given.
    Clear {
        /// A namespace (its 32 hex digits) to delete alone.
        #[arg(long)]
        namespace: Option<String>,
    },
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

pub fn run(a: CacheArgs) -> anyhow::Result<()> {
    let root = a.cache_dir.unwrap_or_else(|| tandem_model::catalogue::tandem_home().join("prefix-cache"));
    let spaces = tandem_engine::disk_cache_namespaces(&root);
    match a.cmd {
        CacheCommand::Stats { json } => {
            if json {
                println!("{}", serde_json::to_string_pretty(&spaces)?);
                return Ok(());
            }
            println!("disk cache: {}", root.display());
            println!("| namespace | model | blocks | checkpoints | size | hits |");
            println!("|---|---|---|---|---|---|");
            for s in &spaces {
                println!(
                    "| {} | {} | {} | {} | {} | {} |",
                    s.namespace,
                    s.model,
                    s.blocks,
                    s.checkpoints,
                    gib(s.bytes),
                    s.hits
                );
            }
            let (b, c, n, h) = spaces
                .iter()
                .fold((0, 0, 0, 0), |t, s| (t.0 + s.blocks, t.1 + s.checkpoints, t.2 + s.bytes, t.3 + s.hits));
            println!("total: {} namespaces, {b} blocks, {c} checkpoints, {}, {h} hits", spaces.len(), gib(n));
        }
        CacheCommand::Ls => {
            for s in &spaces {
                println!("{}  {}", s.namespace, s.model);
            }
        }
        CacheCommand::Clear { namespace } => {
            let mut removed = 0;
            for s in spaces.iter().filter(|s| namespace.as_ref().is_none_or(|n| *n == s.namespace)) {
                std::fs::remove_dir_all(root.join(&s.namespace))?;
                removed += 1;
            }
            if let (Some(n), 0) = (&namespace, removed) {
                anyhow::bail!("no namespace {n} under {}", root.display());
            }
            println!("removed {removed} namespace(s) from {}", root.display());
        }
    }
    Ok(())
}
