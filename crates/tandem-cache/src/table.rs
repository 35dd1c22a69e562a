//! One sequence's block table: the ordered KV block ids holding its positions
//! (position `p` lives in block `blocks[p / block_size]` at offset `p % block_size`).
//!
//! Blocks may be shared (a prefix-cache hit, or the tree caching a block the sequence
//! filled). A shared block is never written: [`BlockTable::prepare_write`] swaps every shared
//! block in the range about to be written for a private copy and tells the caller which
//! block contents to copy (copy-on-write of a partly used shared last block).

use crate::pool::{BlockId, BlockPool};
use crate::{CacheError, Result};

/// Copy the KV of block `src` into block `dst` before writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    pub src: BlockId,
    pub dst: BlockId,
}

#[derive(Debug, Default, Clone)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
}

impl BlockTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Starts the table with `blocks` shared from the prefix cache (one reference each).
    pub fn share_prefix(&mut self, pool: &mut BlockPool, blocks: &[BlockId]) -> Result<()> {
        for (i, &b) in blocks.iter().enumerate() {
            if let Err(e) = pool.retain(b) {
                for &done in &blocks[..i] {
                    let _ = pool.release(done);
                }
                return Err(e);
            }
        }
        self.blocks.extend_from_slice(blocks);
        Ok(())
    }

    /// Free blocks that [`Self::prepare_write`] of positions `start..end` would take: blocks
    /// appended past the table's end plus private copies of shared blocks in the range.
    pub fn blocks_needed(&self, pool: &BlockPool, start: usize, end: usize) -> usize {
        if end <= start {
            return 0;
        }
        let bs = pool.block_size();
        let (first, last) = (start / bs, (end - 1) / bs);
        let appended = (last + 1).saturating_sub(self.blocks.len());
        let shared = (first..=last.min(self.blocks.len().saturating_sub(1)))
            .filter(|&i| i < self.blocks.len() && pool.refcount(self.blocks[i]) > 1)
            .count();
        appended + shared
    }

    /// Makes positions `start..end` writable: appends fresh blocks and replaces shared ones
    /// in the range by private copies. Returns the copies the caller must make in the KV
    /// storage before writing. All or nothing: on `OutOfBlocks` nothing changed.
    pub fn prepare_write(&mut self, pool: &mut BlockPool, start: usize, end: usize) -> Result<Vec<BlockCopy>> {
        if end <= start {
            return Ok(Vec::new());
        }
        let bs = pool.block_size();
        let covered = self.blocks.len() * bs;
        if start > covered {
            return Err(CacheError::Hole { start, end, covered });
        }
        let needed = self.blocks_needed(pool, start, end);
        if needed > pool.free_count() {
            return Err(CacheError::OutOfBlocks { needed, free: pool.free_count() });
        }
        let (first, last) = (start / bs, (end - 1) / bs);
        let mut copies = Vec::new();
        for i in first..=last {
            if i < self.blocks.len() {
                let src = self.blocks[i];
                if pool.refcount(src) > 1 {
                    let dst = pool.allocate()?;
                    // Still referenced elsewhere, so its contents stay valid for the copy.
                    pool.release(src)?;
                    self.blocks[i] = dst;
                    copies.push(BlockCopy { src, dst });
                }
            } else {
                self.blocks.push(pool.allocate()?);
            }
        }
        Ok(copies)
    }

    /// Keeps the blocks holding the first `tokens` positions and releases the rest.
    pub fn truncate(&mut self, pool: &mut BlockPool, tokens: usize) -> Result<()> {
        let keep = pool.blocks_for(tokens);
        while self.blocks.len() > keep {
            if let Some(b) = self.blocks.pop() {
                pool.release(b)?;
            }
        }
        Ok(())
    }

    /// Releases every block (finish, cancellation, preemption).
    pub fn release(&mut self, pool: &mut BlockPool) -> Result<()> {
        self.truncate(pool, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_and_release() {
        let mut pool = BlockPool::new(4, 4).unwrap();
        let mut t = BlockTable::new();
        assert_eq!(t.blocks_needed(&pool, 0, 9), 3);
        assert!(t.prepare_write(&mut pool, 0, 9).unwrap().is_empty());
        assert_eq!(t.blocks().len(), 3);
        assert_eq!(t.blocks_needed(&pool, 9, 12), 0);
        assert_eq!(t.blocks_needed(&pool, 12, 13), 1);
        assert_eq!(t.prepare_write(&mut pool, 14, 15), Err(CacheError::Hole { start: 14, end: 15, covered: 12 }));
        assert!(matches!(t.prepare_write(&mut pool, 12, 20), Err(CacheError::OutOfBlocks { needed: 2, free: 1 })));
        assert_eq!(t.blocks().len(), 3, "a refused write changes nothing");
        t.truncate(&mut pool, 5).unwrap();
        assert_eq!((t.blocks().len(), pool.free_count()), (2, 2));
        t.release(&mut pool).unwrap();
        assert_eq!(pool.free_count(), 4);
    }

    #[test]
    fn copy_on_write_of_shared_last_block() {
        let mut pool = BlockPool::new(6, 4).unwrap();
        let mut a = BlockTable::new();
        a.prepare_write(&mut pool, 0, 6).unwrap(); // two blocks, the second partly used
        let mut b = BlockTable::new();
        b.share_prefix(&mut pool, a.blocks()).unwrap();
        assert_eq!(pool.refcount(a.blocks()[1]), 2);
        // b writes position 6: the shared partial block is copied first.
        assert_eq!(b.blocks_needed(&pool, 6, 7), 1);
        let copies = b.prepare_write(&mut pool, 6, 7).unwrap();
        assert_eq!(copies, vec![BlockCopy { src: a.blocks()[1], dst: b.blocks()[1] }]);
        assert_ne!(a.blocks()[1], b.blocks()[1]);
        assert_eq!(a.blocks()[0], b.blocks()[0], "the full first block stays shared");
        assert_eq!(pool.refcount(a.blocks()[1]), 1);
        // a writes its own block again without copying (now exclusive).
        assert!(a.prepare_write(&mut pool, 6, 8).unwrap().is_empty());
        a.release(&mut pool).unwrap();
        assert_eq!(pool.refcount(b.blocks()[0]), 1);
        b.release(&mut pool).unwrap();
        assert_eq!(pool.free_count(), 6);
    }

    #[test]
    fn copy_on_write_is_all_or_nothing() {
        let mut pool = BlockPool::new(3, 4).unwrap();
        let mut a = BlockTable::new();
        a.prepare_write(&mut pool, 0, 8).unwrap();
        let mut b = BlockTable::new();
        b.share_prefix(&mut pool, a.blocks()).unwrap();
        // Rewriting positions 3..9 needs copies of both shared blocks plus one new block.
        assert_eq!(b.blocks_needed(&pool, 3, 9), 3);
        assert!(matches!(b.prepare_write(&mut pool, 3, 9), Err(CacheError::OutOfBlocks { needed: 3, free: 1 })));
        assert_eq!(b.blocks(), a.blocks());
        assert_eq!(pool.refcount(a.blocks()[0]), 2);
        b.release(&mut pool).unwrap();
        a.release(&mut pool).unwrap();
        assert_eq!(pool.free_count(), 3);
    }

    #[test]
    fn sharing_unallocated_blocks_is_refused_cleanly() {
        let mut pool = BlockPool::new(2, 4).unwrap();
        let held = pool.allocate().unwrap();
        let mut t = BlockTable::new();
        assert!(t.share_prefix(&mut pool, &[held, 1]).is_err());
        assert_eq!(pool.refcount(held), 1);
        assert!(t.is_empty());
    }
}
