//! The disk tier's writer thread: encodes entries ([`super::format`]), writes each to
//! `tmp/`, renames it into place, indexes it and evicts least recently used entries beyond the
//! budget. A failure for lack of space or permission (or a file-size limit) turns the tier off.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use super::format::{self, Header, Kind};
use super::{Index, Job, Meta, Shared};

pub(super) fn run(shared: &Shared, rx: Receiver<Job>) {
    let mut serial = 0u64;
    while let Ok(job) = rx.recv() {
        if let Job::Flush(done) = job {
            let _ = done.send(());
            continue;
        }
        let n = job_entries(&job);
        let entries = {
            // The job's device data read back and freed here, never while the engine records a
            // CUDA graph on the same stream (it would be recorded into the graph).
            let _share = tandem_model::device::stream_share();
            read_back(shared, job)
        };
        for (h, tokens, payload) in entries {
            write_one(shared, h.kind, h.key, format::encode(&h, &tokens, &payload), &mut serial);
        }
        shared.stats.pending.fetch_sub(n, Ordering::Relaxed);
    }
}

/// Entries a job stands for in the `pending` count.
fn job_entries(job: &Job) -> u64 {
    match job {
        Job::Blocks { entries, .. } => entries.len() as u64,
        Job::Block { .. } | Job::Checkpoint { .. } => 1,
        Job::Flush(_) => 0,
    }
}

/// An entry's header, tokens and payload, on the host and ready to encode.
type Ready = (Header, Vec<u32>, Vec<u8>);

/// The job's entries with their bytes on the host (a [`Job::Blocks`] copy read back, a
/// checkpoint's snapshot as bytes); none when the tier is off or a read fails (logged). Drops
/// the job's device data.
fn read_back(shared: &Shared, job: Job) -> Vec<Ready> {
    let on = shared.enabled.load(Ordering::Relaxed);
    let fingerprint = shared.fingerprint;
    match job {
        Job::Flush(_) => Vec::new(),
        Job::Block { key, parent, position, tokens, bytes } => {
            if on {
                vec![(Header { kind: Kind::Block, fingerprint, key, parent, position }, tokens, bytes)]
            } else {
                Vec::new()
            }
        }
        Job::Blocks { entries, copy } => {
            let read = on.then(|| copy.to_host());
            shared.stats.held_copy_bytes.fetch_sub(copy.bytes() as u64, Ordering::Relaxed);
            drop(copy);
            match read {
                Some(Ok(blocks)) if blocks.len() == entries.len() => entries
                    .into_iter()
                    .zip(blocks)
                    .map(|(e, payload)| {
                        let h = Header {
                            kind: Kind::Block,
                            fingerprint,
                            key: e.key,
                            parent: e.parent,
                            position: e.position,
                        };
                        (h, e.tokens, payload)
                    })
                    .collect(),
                Some(Ok(blocks)) => {
                    let (got, want) = (blocks.len(), entries.len());
                    tracing::warn!("prefix disk cache: {got} blocks read back for {want} entries; not written");
                    Vec::new()
                }
                Some(Err(e)) => {
                    tracing::warn!("prefix disk cache: {} blocks not read back: {e}", entries.len());
                    Vec::new()
                }
                None => Vec::new(),
            }
        }
        Job::Checkpoint { key, tokens, snapshot } => {
            // Its device states are read and may be freed here: the device's context first.
            if let Some(d) = snapshot.device() {
                tandem_model::device::bind_thread(d);
            }
            if !on {
                return Vec::new();
            }
            match snapshot.to_bytes() {
                Ok(payload) => {
                    let position = snapshot.position as u64;
                    vec![(Header { kind: Kind::Checkpoint, fingerprint, key, parent: 0, position }, tokens, payload)]
                }
                Err(e) => {
                    tracing::warn!("prefix disk cache: checkpoint not written: {e}");
                    Vec::new()
                }
            }
        }
    }
}

fn write_one(shared: &Shared, kind: Kind, key: format::Key, file: Vec<u8>, serial: &mut u64) {
    if !shared.enabled.load(Ordering::Relaxed) {
        return;
    }
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
