//! Prefix tree: lookups, LRU eviction of unreferenced leaves only, checkpoint budget and LRU,
//! stale handles, and a randomised no-leak run against the pool.

use super::*;
use crate::table::BlockTable;

const BS: usize = 4;

fn toks(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

/// A sequence that wrote `tokens` into fresh blocks and cached its full blocks.
fn cached(tree: &mut PrefixTree<u32>, pool: &mut BlockPool, tokens: &[u32]) -> (BlockTable, Vec<NodeRef>) {
    let mut t = BlockTable::new();
    t.prepare_write(pool, 0, tokens.len()).unwrap();
    let path = tree.insert_chain(pool, tokens, t.blocks()).unwrap();
    (t, path)
}

#[test]
fn lookup_finds_the_longest_full_block_prefix() {
    let mut pool = BlockPool::new(16, BS).unwrap();
    let mut tree = PrefixTree::<u32>::new(BS, 0);
    let a = toks(0, 10); // two full blocks and a partial one
    let (mut ta, path) = cached(&mut tree, &mut pool, &a);
    assert_eq!(path.len(), 2);
    assert_eq!(tree.node_count(), 2);
    assert_eq!(pool.refcount(ta.blocks()[0]), 2);
    assert_eq!(pool.refcount(ta.blocks()[2]), 1, "partial blocks are not cached");
    let mut b = toks(0, 6);
    b.push(99);
    b.extend(toks(7, 5));
    let m = tree.lookup(&b);
    assert_eq!(m.blocks, ta.blocks()[..1].to_vec(), "diverges inside the second block");
    let m = tree.lookup(&toks(0, 8));
    assert_eq!(m.blocks, ta.blocks()[..2].to_vec());
    assert!(tree.lookup(&toks(1, 8)).blocks.is_empty());
    // Re-inserting the same tokens with other blocks keeps the tree's blocks.
    let (mut tb, path_b) = cached(&mut tree, &mut pool, &toks(0, 8));
    assert_eq!(path_b, path);
    assert_eq!(tree.node_count(), 2);
    assert_eq!(pool.refcount(tb.blocks()[0]), 1);
    ta.release(&mut pool).unwrap();
    tb.release(&mut pool).unwrap();
    tree.check_invariants(&pool).unwrap();
    assert_eq!(pool.used_count(), 2);
    tree.clear(&mut pool);
    assert_eq!(pool.free_count(), 16);
}

/// A node can take another block with the same tokens (one that holds more: a proposer's KV);
/// the tree's reference moves from the old block to the new one.
#[test]
fn a_node_can_take_a_richer_block() {
    let mut pool = BlockPool::new(16, BS).unwrap();
    let mut tree = PrefixTree::<u32>::new(BS, 0);
    let (mut ta, path) = cached(&mut tree, &mut pool, &toks(0, 8));
    let mut tb = BlockTable::new();
    tb.prepare_write(&mut pool, 0, 8).unwrap();
    let (old, new) = (ta.blocks()[1], tb.blocks()[1]);
    assert_eq!(tree.node_block(path[1]), Some(old));
    tree.replace_block(&mut pool, path[1], new).unwrap();
    assert_eq!(tree.node_block(path[1]), Some(new));
    assert_eq!(tree.lookup(&toks(0, 8)).blocks, vec![ta.blocks()[0], new]);
    assert_eq!((pool.refcount(old), pool.refcount(new)), (1, 2));
    tree.check_invariants(&pool).unwrap();
    ta.release(&mut pool).unwrap();
    tb.release(&mut pool).unwrap();
    tree.check_invariants(&pool).unwrap();
    assert_eq!(pool.used_count(), 2);
    tree.clear(&mut pool);
    assert_eq!(pool.free_count(), 16);
}

#[test]
fn eviction_is_lru_over_unreferenced_leaves() {
    let mut pool = BlockPool::new(16, BS).unwrap();
    let mut tree = PrefixTree::<u32>::new(BS, 0);
    // Shared first block, two branches of one block each.
    let a: Vec<u32> = [toks(0, 4), toks(100, 4)].concat();
    let b: Vec<u32> = [toks(0, 4), toks(200, 4)].concat();
    let (mut ta, _) = cached(&mut tree, &mut pool, &a);
    let (mut tb, _) = cached(&mut tree, &mut pool, &b);
    assert_eq!(tree.node_count(), 3);
    // While both tables hold their blocks nothing can go.
    assert_eq!(tree.evictable_blocks(&pool), 0);
    assert_eq!(tree.evict(&mut pool, 10), 0);
    ta.release(&mut pool).unwrap();
    tb.release(&mut pool).unwrap();
    assert_eq!(tree.evictable_blocks(&pool), 3);
    tree.lookup(&a); // a's branch is now the most recent
    assert_eq!(tree.evict(&mut pool, 1), 1);
    assert_eq!(tree.lookup(&b).blocks.len(), 1, "b's leaf went first");
    assert_eq!(tree.lookup(&a).blocks.len(), 2);
    // A table holding the root block pins it, but not the leaf below it.
    let m = tree.lookup(&a);
    let mut tc = BlockTable::new();
    tc.share_prefix(&mut pool, &m.blocks[..1]).unwrap();
    assert_eq!(tree.evictable_blocks(&pool), 1);
    assert_eq!(tree.evict(&mut pool, 10), 1);
    assert_eq!(tree.node_count(), 1);
    tc.release(&mut pool).unwrap();
    assert_eq!(tree.evict(&mut pool, 10), 1);
    assert_eq!((tree.node_count(), pool.free_count()), (0, 16));
    tree.check_invariants(&pool).unwrap();
}

#[test]
fn parents_become_evictable_after_their_children() {
    let mut pool = BlockPool::new(8, BS).unwrap();
    let mut tree = PrefixTree::<u32>::new(BS, 0);
    let (mut t, _) = cached(&mut tree, &mut pool, &toks(0, 16));
    t.release(&mut pool).unwrap();
    assert_eq!(tree.evict(&mut pool, 3), 3);
    assert_eq!(tree.lookup(&toks(0, 16)).blocks.len(), 1, "evicted from the leaf up");
    tree.check_invariants(&pool).unwrap();
}

#[test]
fn stale_handles_are_detected() {
    let mut pool = BlockPool::new(8, BS).unwrap();
    let mut tree = PrefixTree::<u32>::new(BS, 0);
    let (mut t, path) = cached(&mut tree, &mut pool, &toks(0, 4));
    t.release(&mut pool).unwrap();
    tree.evict(&mut pool, 1);
    let b = pool.allocate().unwrap();
    assert_eq!(tree.insert(&mut pool, Some(path[0]), &toks(4, 4), b), Err(CacheError::StaleNode));
    // The slot is reused by a new node; the old handle still does not resolve.
    let fresh = tree.insert(&mut pool, None, &toks(50, 4), b).unwrap().unwrap();
    assert_ne!(fresh, path[0]);
    assert_eq!(tree.block_of(path[0]), None);
    assert_eq!(tree.block_of(fresh), Some(b));
    assert!(tree.insert(&mut pool, None, &toks(0, 3), b).is_err(), "a node holds exactly one block");
}

#[test]
fn checkpoints_have_their_own_budget_and_lru() {
    let mut pool = BlockPool::new(16, BS).unwrap();
    let mut tree = PrefixTree::<u32>::new(BS, 100);
    let seq = toks(0, 16);
    let (mut t, path) = cached(&mut tree, &mut pool, &seq);
    assert!(tree.attach_checkpoint(path[0], 4, 40).unwrap());
    assert!(tree.attach_checkpoint(path[1], 8, 40).unwrap());
    // The deepest checkpoint at or before a position.
    let m = tree.lookup(&seq);
    assert_eq!(tree.deepest_checkpoint(&m, 16).map(|(p, c)| (p, *c)), Some((8, 8)));
    assert_eq!(tree.deepest_checkpoint(&m, 7).map(|(p, c)| (p, *c)), Some((4, 4)));
    assert_eq!(tree.deepest_checkpoint(&m, 3), None);
    // Over budget: the least recently used checkpoint (position 8, used before position 4) goes.
    assert!(tree.attach_checkpoint(path[3], 16, 40).unwrap());
    assert_eq!(tree.checkpoint_count(), 2);
    assert!(tree.has_checkpoint(path[0]) && !tree.has_checkpoint(path[1]));
    assert_eq!(tree.node_count(), 4, "nodes keep their KV after losing a checkpoint");
    // Replacing a node's checkpoint does not double count; an oversized one is refused.
    assert!(tree.attach_checkpoint(path[3], 17, 40).unwrap());
    assert_eq!(tree.checkpoint_bytes(), 80);
    assert!(!tree.attach_checkpoint(path[2], 0, 101).unwrap());
    // Evicting a node drops its checkpoint.
    t.release(&mut pool).unwrap();
    tree.evict(&mut pool, 1);
    assert_eq!((tree.checkpoint_count(), tree.checkpoint_bytes()), (1, 40));
    tree.check_invariants(&pool).unwrap();
    tree.clear(&mut pool);
    assert_eq!((tree.checkpoint_count(), pool.free_count()), (0, 16));
}

/// Random sequences come and go, sharing prefixes through the tree; eviction runs under
/// pressure. Nothing leaks and the bookkeeping stays consistent throughout.
#[test]
fn randomised_run_leaks_nothing() {
    let mut pool = BlockPool::new(40, BS).unwrap();
    let mut tree = PrefixTree::<u32>::new(BS, 64);
    let mut live: Vec<BlockTable> = Vec::new();
    let (mut evicted, mut copied, mut refused) = (0, 0, 0);
    let mut rng = 0x2545_f491_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for step in 0..2000 {
        let r = next();
        if r % 3 == 0 && !live.is_empty() {
            let i = (next() as usize) % live.len();
            live.swap_remove(i).release(&mut pool).unwrap();
        } else {
            // Prompts from a small alphabet of prefixes so that they share.
            let len = 1 + (next() as usize) % 20;
            let family = (next() % 3) as u32;
            let tokens: Vec<u32> =
                (0..len as u32).map(|i| family * 1000 + if i < 9 { i } else { i + (next() % 2) as u32 }).collect();
            let m = tree.lookup(&tokens);
            let hit = (m.blocks.len() * BS).min(len - 1);
            let mut t = BlockTable::new();
            let shared = pool.blocks_for(hit);
            t.share_prefix(&mut pool, &m.blocks[..shared]).unwrap();
            let need = t.blocks_needed(&pool, hit, len);
            if need > pool.free_count() {
                let short = need - pool.free_count();
                evicted += tree.evict(&mut pool, short);
            }
            match t.prepare_write(&mut pool, hit, len) {
                Ok(copies) => {
                    copied += copies.len();
                    let path = tree.insert_chain(&mut pool, &tokens, t.blocks()).unwrap();
                    if let Some(&last) = path.last() {
                        tree.attach_checkpoint(last, step, 8 + (step as usize % 20)).unwrap();
                    }
                    live.push(t);
                }
                Err(CacheError::OutOfBlocks { .. }) => {
                    refused += 1;
                    t.release(&mut pool).unwrap()
                }
                Err(e) => panic!("{e}"),
            }
        }
        tree.check_invariants(&pool).unwrap();
        let table_refs: usize = live.iter().map(|t| t.blocks().len()).sum();
        let refs: u32 = (0..pool.total() as u32).map(|b| pool.refcount(b)).sum();
        assert_eq!(refs as usize, table_refs + tree.node_count(), "step {step}");
    }
    assert!(evicted > 0 && copied > 0 && refused > 0, "{evicted} evicted, {copied} copied, {refused} refused");
    for mut t in live {
        t.release(&mut pool).unwrap();
    }
    assert_eq!(tree.evictable_blocks(&pool), tree.node_count());
    tree.evict(&mut pool, usize::MAX);
    assert_eq!((tree.node_count(), pool.free_count()), (0, pool.total()));
}
