//! The block pool: a fixed set of KV block ids with reference counts and a free list.
//!
//! A block is referenced by every block table that lists it and by the prefix-tree node
//! that caches it; it returns to the free list when the last reference is released.

use crate::{CacheError, Result};

/// Index of a KV block in the pool (and in the model's KV storage).
pub type BlockId = u32;

#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    refcounts: Vec<u32>,
    /// Free ids, the next one to hand out last.
    free: Vec<BlockId>,
}

impl BlockPool {
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self> {
        if block_size == 0 {
            return Err(CacheError::Config("block size must be positive".into()));
        }
        if num_blocks > u32::MAX as usize {
            return Err(CacheError::Config(format!("{num_blocks} blocks is more than a pool can index")));
        }
        Ok(Self { block_size, refcounts: vec![0; num_blocks], free: (0..num_blocks as BlockId).rev().collect() })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total(&self) -> usize {
        self.refcounts.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn used_count(&self) -> usize {
        self.total() - self.free.len()
    }

    /// Blocks needed to hold `tokens` positions.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// A free block with one reference.
    pub fn allocate(&mut self) -> Result<BlockId> {
        let id = self.free.pop().ok_or(CacheError::OutOfBlocks { needed: 1, free: 0 })?;
        self.refcounts[id as usize] = 1;
        Ok(id)
    }

    /// One more reference to an allocated block.
    pub fn retain(&mut self, id: BlockId) -> Result<()> {
        match self.refcounts.get_mut(id as usize) {
            Some(rc) if *rc > 0 => {
                *rc += 1;
                Ok(())
            }
            _ => Err(CacheError::NotAllocated(id)),
        }
    }

    /// Drops one reference; returns whether the block went back to the free list.
    pub fn release(&mut self, id: BlockId) -> Result<bool> {
        match self.refcounts.get_mut(id as usize) {
            Some(rc) if *rc > 0 => {
                *rc -= 1;
                if *rc == 0 {
                    self.free.push(id);
                    return Ok(true);
                }
                Ok(false)
            }
            _ => Err(CacheError::NotAllocated(id)),
        }
    }

    /// References held on `id` (0 when free or out of range).
    pub fn refcount(&self, id: BlockId) -> u32 {
        self.refcounts.get(id as usize).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_retain_release() {
        let mut p = BlockPool::new(3, 16).unwrap();
        assert_eq!((p.free_count(), p.used_count(), p.blocks_for(33)), (3, 0, 3));
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        assert_ne!(a, b);
        p.retain(a).unwrap();
        assert_eq!(p.refcount(a), 2);
        assert!(!p.release(a).unwrap());
        assert!(p.release(a).unwrap());
        assert_eq!(p.release(a), Err(CacheError::NotAllocated(a)));
        assert_eq!(p.retain(a), Err(CacheError::NotAllocated(a)));
        let _c = p.allocate().unwrap();
        let _d = p.allocate().unwrap();
        assert_eq!(p.allocate(), Err(CacheError::OutOfBlocks { needed: 1, free: 0 }));
        assert!(p.release(b).unwrap());
        assert_eq!(p.free_count(), 1);
        assert_eq!(p.release(99), Err(CacheError::NotAllocated(99)));
        assert!(BlockPool::new(1, 0).is_err());
    }
}
