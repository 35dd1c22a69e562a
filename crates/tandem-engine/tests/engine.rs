//! Engine behaviour on the tiny fixture models: greedy output equals transformers', batching
//! and prefill chunk size do not change outputs, seeds reproduce, stop rules and cancellation
//! work, and nothing is left allocated afterwards.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use candle_core::Device;
use tandem_engine::*;

fn fixture(name: &str) -> PathBuf {
    match std::env::var_os("TANDEM_FIXTURES") {
        Some(p) => PathBuf::from(p).join("tiny").join(name),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny").join(name),
    }
}

fn engine(name: &str, cfg: EngineConfig) -> EngineHandle {
    EngineHandle::load(&fixture(name), cfg).expect("engine")
}

fn reference(name: &str) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
    let r = candle_core::safetensors::load(fixture(name).join("reference.safetensors"), &Device::Cpu).unwrap();
    let ids = |k: &str| r[k].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect::<Vec<_>>();
    (ids("prompt_ids"), ids("greedy_ids"), r["margins"].to_vec1::<f32>().unwrap())
}

fn greedy_req(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: prompt,
        stop: StopParams { max_tokens, ignore_eos: true, ..Default::default() },
        ..Default::default()
    }
}

struct Outcome {
    ids: Vec<u32>,
    text: String,
    reason: Option<FinishReason>,
    stop_string: Option<String>,
    usage: Usage,
    logprobs: Vec<PositionLogprobs>,
}

fn collect(mut rx: tokio::sync::mpsc::Receiver<GenerationEvent>) -> Outcome {
    let mut o = Outcome {
        ids: vec![],
        text: String::new(),
        reason: None,
        stop_string: None,
        usage: Usage::default(),
        logprobs: vec![],
    };
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Token { id, text, logprobs } => {
                o.ids.push(id);
                o.text.push_str(&text);
                o.logprobs.extend(logprobs);
            }
            GenerationEvent::Finished { reason, text, stop_string, usage, .. } => {
                o.text.push_str(&text);
                o.reason = Some(reason);
                o.stop_string = stop_string;
                o.usage = usage;
                break;
            }
            GenerationEvent::Error(e) => panic!("engine error: {e}"),
        }
    }
    o
}

/// Waits until nothing runs or waits. The scheduler moves a sequence between the gauges so that
/// one of them is non-zero throughout (admission: running up, then waiting down; preemption:
/// waiting up, then running down; retirement: the KV gauges published, then running down), so
/// waiting, running, waiting read as zero is idle with its gauges published.
fn wait_idle(e: &EngineHandle) {
    let t = Instant::now();
    let s = e.stats();
    let busy = || {
        s.waiting.load(Ordering::Acquire) > 0
            || s.running.load(Ordering::Acquire) > 0
            || s.waiting.load(Ordering::Acquire) > 0
    };
    while busy() {
        assert!(t.elapsed() < Duration::from_secs(30), "engine did not become idle");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn greedy_equals_transformers_up_to_first_near_tie() {
    for name in ["llama", "qwen2", "qwen3", "mistral", "gemma3"] {
        let (prompt, want, margins) = reference(name);
        let n = margins.iter().position(|&m| m < 1e-3).unwrap_or(want.len());
        let e = engine(name, EngineConfig::default());
        let o = collect(e.submit(greedy_req(prompt, want.len())).unwrap());
        assert_eq!(o.ids[..n], want[..n], "{name}");
        assert_eq!(o.reason, Some(FinishReason::Length));
        assert_eq!(o.usage.completion_tokens, want.len());
    }
}

/// Eight different requests in flight together give the same tokens as each alone.
#[test]
fn batch_invariance() {
    for name in ["qwen2", "gemma3"] {
        let (prompt, _, _) = reference(name);
        let e = engine(name, EngineConfig::default());
        if std::env::var_os("TANDEM_STEP_ALIGN").is_none() {
            // The default alignment is the device's: CUDA's GEMM row tile, none on the CPU.
            let cuda = tandem_model::device::default_device().unwrap().is_cuda();
            assert_eq!(e.step_align(), if cuda { 128 } else { 1 }, "{name}");
        }
        let prompts: Vec<Vec<u32>> = (0..8).map(|i| prompt[i..i + 12 + 3 * i].to_vec()).collect();
        let alone: Vec<Vec<u32>> =
            prompts.iter().map(|p| collect(e.submit(greedy_req(p.clone(), 16)).unwrap()).ids).collect();
        let rxs: Vec<_> = prompts.iter().map(|p| e.submit(greedy_req(p.clone(), 16)).unwrap()).collect();
        let together: Vec<Vec<u32>> = rxs.into_iter().map(|rx| collect(rx).ids).collect();
        assert_eq!(alone, together, "{name}");
        wait_idle(&e);
        assert_eq!(e.stats().kv_bytes.load(Ordering::Relaxed), 0);
        assert_eq!(e.stats().batch_fallbacks.load(Ordering::Relaxed), 0, "{name}: a batch ran one at a time");
    }
}

/// Steps that carry prefill chunks beside decodes (mixed steps: prompts of different lengths
/// in chunks of 4, so the short ones decode while the long ones still prefill) run as one
/// batch and give every request the tokens it gets alone. No batch may fall back to one
/// sequence at a time: on CUDA the hybrid's GDN layers failed every mixed step until
/// 2026-12-07 (a gather from a column view), and the fallback's right answers hid it.
#[test]
fn mixed_steps_run_as_one_batch() {
    for rel in ["tiny/qwen2", "hybrid/qwen3_5", "hybrid/qwen3_next"] {
        let path = match std::env::var_os("TANDEM_FIXTURES") {
            Some(p) => PathBuf::from(p).join(rel),
            None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(rel),
        };
        let prompts: Vec<Vec<u32>> =
            (0..6u32).map(|i| (0..3 + 9 * i).map(|j| 5 + (j * 37 + i * 11) % 300).collect()).collect();
        let mut alone: Option<Vec<Vec<u32>>> = None;
        // Steps as planned, then trimmed to whole "tiles" of 4 rows (chunks of 4 beside
        // decodes give rows back): the same tokens. With chunks of 64 every prompt is one
        // chunk, which ends it: nothing is trimmed (a first token is never delayed).
        for (chunk, align) in [(4usize, 1usize), (4, 4), (64, 4)] {
            let cfg =
                EngineConfig { prefill_chunk: chunk, prefix_cache: false, step_align: align, ..Default::default() };
            let e = EngineHandle::load(&path, cfg).expect("engine");
            assert_eq!(e.step_align(), align, "{rel}: a set alignment is kept");
            let solo: Vec<Vec<u32>> =
                prompts.iter().map(|p| collect(e.submit(greedy_req(p.clone(), 12)).unwrap()).ids).collect();
            let alone = alone.get_or_insert(solo.clone());
            assert_eq!(&solo, alone, "{rel} chunk {chunk} align {align}");
            let rxs: Vec<_> = prompts.iter().map(|p| e.submit(greedy_req(p.clone(), 12)).unwrap()).collect();
            let together: Vec<Vec<u32>> = rxs.into_iter().map(|rx| collect(rx).ids).collect();
            assert_eq!(alone, &together, "{rel} chunk {chunk} align {align}");
            wait_idle(&e);
            let st = e.stats();
            assert_eq!(st.batch_fallbacks.load(Ordering::Relaxed), 0, "{rel}: a batch ran one at a time");
            assert_eq!(st.kv_bytes.load(Ordering::Relaxed), 0);
            let trimmed = st.step_rows_trimmed.load(Ordering::Relaxed);
            assert_eq!(
                trimmed > 0,
                align > 1 && chunk < 48,
                "{rel} chunk {chunk} align {align}: {trimmed} rows trimmed"
            );
        }
    }
}

/// Prefill chunk sizes 1, 7, 64 and 512 give the same output.
#[test]
fn chunk_equivalence() {
    for name in ["llama", "gemma3"] {
        let (prompt, _, _) = reference(name);
        let mut outs = Vec::new();
        for chunk in [1usize, 7, 64, 512] {
            let e = engine(name, EngineConfig { prefill_chunk: chunk, ..Default::default() });
            let req = GenerateRequest { logprobs: Some(3), ..greedy_req(prompt.clone(), 12) };
            let o = collect(e.submit(req).unwrap());
            outs.push((chunk, o.ids, o.logprobs));
        }
        for (chunk, ids, lps) in &outs[1..] {
            assert_eq!(ids, &outs[0].1, "{name} chunk {chunk}");
            for (a, b) in lps.iter().zip(&outs[0].2) {
                assert!((a.chosen.logprob - b.chosen.logprob).abs() < 1e-4, "{name} chunk {chunk}: logprob drift");
            }
        }
    }
}

#[test]
fn seeded_sampling_reproduces() {
    let (prompt, _, _) = reference("qwen3");
    let e = engine("qwen3", EngineConfig::default());
    let req = |seed| GenerateRequest {
        sampling: SamplingParams { temperature: 1.0, top_p: 0.95, seed: Some(seed), ..Default::default() },
        ..greedy_req(prompt.clone(), 24)
    };
    let a = collect(e.submit(req(42)).unwrap()).ids;
    let b = collect(e.submit(req(42)).unwrap()).ids;
    let c = collect(e.submit(req(43)).unwrap()).ids;
    assert_eq!(a, b);
    assert_ne!(a, c, "different seeds should differ on a 24-token sample");
}

/// On a GPU, sampled requests take their tokens from the device's top candidates
/// (`sampler/candidates.rs`); they must be the tokens the full rows give, seed for seed.
#[test]
fn device_sampling_gives_the_rows_tokens() {
    let (prompt, _, _) = reference("qwen3");
    let on = engine("qwen3", EngineConfig::default());
    let off = engine("qwen3", EngineConfig { device_sampling: false, ..Default::default() });
    let cases = [(0.8, 20, 1.0, 0.0), (1.0, 0, 0.9, 0.0), (0.7, 0, 1.0, 0.1), (1.2, 50, 0.95, 0.02)];
    for (i, &(temperature, top_k, top_p, min_p)) in cases.iter().enumerate() {
        let req = || GenerateRequest {
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                seed: Some(7 + i as u64),
                ..Default::default()
            },
            ..greedy_req(prompt.clone(), 24)
        };
        let a = collect(on.submit(req()).unwrap()).ids;
        let b = collect(off.submit(req()).unwrap()).ids;
        assert_eq!(a, b, "case {i}: candidates vs full rows");
    }
    assert_eq!(off.stats().candidate_samples.load(Ordering::Relaxed), 0);
    let used = on.stats().candidate_samples.load(Ordering::Relaxed);
    if std::env::var("TANDEM_DEVICE").is_ok_and(|d| d.starts_with("cuda")) {
        assert!(used > 48, "only {used} of 96 tokens came from the device's candidates");
    } else {
        assert_eq!(used, 0, "the CPU reads its rows");
    }
}

#[test]
fn stop_rules() {
    let (prompt, want, _) = reference("mistral");
    let e = engine("mistral", EngineConfig::default());
    // A stop token id: generation ends at its first occurrence, which is reported.
    let stop_id = want[3];
    let first = want.iter().position(|&t| t == stop_id).unwrap();
    let req = GenerateRequest {
        stop: StopParams { max_tokens: 20, stop_token_ids: vec![stop_id], ignore_eos: true, ..Default::default() },
        ..greedy_req(prompt.clone(), 20)
    };
    let o = collect(e.submit(req).unwrap());
    assert_eq!((o.reason, o.stop_string), (Some(FinishReason::Stop), None));
    assert_eq!(o.ids, want[..=first].to_vec());
    // A stop string: the text ends right before it.
    let full = collect(e.submit(greedy_req(prompt.clone(), 20)).unwrap());
    let tok = e.tokenizer();
    assert_eq!(full.text, tok.decode(&full.ids, true));
    let cut = full.text.char_indices().nth(full.text.chars().count() / 2).map(|(i, _)| i).unwrap();
    let stop: String = full.text[cut..].chars().take(3).collect();
    let stops = vec!["\u{0}never".to_string(), stop.clone()];
    let req = GenerateRequest {
        stop: StopParams { max_tokens: 20, stop_strings: stops, ignore_eos: true, ..Default::default() },
        ..greedy_req(prompt.clone(), 20)
    };
    let o = collect(e.submit(req).unwrap());
    // The finish event names the stop string that matched.
    assert_eq!((o.reason, o.stop_string.as_deref()), (Some(FinishReason::Stop), Some(stop.as_str())));
    let at = full.text.find(&stop).unwrap();
    assert_eq!(o.text, full.text[..at]);
    // max_tokens
    let o = collect(e.submit(greedy_req(prompt, 5)).unwrap());
    assert_eq!((o.ids.len(), o.reason, o.stop_string), (5, Some(FinishReason::Length), None));
}

#[test]
fn cancellation_frees_everything() {
    let (prompt, _, _) = reference("qwen2");
    let e = engine("qwen2", EngineConfig::default());
    let mut rxs: Vec<_> = (0..6).map(|i| e.submit(greedy_req(prompt[i..].to_vec(), 150)).unwrap()).collect();
    // Read a couple of tokens from some, then drop everything mid-stream.
    for rx in rxs.iter_mut().take(3) {
        let _ = rx.blocking_recv();
    }
    drop(rxs);
    wait_idle(&e);
    assert_eq!(e.stats().kv_bytes.load(Ordering::Relaxed), 0);
    assert!(e.stats().cancelled.load(Ordering::Relaxed) >= 1);
    // The engine still serves.
    let o = collect(e.submit(greedy_req(prompt, 4)).unwrap());
    assert_eq!(o.ids.len(), 4);
}

#[test]
fn invalid_submissions_are_refused() {
    let e = engine("llama", EngineConfig { context_length: 64, ..Default::default() });
    assert_eq!(e.submit(greedy_req(vec![], 4)).unwrap_err(), SubmitError::EmptyPrompt);
    assert!(matches!(e.submit(greedy_req(vec![5; 64], 1)).unwrap_err(), SubmitError::PromptTooLong { .. }));
    assert!(matches!(e.submit(greedy_req(vec![5; 10], 60)).unwrap_err(), SubmitError::MaxTokensTooLarge { .. }));
    assert_eq!(e.submit(greedy_req(vec![5, 100_000], 4)).unwrap_err(), SubmitError::InvalidToken(100_000));
    let bad =
        GenerateRequest { sampling: SamplingParams { top_p: 0.0, ..Default::default() }, ..greedy_req(vec![5], 4) };
    assert!(matches!(e.submit(bad).unwrap_err(), SubmitError::InvalidParam(_)));
    // Context limit during generation ends with Length.
    let o = collect(e.submit(greedy_req(vec![5; 60], 4)).unwrap());
    assert_eq!((o.ids.len(), o.reason), (4, Some(FinishReason::Length)));
}

#[test]
fn logprobs_are_normalised_and_sorted() {
    let (prompt, _, _) = reference("qwen2");
    let e = engine("qwen2", EngineConfig::default());
    let req = GenerateRequest { logprobs: Some(5), ..greedy_req(prompt, 6) };
    let o = collect(e.submit(req).unwrap());
    assert_eq!(o.logprobs.len(), 6);
    for (lp, id) in o.logprobs.iter().zip(&o.ids) {
        assert_eq!(lp.chosen.id, *id);
        assert_eq!(lp.top.len(), 5);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(lp.top[0].id, *id);
        assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        assert!(lp.top.iter().map(|t| t.logprob.exp()).sum::<f32>() <= 1.0 + 1e-4);
    }
}

/// `logit_bias` reaches the sampler: a +100 bias forces its token at every step, a -100 bias
/// keeps the plain greedy token out (also on a GPU, where unbiased greedy rows are reduced on
/// the device).
#[test]
fn logit_bias_forces_and_forbids_tokens() {
    let e = engine("llama", EngineConfig::default());
    let (prompt, greedy, _) = reference("llama");
    let forced = if greedy[0] == 7 { 8 } else { 7 };
    let req = |bias: Vec<(u32, f32)>| GenerateRequest {
        sampling: SamplingParams { logit_bias: bias, ..Default::default() },
        ..greedy_req(prompt.clone(), 4)
    };
    let o = collect(e.submit(req(vec![(forced, 100.0)])).unwrap());
    assert_eq!(o.ids, vec![forced; 4]);
    let o = collect(e.submit(req(vec![(greedy[0], -100.0)])).unwrap());
    assert_ne!(o.ids[0], greedy[0]);
}
