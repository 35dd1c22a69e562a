//! Helpers shared by the cache and memory tests: fixtures, greedy requests with logprobs,
//! collecting a stream, comparing outcomes within tolerance, and waiting for the engine to
//! give every block and slot back.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use candle_core::Device;
use tandem_engine::*;

pub const BS: usize = 16;

/// `tiny/llama`, `hybrid/qwen3_5`, ...
pub fn fixture(path: &str) -> PathBuf {
    fixtures_root().join(path)
}

/// The repository's `fixtures/`, or `TANDEM_FIXTURES` (the device suite runs on a machine
/// where the checkout lives elsewhere).
pub fn fixtures_root() -> PathBuf {
    match std::env::var_os("TANDEM_FIXTURES") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures"),
    }
}

pub fn is_hybrid(path: &str) -> bool {
    path.starts_with("hybrid/")
}

/// Fixtures with sliding-window layers (window 8), whose rings make them resume at checkpoints.
pub fn is_sliding(path: &str) -> bool {
    path.ends_with("gemma3")
}

/// Models whose prefix hits are the deepest checkpoint on the match (recurrent state or
/// sliding-window rings), not the whole match.
pub fn resumes_at_checkpoints(path: &str) -> bool {
    is_hybrid(path) || is_sliding(path)
}

/// Prefill chunk of sliding-window fixtures where a test does not choose one: their rings
/// ((8 - 1 + 24) / 16 + 1 = 3 blocks, 48 positions) then wrap inside every suite's prompts.
pub const SLIDING_CHUNK: usize = 24;

pub fn engine(path: &str, mut cfg: EngineConfig) -> EngineHandle {
    if is_sliding(path) && cfg.prefill_chunk == EngineConfig::default().prefill_chunk {
        cfg.prefill_chunk = SLIDING_CHUNK;
    }
    EngineHandle::load(&fixture(path), cfg).expect("engine")
}

pub fn cache_off() -> EngineConfig {
    EngineConfig { prefix_cache: false, ..Default::default() }
}

pub fn prompt(path: &str) -> Vec<u32> {
    let r = candle_core::safetensors::load(fixture(path).join("reference.safetensors"), &Device::Cpu).unwrap();
    r["prompt_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect()
}

/// Greedy, EOS ignored, with the top-5 logprobs of every step (the logits' proxy).
pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: prompt,
        stop: StopParams { max_tokens, ignore_eos: true, ..Default::default() },
        logprobs: Some(5),
        ..Default::default()
    }
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub ids: Vec<u32>,
    pub usage: Usage,
    pub logprobs: Vec<PositionLogprobs>,
    pub reason: Option<FinishReason>,
}

pub fn collect(mut rx: tokio::sync::mpsc::Receiver<GenerationEvent>) -> Outcome {
    let mut o = Outcome { ids: vec![], usage: Usage::default(), logprobs: vec![], reason: None };
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Token { id, logprobs, .. } => {
                o.ids.push(id);
                o.logprobs.extend(logprobs);
            }
            GenerationEvent::Finished { reason, usage, .. } => {
                o.reason = Some(reason);
                o.usage = usage;
                break;
            }
            GenerationEvent::Error(e) => panic!("engine error: {e}"),
        }
    }
    o
}

pub fn run(e: &EngineHandle, req: GenerateRequest) -> Outcome {
    collect(e.submit(req).expect("submit"))
}

/// Same tokens, and every step's top-5 log-probabilities within `1e-4`.
pub fn assert_same(got: &Outcome, want: &Outcome, what: &str) {
    assert_same_within(got, want, what, 1e-4)
}

/// Same tokens, and every step's top-5 log-probabilities within `tol`.
pub fn assert_same_within(got: &Outcome, want: &Outcome, what: &str, tol: f32) {
    assert_eq!(got.ids, want.ids, "{what}: tokens differ");
    assert_eq!(got.logprobs.len(), want.logprobs.len(), "{what}");
    for (step, (a, b)) in got.logprobs.iter().zip(&want.logprobs).enumerate() {
        let (ta, tb): (Vec<_>, Vec<_>) = (a.top.iter().map(|t| t.id).collect(), b.top.iter().map(|t| t.id).collect());
        assert_eq!(ta[0], tb[0], "{what}: step {step} best token");
        for (x, y) in a.top.iter().zip(&b.top) {
            if x.id == y.id {
                assert!(
                    (x.logprob - y.logprob).abs() < tol,
                    "{what}: step {step} logprob {} vs {}",
                    x.logprob,
                    y.logprob
                );
            }
        }
        assert!((a.chosen.logprob - b.chosen.logprob).abs() < tol, "{what}: step {step} chosen logprob");
    }
}

fn load(a: &std::sync::atomic::AtomicUsize) -> usize {
    a.load(Ordering::Relaxed)
}

/// Waits until nothing runs or waits and every block not held by the prefix cache is free,
/// every state slot too, and no live sequence holds bytes; panics after 30 s.
pub fn assert_no_leaks(e: &EngineHandle) {
    let s = e.stats();
    let t = Instant::now();
    loop {
        let idle = load(&s.running) == 0 && load(&s.waiting) == 0;
        let blocks_ok = s.kv_blocks_used() == load(&s.prefix_cache_blocks);
        let slots_ok = load(&s.state_slots_free) == load(&s.state_slots_total) && load(&s.state_slots_total) > 0;
        if idle && blocks_ok && slots_ok && load(&s.kv_bytes) == 0 {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "leak: running {} waiting {} blocks used {} (prefix cache {}) of {}, slots free {} of {}, kv bytes {}",
            load(&s.running),
            load(&s.waiting),
            s.kv_blocks_used(),
            load(&s.prefix_cache_blocks),
            load(&s.kv_blocks_total),
            load(&s.state_slots_free),
            load(&s.state_slots_total),
            load(&s.kv_bytes)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Length of the common prefix of two token lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The fixture's prompt repeated to `n` tokens (the tiny Llama-family prompts have 40).
pub fn long_prompt(path: &str, n: usize) -> Vec<u32> {
    prompt(path).into_iter().cycle().take(n).collect()
}
