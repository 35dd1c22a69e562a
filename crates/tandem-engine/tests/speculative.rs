//! Speculative decoding is lossless: for every proposer (n-gram prompt lookup, a draft model,
//! the MTP head of the hybrid fixtures), on a prefix-cache miss and hit, alone and in a batch
//! of 8, greedy output equals plain greedy decoding token for token (with log-probabilities
//! within 1e-4). Sampled output keeps the model's distribution (chi-square), and nothing
//! leaks, including requests cancelled while they speculate.

mod common;

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use common::*;
use tandem_engine::*;

fn spec_cfg(method: SpecMethod, k: usize) -> EngineConfig {
    EngineConfig {
        speculative: SpecConfig {
            method,
            num_draft_tokens: k,
            ngram_min: 1,
            ngram_max: 3,
            adaptive: false,
            draft_vocab: 0,
        },
        ..Default::default()
    }
}

fn spec_engine(path: &str, method: SpecMethod, draft: Option<&str>, k: usize) -> EngineHandle {
    let dev = tandem_model::device::default_device().expect("device");
    let target = tandem_model::loader::load(&fixture(path), &dev).expect("target");
    let draft = draft.map(|d| tandem_model::loader::load(&fixture(d), &dev).expect("draft"));
    EngineHandle::start_with_draft(target, draft, spec_cfg(method, k)).expect("engine")
}

/// Eight different prompts from the fixture's prompt (rotations), the first the prompt itself.
fn prompts(path: &str) -> Vec<Vec<u32>> {
    let p = prompt(path);
    (0..8).map(|i| p.iter().cycle().skip(i * 5).take(p.len() - i).copied().collect()).collect()
}

fn run_batch(e: &EngineHandle, reqs: Vec<GenerateRequest>) -> Vec<Outcome> {
    let rxs: Vec<_> = reqs.into_iter().map(|r| e.submit(r).expect("submit")).collect();
    rxs.into_iter().map(collect).collect()
}

/// (model, method, draft model) combinations under test.
fn cases() -> Vec<(&'static str, SpecMethod, Option<&'static str>)> {
    let mut v = Vec::new();
    for path in ["tiny/llama", "tiny/qwen3", "tiny/gemma3", "hybrid/qwen3_5", "hybrid/qwen3_next", "hybrid/qwen3_5_moe"]
    {
        v.push((path, SpecMethod::Ngram, None));
        // A draft that always agrees (the model itself, attention-only) and one that mostly
        // does not (another fixture with the same vocabulary).
        if !is_hybrid(path) {
            v.push((path, SpecMethod::Draft, Some(path)));
        }
        v.push((path, SpecMethod::Draft, Some(if path == "tiny/qwen2" { "tiny/llama" } else { "tiny/qwen2" })));
        if is_hybrid(path) {
            v.push((path, SpecMethod::Mtp, None));
        }
    }
    v
}

#[test]
fn greedy_output_is_unchanged_by_every_proposer() {
    let n = 24;
    for path in ["tiny/llama", "tiny/qwen3", "tiny/gemma3", "hybrid/qwen3_5", "hybrid/qwen3_next", "hybrid/qwen3_5_moe"]
    {
        let plain = engine(path, cache_off());
        let ps = prompts(path);
        let want: Vec<Outcome> = ps.iter().map(|p| run(&plain, greedy(p.clone(), n))).collect();
        for (p2, method, draft) in cases() {
            if p2 != path {
                continue;
            }
            let what = format!("{path} {} (draft {draft:?})", method.as_str());
            let e = spec_engine(path, method, draft, 4);
            // Miss, then hit (the same prompt again), alone.
            let miss = run(&e, greedy(ps[0].clone(), n));
            assert_same(&miss, &want[0], &format!("{what}: miss"));
            assert_eq!(miss.usage.cached_tokens, 0);
            let hit = run(&e, greedy(ps[0].clone(), n));
            assert_same(&hit, &want[0], &format!("{what}: hit"));
            assert!(hit.usage.cached_tokens > 0, "{what}: expected a prefix-cache hit");
            // A batch of 8 (one of them a hit), together.
            let got = run_batch(&e, ps.iter().map(|p| greedy(p.clone(), n)).collect());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_same(g, w, &format!("{what}: batch member {i}"));
            }
            assert_no_leaks(&e); // also waits for the engine to finish its step's bookkeeping
            let st = e.stats();
            let drafted = st.spec_drafted.load(Ordering::Relaxed);
            assert!(drafted > 0, "{what}: nothing was drafted");
            let accepted = st.spec_accepted.load(Ordering::Relaxed);
            let reported: usize = got.iter().chain([&miss, &hit]).map(|o| o.usage.speculative.accepted_tokens).sum();
            assert_eq!(reported, accepted, "{what}: per-request and engine counters agree");
            if draft == Some(path) {
                // A draft model identical to the target agrees with it everywhere.
                assert_eq!(accepted, drafted, "{what}: self-drafting must be fully accepted");
            }
            eprintln!("{what}: {accepted} of {drafted} drafts accepted");
            if draft == Some(path) {
                assert!(accepted > 0, "{what}: no draft was ever accepted");
            }
        }
    }
}

/// Lossless in every 32-value weight format (the fixture's rows are 64 and 128 values, too
/// short for the K-quants, whose rows `tandem-model`'s `row_invariance` test checks): the
/// model quantised at load, self-drafting and n-gram speculation against plain greedy decoding,
/// alone and in a batch of 8. On x86 these run the AVX2 / AVX-512 kernels, on aarch64 (`make
/// test-neon`) the NEON ones.
#[test]
fn greedy_speculation_is_lossless_in_every_weight_format() {
    use tandem_model::loader::{quantize::WeightQuant, LoadOptions};
    let path = "tiny/llama";
    let dev = tandem_model::device::default_device().expect("device");
    let n = 16;
    let ps = prompts(path);
    for ty in ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"] {
        let opts = LoadOptions { quantize: Some(ty.parse::<WeightQuant>().expect("type")), ..Default::default() };
        let load = || tandem_model::loader::load_with(&fixture(path), &dev, &opts).expect("quantised load");
        let plain = EngineHandle::start(load(), cache_off()).expect("engine");
        let want: Vec<Outcome> = ps.iter().map(|p| run(&plain, greedy(p.clone(), n))).collect();
        for (method, draft) in [(SpecMethod::Draft, Some(load())), (SpecMethod::Ngram, None)] {
            let what = format!("{path} {ty} {}", method.as_str());
            let e = EngineHandle::start_with_draft(load(), draft, spec_cfg(method, 4)).expect("engine");
            assert_same(&run(&e, greedy(ps[0].clone(), n)), &want[0], &what);
            let got = run_batch(&e, ps.iter().map(|p| greedy(p.clone(), n)).collect());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_same(g, w, &format!("{what}: batch member {i}"));
            }
            let st = e.stats();
            assert!(st.spec_drafted.load(Ordering::Relaxed) > 0, "{what}: nothing was drafted");
            if method == SpecMethod::Draft {
                let (a, d) = (st.spec_accepted.load(Ordering::Relaxed), st.spec_drafted.load(Ordering::Relaxed));
                assert_eq!(a, d, "{what}: a draft identical to the target must be fully accepted");
            }
            assert_no_leaks(&e);
        }
    }
}

/// Q4_K weights on our own packed CPU kernel (`ops::quant::kquant`, what a Q4_K GGUF gets on an
/// AVX-512 VNNI CPU): a hybrid with 256-wide matrices written as a Q4_K GGUF and loaded back.
/// Greedy output with MTP and n-gram speculation (verify chunks of several rows) equals plain
/// decoding (one row per step), alone and in a batch.
#[test]
fn greedy_speculation_is_lossless_on_q4k_weights() {
    lossless_on_kquant_weights(candle_core::quantized::GgmlDType::Q4K, false);
}

/// The same with the embedding table tied to the LM head in Q4_K: the table is packed once
/// as tiles (`Embedding::KQuant`), lookups dequantise them and the head runs on the kernel.
#[test]
fn greedy_speculation_is_lossless_on_a_tied_q4k_table() {
    lossless_on_kquant_weights(candle_core::quantized::GgmlDType::Q4K, true);
}

/// Q8_0 weights of whole superblocks, the table tied: on an AVX-512 VNNI CPU our Q8_0 tiles
/// (`kquant::tile8`) for every matrix and the LM head; elsewhere the block kernels.
#[test]
fn greedy_speculation_is_lossless_on_q8_0_tiles() {
    lossless_on_kquant_weights(candle_core::quantized::GgmlDType::Q8_0, true);
}

/// The same with Q5_0 weights (our kernel's Q5_0 tiles on x86 with AVX-512 VNNI or AVX2, the
/// block kernels elsewhere).
#[test]
fn greedy_speculation_is_lossless_on_q5_0_tiles() {
    lossless_on_kquant_weights(candle_core::quantized::GgmlDType::Q5_0, false);
}

/// The same with Q4_0 weights (our kernel's Q4_0 tiles on x86 with AVX-512 VNNI or AVX2,
/// candle's kernels elsewhere), the table tied as the LM head.
#[test]
fn greedy_speculation_is_lossless_on_q4_0_tiles() {
    lossless_on_kquant_weights(candle_core::quantized::GgmlDType::Q4_0, true);
}

/// The same with Q3_K weights (our kernel's Q3K tiles on the CPU).
#[test]
fn greedy_speculation_is_lossless_on_q3k_weights() {
    lossless_on_kquant_weights(candle_core::quantized::GgmlDType::Q3K, false);
}

/// The same with Q2_K weights (our kernel's Q2K tiles on the CPU).
#[test]
fn greedy_speculation_is_lossless_on_q2k_weights() {
    lossless_on_kquant_weights(candle_core::quantized::GgmlDType::Q2K, false);
}

fn lossless_on_kquant_weights(dtype: candle_core::quantized::GgmlDType, tied: bool) {
    use tandem_model::arch::qwen_hybrid::random::preset;
    use tandem_model::arch::qwen_hybrid::random_gguf::export_random;
    use tandem_model::arch::qwen_hybrid::HybridConfig;
    let cfg = HybridConfig {
        model_type: "qwen3_5_text".into(),
        moe: None,
        hidden_size: 256,
        intermediate_size: 256,
        mtp_layers: 1,
        tie_word_embeddings: tied,
        ..preset("tiny").expect("preset")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kquant.gguf");
    export_random(&cfg, dtype, &path, |_, _| {}).expect("export");
    let dev = tandem_model::device::default_device().expect("device");
    let load = || tandem_model::loader::load(&path, &dev).expect("load the K-quant GGUF");
    // Repetitive prompts, so that the n-gram proposer finds matches too.
    let ps: Vec<Vec<u32>> =
        (0..4u32).map(|i| (0..24u32).map(|j| 3 + (i * 11 + (j % (5 + i)) * 7) % 500).collect()).collect();
    let n = 16;
    let plain = EngineHandle::start(load(), cache_off()).expect("engine");
    let want: Vec<Outcome> = ps.iter().map(|p| run(&plain, greedy(p.clone(), n))).collect();
    for method in [SpecMethod::Mtp, SpecMethod::Ngram] {
        let what = format!("{dtype:?} hybrid (tied {tied}) {}", method.as_str());
        // The prefix cache off in both: with it a hybrid's prompt is prefilled in other chunks
        // (checkpoint boundaries), which the chunked GDN form sums in another order, and 8-bit
        // activations turn such last-bit differences into 1e-3 ones in this random model.
        let cfg = EngineConfig { prefix_cache: false, ..spec_cfg(method, 4) };
        let e = EngineHandle::start_with_draft(load(), None, cfg).expect("engine");
        assert_same(&run(&e, greedy(ps[0].clone(), n)), &want[0], &what);
        let got = run_batch(&e, ps.iter().map(|p| greedy(p.clone(), n)).collect());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_same(g, w, &format!("{what}: batch member {i}"));
        }
        // MTP drafts at every step; prompt lookup only where the output repeats its context,
        // which depends on the device's greedy path: where some step of the plain output has
        // an n-gram match, the first such step is reached one token at a time, so it drafts.
        let matchable = ps.iter().zip(&want).any(|(p, w)| {
            (1..w.ids.len()).any(|i| {
                let ctx: Vec<u32> = p.iter().chain(&w.ids[..i]).copied().collect();
                !tandem_engine::spec::ngram::propose(&ctx, 1, 3, 4).is_empty()
            })
        });
        if method == SpecMethod::Mtp || matchable {
            assert!(e.stats().spec_drafted.load(Ordering::Relaxed) > 0, "{what}: nothing was drafted");
        } else {
            eprintln!("{what}: no step of the plain output repeats its context; nothing to draft");
        }
        assert_no_leaks(&e);
    }
}

/// With temperature 1 and top-k 5, the token chosen by verification (accepting a greedy draft
/// with probability p(draft), else drawing from the rest) follows the model's distribution,
/// which the request's own top-5 log-probabilities give exactly.
#[test]
fn sampled_output_keeps_the_model_distribution() {
    let path = "tiny/llama";
    let e = spec_engine(path, SpecMethod::Draft, Some(path), 1);
    let p = prompt(path);
    let samples = 1600;
    let mut outcomes = Vec::new();
    for chunk in (0..samples).collect::<Vec<u64>>().chunks(32) {
        let reqs = chunk
            .iter()
            .map(|&seed| GenerateRequest {
                prompt_ids: p.clone(),
                sampling: SamplingParams { temperature: 1.0, top_k: 5, seed: Some(seed), ..Default::default() },
                stop: StopParams { max_tokens: 3, ignore_eos: true, ..Default::default() },
                logprobs: Some(5),
                ..Default::default()
            })
            .collect();
        outcomes.extend(run_batch(&e, reqs));
    }
    assert!(e.stats().spec_drafted.load(Ordering::Relaxed) > 0);
    // Group by the first token; the second was chosen by verification.
    let mut groups: HashMap<u32, Vec<&Outcome>> = HashMap::new();
    for o in &outcomes {
        groups.entry(o.ids[0]).or_default().push(o);
    }
    let (_, group) = groups.into_iter().max_by_key(|(_, g)| g.len()).unwrap();
    assert!(group.len() >= 200, "too few samples share a first token: {}", group.len());
    let top = &group[0].logprobs[1].top;
    let z: f64 = top.iter().map(|t| (t.logprob as f64).exp()).sum();
    let mut chi2 = 0.0;
    for t in top {
        let expected = (t.logprob as f64).exp() / z * group.len() as f64;
        let seen = group.iter().filter(|o| o.ids[1] == t.id).count() as f64;
        chi2 += (seen - expected).powi(2) / expected;
    }
    // 5 categories, 4 degrees of freedom: p > 0.01 <=> chi2 < 13.28.
    assert!(chi2 < 13.28, "chi-square {chi2:.2} over {} samples", group.len());
    assert!(group.iter().all(|o| top.iter().any(|t| t.id == o.ids[1])), "a token outside the top 5 was sampled");
}

#[test]
fn nothing_leaks_when_speculating_requests_finish_or_are_cancelled() {
    for (path, method, draft) in
        [("tiny/llama", SpecMethod::Draft, Some("tiny/llama")), ("hybrid/qwen3_5", SpecMethod::Mtp, None)]
    {
        let e = spec_engine(path, method, draft, 4);
        let ps = prompts(path);
        let mut keep = Vec::new();
        for (i, p) in ps.iter().enumerate() {
            let mut rx = e.submit(greedy(p.clone(), 64)).expect("submit");
            if i % 2 == 0 {
                // Cancel after a few tokens, while it speculates.
                for _ in 0..3 {
                    rx.blocking_recv();
                }
                drop(rx);
            } else {
                keep.push(rx);
            }
        }
        for rx in keep {
            let o = collect(rx);
            assert_eq!(o.ids.len(), 64);
        }
        assert!(e.stats().cancelled.load(Ordering::Relaxed) > 0 || e.stats().finished.load(Ordering::Relaxed) == 8);
        assert_no_leaks(&e);
    }
}

#[test]
fn unavailable_methods_are_refused() {
    let e = spec_engine("tiny/llama", SpecMethod::Ngram, None, 4);
    let req = GenerateRequest {
        speculative: Some(SpecRequest { method: Some(SpecMethod::Mtp), num_draft_tokens: None }),
        ..greedy(prompt("tiny/llama"), 4)
    };
    assert!(matches!(e.submit(req), Err(SubmitError::InvalidParam(m)) if m.contains("mtp")));
    let dev = tandem_model::device::default_device().expect("device");
    let target = tandem_model::loader::load(&fixture("tiny/llama"), &dev).unwrap();
    assert!(EngineHandle::start_with_draft(target, None, spec_cfg(SpecMethod::Draft, 4)).is_err());
    let target = tandem_model::loader::load(&fixture("tiny/llama"), &dev).unwrap();
    assert!(EngineHandle::start_with_draft(target, None, spec_cfg(SpecMethod::Mtp, 4)).is_err());
    // A request may turn speculation off.
    let off = GenerateRequest {
        speculative: Some(SpecRequest { method: Some(SpecMethod::Off), num_draft_tokens: None }),
        ..greedy(prompt("tiny/llama"), 8)
    };
    assert_eq!(run(&e, off).usage.speculative.drafted_tokens, 0);
}

/// With drafts that are always wrong (another model's), the adaptive draft length backs off to
/// occasional single-draft probes, and output stays that of plain decoding.
#[test]
fn adaptive_draft_length_backs_off_when_drafts_fail() {
    let path = "tiny/llama";
    let dev = tandem_model::device::default_device().expect("device");
    let target = tandem_model::loader::load(&fixture(path), &dev).unwrap();
    let draft = tandem_model::loader::load(&fixture("tiny/qwen2"), &dev).unwrap();
    let mut cfg = spec_cfg(SpecMethod::Draft, 4);
    cfg.speculative.adaptive = true;
    let e = EngineHandle::start_with_draft(target, Some(draft), cfg).unwrap();
    let plain = engine(path, cache_off());
    let n = 48;
    for p in prompts(path) {
        assert_same(&run(&e, greedy(p.clone(), n)), &run(&plain, greedy(p, n)), "adaptive draft");
    }
    assert_no_leaks(&e);
    let drafted = e.stats().spec_drafted.load(Ordering::Relaxed);
    let fixed = 8 * (n - 1) * 4;
    assert!(drafted > 0 && drafted * 5 < fixed, "drafted {drafted} of at most {fixed}");
}

/// The MTP head's KV is part of what a prefix hit must restore. Blocks filled by a request
/// that did not run the head hold none of it, so an MTP request does not resume on them: it
/// recomputes them, and drafts exactly as on a miss. Blocks it filled itself serve the next
/// MTP request.
#[test]
fn mtp_requests_resume_only_where_the_head_kv_is_written() {
    let path = "hybrid/qwen3_5";
    let p = prompt(path);
    let n = 16;
    let want = run(&spec_engine(path, SpecMethod::Mtp, None, 2), greedy(p.clone(), n));
    assert!(want.usage.speculative.drafted_tokens > 0);
    let e = spec_engine(path, SpecMethod::Mtp, None, 2);
    let off = || GenerateRequest {
        speculative: Some(SpecRequest { method: Some(SpecMethod::Off), num_draft_tokens: None }),
        ..greedy(p.clone(), n)
    };
    run(&e, off());
    assert!(run(&e, off()).usage.cached_tokens > 0, "the target's own KV is reusable");
    let after_off = run(&e, greedy(p.clone(), n));
    assert_eq!(after_off.usage.cached_tokens, 0, "those blocks hold no MTP head KV");
    assert_same(&after_off, &want, "MTP after an off request");
    assert_eq!(after_off.usage.speculative, want.usage.speculative, "drafts as on a miss");
    let hit = run(&e, greedy(p.clone(), n));
    assert!(hit.usage.cached_tokens > 0, "blocks with head KV serve the next MTP request");
    assert_same(&hit, &want, "MTP hit");
    assert_no_leaks(&e);
}

/// A draft model limited to the first token ids (`draft_vocab`) drafts only those, and output
/// is still that of plain decoding; a draft identical to the target then misses exactly where
/// the target's token lies past the limit.
#[test]
fn a_draft_model_limited_to_the_first_ids_is_still_lossless() {
    let path = "tiny/llama";
    let dev = tandem_model::device::default_device().expect("device");
    let target = tandem_model::loader::load(&fixture(path), &dev).unwrap();
    let draft = tandem_model::loader::load(&fixture(path), &dev).unwrap();
    let mut cfg = spec_cfg(SpecMethod::Draft, 4);
    cfg.speculative.draft_vocab = 200;
    let e = EngineHandle::start_with_draft(target, Some(draft), cfg).unwrap();
    let plain = engine(path, cache_off());
    let mut past_limit = 0;
    for p in prompts(path).into_iter().take(4) {
        let want = run(&plain, greedy(p.clone(), 24));
        past_limit += want.ids.iter().filter(|&&t| t >= 200).count();
        assert_same(&run(&e, greedy(p, 24)), &want, "draft limited to 200 ids");
    }
    let st = e.stats();
    let (drafted, accepted) = (st.spec_drafted.load(Ordering::Relaxed), st.spec_accepted.load(Ordering::Relaxed));
    assert!(drafted > 0);
    assert!(past_limit == 0 || accepted < drafted, "{past_limit} target tokens past the limit, all drafts accepted");
    assert_no_leaks(&e);
}
