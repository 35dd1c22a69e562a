//! The KV cache formats (f16, q8_0, q4_0) keep the engine's invariants: within one format, a
//! prefix-cache hit and speculative decoding give the same greedy output as a plain run
//! (log-probabilities within 1e-4: the hit reads the very bytes the miss wrote); chunked
//! prefill and batching give the same tokens with log-probabilities within 2e-3 — a
//! different chunking or batch can change a key's last bits before it is rounded to 16, 8 or
//! 4 bits, and at a rounding boundary that moves the stored value by one step; no leaks; the
//! smaller formats hold proportionally more blocks in the same memory; and their output stays
//! close to the f32 cache's.

mod common;

use common::*;
use tandem_engine::*;
use tandem_model::kv::KvDtype;

/// Log-probability tolerance where a key may be rounded to the neighbouring step.
const ROUNDING_TOL: f32 = 2e-3;

fn cfg(kv: KvDtype) -> EngineConfig {
    EngineConfig { kv_dtype: kv, ..Default::default() }
}

/// Fixtures whose head dimension the format can store (the quantised formats need multiples
/// of 32; tiny/llama's heads are 16 wide).
fn models(kv: KvDtype) -> Vec<&'static str> {
    let mut v = vec!["tiny/qwen3", "tiny/gemma3", "hybrid/qwen3_5"];
    if !kv.is_quantized() {
        v.push("tiny/llama");
    }
    v
}

/// Eight different prompts from the fixture's prompt (rotations).
fn prompts(path: &str) -> Vec<Vec<u32>> {
    let p = prompt(path);
    (0..8).map(|i| p.iter().cycle().skip(i * 3).take(p.len() - i).copied().collect()).collect()
}

#[test]
fn cache_hits_chunking_and_batching_are_transparent_in_every_format() {
    let n = 16;
    for kv in [KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0] {
        for path in models(kv) {
            let what = format!("{path} {kv}");
            let off = engine(path, EngineConfig { prefix_cache: false, ..cfg(kv) });
            let ps = prompts(path);
            let alone: Vec<Outcome> = ps.iter().map(|p| run(&off, greedy(p.clone(), n))).collect();

            // Prefix-cache hit: the second run reuses the first's blocks (and checkpoint).
            let on = engine(path, cfg(kv));
            let first = run(&on, greedy(ps[0].clone(), n));
            let second = run(&on, greedy(ps[0].clone(), n));
            assert_same(&first, &alone[0], &format!("{what} miss"));
            assert_same(&second, &alone[0], &format!("{what} hit"));
            assert!(second.usage.cached_tokens >= BS, "{what}: {:?}", second.usage);

            // Chunked prefill, one token and seven tokens at a time.
            for chunk in [1, 7] {
                let e = engine(path, EngineConfig { prefill_chunk: chunk, prefix_cache: false, ..cfg(kv) });
                let got = run(&e, greedy(ps[0].clone(), n));
                assert_same_within(&got, &alone[0], &format!("{what} chunk {chunk}"), ROUNDING_TOL);
            }

            // Eight requests batched together.
            let rxs: Vec<_> = ps.iter().map(|p| off.submit(greedy(p.clone(), n)).expect("submit")).collect();
            for (i, (got, want)) in rxs.into_iter().map(collect).zip(&alone).enumerate() {
                assert_same_within(&got, want, &format!("{what} batch member {i}"), ROUNDING_TOL);
            }
            assert_no_leaks(&off);
            assert_no_leaks(&on);
        }
    }
}

#[test]
fn speculation_is_lossless_with_a_quantised_cache() {
    let n = 20;
    for kv in [KvDtype::Q8_0, KvDtype::Q4_0] {
        for (path, method) in [
            ("tiny/qwen3", SpecMethod::Ngram),
            ("hybrid/qwen3_5", SpecMethod::Ngram),
            ("hybrid/qwen3_5", SpecMethod::Mtp),
        ] {
            let plain = engine(path, cfg(kv));
            let speculative =
                SpecConfig { method, num_draft_tokens: 3, ngram_min: 1, ngram_max: 3, adaptive: false, draft_vocab: 0 };
            let spec = engine(path, EngineConfig { speculative, ..cfg(kv) });
            for p in prompts(path).into_iter().take(3) {
                let want = run(&plain, greedy(p.clone(), n));
                let got = run(&spec, greedy(p, n));
                assert_same(&got, &want, &format!("{path} {kv} {method:?}"));
                assert!(got.usage.speculative.drafted_tokens > 0, "{path} {kv} {method:?}: nothing drafted");
            }
            assert_no_leaks(&spec);
        }
    }
}

#[test]
fn smaller_formats_hold_more_blocks_in_the_same_memory() {
    let budget = MemoryBudget::Bytes(4 << 20);
    let blocks = |kv: KvDtype| {
        // Enough running sequences that the budget, not the context, bounds the pool.
        let e = engine("tiny/qwen3", EngineConfig { kv_memory: budget, max_running: 256, ..cfg(kv) });
        e.stats().kv_blocks_total.load(std::sync::atomic::Ordering::Relaxed)
    };
    let f32_blocks = blocks(KvDtype::F32);
    // Bytes per value: 4, 2, 34/32 and 18/32.
    for (kv, ratio) in [(KvDtype::F16, 2.0), (KvDtype::Q8_0, 4.0 * 32.0 / 34.0), (KvDtype::Q4_0, 4.0 * 32.0 / 18.0)] {
        let got = blocks(kv) as f64 / f32_blocks as f64;
        assert!((got - ratio).abs() < 0.02 * ratio, "{kv}: {got} times the f32 blocks, want {ratio}");
    }
    // The quantised formats refuse heads they cannot store, with a message that says why.
    let err = EngineHandle::load(&fixture("tiny/llama"), cfg(KvDtype::Q8_0)).err().expect("q8_0 on 16-wide heads");
    assert!(err.to_string().contains("multiple of 32"), "{err}");
}

/// The first steps' log-probabilities of the chosen tokens stay near the f32 cache's: each
/// format only rounds the stored keys and values (bounds ~10x the errors measured on these
/// fixtures).
#[test]
fn formats_stay_close_to_the_f32_cache() {
    for path in ["tiny/qwen3", "hybrid/qwen3_5"] {
        let p = prompt(path);
        let want = run(&engine(path, cfg(KvDtype::F32)), greedy(p.clone(), 1));
        let mut errs = Vec::new();
        for (kv, tol) in [(KvDtype::F16, 5e-3), (KvDtype::Q8_0, 0.1), (KvDtype::Q4_0, 0.5)] {
            let got = run(&engine(path, cfg(kv)), greedy(p.clone(), 1));
            let mut worst = 0f32;
            for a in &got.logprobs[0].top {
                let Some(b) = want.logprobs[0].top.iter().find(|b| b.id == a.id) else { continue };
                let err = (a.logprob - b.logprob).abs();
                eprintln!("{path} {kv}: top logprob {} vs {} (err {err:.2e})", a.logprob, b.logprob);
                assert!(err < tol, "{path} {kv}: {} vs {}", a.logprob, b.logprob);
                worst = worst.max(err);
            }
            errs.push(worst);
        }
        // Every format really rounds, and f16 much less than q4_0.
        assert!(errs[0] > 0.0 && errs[0] < errs[2], "{path}: worst errors f16, q8_0, q4_0 = {errs:?}");
    }
}
