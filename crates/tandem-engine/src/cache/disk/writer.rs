//! The disk tier's writer thread: encodes entries ([`super::format`]), writes each to
//! `tmp/`, renames it into place, indexes it and evicts least recently used entries beyond the
//! budget. A failure for lack of space or permission (or a file-size limit) turns the tier off.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use super::format::{self, Header, Kind};
use tandem_model::kv::BlockCopy;

use super::{BlockEntry, Index, Job, Meta, Shared};

pub(super) fn run(shared: &Shared, rx: Receiver<Job>) {
    let mut serial = 0u64;
    while let Ok(job) = rx.recv() {
        match job {
            Job::Blocks { entries, copy } => write_blocks(shared, entries, copy, &mut serial),
            Job::Flush(_) => write_one(shared, job, &mut serial),
            job => {
                write_one(shared, job, &mut serial);
                shared.stats.pending.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// Reads a [`Job::Blocks`] copy back (here, off the engine's thread) and writes its blocks.
fn write_blocks(shared: &Shared, entries: Vec<BlockEntry>, copy: BlockCopy, serial: &mut u64) {
    let n = entries.len() as u64;
    let read = if shared.enabled.load(Ordering::Relaxed) { Some(copy.to_host()) } else { None };
    shared.stats.held_copy_bytes.fetch_sub(copy.bytes() as u64, Ordering::Relaxed);
    drop(copy);
    match read {
        Some(Ok(blocks)) if blocks.len() == entries.len() => {
            for (e, bytes) in entries.into_iter().zip(blocks) {
                let job = Job::Block { key: e.key, parent: e.parent, position: e.position, tokens: e.tokens, bytes };
                write_one(shared, job, serial);
                shared.stats.pending.fetch_sub(1, Ordering::Relaxed);
            }
            return;
        }
        Some(Ok(blocks)) => {
            tracing::warn!("prefix disk cache: {} blocks read back for {} entries; not written", blocks.len(), n)
        }
        Some(Err(e)) => tracing::warn!("prefix disk cache: {n} blocks not read back: {e}"),
        None => {}
    }
    shared.stats.pending.fetch_sub(n, Ordering::Relaxed);
}

fn write_one(shared: &Shared, job: Job, serial: &mut u64) {
    let (kind, key, file) = match job {
        Job::Flush(done) => {
            let _ = done.send(());
            return;
        }
        // Split by `run` before this.
        Job::Blocks { .. } => return,
        _ if !shared.enabled.load(Ordering::Relaxed) => return,
        Job::Block { key, parent, position, tokens, bytes } => {
            let h = Header { kind: Kind::Block, fingerprint: shared.fingerprint, key, parent, position };
            (Kind::Block, key, format::encode(&h, &tokens, &bytes))
        }
        Job::Checkpoint { key, tokens, snapshot } => {
            let payload = match snapshot.to_bytes() {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!("prefix disk cache: checkpoint not written: {e}");
                    return;
                }
            };
            let h = Header {
                kind: Kind::Checkpoint,
                fingerprint: shared.fingerprint,
                key,
                parent: 0,
                position: snapshot.position as u64,
            };
            (Kind::Checkpoint, key, format::encode(&h, &tokens, &payload))
        }
    };
    if shared.index.lock().is_ok_and(|ix| ix.entries.contains_key(&(kind, key))) {
        return;
    }
    let bytes = file.len() as u64;
    {
        let Ok(mut ix) = shared.index.lock() else { return };
        if bytes > ix.budget {
            return;
        }
        evict_to_budget(shared, &mut ix, bytes);
    }
    *serial += 1;
    match write_atomically(shared, kind, key, &file, *serial) {
        Ok(()) => {
            shared.stats.written_bytes.fetch_add(bytes, Ordering::Relaxed);
            shared.stats.writes.fetch_add(1, Ordering::Relaxed);
            let Ok(mut ix) = shared.index.lock() else { return };
            ix.tick += 1;
            let tick = ix.tick;
            if let Some(old) = ix.entries.insert((kind, key), Meta { bytes, tick }) {
                ix.total -= old.bytes;
            }
            ix.total += bytes;
            shared.publish_sizes(&ix);
        }
        Err(e) => {
            if fatal(&e) {
                shared.disable(&format!("writing failed: {e}"));
            } else {
                tracing::warn!("prefix disk cache: an entry was not written: {e}");
            }
        }
    }
}

/// Errors after which writing on is pointless: no space, no permission, read-only, too large.
fn fatal(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), StorageFull | PermissionDenied | ReadOnlyFilesystem | QuotaExceeded | FileTooLarge)
        || matches!(e.raw_os_error(), Some(27 | 28 | 30 | 13 | 1 | 122))
}

fn write_atomically(shared: &Shared, kind: Kind, key: format::Key, file: &[u8], serial: u64) -> std::io::Result<()> {
    let dest = shared.path(kind, key);
    let tmp = shared.ns.join("tmp").join(format!("{key:032x}.{}.{}.{serial}", kind.ext(), std::process::id()));
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let written = std::fs::File::create(&tmp).and_then(|mut f| f.write_all(file));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &dest).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Deletes least recently used entries until `incoming` more bytes fit the budget.
pub(super) fn evict_to_budget(shared: &Shared, ix: &mut Index, incoming: u64) {
    while ix.total + incoming > ix.budget && !ix.entries.is_empty() {
        let Some((&k, _)) = ix.entries.iter().min_by_key(|(_, m)| m.tick) else { break };
        ix.remove(&k);
        let _ = std::fs::remove_file(shared.path(k.0, k.1));
        shared.stats.evictions.fetch_add(1, Ordering::Relaxed);
    }
}
