//! The engine under memory rules: batch invariance and prefill-chunk equivalence with the
//! paged cache (attention-only and hybrid), nothing leaks after finishing, cancelling or
//! preempting, and with a tiny KV budget sixteen concurrent requests are preempted and
//! recomputed yet all produce exactly their outputs from running alone.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use tandem_engine::*;

/// Eight requests with overlapping prefixes in flight together give the same tokens as each
/// alone on an engine without a prefix cache.
#[test]
fn batch_invariance_with_prefix_sharing() {
    for path in ["tiny/llama", "tiny/gemma3", "hybrid/qwen3_5", "hybrid/qwen3_5_moe"] {
        let p = long_prompt(path, 200);
        let prompts: Vec<Vec<u32>> =
            (0..8).map(|i| if i % 2 == 0 { p[..20 + 6 * i].to_vec() } else { p[i..i + 25].to_vec() }).collect();
        let alone_engine = engine(path, cache_off());
        let alone: Vec<Outcome> = prompts.iter().map(|q| run(&alone_engine, greedy(q.clone(), 12))).collect();
        let e = engine(path, EngineConfig::default());
        let rxs: Vec<_> = prompts.iter().map(|q| e.submit(greedy(q.clone(), 12)).unwrap()).collect();
        for (i, (rx, want)) in rxs.into_iter().zip(&alone).enumerate() {
            assert_same(&collect(rx), want, &format!("{path}: request {i}"));
        }
        assert_no_leaks(&e);
        assert_no_leaks(&alone_engine);
    }
}

/// Prefill chunk sizes 1, 7, 64 and 500 give the same tokens and log-probabilities, with
/// the prefix cache on (chunks are also cut at checkpoint positions). The sliding-window
/// fixture's rings are sized from the chunk: 2 to 34 blocks against a 210-token sequence.
#[test]
fn chunk_equivalence_on_hybrid_models() {
    for path in ["hybrid/qwen3_next", "tiny/qwen2", "tiny/gemma3"] {
        let p = long_prompt(path, 200);
        let mut outs = Vec::new();
        for chunk in [1usize, 7, 64, 500] {
            let e = engine(path, EngineConfig { prefill_chunk: chunk, checkpoint_interval: 48, ..Default::default() });
            let first = run(&e, greedy(p.clone(), 10));
            // A second, cache-served request must agree too.
            let second = run(&e, greedy(p.clone(), 10));
            assert_same(&second, &first, &format!("{path} chunk {chunk}: cached rerun"));
            outs.push((chunk, first));
            assert_no_leaks(&e);
        }
        for (chunk, o) in &outs[1..] {
            assert_same(o, &outs[0].1, &format!("{path}: chunk {chunk} vs 1"));
        }
    }
}

#[test]
fn cancellation_frees_blocks_and_slots() {
    for (path, prefix_cache) in [("tiny/qwen2", true), ("hybrid/qwen3_5", true), ("hybrid/qwen3_5", false)] {
        let p = long_prompt(path, 200);
        let e = engine(path, EngineConfig { prefix_cache, ..Default::default() });
        let mut rxs: Vec<_> = (0..6).map(|i| e.submit(greedy(p[i..i + 40].to_vec(), 150)).unwrap()).collect();
        for rx in rxs.iter_mut().take(3) {
            let _ = rx.blocking_recv();
        }
        drop(rxs);
        assert_no_leaks(&e);
        assert!(e.stats().cancelled.load(Ordering::Relaxed) >= 1);
        if !prefix_cache {
            assert_eq!(e.stats().kv_blocks_used(), 0);
        }
        // Still serving, and correctly.
        let want = run(&engine(path, cache_off()), greedy(p[..30].to_vec(), 6));
        assert_same(&run(&e, greedy(p[..30].to_vec(), 6)), &want, path);
        assert_no_leaks(&e);
    }
}

/// A KV budget far below what sixteen concurrent requests need: some are preempted (their
/// KV dropped and recomputed later), the prefix cache is evicted, a few others are cancelled
/// while queued or running; every surviving request produces exactly its output from running
/// alone, and afterwards every block and slot is back.
#[test]
fn memory_pressure_preempts_and_recomputes_without_changing_outputs() {
    for path in ["tiny/llama", "hybrid/qwen3_5"] {
        let p = long_prompt(path, 200);
        let prompts: Vec<Vec<u32>> = (0..16).map(|i| p[i..i + 24].to_vec()).collect();
        let max_tokens = 40; // 64 positions, 4 blocks per request at most
        let reference = engine(path, cache_off());
        let alone: Vec<Outcome> = prompts.iter().map(|q| run(&reference, greedy(q.clone(), max_tokens))).collect();
        let block_bytes = reference.stats().kv_block_bytes.load(Ordering::Relaxed);
        assert!(block_bytes > 0);
        for prefix_cache in [true, false] {
            let cfg = EngineConfig {
                kv_memory: MemoryBudget::Bytes(10 * block_bytes as u64),
                prefix_cache,
                prefill_chunk: 16,
                ..Default::default()
            };
            let e = engine(path, cfg);
            assert_eq!(e.stats().kv_blocks_total.load(Ordering::Relaxed), 10);
            let rxs: Vec<_> = prompts.iter().map(|q| e.submit(greedy(q.clone(), max_tokens)).unwrap()).collect();
            // Four more that give up: two at once, two after their first token.
            let dropped: Vec<_> =
                (0..4).map(|i| e.submit(greedy(p[40 + i..64 + i].to_vec(), max_tokens)).unwrap()).collect();
            for (i, mut rx) in dropped.into_iter().enumerate() {
                if i >= 2 {
                    let _ = rx.blocking_recv();
                }
            }
            for (i, (rx, want)) in rxs.into_iter().zip(&alone).enumerate() {
                assert_same(&collect(rx), want, &format!("{path} (prefix cache {prefix_cache}): request {i}"));
            }
            let st = e.stats();
            assert!(st.preemptions.load(Ordering::Relaxed) > 0, "{path}: the budget should force preemption");
            assert_no_leaks(&e);
            if !prefix_cache {
                assert_eq!(st.kv_blocks_used(), 0);
            }
        }
    }
}

/// A request that cannot fit the whole pool even alone is refused with an error, not hung.
#[test]
fn a_request_larger_than_the_pool_is_refused() {
    let p = long_prompt("tiny/llama", 200);
    let probe = engine("tiny/llama", EngineConfig::default());
    let block_bytes = probe.stats().kv_block_bytes.load(Ordering::Relaxed) as u64;
    let e =
        engine("tiny/llama", EngineConfig { kv_memory: MemoryBudget::Bytes(3 * block_bytes), ..Default::default() });
    let mut rx = e.submit(greedy(p[..30].to_vec(), 40)).unwrap();
    let mut saw_error = false;
    while let Some(ev) = rx.blocking_recv() {
        if let GenerationEvent::Error(msg) = ev {
            assert!(msg.contains("--kv-memory"), "{msg}");
            saw_error = true;
        }
    }
    assert!(saw_error);
    // A small one still runs.
    let o = run(&e, greedy(p[..10].to_vec(), 5));
    assert_eq!(o.ids.len(), 5);
    assert_no_leaks(&e);
    let tiny = EngineConfig { kv_memory: MemoryBudget::Bytes(block_bytes - 1), ..Default::default() };
    assert!(
        EngineHandle::load(&fixture("tiny/llama"), tiny).is_err(),
        "a pool without a single block is a config error"
    );
}

/// The pool never takes more than the configuration can fill: with one running sequence and
/// a 64-token context, two contexts' blocks (the sequence's and one of cached prefixes) out of
/// a budget that would allow thousands; a long request still runs to the end of its context.
#[test]
fn the_pool_is_sized_from_the_context_and_the_running_sequences() {
    let path = "tiny/llama";
    let big = MemoryBudget::Bytes(1 << 30);
    let cfg = EngineConfig { max_running: 1, context_length: 64, kv_memory: big, ..Default::default() };
    let e = engine(path, cfg);
    let bs = EngineConfig::default().block_size;
    assert_eq!(e.stats().kv_blocks_total.load(Ordering::Relaxed), 2 * 64usize.div_ceil(bs));
    let p = long_prompt(path, 40);
    let got = run(&e, greedy(p, 24));
    assert_eq!(got.usage.completion_tokens, 24);
    let wide = engine(path, EngineConfig { max_running: 3, context_length: 64, kv_memory: big, ..Default::default() });
    assert_eq!(wide.stats().kv_blocks_total.load(Ordering::Relaxed), 4 * 64usize.div_ceil(bs));
    assert_no_leaks(&e);
}
