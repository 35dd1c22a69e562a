//! The prefix tree: full token blocks chained by hash, each node holding one reference to the
//! KV block computed for those tokens and optionally a recurrent-state checkpoint taken at the
//! position right after the block.
//!
//! A node's key is `hash(parent's key, its block_size tokens)`, so a lookup walks a prompt
//! block by block through one hash map; tokens and parent are compared on every hit, so a
//! hash collision is a miss, never a wrong answer. Nodes are evicted least recently used
//! first, and only leaves whose block nobody but the tree references. Checkpoints have their
//! own byte budget and LRU order: a node may keep its KV after its checkpoint is evicted,
//! while evicting a node drops its checkpoint.

use std::cmp::Reverse;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{Hash, Hasher};

use crate::pool::{BlockId, BlockPool};
use crate::{CacheError, Result};

/// A handle to a tree node; it goes stale (and is detected as such) once the node is evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeRef {
    index: u32,
    generation: u32,
}

/// The cached part of a token sequence: one node and block per matched full block.
#[derive(Debug, Default, Clone)]
pub struct PrefixMatch {
    pub nodes: Vec<NodeRef>,
    pub blocks: Vec<BlockId>,
}

struct Checkpoint<C> {
    payload: C,
    bytes: usize,
    last_used: u64,
}

struct Node<C> {
    parent: Option<u32>,
    key: u64,
    tokens: Box<[u32]>,
    block: BlockId,
    children: u32,
    last_used: u64,
    checkpoint: Option<Checkpoint<C>>,
}

struct Slot<C> {
    generation: u32,
    node: Option<Node<C>>,
}

pub struct PrefixTree<C> {
    block_size: usize,
    slots: Vec<Slot<C>>,
    free_slots: Vec<u32>,
    by_key: HashMap<u64, u32>,
    tick: u64,
    nodes: usize,
    checkpoint_budget: usize,
    checkpoint_bytes: usize,
    checkpoints: usize,
}

const ROOT_KEY: u64 = 0x7461_6e64_656d_0001;

fn chain_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl<C> PrefixTree<C> {
    /// A tree over blocks of `block_size` tokens whose checkpoints may hold at most
    /// `checkpoint_budget` bytes together.
    pub fn new(block_size: usize, checkpoint_budget: usize) -> Self {
        Self {
            block_size,
            slots: Vec::new(),
            free_slots: Vec::new(),
            by_key: HashMap::new(),
            tick: 0,
            nodes: 0,
            checkpoint_budget,
            checkpoint_bytes: 0,
            checkpoints: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    /// Nodes in the tree, which is also the number of block references it holds.
    pub fn node_count(&self) -> usize {
        self.nodes
    }
    pub fn checkpoint_count(&self) -> usize {
        self.checkpoints
    }
    pub fn checkpoint_bytes(&self) -> usize {
        self.checkpoint_bytes
    }
    pub fn checkpoint_budget(&self) -> usize {
        self.checkpoint_budget
    }

    fn live(&self, index: u32) -> Option<&Node<C>> {
        self.slots.get(index as usize).and_then(|s| s.node.as_ref())
    }

    fn live_mut(&mut self, index: u32) -> Option<&mut Node<C>> {
        self.slots.get_mut(index as usize).and_then(|s| s.node.as_mut())
    }

    fn resolve(&self, r: NodeRef) -> Option<u32> {
        let slot = self.slots.get(r.index as usize)?;
        (slot.generation == r.generation && slot.node.is_some()).then_some(r.index)
    }

    fn node_ref(&self, index: u32) -> NodeRef {
        NodeRef { index, generation: self.slots.get(index as usize).map(|s| s.generation).unwrap_or(0) }
    }

    /// The key a child of `parent` with `tokens` has, and that child if it exists.
    fn child(&self, parent: Option<u32>, tokens: &[u32]) -> (u64, Option<u32>) {
        let pkey = parent.and_then(|p| self.live(p)).map(|n| n.key).unwrap_or(ROOT_KEY);
        let key = chain_key(pkey, tokens);
        let found = self
            .by_key
            .get(&key)
            .copied()
            .filter(|&i| self.live(i).is_some_and(|n| n.parent == parent && &*n.tokens == tokens));
        (key, found)
    }

    fn touch(&mut self, index: u32) {
        let tick = self.tick;
        if let Some(n) = self.live_mut(index) {
            n.last_used = tick;
        }
    }

    /// The longest cached prefix of `tokens` in whole blocks. Marks it recently used.
    pub fn lookup(&mut self, tokens: &[u32]) -> PrefixMatch {
        self.tick += 1;
        let mut m = PrefixMatch::default();
        let mut parent = None;
        for blk in tokens.chunks_exact(self.block_size) {
            let Some(i) = self.child(parent, blk).1 else { break };
            self.touch(i);
            let block = self.live(i).map(|n| n.block).unwrap_or_default();
            m.nodes.push(self.node_ref(i));
            m.blocks.push(block);
            parent = Some(i);
        }
        m
    }

    /// The block a node holds, if the node is still cached.
    pub fn node_block(&self, r: NodeRef) -> Option<BlockId> {
        self.resolve(r).and_then(|i| self.live(i)).map(|n| n.block)
    }

    /// Lets a cached node hold `block` instead of its own (the same tokens, with more in it:
    /// a proposer's KV its own block lacks). Takes a reference to `block`, gives back the old
    /// one; sequences that share the old block keep it.
    pub fn replace_block(&mut self, pool: &mut BlockPool, r: NodeRef, block: BlockId) -> Result<()> {
        let i = self.resolve(r).ok_or(CacheError::StaleNode)?;
        let old = self.live(i).map(|n| n.block).ok_or(CacheError::StaleNode)?;
        if old == block {
            return Ok(());
        }
        pool.retain(block)?;
        if let Some(n) = self.live_mut(i) {
            n.block = block;
        }
        pool.release(old)?;
        Ok(())
    }

    /// Caches `block` as holding `tokens` (exactly one block of them) after `parent` (`None`:
    /// at the root). Takes a reference to the block. If the node exists already it is only
    /// marked used and keeps its own block. Returns the node, or `None` when a hash collision
    /// makes the position uncacheable.
    pub fn insert(
        &mut self,
        pool: &mut BlockPool,
        parent: Option<NodeRef>,
        tokens: &[u32],
        block: BlockId,
    ) -> Result<Option<NodeRef>> {
        if tokens.len() != self.block_size {
            return Err(CacheError::Config(format!(
                "a tree node holds {} tokens, got {}",
                self.block_size,
                tokens.len()
            )));
        }
        let parent = match parent {
            Some(r) => Some(self.resolve(r).ok_or(CacheError::StaleNode)?),
            None => None,
        };
        self.tick += 1;
        let (key, found) = self.child(parent, tokens);
        if let Some(i) = found {
            self.touch(i);
            return Ok(Some(self.node_ref(i)));
        }
        if self.by_key.contains_key(&key) {
            return Ok(None);
        }
        pool.retain(block)?;
        let node =
            Node { parent, key, tokens: tokens.into(), block, children: 0, last_used: self.tick, checkpoint: None };
        let index = match self.free_slots.pop() {
            Some(i) => {
                self.slots[i as usize].node = Some(node);
                i
            }
            None => {
                self.slots.push(Slot { generation: 0, node: Some(node) });
                (self.slots.len() - 1) as u32
            }
        };
        if let Some(p) = parent.and_then(|p| self.live_mut(p)) {
            p.children += 1;
        }
        self.by_key.insert(key, index);
        self.nodes += 1;
        Ok(Some(self.node_ref(index)))
    }

    /// Inserts the full blocks of `tokens` from the root, `blocks[i]` holding block `i`.
    /// Returns the nodes of the path (shorter than the blocks on a hash collision).
    pub fn insert_chain(&mut self, pool: &mut BlockPool, tokens: &[u32], blocks: &[BlockId]) -> Result<Vec<NodeRef>> {
        let mut path = Vec::new();
        let mut parent = None;
        for (blk, &b) in tokens.chunks_exact(self.block_size).zip(blocks) {
            match self.insert(pool, parent, blk, b)? {
                Some(n) => {
                    path.push(n);
                    parent = Some(n);
                }
                None => break,
            }
        }
        Ok(path)
    }

    /// The block a live node caches.
    pub fn block_of(&self, node: NodeRef) -> Option<BlockId> {
        self.resolve(node).and_then(|i| self.live(i)).map(|n| n.block)
    }

    /// Attaches a checkpoint of `bytes` bytes to `node` (replacing one it had), evicting least
    /// recently used checkpoints to stay within budget. `Ok(false)` when it cannot fit at all.
    pub fn attach_checkpoint(&mut self, node: NodeRef, payload: C, bytes: usize) -> Result<bool> {
        let index = self.resolve(node).ok_or(CacheError::StaleNode)?;
        if bytes > self.checkpoint_budget {
            return Ok(false);
        }
        self.drop_checkpoint(index);
        while self.checkpoint_bytes + bytes > self.checkpoint_budget {
            let lru = self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.node.as_ref()?.checkpoint.as_ref().map(|c| (c.last_used, i as u32)))
                .min();
            match lru {
                Some((_, i)) => self.drop_checkpoint(i),
                None => return Ok(false),
            }
        }
        self.tick += 1;
        let last_used = self.tick;
        if let Some(n) = self.live_mut(index) {
            n.checkpoint = Some(Checkpoint { payload, bytes, last_used });
        }
        self.checkpoint_bytes += bytes;
        self.checkpoints += 1;
        Ok(true)
    }

    fn drop_checkpoint(&mut self, index: u32) {
        if let Some(c) = self.live_mut(index).and_then(|n| n.checkpoint.take()) {
            self.checkpoint_bytes -= c.bytes;
            self.checkpoints -= 1;
        }
    }

    /// Whether `node` carries a checkpoint.
    pub fn has_checkpoint(&self, node: NodeRef) -> bool {
        self.resolve(node).and_then(|i| self.live(i)).is_some_and(|n| n.checkpoint.is_some())
    }

    /// The deepest checkpoint on the matched path at a position `<= max_tokens`: the
    /// position (in tokens) and the payload. Marks it recently used.
    pub fn deepest_checkpoint(&mut self, m: &PrefixMatch, max_tokens: usize) -> Option<(usize, &C)> {
        let depth = m
            .nodes
            .iter()
            .enumerate()
            .rev()
            .filter(|(d, _)| (d + 1) * self.block_size <= max_tokens)
            .find(|(_, r)| self.has_checkpoint(**r))
            .map(|(d, _)| d)?;
        let index = self.resolve(m.nodes[depth])?;
        self.tick += 1;
        let (tick, pos) = (self.tick, (depth + 1) * self.block_size);
        let cp = self.live_mut(index)?.checkpoint.as_mut()?;
        cp.last_used = tick;
        Some((pos, &cp.payload))
    }

    /// Blocks that [`Self::evict`] could free now: nodes no table references, with no such
    /// node below them.
    pub fn evictable_blocks(&self, pool: &BlockPool) -> usize {
        let mut pinned = vec![false; self.slots.len()];
        let mut count = 0;
        for (i, s) in self.slots.iter().enumerate() {
            let Some(n) = &s.node else { continue };
            if pool.refcount(n.block) <= 1 {
                continue;
            }
            let mut cur = Some(i as u32);
            while let Some(c) = cur {
                if pinned[c as usize] {
                    break;
                }
                pinned[c as usize] = true;
                count += 1;
                cur = self.live(c).and_then(|n| n.parent);
            }
        }
        self.nodes - count
    }

    /// Evicts least recently used leaves nobody else references until `want` blocks went back
    /// to the free list or nothing more can go. Returns the blocks freed.
    pub fn evict(&mut self, pool: &mut BlockPool, want: usize) -> usize {
        let mut heap: BinaryHeap<Reverse<(u64, u32)>> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let n = s.node.as_ref()?;
                (n.children == 0 && pool.refcount(n.block) == 1).then_some(Reverse((n.last_used, i as u32)))
            })
            .collect();
        let mut freed = 0;
        while freed < want {
            let Some(Reverse((_, i))) = heap.pop() else { break };
            let parent = self.live(i).and_then(|n| n.parent);
            if self.remove_leaf(pool, i) {
                freed += 1;
            }
            if let Some(p) = parent {
                if let Some(n) = self.live(p).filter(|n| n.children == 0 && pool.refcount(n.block) == 1) {
                    heap.push(Reverse((n.last_used, p)));
                }
            }
        }
        freed
    }

    /// Removes leaf `index`, releasing its block; returns whether the block became free.
    fn remove_leaf(&mut self, pool: &mut BlockPool, index: u32) -> bool {
        self.drop_checkpoint(index);
        let Some(slot) = self.slots.get_mut(index as usize) else { return false };
        let Some(node) = slot.node.take() else { return false };
        slot.generation = slot.generation.wrapping_add(1);
        self.free_slots.push(index);
        self.nodes -= 1;
        if self.by_key.get(&node.key) == Some(&index) {
            self.by_key.remove(&node.key);
        }
        if let Some(p) = node.parent.and_then(|p| self.live_mut(p)) {
            p.children -= 1;
        }
        pool.release(node.block).unwrap_or(false)
    }

    /// Drops every node and checkpoint, releasing the tree's block references.
    pub fn clear(&mut self, pool: &mut BlockPool) {
        for s in &mut self.slots {
            if let Some(n) = s.node.take() {
                let _ = pool.release(n.block);
                s.generation = s.generation.wrapping_add(1);
            }
        }
        self.free_slots = (0..self.slots.len() as u32).rev().collect();
        self.by_key.clear();
        self.nodes = 0;
        self.checkpoints = 0;
        self.checkpoint_bytes = 0;
    }

    /// Checks the tree's internal bookkeeping against itself and the pool (for tests).
    pub fn check_invariants(&self, pool: &BlockPool) -> std::result::Result<(), String> {
        let mut children = vec![0u32; self.slots.len()];
        let (mut nodes, mut cps, mut bytes) = (0, 0, 0);
        for (i, s) in self.slots.iter().enumerate() {
            let Some(n) = &s.node else { continue };
            nodes += 1;
            if pool.refcount(n.block) == 0 {
                return Err(format!("node {i} holds free block {}", n.block));
            }
            if let Some(p) = n.parent {
                if self.live(p).is_none() {
                    return Err(format!("node {i} has a dead parent {p}"));
                }
                children[p as usize] += 1;
            }
            if let Some(c) = &n.checkpoint {
                cps += 1;
                bytes += c.bytes;
            }
        }
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(n) = &s.node {
                if n.children != children[i] {
                    return Err(format!("node {i} counts {} children, has {}", n.children, children[i]));
                }
            }
        }
        if (nodes, cps, bytes) != (self.nodes, self.checkpoints, self.checkpoint_bytes) {
            return Err(format!(
                "counters {:?} vs actual {:?}",
                (self.nodes, self.checkpoints, self.checkpoint_bytes),
                (nodes, cps, bytes)
            ));
        }
        if bytes > self.checkpoint_budget {
            return Err(format!("checkpoints hold {bytes} bytes over a budget of {}", self.checkpoint_budget));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
