//! Where the host's time goes during `tandem bench`'s decode test: with the `pprof` feature and
//! `TANDEM_PPROF=FILE`, a sampling profiler (SIGPROF, 1 kHz) runs over the timed decode steps
//! and FILE gets the functions with the most samples, by self time (the innermost frame) and
//! by inclusive time (anywhere on the stack). Made for the GPU host-overhead work (issue 16),
//! where the device machine has no `perf`: build with `--features cuda,pprof`, strip only the
//! debug info (the symbol table names the functions).
//!
//! Without the feature, or without the variable, [`start`] returns `None` and nothing runs.

/// A running profile, written out by [`finish`].
pub struct HostProfile {
    #[cfg(feature = "pprof")]
    guard: pprof::ProfilerGuard<'static>,
    #[cfg(feature = "pprof")]
    path: std::path::PathBuf,
}

/// Starts sampling if this build has the profiler and `TANDEM_PPROF` names a file.
pub fn start() -> Option<HostProfile> {
    #[cfg(feature = "pprof")]
    {
        let path = std::env::var_os("TANDEM_PPROF")?;
        match pprof::ProfilerGuardBuilder::default().frequency(1000).build() {
            Ok(guard) => Some(HostProfile { guard, path: path.into() }),
            Err(e) => {
                eprintln!("TANDEM_PPROF: the profiler did not start: {e}");
                None
            }
        }
    }
    #[cfg(not(feature = "pprof"))]
    {
        if std::env::var_os("TANDEM_PPROF").is_some() {
            eprintln!("TANDEM_PPROF: this build has no profiler (build with --features pprof)");
        }
        None
    }
}

/// Stops sampling and writes the report (errors are printed, not returned: a failed profile
/// must not fail the benchmark).
pub fn finish(profile: Option<HostProfile>) {
    #[cfg(feature = "pprof")]
    if let Some(p) = profile {
        if let Err(e) = write_report(&p) {
            eprintln!("TANDEM_PPROF: could not write {}: {e}", p.path.display());
        }
    }
    #[cfg(not(feature = "pprof"))]
    let _ = profile;
}

#[cfg(feature = "pprof")]
fn write_report(p: &HostProfile) -> anyhow::Result<()> {
    use std::collections::{HashMap, HashSet};
    use std::fmt::Write;

    let report = p.guard.report().build()?;
    let mut total = 0isize;
    let mut self_time: HashMap<String, isize> = HashMap::new();
    let mut inclusive: HashMap<String, isize> = HashMap::new();
    let mut threads: HashMap<String, isize> = HashMap::new();
    for (frames, &count) in &report.data {
        total += count;
        *threads.entry(frames.thread_name_or_id()).or_default() += count;
        // frames[0] is the innermost frame; a frame holds its inlined functions, innermost first.
        let names: Vec<String> = frames.frames.iter().flat_map(|f| f.iter().map(|s| short(&s.name()))).collect();
        if let Some(leaf) = names.first() {
            *self_time.entry(leaf.clone()).or_default() += count;
        }
        let mut seen = HashSet::new();
        for n in names {
            if seen.insert(n.clone()) {
                *inclusive.entry(n).or_default() += count;
            }
        }
    }
    let mut out = String::new();
    writeln!(out, "# host profile: {total} samples at 1 kHz")?;
    let table = |out: &mut String, title: &str, map: &HashMap<String, isize>, n: usize| -> std::fmt::Result {
        let mut v: Vec<_> = map.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        writeln!(out, "\n## {title}\n")?;
        for (name, &c) in v.into_iter().take(n) {
            writeln!(out, "{:6.2}% {c:7} {name}", 100.0 * c as f64 / total.max(1) as f64)?;
        }
        Ok(())
    };
    table(&mut out, "threads", &threads, 20)?;
    table(&mut out, "self", &self_time, 60)?;
    table(&mut out, "inclusive", &inclusive, 150)?;
    std::fs::write(&p.path, out)?;
    Ok(())
}

/// A symbol without its hash suffix, cut to a readable length.
#[cfg(feature = "pprof")]
fn short(name: &str) -> String {
    let name = match name.rfind("::h") {
        Some(i) if name.len() - i == 19 => &name[..i],
        _ => name,
    };
    name.chars().take(160).collect()
}
