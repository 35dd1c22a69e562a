//! The tier on its own: entries written behind and read back, refused when asked for other
//! tokens or another parent, the index rebuilt from the directory, the budget, listing.

use super::*;

fn tier(dir: &Path, budget: u64, fp: u128) -> DiskTier {
    DiskTier::open(
        &DiskCacheConfig { dir: dir.to_path_buf(), budget },
        fp,
        "test-model",
        Arc::new(DiskStats::default()),
    )
    .expect("tier")
}

fn block(i: u32) -> (Key, Vec<u32>, Vec<u8>) {
    let tokens: Vec<u32> = (i * 16..i * 16 + 16).collect();
    (chain_key(ROOT, &tokens), tokens, vec![i as u8; 1000])
}

#[test]
fn write_behind_read_back_reopen_and_evict() {
    let dir = tempfile::tempdir().unwrap();
    let t = tier(dir.path(), 1 << 20, 42);
    for i in 0..4 {
        let (key, tokens, bytes) = block(i);
        t.put(Job::Block { key, parent: ROOT, position: 16, tokens, bytes });
    }
    t.flush();
    let (key, tokens, bytes) = block(2);
    assert_eq!(t.read(Kind::Block, key, ROOT, &tokens), Some(bytes.clone()));
    assert_eq!(t.read(Kind::Block, key, key, &tokens), None, "another parent");
    // The refusal deleted it.
    assert!(!t.has(Kind::Block, key));
    drop(t);
    let t = tier(dir.path(), 1 << 20, 42);
    assert_eq!(t.shared.stats.entries.load(Ordering::Relaxed), 3, "index rebuilt from the names");
    let (k0, tok0, b0) = block(0);
    assert_eq!(t.read(Kind::Block, k0, ROOT, &tok0), Some(b0));
    assert_eq!(t.read(Kind::Block, k0, ROOT, &tok0[..15]), None, "other tokens");
    drop(t);
    // Another namespace sees none of it; a smaller budget evicts at open.
    assert_eq!(tier(dir.path(), 1 << 20, 43).shared.stats.entries.load(Ordering::Relaxed), 0);
    let small = tier(dir.path(), 2000, 42);
    assert!(small.shared.stats.bytes.load(Ordering::Relaxed) <= 2000);
    assert!(small.shared.stats.evictions.load(Ordering::Relaxed) >= 1);
    drop(small);
    let ns = namespaces(dir.path());
    assert_eq!(ns.len(), 2);
    assert!(ns.iter().all(|n| n.model == "test-model"));
    assert_eq!(ns.iter().map(|n| n.blocks).sum::<usize>(), 1, "two refused, one evicted");
}

#[test]
fn an_unwritable_directory_leaves_the_tier_off() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let cfg = DiskCacheConfig { dir: file, budget: 1 << 20 };
    assert!(DiskTier::open(&cfg, 1, "m", Arc::new(DiskStats::default())).is_none());
    let off = DiskCacheConfig { dir: dir.path().to_path_buf(), budget: 0 };
    assert!(DiskTier::open(&off, 1, "m", Arc::new(DiskStats::default())).is_none());
}

#[test]
fn block_copies_are_reserved_against_their_cap() {
    let dir = tempfile::tempdir().unwrap();
    let t = tier(dir.path(), 1 << 20, 42);
    let stats = &t.shared.stats;
    assert!(t.reserve_copy(HELD_COPY_BYTES - 10, 3));
    assert!(!t.reserve_copy(11, 2), "past the cap");
    assert_eq!(stats.dropped_writes.load(Ordering::Relaxed), 2);
    assert!(t.reserve_copy(10, 1), "up to the cap");
    t.release_copy(HELD_COPY_BYTES);
    assert_eq!(stats.held_copy_bytes.load(Ordering::Relaxed), 0);
    // A copy handed over is released once the writer has read it back.
    let store = tandem_model::kv::PagedKvStore::new(
        &[tandem_model::kv::LayerCacheSpec::Attention { kv_heads: 1, head_dim: 8 }],
        4,
        16,
        tandem_model::kv::KvDtype::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let copy = store.copy_blocks(&[1, 2]).unwrap();
    let entries: Vec<BlockEntry> = [1u32, 2]
        .iter()
        .map(|&i| {
            let (key, tokens, _) = block(i);
            BlockEntry { key, parent: ROOT, position: 16, tokens }
        })
        .collect();
    assert!(t.reserve_copy(copy.bytes() as u64, 2));
    t.put_blocks(entries, copy);
    t.flush();
    assert_eq!(stats.held_copy_bytes.load(Ordering::Relaxed), 0);
    assert_eq!(stats.pending.load(Ordering::Relaxed), 0);
    assert_eq!(stats.writes.load(Ordering::Relaxed), 2);
    let (key, tokens, _) = block(2);
    assert_eq!(t.read(Kind::Block, key, ROOT, &tokens), Some(store.read_block(2).unwrap()));
}
