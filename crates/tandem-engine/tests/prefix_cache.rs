//! Cache transparency: with the prefix cache on, a repeated request, a request sharing a
//! prefix and every turn of a multi-turn conversation give the same greedy tokens and
//! log-probabilities (within 1e-4) as with the cache off, and report the cached prompt tokens:
//! the whole matched prefix for attention-only models, the deepest checkpoint on it for hybrid
//! ones and for sliding-window ones (whose rings hold only the last window: a checkpoint keeps
//! it), at prompt ends, message boundaries, `checkpoint_interval`, and the last block boundary
//! a finished request reached while generating. The sliding-window fixture's window (8) is far
//! below the prompts, so hits land beyond it.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use tandem_engine::*;

const MODELS: [&str; 6] =
    ["tiny/llama", "tiny/qwen3", "tiny/gemma3", "hybrid/qwen3_5", "hybrid/qwen3_next", "hybrid/qwen3_5_moe"];

/// Cached tokens expected when `prompt` is looked up in a tree that holds the blocks of
/// `fed` (tokens some earlier sequence fed) and, for hybrid models, checkpoints at
/// `checkpoints`.
fn expected_hit(path: &str, prompt: &[u32], fed: &[u32], checkpoints: &[usize]) -> usize {
    let common = common_prefix(prompt, fed);
    let limit = prompt.len() - 1;
    if resumes_at_checkpoints(path) {
        checkpoints.iter().copied().filter(|&c| c <= common.min(limit)).max().unwrap_or(0)
    } else {
        (common / BS * BS).min(limit)
    }
}

/// Checkpoints a prompt of `len` tokens leaves (no boundaries, default interval).
fn prompt_end_checkpoints(len: usize) -> Vec<usize> {
    let mut c = vec![len / BS * BS];
    if len.is_multiple_of(BS) {
        c.push(len - BS);
    }
    c
}

#[test]
fn repeated_and_shared_prefix_requests_are_transparent() {
    for path in MODELS {
        let p = prompt(path);
        let (on, off) = (engine(path, EngineConfig::default()), engine(path, cache_off()));
        let short = p[..p.len() * 2 / 3].to_vec();
        let a_off = run(&off, greedy(short.clone(), 8));
        let a1 = run(&on, greedy(short.clone(), 8));
        assert_same(&a1, &a_off, &format!("{path}: first run"));
        assert_eq!(a1.usage.cached_tokens, 0);
        let fed: Vec<u32> = [&short[..], &a1.ids[..7]].concat();
        let a2 = run(&on, greedy(short.clone(), 8));
        assert_same(&a2, &a_off, &format!("{path}: repeated"));
        let want = expected_hit(path, &short, &fed, &prompt_end_checkpoints(short.len()));
        assert!(want > 0);
        assert_eq!(a2.usage.cached_tokens, want, "{path}: cached tokens of the repeat");
        // The whole prompt shares `short` with the cached run.
        let b = run(&on, greedy(p.clone(), 8));
        assert_same(&b, &run(&off, greedy(p.clone(), 8)), &format!("{path}: shared prefix"));
        assert_eq!(b.usage.cached_tokens, expected_hit(path, &p, &fed, &prompt_end_checkpoints(short.len())), "{path}");
        let st = on.stats();
        assert!(st.prefix_hit_tokens.load(Ordering::Relaxed) >= want + b.usage.cached_tokens);
        assert!(st.prefix_hit_ratio() > 0.0 && st.prefix_hit_ratio() < 1.0);
        if resumes_at_checkpoints(path) {
            assert!(st.checkpoints.load(Ordering::Relaxed) >= 1, "{path}: checkpoints held");
        }
        assert_no_leaks(&on);
        assert_no_leaks(&off);
        assert_eq!(off.stats().kv_blocks_used(), 0, "{path}: without a prefix cache every block comes back");
    }
}

/// A conversation: each turn's prompt is the previous prompt, the previous answer and a new
/// user message, with message boundaries. Every turn equals the uncached run.
#[test]
fn multi_turn_conversation_is_transparent() {
    for path in MODELS {
        let p = prompt(path);
        let (on, off) = (engine(path, EngineConfig::default()), engine(path, cache_off()));
        let mut prompt_ids = p[..30].to_vec();
        let mut boundaries = vec![10, 30];
        let mut prev: Option<(Vec<u32>, Vec<usize>)> = None; // (fed tokens, checkpoints)
        for turn in 0..4 {
            let req = GenerateRequest { message_boundaries: boundaries.clone(), ..greedy(prompt_ids.clone(), 8) };
            let got = run(&on, req.clone());
            let want = run(&off, req);
            assert_same(&got, &want, &format!("{path}: turn {turn}"));
            match &prev {
                None => assert_eq!(got.usage.cached_tokens, 0),
                Some((fed, cps)) => {
                    let hit = expected_hit(path, &prompt_ids, fed, cps);
                    assert!(hit > 0, "{path}: turn {turn} should hit");
                    assert_eq!(got.usage.cached_tokens, hit, "{path}: turn {turn}");
                }
            }
            // Checkpoints this turn left: prompt end and every boundary, block-aligned.
            let mut cps: Vec<usize> = boundaries.iter().chain([&prompt_ids.len()]).map(|&b| b / BS * BS).collect();
            if let Some((_, old)) = &prev {
                cps.extend(old);
            }
            let fed = [&prompt_ids[..], &got.ids[..7]].concat();
            // And the last block boundary reached while generating (kept when it finished).
            let last = fed.len() / BS * BS;
            if last > prompt_ids.len() {
                cps.push(last);
            }
            prev = Some((fed, cps));
            prompt_ids.extend(&got.ids);
            boundaries.push(prompt_ids.len());
            prompt_ids.extend(p.iter().cycle().skip(17 * turn + 5).take(20));
            boundaries.push(prompt_ids.len());
        }
        assert_no_leaks(&on);
    }
}

/// Hybrid models checkpoint every `checkpoint_interval` tokens of a long prefill; a request
/// diverging inside the prompt resumes from the last interval checkpoint before the split.
#[test]
fn interval_checkpoints_serve_a_diverging_prompt() {
    for path in ["hybrid/qwen3_5", "hybrid/qwen3_next"] {
        let p = prompt(path);
        assert!(p.len() > 110);
        let on = engine(path, EngineConfig { checkpoint_interval: 32, ..Default::default() });
        let off = engine(path, cache_off());
        run(&on, greedy(p.clone(), 2));
        let held = on.stats().checkpoints.load(Ordering::Relaxed);
        assert!(held >= p.len() / 32, "{path}: {held} checkpoints for a {} token prompt", p.len());
        let mut other = p[..100].to_vec();
        other.extend(p[100..].iter().rev());
        let got = run(&on, greedy(other.clone(), 6));
        assert_eq!(got.usage.cached_tokens, 96, "{path}");
        assert_same(&got, &run(&off, greedy(other, 6)), path);
        assert_no_leaks(&on);
    }
}

/// Without room for a single checkpoint a hybrid or sliding-window model gets no hits but
/// stays correct, and an attention-only model is unaffected.
#[test]
fn no_checkpoint_memory_means_no_hybrid_hits() {
    for path in ["hybrid/qwen3_5", "tiny/gemma3", "tiny/llama"] {
        let p = prompt(path);
        let cfg = EngineConfig { checkpoint_memory: MemoryBudget::Bytes(1), ..Default::default() };
        let on = engine(path, cfg);
        let want = run(&engine(path, cache_off()), greedy(p.clone(), 6));
        run(&on, greedy(p.clone(), 6));
        let again = run(&on, greedy(p.clone(), 6));
        assert_same(&again, &want, path);
        assert_eq!(on.stats().checkpoints.load(Ordering::Relaxed), 0);
        assert_eq!(again.usage.cached_tokens > 0, !resumes_at_checkpoints(path), "{path}");
        assert_no_leaks(&on);
    }
}

/// A message boundary past the prompt (where a thinking budget cuts the reasoning) leaves a
/// checkpoint when decoding reaches it, however far the request runs beyond, with speculation
/// on too (`scheduler/tests.rs` checks that accepted drafts do not jump over it); a
/// continuation that diverges right after the boundary resumes there.
#[test]
fn boundaries_past_the_prompt_are_checkpointed_while_decoding() {
    let path = "hybrid/qwen3_5";
    let p = prompt(path)[..40].to_vec();
    let cut = p.len() + 2 * BS + 3;
    let fixed = |method| SpecConfig { method, adaptive: false, ngram_min: 1, ..Default::default() };
    for spec in [SpecConfig::default(), fixed(SpecMethod::Ngram), fixed(SpecMethod::Mtp)] {
        let on = engine(path, EngineConfig { speculative: spec.clone(), ..EngineConfig::default() });
        let off = engine(path, cache_off());
        let first = GenerateRequest { message_boundaries: vec![cut], ..greedy(p.clone(), 3 * BS + 10) };
        let a = run(&on, first);
        // The continuation: prompt + what was generated up to the cut + something else.
        let mut next = [&p[..], &a.ids[..cut - p.len()]].concat();
        next.extend(p.iter().rev().take(5));
        let got = run(&on, greedy(next.clone(), 4));
        assert_eq!(got.usage.cached_tokens, cut / BS * BS, "{path} {:?}: resumes at the cut", spec.method);
        assert_same(&got, &run(&off, greedy(next, 4)), path);
        assert_no_leaks(&on);
    }
}
