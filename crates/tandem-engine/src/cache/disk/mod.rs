//! The prefix cache's disk tier: KV blocks and recurrent checkpoints the in-memory prefix tree
//! published, kept as files under a byte budget so that a restart (or memory eviction) does not
//! cost the prefill again.
//!
//! Layout: `<root>/<namespace>/<2 hex>/<32 hex>.kvb|ckp` (one file per entry, [`format`]),
//! `<root>/<namespace>/tmp/` for writes in progress and `meta.json` (model, hits). The
//! namespace is a fingerprint of everything the bytes depend on ([`fingerprint`]). Entries are
//! immutable and content-addressed, written to `tmp/` and renamed into place (no fsync: a crash
//! can lose the newest entries or leave a torn file, which its checksum refuses), so two
//! servers may share a directory: the worst either does to the other is delete an entry it had
//! indexed, which is then a miss.
//!
//! Writes are write-behind: the engine hands an entry to a background thread when the memory
//! tree publishes it (a block once all of its tokens are computed, a checkpoint when taken) and
//! never waits; a full queue drops the entry (counted). Publishing, not eviction, is the moment,
//! so that what a restart needs is already on disk, and the eviction path stays free of I/O.
//! Reads happen at admission ([`super::EngineCache::start`]): where the memory tree's match
//! ends, the lookup goes on through the index; matching blocks (and for hybrid models the
//! deepest checkpoint among them) are read, checked and promoted into the memory tree. Any
//! entry failing a check is deleted, counted and treated as a miss. A write that fails for
//! lack of space or permission turns the tier off with one warning.

pub mod fingerprint;
pub mod format;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

pub use format::{chain_key, chain_keys, Key, Kind, ROOT};
use tandem_model::kv::{BlockCopy, RecurrentSnapshot};

/// Where the tier lives and how much it may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCacheConfig {
    /// The cache root; each model gets its own namespace directory below it.
    pub dir: PathBuf,
    /// Bytes of entries the namespace may hold (least recently used go first).
    pub budget: u64,
}

/// Counters of the tier (all only grow, except `entries` and `bytes`).
#[derive(Debug, Default)]
pub struct DiskStats {
    /// Prompt tokens a request got from entries read back from disk.
    pub hit_tokens: AtomicU64,
    pub read_bytes: AtomicU64,
    /// Nanoseconds spent reading and checking entries (read bandwidth = read_bytes / this).
    pub read_ns: AtomicU64,
    pub written_bytes: AtomicU64,
    pub writes: AtomicU64,
    /// Entries handed to the writer while its queue was full (not written).
    pub dropped_writes: AtomicU64,
    pub evictions: AtomicU64,
    /// Entries refused by a check (truncated, checksum, foreign, renamed, other tokens) and deleted.
    pub rejected: AtomicU64,
    pub entries: AtomicU64,
    pub bytes: AtomicU64,
    /// 1 while the tier is on.
    pub enabled: AtomicU64,
    /// Entries handed to the writer and not yet written (or skipped).
    pub pending: AtomicU64,
    /// Device bytes of block copies handed to the writer and not yet read back.
    pub held_copy_bytes: AtomicU64,
    /// Block copies made (`batched` and `writer` read-backs) and, of those, handed to the
    /// writer's thread (`writer`): which read-back ran.
    pub block_copies: AtomicU64,
    pub writer_copies: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    bytes: u64,
    tick: u64,
}

/// The index: every entry's size and last use, and the total against the budget.
struct Index {
    entries: HashMap<(Kind, Key), Meta>,
    total: u64,
    tick: u64,
    budget: u64,
}

impl Index {
    fn touch(&mut self, k: (Kind, Key)) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(m) = self.entries.get_mut(&k) {
            m.tick = tick;
        }
    }

    fn remove(&mut self, k: &(Kind, Key)) -> Option<Meta> {
        let m = self.entries.remove(k)?;
        self.total -= m.bytes;
        Some(m)
    }
}

/// An entry for the writer thread.
pub(crate) enum Job {
    /// One block's bytes already on the host (read back on the engine's thread: the
    /// `engine` and `batched` read-backs, the default on a GPU).
    Block {
        key: Key,
        parent: Key,
        position: u64,
        tokens: Vec<u32>,
        bytes: Vec<u8>,
    },
    /// Blocks published together, copied on the model's device ([`BlockCopy`]) and read back
    /// by the writer, so the engine's thread never waits for a transfer (the `writer`
    /// read-back, the default on the CPU).
    Blocks {
        entries: Vec<BlockEntry>,
        copy: BlockCopy,
    },
    Checkpoint {
        key: Key,
        tokens: Vec<u32>,
        snapshot: RecurrentSnapshot,
    },
    /// Answered once everything before it is written.
    Flush(SyncSender<()>),
}

struct Shared {
    ns: PathBuf,
    fingerprint: u128,
    index: Mutex<Index>,
    enabled: AtomicBool,
    stats: Arc<DiskStats>,
    hits: AtomicU64,
}

impl Shared {
    fn path(&self, kind: Kind, key: Key) -> PathBuf {
        let hex = format!("{key:032x}");
        self.ns.join(&hex[..2]).join(format!("{hex}.{}", kind.ext()))
    }

    fn publish_sizes(&self, ix: &Index) {
        self.stats.entries.store(ix.entries.len() as u64, Ordering::Relaxed);
        self.stats.bytes.store(ix.total, Ordering::Relaxed);
    }

    /// Turns the tier off (once, with a warning).
    fn disable(&self, why: &str) {
        if self.enabled.swap(false, Ordering::Relaxed) {
            tracing::warn!("prefix disk cache at {} turned off: {why}", self.ns.display());
            self.stats.enabled.store(0, Ordering::Relaxed);
        }
    }

    /// Deletes an entry that failed a check.
    fn reject(&self, kind: Kind, key: Key, why: format::Reject) {
        tracing::warn!("prefix disk cache: dropped entry {key:032x}.{} ({why:?})", kind.ext());
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        let _ = std::fs::remove_file(self.path(kind, key));
        if let Ok(mut ix) = self.index.lock() {
            ix.remove(&(kind, key));
            self.publish_sizes(&ix);
        }
    }
}

/// The disk tier of one model's prefix cache.
pub struct DiskTier {
    shared: Arc<Shared>,
    tx: Option<SyncSender<Job>>,
}

/// A block of a [`Job::Blocks`]: where it hangs in the chain and its tokens.
pub(crate) struct BlockEntry {
    pub key: Key,
    pub parent: Key,
    pub position: u64,
    pub tokens: Vec<u32>,
}

impl BlockEntry {
    /// The entry's job once its bytes are on the host.
    pub(crate) fn with_bytes(self, bytes: Vec<u8>) -> Job {
        Job::Block { key: self.key, parent: self.parent, position: self.position, tokens: self.tokens, bytes }
    }
}

/// Entries the writer may have queued.
const QUEUE: usize = 256;

/// Device bytes the queued [`Job::Blocks`] copies may hold together; past it a copy is
/// dropped (counted like a full queue). 256 MiB: 512 blocks of the 9B shape in f16.
const HELD_COPY_BYTES: u64 = 256 << 20;

/// Device bytes of one [`Job::Blocks`] copy at most (a commit of more blocks goes as several),
/// so that one long prefill chunk cannot take the whole of [`HELD_COPY_BYTES`] or pass it.
pub(crate) const COPY_BYTES: u64 = 32 << 20;

impl DiskTier {
    /// Opens (creating it) the namespace `fingerprint` under `cfg.dir`, rebuilds the index from
    /// the file names and sizes (nothing is read), removes interrupted writes and starts the
    /// writer. A directory that cannot be created or written gives one warning and `None`.
    pub fn open(cfg: &DiskCacheConfig, fingerprint: u128, model: &str, stats: Arc<DiskStats>) -> Option<Self> {
        if cfg.budget == 0 {
            return None;
        }
        let ns = cfg.dir.join(format!("{fingerprint:032x}"));
        let tmp = ns.join("tmp");
        if let Err(e) = std::fs::create_dir_all(&tmp) {
            tracing::warn!("prefix disk cache off: cannot create {}: {e}", tmp.display());
            return None;
        }
        if let Ok(rd) = std::fs::read_dir(&tmp) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let meta = ns.join("meta.json");
        let hits = read_hits(&meta);
        if std::fs::write(&meta, meta_json(model, fingerprint, hits)).is_err() {
            tracing::warn!("prefix disk cache off: {} is not writable", ns.display());
            return None;
        }
        let mut index = Index { entries: HashMap::new(), total: 0, tick: 0, budget: cfg.budget };
        let mut found: Vec<(std::time::SystemTime, (Kind, Key), u64)> = scan(&ns);
        found.sort_by_key(|f| f.0);
        for (_, k, bytes) in found {
            index.tick += 1;
            index.entries.insert(k, Meta { bytes, tick: index.tick });
            index.total += bytes;
        }
        stats.enabled.store(1, Ordering::Relaxed);
        let shared = Arc::new(Shared {
            ns,
            fingerprint,
            index: Mutex::new(index),
            enabled: AtomicBool::new(true),
            stats,
            hits: AtomicU64::new(hits),
        });
        {
            let mut ix = shared.index.lock().ok()?;
            writer::evict_to_budget(&shared, &mut ix, 0);
            shared.publish_sizes(&ix);
        }
        let (tx, rx) = sync_channel(QUEUE);
        let w = shared.clone();
        let spawned = std::thread::Builder::new().name("tandem-disk-cache".into()).spawn(move || writer::run(&w, rx));
        if let Err(e) = spawned {
            tracing::warn!("prefix disk cache off: cannot start its writer: {e}");
            return None;
        }
        tracing::info!(
            dir = %shared.ns.display(),
            entries = shared.stats.entries.load(Ordering::Relaxed),
            mib = shared.stats.bytes.load(Ordering::Relaxed) >> 20,
            budget_mib = cfg.budget >> 20,
            "prefix disk cache"
        );
        Some(Self { shared, tx: Some(tx) })
    }

    pub fn enabled(&self) -> bool {
        self.shared.enabled.load(Ordering::Relaxed)
    }

    /// Whether the index holds the entry.
    pub fn has(&self, kind: Kind, key: Key) -> bool {
        self.enabled() && self.shared.index.lock().is_ok_and(|ix| ix.entries.contains_key(&(kind, key)))
    }

    /// Reserves `bytes` of device memory for a block copy of `n` blocks about to be made
    /// ([`Self::put_blocks`] hands it over, [`Self::release_copy`] gives it back if the copy
    /// fails). `false`, counting the blocks as dropped, when the queued copies would pass
    /// [`HELD_COPY_BYTES`] or the tier is off.
    pub(crate) fn reserve_copy(&self, bytes: u64, n: usize) -> bool {
        let stats = &self.shared.stats;
        if !self.enabled() || self.tx.is_none() {
            return false;
        }
        if stats.held_copy_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > HELD_COPY_BYTES {
            stats.held_copy_bytes.fetch_sub(bytes, Ordering::Relaxed);
            stats.dropped_writes.fetch_add(n as u64, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Counts a block copy made, `to_writer` when the writer's thread reads it back.
    pub(crate) fn count_copy(&self, to_writer: bool) {
        let stats = &self.shared.stats;
        stats.block_copies.fetch_add(1, Ordering::Relaxed);
        if to_writer {
            stats.writer_copies.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Gives back a reservation whose copy was not made.
    pub(crate) fn release_copy(&self, bytes: u64) {
        self.shared.stats.held_copy_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Hands blocks published together (the caller leaves out those [`Self::has`] already) to
    /// the writer as one copy on the device, reserved by [`Self::reserve_copy`] for
    /// `copy.bytes()`; never blocks. A full queue drops them (counted).
    pub(crate) fn put_blocks(&self, entries: Vec<BlockEntry>, copy: BlockCopy) {
        let (n, bytes) = (entries.len() as u64, copy.bytes() as u64);
        let stats = &self.shared.stats;
        let Some(tx) = self.tx.as_ref().filter(|_| n > 0) else {
            self.release_copy(bytes);
            return;
        };
        stats.pending.fetch_add(n, Ordering::Relaxed);
        if let Err(e) = tx.try_send(Job::Blocks { entries, copy }) {
            stats.pending.fetch_sub(n, Ordering::Relaxed);
            stats.held_copy_bytes.fetch_sub(bytes, Ordering::Relaxed);
            if let TrySendError::Full(_) = e {
                stats.dropped_writes.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// Hands an entry to the writer unless it is on disk already; never blocks.
    pub(crate) fn put(&self, job: Job) {
        let (kind, key) = match job {
            Job::Block { key, .. } => (Kind::Block, key),
            Job::Checkpoint { key, .. } => (Kind::Checkpoint, key),
            // Block copies go through `reserve_copy` (before the copy is made) and `put_blocks`.
            Job::Blocks { .. } | Job::Flush(_) => return,
        };
        if !self.enabled() || self.has(kind, key) {
            return;
        }
        if let Some(tx) = &self.tx {
            self.shared.stats.pending.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = tx.try_send(job) {
                self.shared.stats.pending.fetch_sub(1, Ordering::Relaxed);
                if let TrySendError::Full(_) = e {
                    self.shared.stats.dropped_writes.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Reads and checks an entry standing for `tokens` (a block's own tokens; a checkpoint's
    /// whole prefix). A block must also hang below `parent`. `None` on a miss or a refusal.
    pub fn read(&self, kind: Kind, key: Key, parent: Key, tokens: &[u32]) -> Option<Vec<u8>> {
        if !self.has(kind, key) {
            return None;
        }
        let path = self.shared.path(kind, key);
        let started = std::time::Instant::now();
        let _timer = ReadTimer(&self.shared.stats, started);
        let file = match std::fs::read(&path) {
            Ok(f) => f,
            Err(_) => {
                // Deleted under us (another server sharing the directory evicted it).
                if let Ok(mut ix) = self.shared.index.lock() {
                    ix.remove(&(kind, key));
                    self.shared.publish_sizes(&ix);
                }
                return None;
            }
        };
        self.shared.stats.read_bytes.fetch_add(file.len() as u64, Ordering::Relaxed);
        match format::decode(&file, kind, self.shared.fingerprint, key, tokens) {
            Ok(d) if kind == Kind::Checkpoint || d.parent == parent => {
                if let Ok(mut ix) = self.shared.index.lock() {
                    ix.touch((kind, key));
                }
                // Keeps the LRU order across restarts (best effort).
                let _ = std::fs::File::options()
                    .append(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                Some(d.payload.to_vec())
            }
            Ok(_) => {
                self.shared.reject(kind, key, format::Reject::WrongEntry);
                None
            }
            Err(why) => {
                self.shared.reject(kind, key, why);
                None
            }
        }
    }

    /// Entries refused so far.
    pub fn rejected(&self) -> u64 {
        self.shared.stats.rejected.load(Ordering::Relaxed)
    }

    /// Counts `tokens` prompt tokens served from disk for one request.
    pub fn count_hit(&self, tokens: usize) {
        self.shared.stats.hit_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        let hits = self.shared.hits.fetch_add(1, Ordering::Relaxed) + 1;
        let _ = std::fs::write(
            self.shared.ns.join("meta.json"),
            meta_json(&meta_model(&self.shared.ns), self.shared.fingerprint, hits),
        );
    }

    /// Waits until every entry handed over so far is written (tests, shutdown).
    pub fn flush(&self) {
        if let Some(tx) = &self.tx {
            let (done_tx, done_rx) = sync_channel(1);
            if tx.send(Job::Flush(done_tx)).is_ok() {
                let _ = done_rx.recv_timeout(std::time::Duration::from_secs(30));
            }
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.flush();
        self.tx = None;
    }
}

/// Adds the time of one read (and its checks) to the stats when dropped.
struct ReadTimer<'a>(&'a DiskStats, std::time::Instant);

impl Drop for ReadTimer<'_> {
    fn drop(&mut self) {
        self.0.read_ns.fetch_add(self.1.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// Every entry file in a namespace: (modified, entry, bytes), from names and metadata only.
fn scan(ns: &Path) -> Vec<(std::time::SystemTime, (Kind, Key), u64)> {
    let mut out = Vec::new();
    let Ok(dirs) = std::fs::read_dir(ns) else { return out };
    for d in dirs.flatten() {
        let name = d.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() != 2 || !d.path().is_dir() {
            continue;
        }
        let Ok(files) = std::fs::read_dir(d.path()) else { continue };
        for f in files.flatten() {
            let path = f.path();
            let (Some(stem), Some(ext)) =
                (path.file_stem().and_then(|s| s.to_str()), path.extension().and_then(|s| s.to_str()))
            else {
                continue;
            };
            let kind = match ext {
                "kvb" => Kind::Block,
                "ckp" => Kind::Checkpoint,
                _ => continue,
            };
            let (Ok(key), Ok(meta)) = (u128::from_str_radix(stem, 16), f.metadata()) else { continue };
            if stem.len() != 32 || !stem.starts_with(name) {
                continue;
            }
            let modified = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
            out.push((modified, (kind, key), meta.len()));
        }
    }
    out
}

fn meta_json(model: &str, fingerprint: u128, hits: u64) -> String {
    serde_json::json!({
        "model": model,
        "fingerprint": format!("{fingerprint:032x}"),
        "format_version": format::FORMAT_VERSION,
        "hits": hits,
    })
    .to_string()
}

fn read_meta(meta: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(meta).ok()?).ok()
}

fn read_hits(meta: &Path) -> u64 {
    read_meta(meta).and_then(|v| v["hits"].as_u64()).unwrap_or(0)
}

fn meta_model(ns: &Path) -> String {
    read_meta(&ns.join("meta.json")).and_then(|v| v["model"].as_str().map(String::from)).unwrap_or_default()
}

/// What `tandem cache stats|ls` shows of one namespace.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NamespaceInfo {
    pub namespace: String,
    pub model: String,
    pub blocks: usize,
    pub checkpoints: usize,
    pub bytes: u64,
    pub hits: u64,
}

/// Every namespace under a cache root.
pub fn namespaces(root: &Path) -> Vec<NamespaceInfo> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(root) else { return out };
    for d in rd.flatten() {
        let ns = d.path();
        let Some(name) = ns.file_name().and_then(|n| n.to_str()).map(String::from) else { continue };
        if name.len() != 32 || !ns.join("meta.json").is_file() {
            continue;
        }
        let files = scan(&ns);
        let meta = read_meta(&ns.join("meta.json"));
        out.push(NamespaceInfo {
            namespace: name,
            model: meta.as_ref().and_then(|v| v["model"].as_str().map(String::from)).unwrap_or_default(),
            blocks: files.iter().filter(|f| f.1 .0 == Kind::Block).count(),
            checkpoints: files.iter().filter(|f| f.1 .0 == Kind::Checkpoint).count(),
            bytes: files.iter().map(|f| f.2).sum(),
            hits: meta.and_then(|v| v["hits"].as_u64()).unwrap_or(0),
        });
    }
    out.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    out
}

#[cfg(test)]
mod tests;
