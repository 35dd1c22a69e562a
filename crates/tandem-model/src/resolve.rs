//! Turns the model argument a user typed into a file or directory to load.
//!
//! Accepted, in this order: a path to a `.gguf` file; a directory with `config.json` (Hugging
//! Face layout); a directory holding exactly one `.gguf`; a catalogue alias (pulled when
//! missing if asked to); a Hugging Face repo id `org/name` found in the local HF cache
//! (`$HF_HUB_CACHE`, `$HF_HOME/hub` or `~/.cache/huggingface/hub`) as
//! `models--org--name/snapshots/<rev>/`, using `refs/main` when present, else the newest
//! snapshot. Nothing here reaches the network except [`pull`] for aliases.

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::catalogue::{aliases, lookup, models_dir, pull, CatalogueEntry, PullProgress};
use crate::error::{ModelError, Result};

/// Where a model's weights are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A single GGUF file (weights, tokenizer and chat template inside).
    Gguf(PathBuf),
    /// A Hugging Face model directory (`config.json`, `*.safetensors`, `tokenizer.json`).
    HfDir(PathBuf),
}

impl ModelSource {
    /// The file or directory.
    pub fn path(&self) -> &Path {
        match self {
            ModelSource::Gguf(p) | ModelSource::HfDir(p) => p,
        }
    }
}

/// Resolves `arg` (see the module docs). With `auto_pull`, a catalogue alias that is not yet
/// downloaded is pulled (reporting through `progress`); without it that is a `NotFound` that
/// says to run `tandem pull <alias>`.
pub fn resolve(arg: &str, auto_pull: bool, progress: &dyn Fn(PullProgress)) -> Result<ModelSource> {
    let roots = Roots { models: models_dir(), hf_hub: hf_hub_root(|k| std::env::var_os(k)) };
    resolve_with(arg, &roots, auto_pull, &|e| pull(e, progress))
}

/// The directories resolution looks in (explicit, so tests need not touch the environment).
pub(crate) struct Roots {
    /// `$TANDEM_HOME/models`.
    pub models: PathBuf,
    /// The Hugging Face hub cache, if one is known.
    pub hf_hub: Option<PathBuf>,
}

/// The Hugging Face hub cache directory as `huggingface_hub` computes it, from `env`.
pub(crate) fn hf_hub_root(env: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let var = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = var("HF_HUB_CACHE") {
        return Some(p);
    }
    if let Some(p) = var("HF_HOME") {
        return Some(p.join("hub"));
    }
    if let Some(p) = var("XDG_CACHE_HOME") {
        return Some(p.join("huggingface").join("hub"));
    }
    var("HOME").or_else(|| var("USERPROFILE")).map(|h| h.join(".cache").join("huggingface").join("hub"))
}

/// [`resolve`] against explicit roots, pulling aliases with `pull_alias`.
pub(crate) fn resolve_with(
    arg: &str,
    roots: &Roots,
    auto_pull: bool,
    pull_alias: &dyn Fn(&'static CatalogueEntry) -> Result<PathBuf>,
) -> Result<ModelSource> {
    let arg = arg.trim();
    if arg.is_empty() {
        return Err(ModelError::Input(
            "no model given: pass a .gguf file, a model directory, \
             a Hugging Face repo id or a catalogue alias"
                .into(),
        ));
    }
    let path = expand_tilde(arg);
    if path.exists() {
        return from_path(&path);
    }
    if let Some(entry) = lookup(arg) {
        let file = roots.models.join(entry.file_name);
        if auto_pull {
            return pull_alias(entry).map(ModelSource::Gguf);
        }
        if file.is_file() {
            return Ok(ModelSource::Gguf(file));
        }
        return Err(ModelError::NotFound(format!(
            "model `{}` is not downloaded yet (expected at {}): run `tandem pull {}`",
            entry.alias,
            file.display(),
            entry.alias
        )));
    }
    if looks_like_repo_id(arg) {
        return from_hf_cache(arg, roots.hf_hub.as_deref());
    }
    Err(ModelError::NotFound(format!(
        "`{arg}` is not a file, a directory, a cached Hugging Face repo (org/name) or a catalogue \
         alias; known aliases: {} (fetch one with `tandem pull <alias>`)",
        aliases()
    )))
}

/// `~/x` -> `$HOME/x`; anything else unchanged.
fn expand_tilde(arg: &str) -> PathBuf {
    match arg.strip_prefix("~/") {
        Some(rest) => match crate::catalogue::home_dir() {
            Some(home) => home.join(rest),
            None => PathBuf::from(arg),
        },
        None => PathBuf::from(arg),
    }
}

/// `org/name` with plain characters (not a relative path like `./x` or `a/b/c`).
fn looks_like_repo_id(arg: &str) -> bool {
    let ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(arg.split_once('/'), Some((org, name)) if ok(org) && ok(name))
}

/// An existing file or directory.
fn from_path(path: &Path) -> Result<ModelSource> {
    if path.is_dir() {
        return from_dir(path, true);
    }
    if is_gguf_file(path) {
        return Ok(ModelSource::Gguf(path.to_path_buf()));
    }
    if path.file_name().is_some_and(|n| n == "config.json") {
        if let Some(dir) = path.parent() {
            return Ok(ModelSource::HfDir(if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir.to_path_buf()
            }));
        }
    }
    Err(ModelError::Input(format!(
        "{} is not a GGUF file (no .gguf extension and no GGUF magic); pass a .gguf file or a \
         model directory",
        path.display()
    )))
}

/// A `.gguf` by extension, or any file that starts with the GGUF magic.
fn is_gguf_file(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return true;
    }
    let mut magic = [0u8; 4];
    fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

/// A directory: HF layout, a HF cache repo (`snapshots/`), or exactly one `.gguf`.
fn from_dir(dir: &Path, allow_snapshots: bool) -> Result<ModelSource> {
    if dir.join("config.json").is_file() {
        return Ok(ModelSource::HfDir(dir.to_path_buf()));
    }
    if allow_snapshots && dir.join("snapshots").is_dir() {
        let snap = pick_snapshot(dir)?;
        return from_dir(&snap, false);
    }
    let entries = fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut ggufs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
        .collect();
    ggufs.sort();
    match ggufs.len() {
        1 => Ok(ModelSource::Gguf(ggufs.remove(0))),
        0 => Err(ModelError::NotFound(format!(
            "{} has no config.json and no .gguf file: pass a .gguf file or a Hugging Face model \
             directory",
            dir.display()
        ))),
        _ => Err(ModelError::Input(format!(
            "{} holds {} .gguf files; pass one of them: {}",
            dir.display(),
            ggufs.len(),
            ggufs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The snapshot of a HF cache repo dir: the one `refs/main` names, else the newest.
fn pick_snapshot(repo: &Path) -> Result<PathBuf> {
    let snapshots = repo.join("snapshots");
    if let Ok(rev) = fs::read_to_string(repo.join("refs").join("main")) {
        let rev = rev.trim();
        let dir = snapshots.join(rev);
        if !rev.is_empty() && !rev.contains(['/', '\\']) && dir.is_dir() {
            return Ok(dir);
        }
    }
    let entries = fs::read_dir(&snapshots).map_err(|e| ModelError::io(&snapshots, e))?;
    entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| {
            let mtime = e.metadata().and_then(|m| m.modified()).ok();
            (mtime, e.path())
        })
        .max()
        .map(|(_, p)| p)
        .ok_or_else(|| ModelError::NotFound(format!("{} has no snapshot", snapshots.display())))
}

/// `org/name` in the HF hub cache.
fn from_hf_cache(repo_id: &str, hub: Option<&Path>) -> Result<ModelSource> {
    let Some(hub) = hub else {
        return Err(ModelError::NotFound(format!(
            "`{repo_id}` looks like a Hugging Face repo id, but no Hugging Face cache is known \
             (set HF_HOME); or pass a local path"
        )));
    };
    let repo = hub.join(format!("models--{}", repo_id.replace('/', "--")));
    if !repo.is_dir() {
        return Err(ModelError::NotFound(format!(
            "`{repo_id}` is not in the Hugging Face cache at {} and cannot be downloaded from \
             here: copy the model there (or pass a local path), or use a catalogue alias: {}",
            hub.display(),
            aliases()
        )));
    }
    from_dir(&pick_snapshot(&repo)?, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn touch(path: &Path, data: &[u8]) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, data).unwrap();
    }

    fn roots(tmp: &Path) -> Roots {
        Roots { models: tmp.join("models"), hf_hub: Some(tmp.join("hf").join("hub")) }
    }

    fn no_pull(_: &'static CatalogueEntry) -> Result<PathBuf> {
        panic!("must not pull")
    }

    fn res(arg: &Path, r: &Roots) -> Result<ModelSource> {
        resolve_with(arg.to_str().unwrap(), r, false, &no_pull)
    }

    #[test]
    fn files_and_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let r = roots(t);
        let g = t.join("a").join("model.GGUF");
        touch(&g, b"xx");
        assert_eq!(res(&g, &r).unwrap(), ModelSource::Gguf(g.clone()));
        // The directory holding exactly one .gguf.
        assert_eq!(res(&t.join("a"), &r).unwrap(), ModelSource::Gguf(g.clone()));
        // Two .gguf: an error naming both.
        touch(&t.join("a").join("other.gguf"), b"yy");
        let err = res(&t.join("a"), &r).unwrap_err().to_string();
        assert!(err.contains("model.GGUF") && err.contains("other.gguf"), "{err}");
        // A file without the extension but with the magic.
        let m = t.join("weights.bin");
        touch(&m, b"GGUF\x03\0\0\0");
        assert_eq!(res(&m, &r).unwrap(), ModelSource::Gguf(m.clone()));
        // Neither.
        let txt = t.join("notes.txt");
        touch(&txt, b"hello");
        assert!(matches!(res(&txt, &r), Err(ModelError::Input(_))));
        // HF layout, by directory or by its config.json.
        let hf = t.join("hf-model");
        touch(&hf.join("config.json"), b"{}");
        touch(&hf.join("extra.gguf"), b"zz");
        assert_eq!(res(&hf, &r).unwrap(), ModelSource::HfDir(hf.clone()));
        assert_eq!(res(&hf.join("config.json"), &r).unwrap(), ModelSource::HfDir(hf.clone()));
        // Empty directory.
        fs::create_dir_all(t.join("empty")).unwrap();
        assert!(matches!(res(&t.join("empty"), &r), Err(ModelError::NotFound(_))));
        assert!(matches!(resolve_with("  ", &r, false, &no_pull), Err(ModelError::Input(_))));
    }

    fn make_repo(hub: &Path, id: &str, revs: &[&str], main: Option<&str>) -> PathBuf {
        let repo = hub.join(format!("models--{}", id.replace('/', "--")));
        for rev in revs {
            touch(&repo.join("snapshots").join(rev).join("config.json"), b"{}");
            std::thread::sleep(std::time::Duration::from_millis(15));
        }
        if let Some(m) = main {
            touch(&repo.join("refs").join("main"), format!("{m}\n").as_bytes());
        }
        repo
    }

    #[test]
    fn hf_cache_repo_ids() {
        let tmp = tempfile::tempdir().unwrap();
        let r = roots(tmp.path());
        let hub = r.hf_hub.clone().unwrap();
        // refs/main wins even when it is not the newest snapshot.
        let repo = make_repo(&hub, "Org/Model-1.5B", &["aaa", "bbb"], Some("aaa"));
        let got = resolve_with("Org/Model-1.5B", &r, false, &no_pull).unwrap();
        assert_eq!(got, ModelSource::HfDir(repo.join("snapshots").join("aaa")));
        // Without refs/main: the newest snapshot.
        let repo2 = make_repo(&hub, "org/other", &["old", "new"], None);
        let got = resolve_with("org/other", &r, false, &no_pull).unwrap();
        assert_eq!(got, ModelSource::HfDir(repo2.join("snapshots").join("new")));
        // A stale refs/main falls back to the newest.
        touch(&repo2.join("refs").join("main"), b"gone");
        assert_eq!(resolve_with("org/other", &r, false, &no_pull).unwrap(), got);
        // A snapshot holding one GGUF.
        let repo3 = hub.join("models--org--gguf-only");
        let g = repo3.join("snapshots").join("r1").join("m-q4.gguf");
        touch(&g, b"GGUF");
        assert_eq!(resolve_with("org/gguf-only", &r, false, &no_pull).unwrap(), ModelSource::Gguf(g));
        // The repo directory itself as a path.
        assert_eq!(res(&repo, &r).unwrap(), ModelSource::HfDir(repo.join("snapshots").join("aaa")));
        // Missing repo / no cache at all.
        let err = resolve_with("org/missing", &r, false, &no_pull).unwrap_err().to_string();
        assert!(err.contains("not in the Hugging Face cache"), "{err}");
        let r0 = Roots { models: r.models.clone(), hf_hub: None };
        assert!(matches!(resolve_with("org/missing", &r0, false, &no_pull), Err(ModelError::NotFound(_))));
    }

    #[test]
    fn hub_root_from_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| OsString::from(p.1))
        };
        assert_eq!(hf_hub_root(env(&[("HF_HUB_CACHE", "/c"), ("HF_HOME", "/h")])), Some("/c".into()));
        assert_eq!(hf_hub_root(env(&[("HF_HOME", "/h"), ("HOME", "/u")])), Some("/h/hub".into()));
        assert_eq!(hf_hub_root(env(&[("HF_HOME", ""), ("HOME", "/u")])), Some("/u/.cache/huggingface/hub".into()));
        assert_eq!(hf_hub_root(env(&[("XDG_CACHE_HOME", "/x")])), Some("/x/huggingface/hub".into()));
        assert_eq!(hf_hub_root(env(&[])), None);
    }

    #[test]
    fn catalogue_aliases() {
        let tmp = tempfile::tempdir().unwrap();
        let r = roots(tmp.path());
        // Missing, no auto-pull: a hint to pull.
        let err = resolve_with("smollm2-135m", &r, false, &no_pull).unwrap_err();
        assert!(matches!(err, ModelError::NotFound(_)));
        assert!(err.to_string().contains("tandem pull smollm2-135m"), "{err}");
        // Missing, auto-pull: the puller is asked for exactly that entry.
        let asked = Cell::new("");
        let fake = r.models.join("smollm2-135m.gguf");
        let puller = |e: &'static CatalogueEntry| {
            asked.set(e.alias);
            Ok(fake.clone())
        };
        assert_eq!(resolve_with("smollm2-135m", &r, true, &puller).unwrap(), ModelSource::Gguf(fake.clone()));
        assert_eq!(asked.get(), "smollm2-135m");
        // Present, no auto-pull: used as is.
        touch(&fake, b"GGUF");
        assert_eq!(resolve_with("smollm2-135m", &r, false, &no_pull).unwrap(), ModelSource::Gguf(fake));
        // Pull errors propagate.
        let failing = |_: &'static CatalogueEntry| Err(ModelError::Fetch("offline".into()));
        assert!(matches!(resolve_with("gemma3-270m", &r, true, &failing), Err(ModelError::Fetch(_))));
    }

    #[test]
    fn unknown_lists_aliases() {
        let tmp = tempfile::tempdir().unwrap();
        let r = roots(tmp.path());
        let err = resolve_with("no-such-model", &r, true, &no_pull).unwrap_err().to_string();
        assert!(err.contains("qwen2.5-coder-0.5b") && err.contains("tandem pull"), "{err}");
        // Relative paths that do not exist are not repo ids.
        assert!(!looks_like_repo_id("./a/b") && !looks_like_repo_id("a/b/c") && !looks_like_repo_id("/a"));
        assert!(looks_like_repo_id("Qwen/Qwen2.5-0.5B-Instruct"));
    }
}
