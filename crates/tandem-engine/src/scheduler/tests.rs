//! Scheduler tests that need its insides: speculative rollback at every draft position on the
//! hybrid fixtures, driven by a scripted proposer that knows the plain greedy continuation and
//! corrupts one draft position per step (including none), so every acceptance length occurs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use candle_core::Tensor;
use tandem_model::arch::CausalLm;
use tokio::sync::mpsc;

use super::{Scheduler, Submission};
use crate::engine::{EngineConfig, EngineStats};
use crate::request::{GenerateRequest, GenerationEvent, StopParams};
use crate::sampler::Sampler;
use crate::spec::{Proposer, ProposerView, SpecConfig, SpecMethod};

struct Oracle {
    prompt_len: usize,
    truth: Vec<u32>,
    k: usize,
    step: usize,
}

impl Proposer for Oracle {
    fn propose(&mut self, _m: &dyn CausalLm, seqs: &mut [(ProposerView<'_>, usize)]) -> Result<(), String> {
        for (s, k) in seqs.iter_mut() {
            let at = s.tokens().len() - self.prompt_len;
            let mut d: Vec<u32> = self.truth.iter().skip(at).take(*k).copied().collect();
            // Corrupt draft `step % (k + 1)` (none when it equals k): rejections everywhere.
            let bad = self.step % (self.k + 1);
            if let Some(t) = d.get_mut(bad) {
                *t = (*t + 1) % 384;
            }
            self.step += 1;
            s.spec.drafts = d;
        }
        Ok(())
    }

    fn catch_up(&mut self, _m: &dyn CausalLm, _s: &mut [(ProposerView<'_>, Option<Tensor>)]) -> Result<(), String> {
        Ok(())
    }
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hybrid").join(name)
}

/// A greedy request (EOS ignored).
fn greedy(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt_ids: prompt.to_vec(),
        stop: StopParams { max_tokens, ignore_eos: true, ..Default::default() },
        ..Default::default()
    }
}

/// Queues a request on a scheduler; its event stream.
fn enqueue(s: &mut Scheduler, req: GenerateRequest) -> mpsc::Receiver<GenerationEvent> {
    let (tx, rx) = mpsc::channel(req.stop.max_tokens + 2);
    let sampler = Sampler::new(req.sampling.clone()).unwrap();
    s.enqueue(Submission { req, sampler, constraint: None, stop_ids: vec![], events: tx, submitted: Instant::now() });
    rx
}

/// Steps the scheduler until every request has finished.
fn run_to_completion(s: &mut Scheduler) {
    while !(s.running.is_empty() && s.waiting.is_empty()) {
        s.admit();
        s.step();
        s.retire_finished();
    }
}

/// Queues one greedy request on a scheduler; its event stream.
fn submit(s: &mut Scheduler, prompt: &[u32], max_tokens: usize) -> mpsc::Receiver<GenerationEvent> {
    enqueue(s, greedy(prompt, max_tokens))
}

/// Runs one greedy request to completion on a scheduler; the generated ids.
fn generate(s: &mut Scheduler, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut rx = submit(s, prompt, n);
    run_to_completion(s);
    let mut ids = Vec::new();
    while let Ok(ev) = rx.try_recv() {
        match ev {
            GenerationEvent::Token { id, .. } => ids.push(id),
            GenerationEvent::Error(e) => panic!("{e}"),
            GenerationEvent::Finished { .. } => {}
        }
    }
    ids
}

fn scheduler(name: &str, method: SpecMethod, k: usize) -> Scheduler {
    let loaded = tandem_model::loader::load(&fixture(name), &candle_core::Device::Cpu).unwrap();
    let cfg = EngineConfig {
        speculative: SpecConfig { method, num_draft_tokens: k, adaptive: false, ..Default::default() },
        ..Default::default()
    };
    let ctx = loaded.model.context_length().min(4096);
    Scheduler::new(loaded.model, None, Arc::new(loaded.tokenizer), cfg, ctx, Arc::new(EngineStats::default()), None)
        .unwrap()
}

#[test]
fn rollback_at_every_draft_position_matches_plain_decoding() {
    let k = 4;
    for name in ["qwen3_5", "qwen3_next", "qwen3_5_moe"] {
        let prompt: Vec<u32> = (0..37u32).map(|i| (i * 29 + 3) % 384).collect();
        let truth = generate(&mut scheduler(name, SpecMethod::Off, 0), &prompt, 30);
        let mut s = scheduler(name, SpecMethod::Ngram, k);
        s.proposers.ngram = Box::new(Oracle { prompt_len: prompt.len(), truth: truth.clone(), k, step: 0 });
        let got = generate(&mut s, &prompt, 30);
        assert_eq!(got, truth, "{name}");
        // Every acceptance length 0..=k happened.
        let st = &s.stats;
        let at = |i: usize| st.spec_accepted_at[i].load(std::sync::atomic::Ordering::Relaxed);
        assert!((0..k).all(|i| at(i) > 0), "{name}: accepted per position {:?}", (0..k).map(at).collect::<Vec<_>>());
        assert!(at(0) < st.spec_steps.load(std::sync::atomic::Ordering::Relaxed), "{name}: no rejection at 0");
        // Same prompt again: a prefix-cache hit, then the same rollbacks on top of it.
        let again = generate(&mut s, &prompt, 30);
        assert_eq!(again, truth, "{name}: after a prefix-cache hit");
    }
}

/// The MTP proposer's drafts after prefill (catch-up over the prompt's hidden states in paged
/// head KV, then one head step) equal the fixtures' independent PyTorch reference drafts.
#[test]
fn mtp_drafts_after_prefill_match_the_reference() {
    for name in ["qwen3_5", "qwen3_next", "qwen3_5_moe"] {
        let r = candle_core::safetensors::load(fixture(name).join("reference.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
        let ids = |k: &str| r[k].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect::<Vec<_>>();
        let (prompt, greedy, want) = (ids("prompt_ids"), ids("greedy_ids"), ids("mtp_draft_ids"));
        let mut s = scheduler(name, SpecMethod::Mtp, 2);
        let _rx = submit(&mut s, &prompt, 8);
        s.admit();
        while s.running[0].tokens().len() == prompt.len() {
            s.step();
        }
        assert_eq!(s.running[0].tokens()[prompt.len()], greedy[0], "{name}: first token");
        let drafted = s.propose(&[1 + want.len()], &[false]);
        assert_eq!(drafted, want.len());
        assert_eq!(s.running[0].spec.drafts, want, "{name}: MTP drafts");
    }
}

/// A draft-model request that ends at its first token still mirrors its prompt in the draft
/// model, so the next request on that prompt resumes the draft model from the prefix cache
/// instead of re-reading the whole prompt with it.
#[test]
fn a_one_token_draft_request_leaves_draft_kv_in_the_prefix_cache() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/llama");
    let target = tandem_model::loader::load(&dir, &candle_core::Device::Cpu).unwrap();
    let draft = tandem_model::loader::load(&dir, &candle_core::Device::Cpu).unwrap();
    let cfg = EngineConfig {
        speculative: SpecConfig {
            method: SpecMethod::Draft,
            num_draft_tokens: 2,
            adaptive: false,
            ..Default::default()
        },
        ..Default::default()
    };
    let stats = Arc::new(EngineStats::default());
    let mut s =
        Scheduler::new(target.model, Some(draft.model), Arc::new(target.tokenizer), cfg, 512, stats, None).unwrap();
    let prompt: Vec<u32> = (0..70).map(|i| (i * 7 + 3) % 300).collect();
    assert_eq!(generate(&mut s, &prompt, 1).len(), 1);
    // The same prompt again: admitted on a prefix-cache hit.
    let _rx = submit(&mut s, &prompt, 4);
    s.admit();
    let seq = &s.running[0];
    let cached = seq.cache.position();
    assert!(cached >= 32, "expected a prefix-cache hit, resumed at {cached}");
    let draft_pos = seq.spec.draft_cache.as_ref().map(|c| c.position());
    assert_eq!(draft_pos, Some(cached), "the draft model resumes where the target does");
}

/// While a sequence does not draft, the MTP head gathers the target's hidden rows and reads
/// them in chunks; when it drafts again, its drafts are those of a head that read every
/// position (here: a fresh sequence prefilling the same tokens).
#[test]
fn lazy_mtp_catch_up_drafts_like_an_eager_head() {
    let name = "qwen3_5";
    let r =
        candle_core::safetensors::load(fixture(name).join("reference.safetensors"), &candle_core::Device::Cpu).unwrap();
    let prompt: Vec<u32> = r["prompt_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect();
    let mut s = scheduler(name, SpecMethod::Mtp, 2);
    s.cfg.speculative.adaptive = true;
    let _rx = submit(&mut s, &prompt, 200);
    s.admit();
    // Decode until the head has gathered rows it has not read (the sequence idles: random
    // weights rarely agree), well past the prompt.
    let mut lazy_seen = false;
    for _ in 0..150 {
        s.step();
        let seq = &s.running[0];
        lazy_seen |= seq.spec.mtp_rows.is_some();
        if lazy_seen && seq.spec.mtp_rows.is_some() && seq.tokens().len() > prompt.len() + 40 {
            break;
        }
    }
    let seq = &s.running[0];
    assert!(seq.spec.mtp_rows.is_some(), "the head never caught up lazily");
    assert!(seq.spec.mtp_pos < seq.cache.position());
    let tokens = seq.tokens().to_vec();
    let drafted = s.propose(&[3], &[false]);
    assert_eq!(drafted, 2);
    let lazy = s.running[0].spec.drafts.clone();
    assert_eq!(s.running[0].spec.mtp_pos, s.running[0].cache.position(), "the head is level again");
    // A fresh sequence prefilling everything but the pending token.
    let mut f = scheduler(name, SpecMethod::Mtp, 2);
    let _rx2 = submit(&mut f, &tokens[..tokens.len() - 1], 8);
    f.admit();
    while f.running[0].tokens().len() < tokens.len() {
        f.step();
    }
    assert_eq!(f.running[0].tokens(), &tokens[..], "same greedy continuation");
    assert_eq!(f.propose(&[3], &[false]), 2);
    assert_eq!(lazy, f.running[0].spec.drafts, "drafts after lazy catch-up");
}

/// Verify chunks stop at a checkpoint position (here a message boundary past the prompt), so
/// a sequence whose drafts are accepted still leaves its recurrent state there: a request
/// diverging right after it resumes at it.
#[test]
fn verify_chunks_stop_at_checkpoints() {
    let (name, k) = ("qwen3_5", 4);
    let prompt: Vec<u32> = (0..37u32).map(|i| (i * 29 + 3) % 384).collect();
    let truth = generate(&mut scheduler(name, SpecMethod::Off, 0), &prompt, 40);
    let mut s = scheduler(name, SpecMethod::Ngram, k);
    // Drafts are the true continuation, one corrupted per step except every (k + 1)-th step.
    s.proposers.ngram = Box::new(Oracle { prompt_len: prompt.len(), truth: truth.clone(), k, step: 0 });
    let cut = 64 + 5; // the checkpoint goes to 64, inside a run of accepted drafts
    let _rx = enqueue(&mut s, GenerateRequest { message_boundaries: vec![cut], ..greedy(&prompt, 40) });
    run_to_completion(&mut s);
    assert!(s.stats.spec_accepted.load(std::sync::atomic::Ordering::Relaxed) > 8);
    let mut next = [&prompt[..], &truth[..cut - prompt.len()]].concat();
    next.push(1);
    let _rx = submit(&mut s, &next, 2);
    s.admit();
    assert_eq!(s.running[0].cache.position(), 64, "resumed at the checkpoint");
}
