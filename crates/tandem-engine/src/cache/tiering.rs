//! Moving prefix state between the memory tree and the disk tier ([`super::disk`]): published
//! blocks and checkpoints go down (write-behind, [`EngineCache::persist_blocks`] and
//! [`EngineCache::persist_checkpoint`]); at admission, what the memory tree lacks comes up
//! ([`EngineCache::promote_from_disk`]) into fresh pool blocks and tree nodes, after which the
//! request starts exactly as from a memory hit.

use tandem_cache::NodeRef;
use tandem_model::kv::RecurrentSnapshot;

use super::disk::{chain_key, chain_keys, BlockEntry, Job, Key, Kind, COPY_BYTES, ROOT};
use super::{snapshot_bytes, EngineCache};
use crate::cache::CacheBook;

/// Where the bytes of the blocks a commit publishes are read back to the host for the disk
/// tier (`TANDEM_DISK_READBACK`):
/// - `engine`: block by block on the engine's thread, as before 2026-12-07 (on a GPU 16
///   transfers a block that each wait for the device: a 9B agent session's TTFT doubled);
/// - `batched` (the default on a GPU): the commit's blocks copied together on the device
///   ([`PagedKvStore::copy_blocks`]) and read back there and then, one transfer a pool;
/// - `writer` (the default on the CPU): the copies handed to the disk writer's thread and read
///   back there, off the engine's thread. On CUDA this wrote wrong bytes on 2026-12-07 with
///   the copies then gathered by row index; with the concatenated copies it writes the same
///   bytes as the others on an H100 (`the_read_back_paths_write_the_same_entries` with
///   `TANDEM_TEST_WRITER_READBACK=1`), but its speed there is not measured: a GPU keeps
///   `batched`.
///
/// [`PagedKvStore::copy_blocks`]: tandem_model::kv::PagedKvStore::copy_blocks
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadBack {
    Engine,
    Batched,
    Writer,
}

fn read_back_mode(cpu: bool) -> ReadBack {
    static SET: std::sync::OnceLock<Option<ReadBack>> = std::sync::OnceLock::new();
    let set = *SET.get_or_init(|| match std::env::var("TANDEM_DISK_READBACK").as_deref() {
        Ok("engine") => Some(ReadBack::Engine),
        Ok("batched") => Some(ReadBack::Batched),
        Ok("writer") => Some(ReadBack::Writer),
        Ok(other) => {
            tracing::warn!("TANDEM_DISK_READBACK={other:?} is none of engine, batched, writer; using the default");
            None
        }
        Err(_) => None,
    });
    set.unwrap_or(if cpu { ReadBack::Writer } else { ReadBack::Batched })
}

impl EngineCache {
    /// The disk key of the sequence's block `i` (computed along the chain as needed).
    fn disk_key(book: &mut CacheBook, tokens: &[u32], bs: usize, i: usize) -> Key {
        while book.disk_keys.len() <= i {
            let j = book.disk_keys.len();
            let parent = j.checked_sub(1).map_or(ROOT, |p| book.disk_keys[p]);
            book.disk_keys.push(chain_key(parent, &tokens[j * bs..(j + 1) * bs]));
        }
        book.disk_keys[i]
    }

    /// Hands the sequence's blocks `(i, block)` (just published in the tree) to the disk tier:
    /// those not on disk yet, read back as [`ReadBack`] says.
    pub(super) fn persist_blocks(&self, book: &mut CacheBook, tokens: &[u32], published: &[(usize, u32)]) {
        let Some(disk) = &self.disk else { return };
        if published.is_empty() || !disk.enabled() {
            return;
        }
        let bs = self.pool.block_size();
        let mut entries = Vec::with_capacity(published.len());
        let mut blocks = Vec::with_capacity(published.len());
        for &(i, block) in published {
            let key = Self::disk_key(book, tokens, bs, i);
            if disk.has(Kind::Block, key) {
                continue;
            }
            let parent = i.checked_sub(1).map_or(ROOT, |p| book.disk_keys[p]);
            let position = ((i + 1) * bs) as u64;
            entries.push(BlockEntry { key, parent, position, tokens: tokens[i * bs..(i + 1) * bs].to_vec() });
            blocks.push(block);
        }
        let mode = read_back_mode(self.store.device().is_cpu());
        if mode == ReadBack::Engine {
            for (e, &block) in entries.into_iter().zip(&blocks) {
                match self.store.read_block(block) {
                    Ok(bytes) => disk.put(e.with_bytes(bytes)),
                    Err(err) => tracing::warn!("prefix disk cache: block {block} not read: {err}"),
                }
            }
            return;
        }
        // Copies of at most COPY_BYTES each; those for the writer reserved before they are made.
        let block_len = self.store.block_len() as u64;
        let per_copy = (COPY_BYTES / block_len.max(1)).max(1) as usize;
        let mut entries = entries.into_iter();
        for part in blocks.chunks(per_copy) {
            let mine: Vec<BlockEntry> = entries.by_ref().take(part.len()).collect();
            if mode == ReadBack::Batched {
                disk.count_copy(false);
                match self.store.copy_blocks(part).and_then(|c| c.to_host()) {
                    Ok(read) => {
                        for (e, bytes) in mine.into_iter().zip(read) {
                            disk.put(e.with_bytes(bytes));
                        }
                    }
                    Err(e) => tracing::warn!("prefix disk cache: {} blocks not read: {e}", part.len()),
                }
                continue;
            }
            let bytes = block_len * part.len() as u64;
            if !disk.reserve_copy(bytes, part.len()) {
                continue;
            }
            match self.store.copy_blocks(part) {
                Ok(copy) => {
                    disk.count_copy(true);
                    disk.put_blocks(mine, copy)
                }
                Err(e) => {
                    disk.release_copy(bytes);
                    tracing::warn!("prefix disk cache: {} blocks not copied: {e}", part.len());
                }
            }
        }
    }

    /// Hands a checkpoint taken at a block boundary to the disk tier.
    pub(super) fn persist_checkpoint(&self, book: &mut CacheBook, tokens: &[u32], snap: &RecurrentSnapshot) {
        let Some(disk) = &self.disk else { return };
        let bs = self.pool.block_size();
        let pos = snap.position;
        if pos == 0 || !pos.is_multiple_of(bs) || pos > tokens.len() {
            return;
        }
        let key = Self::disk_key(book, tokens, bs, pos / bs - 1);
        if disk.enabled() && !disk.has(Kind::Checkpoint, key) {
            disk.put(Job::Checkpoint { key, tokens: tokens[..pos].to_vec(), snapshot: snap.clone() });
        }
    }

    /// Where the memory tree's match of `tokens` ends, continues on disk: reads the matching
    /// blocks (for models with recurrent layers up to the deepest checkpoint on disk that goes
    /// further than memory can, and that checkpoint) into fresh blocks and tree nodes. Returns
    /// how many more prompt tokens are usable than memory alone had (never past `limit`).
    pub(super) fn promote_from_disk(&mut self, tokens: &[u32], limit: usize) -> usize {
        let (Some(tree), Some(disk)) = (&mut self.tree, &self.disk) else { return 0 };
        if !disk.enabled() {
            return 0;
        }
        let bs = self.pool.block_size();
        let m = tree.lookup(tokens);
        let mem = m.blocks.len();
        let mem_usable =
            if self.stateful { tree.deepest_checkpoint(&m, limit).map_or(0, |c| c.0) } else { (mem * bs).min(limit) };
        let full = tokens.len() / bs;
        if mem >= full {
            return 0;
        }
        let keys = chain_keys(tokens, bs, full);
        let mut on_disk = mem;
        while on_disk < full && disk.has(Kind::Block, keys[on_disk]) {
            on_disk += 1;
        }
        let rejected_before = disk.rejected();
        // The deepest usable place: for hybrid models the deepest valid checkpoint on disk
        // past what memory has (without it the blocks are of no use), else every block.
        let mut snapshot = None;
        let target = if self.stateful {
            let mut found = None;
            for j in (mem_usable / bs + 1..=on_disk).rev().filter(|&j| j * bs <= limit) {
                if !disk.has(Kind::Checkpoint, keys[j - 1]) {
                    continue;
                }
                let Some(bytes) = disk.read(Kind::Checkpoint, keys[j - 1], 0, &tokens[..j * bs]) else { continue };
                match RecurrentSnapshot::from_bytes(&bytes, &self.spec, self.store.dtype(), self.store.device()) {
                    Ok(s) if s.position == j * bs => {
                        snapshot = Some(s);
                        found = Some(j);
                        break;
                    }
                    _ => tracing::warn!("prefix disk cache: a checkpoint does not fit this model; not used"),
                }
            }
            if found.is_none() && disk.rejected() > rejected_before {
                scrub(disk, &keys, tokens, on_disk, bs);
            }
            found
        } else {
            (on_disk > mem).then_some(on_disk)
        };
        let Some(target) = target else { return 0 };
        if (target * bs).min(limit) <= mem_usable {
            return 0;
        }
        if !self.make_room(target - mem) {
            return 0;
        }
        let (Some(tree), Some(disk)) = (&mut self.tree, &self.disk) else { return 0 };
        // The memory part of the match again (making room may have evicted some of it).
        let m = tree.lookup(&tokens[..mem * bs]);
        if m.blocks.len() != mem {
            return 0;
        }
        let mut parent: Option<NodeRef> = m.nodes.last().copied();
        let mut parent_key = mem.checked_sub(1).map_or(ROOT, |p| keys[p]);
        let mut done = mem;
        while done < target {
            let blk = &tokens[done * bs..(done + 1) * bs];
            let Some(bytes) = disk.read(Kind::Block, keys[done], parent_key, blk) else { break };
            let Ok(b) = self.pool.allocate() else { break };
            self.proposer_kv.clear(&[b]);
            let node = match self.store.write_block(b, &bytes) {
                Ok(()) => tree.insert(&mut self.pool, parent, blk, b).ok().flatten(),
                Err(e) => {
                    tracing::warn!("prefix disk cache: a block does not fit this cache: {e}");
                    None
                }
            };
            // The tree holds its own reference now (or nobody does).
            let _ = self.pool.release(b);
            let Some(node) = node else { break };
            parent = Some(node);
            parent_key = keys[done];
            done += 1;
        }
        if done < target {
            scrub(disk, &keys, tokens, on_disk, bs);
        }
        let usable = match (snapshot, parent) {
            (Some(snap), Some(node)) if done == target => {
                let bytes = snapshot_bytes(&snap);
                match tree.attach_checkpoint(node, snap, bytes) {
                    Ok(true) => target * bs,
                    _ => mem_usable,
                }
            }
            (Some(_), _) => mem_usable,
            (None, _) => (done * bs).min(limit),
        };
        usable.saturating_sub(mem_usable)
    }
}

/// After a damaged entry: checks every other entry on the chain of `tokens` now, so that all
/// bad ones are deleted (and the request's own blocks and checkpoints replace them).
fn scrub(disk: &super::disk::DiskTier, keys: &[Key], tokens: &[u32], on_disk: usize, bs: usize) {
    for j in 0..on_disk {
        let parent = j.checked_sub(1).map_or(ROOT, |p| keys[p]);
        let _ = disk.read(Kind::Block, keys[j], parent, &tokens[j * bs..(j + 1) * bs]);
        if disk.has(Kind::Checkpoint, keys[j]) {
            let _ = disk.read(Kind::Checkpoint, keys[j], 0, &tokens[..(j + 1) * bs]);
        }
    }
}
