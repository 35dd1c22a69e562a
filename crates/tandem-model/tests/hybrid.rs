//! Hybrid (Gated DeltaNet + gated attention) models against HF `transformers`: tiny random
//! `qwen3_next`, `qwen3_5` (dense) and `qwen3_5_moe` checkpoints from
//! `scripts/gen_hybrid_fixtures.py` must give the same logits (f32, relative error <= 1e-4)
//! for a 150-token prompt (three GDN chunks) and every greedy decode step. Also: uneven
//! chunked prefill, ragged batches, snapshot/restore, verify mode, refused truncation, and
//! the MTP head against the script's independent PyTorch reference.

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use tandem_model::arch::qwen_hybrid::{read_config, QwenHybrid};
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::{KvBuffer, SequenceCache};
use tandem_model::loader::safetensors::SafetensorsSource;

const VARIANTS: [&str; 3] = ["qwen3_next", "qwen3_5", "qwen3_5_moe"];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hybrid").join(name)
}

fn load(name: &str) -> QwenHybrid {
    let dir = fixture(name);
    let cfg = read_config(&dir).expect("config");
    let src = SafetensorsSource::open(&dir, &Device::Cpu).expect("safetensors");
    QwenHybrid::load(&cfg, &src).expect("load")
}

struct Reference {
    prompt: Vec<u32>,
    prompt_logits: Tensor,
    greedy: Vec<u32>,
    decode_logits: Tensor,
    margins: Vec<f32>,
    r: std::collections::HashMap<String, Tensor>,
}

fn reference(name: &str) -> Reference {
    let r =
        candle_core::safetensors::load(fixture(name).join("reference.safetensors"), &Device::Cpu).expect("reference");
    let ids = |k: &str| r[k].to_vec1::<i64>().expect("ids").into_iter().map(|x| x as u32).collect::<Vec<_>>();
    Reference {
        prompt: ids("prompt_ids"),
        prompt_logits: r["prompt_logits"].clone(),
        greedy: ids("greedy_ids"),
        decode_logits: r["decode_logits"].clone(),
        margins: r["margins"].to_vec1::<f32>().expect("margins"),
        r,
    }
}

/// max |a - b| / max |b|
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    diff / b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-6)
}

fn new_cache(m: &QwenHybrid) -> SequenceCache {
    SequenceCache::new(&m.cache_spec(), &Device::Cpu)
}

fn fwd(m: &QwenHybrid, cache: &mut SequenceCache, tokens: &[u32], logits: LogitsWanted) -> Option<Tensor> {
    let mut chunks = [SeqChunk { tokens, cache, logits }];
    m.forward(&mut chunks).expect("forward").pop().flatten()
}

fn argmax(t: &Tensor) -> u32 {
    t.flatten_all().unwrap().argmax(0).unwrap().to_scalar::<u32>().unwrap()
}

#[test]
fn prompt_and_decode_logits_match_transformers() {
    for name in VARIANTS {
        let m = load(name);
        let r = reference(name);
        let mut cache = new_cache(&m);
        let logits = fwd(&m, &mut cache, &r.prompt, LogitsWanted::All).unwrap();
        let e = rel_err(&logits, &r.prompt_logits);
        eprintln!("{name}: prompt logits relative error {e:.2e}");
        assert!(e <= 1e-4, "{name}: prompt logits relative error {e}");
        let mut last = logits.narrow(0, r.prompt.len() - 1, 1).unwrap();
        let mut agree = true;
        for (i, &tok) in r.greedy.iter().enumerate() {
            let e = rel_err(&last, &r.decode_logits.narrow(0, i, 1).unwrap());
            assert!(e <= 1e-4, "{name}: decode step {i} relative error {e}");
            agree &= r.margins[i] >= 1e-3;
            if agree {
                assert_eq!(argmax(&last), tok, "{name}: greedy token at step {i}");
            }
            last = fwd(&m, &mut cache, &[tok], LogitsWanted::Last).unwrap();
        }
    }
}

#[test]
fn uneven_chunked_prefill_equals_one_shot() {
    for name in VARIANTS {
        let m = load(name);
        let r = reference(name);
        let whole = fwd(&m, &mut new_cache(&m), &r.prompt, LogitsWanted::All).unwrap();
        for sizes in [vec![7usize, 64, 79], vec![1, 1, 1, 63, 2, 82], vec![100, 50]] {
            let mut cache = new_cache(&m);
            let (mut off, mut parts) = (0, Vec::new());
            for s in sizes.iter().copied() {
                parts.push(fwd(&m, &mut cache, &r.prompt[off..off + s], LogitsWanted::All).unwrap());
                off += s;
            }
            assert_eq!(off, r.prompt.len());
            let e = rel_err(&Tensor::cat(&parts, 0).unwrap(), &whole);
            assert!(e <= 1e-5, "{name} chunks {sizes:?}: relative error {e}");
        }
    }
}

#[test]
fn ragged_batch_equals_sequences_alone() {
    let m = load("qwen3_5_moe");
    let r = reference("qwen3_5_moe");
    let (a, b) = (&r.prompt[..70], &r.prompt[3..]);
    let la = fwd(&m, &mut new_cache(&m), a, LogitsWanted::All).unwrap();
    let lb = fwd(&m, &mut new_cache(&m), b, LogitsWanted::All).unwrap();
    let (mut ca, mut cb) = (new_cache(&m), new_cache(&m));
    let mut chunks = [
        SeqChunk { tokens: a, cache: &mut ca, logits: LogitsWanted::All },
        SeqChunk { tokens: b, cache: &mut cb, logits: LogitsWanted::All },
    ];
    let out = m.forward(&mut chunks).unwrap();
    assert!(rel_err(out[0].as_ref().unwrap(), &la) <= 1e-5);
    assert!(rel_err(out[1].as_ref().unwrap(), &lb) <= 1e-5);
}

#[test]
fn snapshot_more_tokens_restore_continue_equals_uninterrupted() {
    let m = load("qwen3_next");
    let r = reference("qwen3_next");
    let (p, rest) = r.prompt.split_at(90);
    let want = fwd(&m, &mut new_cache(&m), &r.prompt, LogitsWanted::All).unwrap().narrow(0, 90, rest.len()).unwrap();
    let mut cache = new_cache(&m);
    fwd(&m, &mut cache, p, LogitsWanted::None);
    let snap = cache.snapshot();
    fwd(&m, &mut cache, &[5, 6, 7, 8, 9], LogitsWanted::Last);
    fwd(&m, &mut cache, &[10], LogitsWanted::Last);
    cache.restore(&snap).unwrap();
    assert_eq!(cache.position(), 90);
    let got = fwd(&m, &mut cache, rest, LogitsWanted::All).unwrap();
    assert!(rel_err(&got, &want) <= 1e-5);
}

#[test]
fn verify_commit_j_equals_plain_run_of_j_tokens() {
    let m = load("qwen3_5");
    let r = reference("qwen3_5");
    let prompt = &r.prompt[..40];
    let drafts = [11u32, 200, 37, 5]; // k + 1 = 4 positions
    let follow = 99u32;
    for j in 1..=drafts.len() {
        let mut plain = new_cache(&m);
        fwd(&m, &mut plain, prompt, LogitsWanted::None);
        let want_v = fwd(&m, &mut plain, &drafts[..j], LogitsWanted::All).unwrap();
        let want_state = plain.snapshot();
        let want = fwd(&m, &mut plain, &[follow], LogitsWanted::Last).unwrap();
        let mut c = new_cache(&m);
        fwd(&m, &mut c, prompt, LogitsWanted::None);
        c.begin_verify();
        let v = fwd(&m, &mut c, &drafts, LogitsWanted::All).unwrap();
        assert!(rel_err(&v.narrow(0, 0, j).unwrap(), &want_v) <= 1e-5, "verify logits, j={j}");
        c.commit_speculative(drafts.len(), j).unwrap();
        assert_eq!(c.position(), prompt.len() + j);
        // The rolled-back recurrent state is the plain run's, not just close in its effect.
        let got_state = c.snapshot();
        assert_eq!(got_state.position, want_state.position);
        for (a, b) in got_state.layers.iter().zip(&want_state.layers) {
            if let (Some(a), Some(b)) = (a, b) {
                let diff = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
                let (ac, bc) = (a.conv_values().unwrap(), b.conv_values().unwrap());
                let (as_, bs) = (a.ssm_values().unwrap(), b.ssm_values().unwrap());
                assert!(diff(&ac, &bc) <= 1e-5 && diff(&as_, &bs) <= 1e-4, "state after rollback to {j}");
            }
        }
        let got = fwd(&m, &mut c, &[follow], LogitsWanted::Last).unwrap();
        assert!(rel_err(&got, &want) <= 1e-5, "after committing {j}");
    }
}

#[test]
fn recurrent_state_cannot_be_truncated() {
    let m = load("qwen3_5");
    let mut c = new_cache(&m);
    fwd(&m, &mut c, &[1, 2, 3, 4], LogitsWanted::None);
    assert!(c.truncate(2).is_err());
    assert_eq!(c.position(), 4);
    assert!(c.truncate(4).is_ok());
    let mut chunks = [SeqChunk { tokens: &[1, 100_000], cache: &mut c, logits: LogitsWanted::Last }];
    assert!(m.forward(&mut chunks).is_err());
}

#[test]
fn mtp_head_matches_pytorch_reference() {
    for name in VARIANTS {
        let m = load(name);
        let r = reference(name);
        let mtp = m.mtp().expect("fixture has an MTP head");
        let t = r.prompt.len();
        let mut cache = new_cache(&m);
        let hidden = {
            let mut chunks = [SeqChunk { tokens: &r.prompt, cache: &mut cache, logits: LogitsWanted::All }];
            m.forward_hidden(&mut chunks).unwrap()
        };
        assert!(rel_err(&hidden, &r.r["final_hidden"]) <= 1e-4, "{name}: final hidden");
        let mut next: Vec<u32> = r.prompt[1..].to_vec();
        next.push(r.greedy[0]);
        let mut kv = KvBuffer::new(m.config().num_kv_heads, m.config().head_dim);
        let (logits, _) = mtp.forward(&m, &hidden, &next, &mut kv).unwrap();
        let start = r.r["mtp_tail_start"].to_vec1::<i64>().unwrap()[0] as usize;
        let tail = logits.narrow(0, start, t - start).unwrap();
        let e = rel_err(&tail, &r.r["mtp_logits_tail"]);
        eprintln!("{name}: MTP logits relative error {e:.2e}");
        assert!(e <= 1e-4, "{name}: MTP logits relative error {e}");
        // k = 2 drafting from the last position, in two calls: the prefix, then the last row.
        let mut kv = KvBuffer::new(m.config().num_kv_heads, m.config().head_dim);
        mtp.forward(&m, &hidden.narrow(0, 0, t - 1).unwrap(), &next[..t - 1], &mut kv).unwrap();
        let d = mtp.draft(&m, &hidden.narrow(0, t - 1, 1).unwrap(), &next[t - 1..], &mut kv, 2).unwrap();
        assert_eq!(kv.len(), t, "{name}: drafts leave no KV behind");
        let want: Vec<u32> = r.r["mtp_draft_ids"].to_vec1::<i64>().unwrap().into_iter().map(|x| x as u32).collect();
        let e = rel_err(&d.logits, &r.r["mtp_draft_logits"]);
        assert!(e <= 1e-4, "{name}: draft logits relative error {e}");
        assert_eq!(d.tokens, want, "{name}: drafted tokens");
    }
}

#[test]
fn generic_loader_dispatches_hybrid_dirs() {
    let dir = fixture("qwen3_5_moe");
    let loaded = tandem_model::loader::load(&dir, &Device::Cpu).expect("load");
    assert!(loaded.summary.architecture.contains("GGAG") && loaded.summary.architecture.contains("MTP head: yes"));
    let s = tandem_model::loader::summarize(&dir).expect("summary");
    assert_eq!((s.num_layers, s.hidden_size), (4, 64));
    let r = reference("qwen3_5_moe");
    let mut cache = SequenceCache::new(&loaded.model.cache_spec(), &Device::Cpu);
    let mut chunks = [SeqChunk { tokens: &r.prompt, cache: &mut cache, logits: LogitsWanted::All }];
    let logits = loaded.model.forward(&mut chunks).unwrap().pop().flatten().unwrap();
    assert!(rel_err(&logits, &r.prompt_logits) <= 1e-4);
}
