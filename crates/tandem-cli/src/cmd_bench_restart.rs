//! `tandem bench restart`: what the prefix cache's disk tier saves across a restart. A cold
//! request with a long shared prefix (its prefill writes the tier), a restart (a new engine on
//! the same cache directory), then the first request carrying that prefix plus a new suffix:
//! its TTFT against the cold one, the tokens and bytes read back from disk, and for reference
//! the same request again from memory.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use tandem_engine::{DiskCacheConfig, EngineConfig, EngineHandle, GenerateRequest, GenerationEvent, StopParams, Usage};

use crate::args::ModelArgs;

#[derive(Args, Debug, Clone)]
pub struct RestartBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Shared prefix length in tokens.
    #[arg(short = 'p', long, default_value_t = 8192)]
    pub prefix_tokens: usize,
    /// New tokens after the prefix in the request after the restart.
    #[arg(long, default_value_t = 64)]
    pub suffix_tokens: usize,
    /// Cache directory (default: a fresh temporary one, removed afterwards).
    #[arg(long)]
    pub cache_dir: Option<std::path::PathBuf>,
}

fn ttft(e: &EngineHandle, prompt: Vec<u32>) -> anyhow::Result<(f64, Usage)> {
    let req = GenerateRequest {
        prompt_ids: prompt,
        stop: StopParams { max_tokens: 1, ignore_eos: true, ..Default::default() },
        ..Default::default()
    };
    let t = Instant::now();
    let mut rx = e.submit(req).context("submit")?;
    let mut first = None;
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Token { .. } => {
                first.get_or_insert(t.elapsed().as_secs_f64());
            }
            GenerationEvent::Finished { usage, .. } => return Ok((first.unwrap_or(t.elapsed().as_secs_f64()), usage)),
            GenerationEvent::Error(err) => bail!("generation failed: {err}"),
        }
    }
    bail!("the engine stopped")
}

fn settle(e: &EngineHandle) {
    let t = Instant::now();
    while e.stats().disk.pending.load(Ordering::Relaxed) > 0 && t.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn run(a: RestartBenchArgs) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = a.cache_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let cfg = || EngineConfig {
        context_length: a.prefix_tokens + a.suffix_tokens + 16,
        disk_cache: Some(DiskCacheConfig { dir: dir.clone(), budget: 16 << 30 }),
        ..Default::default()
    };
    let start = || -> anyhow::Result<EngineHandle> { a.model.start_engine(cfg()) };
    let e = start()?;
    let vocab = e.info().vocab_size as u32;
    let toks = |n: usize, salt: u32| -> Vec<u32> {
        (0..n as u32).map(|i| 100 + (i * 7919 + 13 + salt) % (vocab - 200)).collect()
    };
    let prefix = toks(a.prefix_tokens, 0);
    let (cold, _) = ttft(&e, prefix.clone())?;
    let t = Instant::now();
    settle(&e);
    let written = e.stats().disk.written_bytes.load(Ordering::Relaxed);
    let write_wait = t.elapsed().as_secs_f64();
    drop(e);
    let t = Instant::now();
    let e = start()?;
    let restart_s = t.elapsed().as_secs_f64();
    let prompt = [prefix.clone(), toks(a.suffix_tokens, 1)].concat();
    let (warm, usage) = ttft(&e, prompt.clone())?;
    let read = e.stats().disk.read_bytes.load(Ordering::Relaxed);
    let read_s = e.stats().disk.read_ns.load(Ordering::Relaxed) as f64 * 1e-9;
    let (mem, mem_usage) = ttft(&e, [prefix, toks(a.suffix_tokens, 2)].concat())?;
    println!("| request | TTFT (s) | vs cold | cached tokens | from disk | read |");
    println!("|---|---|---|---|---|---|");
    println!("| cold, {} tokens | {cold:.3} | 1.00 | 0 | 0 | |", a.prefix_tokens);
    println!(
        "| after restart, {} + {} | {warm:.3} | {:.3} | {} | {} | {:.1} MiB in {read_s:.3} s ({:.2} GB/s) |",
        a.prefix_tokens,
        a.suffix_tokens,
        warm / cold,
        usage.cached_tokens,
        usage.disk_cached_tokens,
        read as f64 / (1u64 << 20) as f64,
        read as f64 / read_s.max(1e-9) / 1e9
    );
    println!(
        "| memory hit, {} + {} | {mem:.3} | {:.3} | {} | {} | |",
        a.prefix_tokens,
        a.suffix_tokens,
        mem / cold,
        mem_usage.cached_tokens,
        mem_usage.disk_cached_tokens
    );
    println!("written behind: {:.1} MiB (writer done {write_wait:.2} s after the cold request); restart (load + index) {restart_s:.2} s", written as f64 / (1u64 << 20) as f64);
    Ok(())
}
