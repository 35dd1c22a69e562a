//! Sliding-window layers in the engine (the tiny Gemma 3 fixture: window 8, four sliding-window
//! layers and one global): their KV lives in per-sequence rings, so a sequence's memory grows
//! only by the global layer's blocks; a budget that could not hold the sliding-window layers'
//! full KV still runs a long request to the end, unpreempted and exact; prefix hits inside and
//! beyond the window resume exactly from checkpoints that carry the window.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use tandem_engine::*;

const PATH: &str = "tiny/gemma3";

fn load(s: &std::sync::atomic::AtomicUsize) -> usize {
    s.load(Ordering::Relaxed)
}

/// A block holds the one global layer only; each running sequence's rings are 3 blocks
/// (window 8 - 1 + chunk 24, plus a block) of the four sliding-window layers, the same shape.
#[test]
fn window_memory_is_per_sequence_and_flat() {
    let probe = engine(PATH, EngineConfig::default());
    let st = probe.stats();
    let (block, ring) = (load(&st.kv_block_bytes), load(&st.kv_ring_bytes));
    assert!(block > 0);
    assert_eq!(ring, 3 * 4 * block, "rings: 3 blocks of the 4 sliding-window layers");
    let p = long_prompt(PATH, 40);
    let want = run(&engine(PATH, cache_off()), greedy(p.clone(), 160));

    // Room for two sequences' rings and 14 blocks of the global layer: 224 positions, enough
    // for this 200-position request; paging the sliding-window layers too would take 5x.
    let budget = (2 * ring + 14 * block) as u64;
    let cfg = EngineConfig { max_running: 2, kv_memory: MemoryBudget::Bytes(budget), ..cache_off() };
    let e = engine(PATH, cfg);
    assert_eq!(load(&e.stats().kv_blocks_total), 14);
    let mut rx = e.submit(greedy(p.clone(), 160)).unwrap();
    let mut ids = Vec::new();
    let mut live = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Token { id, .. } => {
                ids.push(id);
                live.push(load(&e.stats().kv_bytes));
            }
            GenerationEvent::Finished { .. } => break,
            GenerationEvent::Error(m) => panic!("{m}"),
        }
    }
    assert_eq!(ids, want.ids, "the long request under the tight budget");
    assert_eq!(load(&e.stats().preemptions), 0);
    // While it runs the sequence holds its rings and one global block per 16 positions: from
    // the prompt's 3 blocks up to the 13 of 200 positions, never more. The engine's peak says
    // it reached exactly that; the samples taken as tokens arrive (as many as this thread
    // sees before the engine is done: few on a busy machine) stay inside it and only grow.
    // The engine publishes its stats after a step has sent its tokens, so a sample may show
    // the step before: the prompt's first chunk of 24 positions, 2 blocks.
    assert_eq!(load(&e.stats().kv_bytes_peak), ring + 13 * block, "the peak: rings and 13 global blocks");
    let blocks: Vec<usize> = live
        .iter()
        .filter(|&&b| b > 0)
        .map(|&b| {
            let paged = b.checked_sub(ring).expect("a live sequence holds its rings");
            assert_eq!(paged % block, 0, "{b} bytes");
            paged / block
        })
        .collect();
    assert!(blocks.iter().all(|&n| (2..=13).contains(&n)), "{blocks:?}");
    assert!(blocks.windows(2).all(|w| w[0] <= w[1]), "{blocks:?}");
    assert_no_leaks(&e);
}

/// Block size 4: checkpoints every 4 positions, so a hit can land inside the window (4 < 8)
/// as well as far beyond it, after the ring has wrapped many times; every answer equals the
/// uncached one and the cached tokens are the deepest checkpoint on the match (prompt ends,
/// intervals of 32, the last block boundary each finished request reached).
#[test]
fn prefix_hits_inside_and_beyond_the_window_are_exact() {
    const B: usize = 4;
    let p = long_prompt(PATH, 120);
    let cfg =
        |prefix_cache| EngineConfig { block_size: B, prefix_cache, checkpoint_interval: 32, ..Default::default() };
    let (on, off) = (engine(PATH, cfg(true)), engine(PATH, cfg(false)));
    let mut held: Vec<(Vec<u32>, Vec<usize>)> = Vec::new(); // (tokens fed, checkpoints)
    let mut hits = Vec::new();
    // Before each request another one runs on the same state slot (slots are reused last in,
    // first out) and fills the ring with other keys, so a hit must restore the window itself.
    let other: Vec<u32> = p[..60].iter().rev().copied().collect();
    for (i, len) in [6usize, 30, 30, 110, 100].into_iter().enumerate() {
        let scrub = run(&on, greedy(other.clone(), 4));
        held.push(([&other[..], &scrub.ids[..3]].concat(), vec![56, 60]));
        let prompt = p[..len].to_vec();
        let n = 12;
        let got = run(&on, greedy(prompt.clone(), n));
        assert_same(&got, &run(&off, greedy(prompt.clone(), n)), &format!("request {i}"));
        let want = held
            .iter()
            .flat_map(|(fed, cps)| {
                let reach = common_prefix(&prompt, fed).min(len - 1);
                cps.iter().copied().filter(move |&c| c <= reach)
            })
            .max()
            .unwrap_or(0);
        assert_eq!(got.usage.cached_tokens, want, "request {i} ({len} tokens)");
        hits.push(want);
        let fed = [&prompt[..], &got.ids[..n - 1]].concat();
        let mut cps = vec![len / B * B, fed.len() / B * B];
        if len.is_multiple_of(B) {
            cps.push(len - B);
        }
        cps.extend((1..=len / 32).map(|k| 32 * k));
        held.push((fed, cps));
    }
    assert!(hits.iter().any(|&h| h > 0 && h < 8), "a hit inside the window: {hits:?}");
    assert!(hits.iter().any(|&h| h >= 64), "a hit far beyond the window: {hits:?}");
    assert!(load(&on.stats().checkpoints) >= 4);
    assert_no_leaks(&on);
    assert_no_leaks(&off);
}

/// A ring cannot be made smaller than the window and a chunk: a budget without room for the
/// running sequences' rings is a configuration error that says what to change.
#[test]
fn a_budget_without_room_for_the_rings_is_refused() {
    let probe = engine(PATH, EngineConfig::default());
    let ring = load(&probe.stats().kv_ring_bytes) as u64;
    let cfg = EngineConfig { max_running: 4, kv_memory: MemoryBudget::Bytes(3 * ring), ..Default::default() };
    let err = EngineHandle::load(&fixture(PATH), cfg).err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("--kv-memory") && msg.contains("--max-running"), "{msg}");
}
