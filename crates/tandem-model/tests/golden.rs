//! Golden logits: tiny random Llama-family checkpoints generated with HF `transformers`
//! (`scripts/gen_llama_fixtures.py`) must give the same logits (f32, relative error <= 1e-4)
//! for a whole prompt and for every greedy decode step. Also checks, at the model level, that
//! chunked prefill and ragged batching do not change results.

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::SequenceCache;

const VARIANTS: [&str; 5] = ["llama", "qwen2", "qwen3", "mistral", "gemma3"];

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny").join(name)
}

struct Reference {
    prompt: Vec<u32>,
    prompt_logits: Tensor,
    greedy: Vec<u32>,
    decode_logits: Tensor,
    margins: Vec<f32>,
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
    }
}

fn load(name: &str) -> Box<dyn CausalLm> {
    tandem_model::loader::load(&fixture(name), &Device::Cpu).expect("load fixture").model
}

/// max |a - b| / max |b|
fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let scale = b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-6);
    diff / scale
}

fn forward_one(
    model: &dyn CausalLm,
    cache: &mut SequenceCache,
    tokens: &[u32],
    logits: LogitsWanted,
) -> Option<Tensor> {
    let mut chunks = [SeqChunk { tokens, cache, logits }];
    model.forward(&mut chunks).expect("forward").pop().flatten()
}

fn argmax(t: &Tensor) -> u32 {
    let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn prompt_and_decode_logits_match_transformers() {
    for name in VARIANTS {
        let model = load(name);
        let r = reference(name);
        let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
        let logits = forward_one(model.as_ref(), &mut cache, &r.prompt, LogitsWanted::All).unwrap();
        let e = rel_err(&logits, &r.prompt_logits);
        assert!(e <= 1e-4, "{name}: prompt logits relative error {e}");
        // Teacher-forced decode over the reference greedy tokens: every step's logits match.
        let mut last = logits.narrow(0, r.prompt.len() - 1, 1).unwrap();
        let mut tokens_agree = true;
        for (i, &tok) in r.greedy.iter().enumerate() {
            let want = r.decode_logits.narrow(0, i, 1).unwrap();
            let e = rel_err(&last, &want);
            assert!(e <= 1e-4, "{name}: decode step {i} relative error {e}");
            // Our greedy choice equals transformers' until the first near tie.
            if r.margins[i] < 1e-3 {
                tokens_agree = false;
            }
            if tokens_agree {
                assert_eq!(argmax(&last), tok, "{name}: greedy token at step {i}");
            }
            last = forward_one(model.as_ref(), &mut cache, &[tok], LogitsWanted::Last).unwrap();
        }
    }
}

#[test]
fn chunked_prefill_equals_one_shot() {
    for name in ["qwen2", "llama", "gemma3"] {
        let model = load(name);
        let r = reference(name);
        let mut one = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
        let whole = forward_one(model.as_ref(), &mut one, &r.prompt, LogitsWanted::All).unwrap();
        for sizes in [vec![1usize; r.prompt.len()], vec![7, 16, 17], vec![13, 27]] {
            let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
            let mut off = 0;
            let mut parts = Vec::new();
            for s in sizes.iter().copied() {
                let s = s.min(r.prompt.len() - off);
                parts
                    .push(forward_one(model.as_ref(), &mut cache, &r.prompt[off..off + s], LogitsWanted::All).unwrap());
                off += s;
            }
            assert_eq!(off, r.prompt.len());
            let chunked = Tensor::cat(&parts, 0).unwrap();
            let e = rel_err(&chunked, &whole);
            assert!(e <= 1e-5, "{name} chunks {sizes:?}: relative error {e}");
        }
    }
}

#[test]
fn ragged_batch_equals_sequences_alone() {
    let model = load("qwen3");
    let r = reference("qwen3");
    let dev = Device::Cpu;
    let a = &r.prompt[..29];
    let b = &r.prompt[5..];
    let alone = |p: &[u32]| {
        let mut c = SequenceCache::new(&model.cache_spec(), &dev);
        forward_one(model.as_ref(), &mut c, p, LogitsWanted::All).unwrap()
    };
    let (la, lb) = (alone(a), alone(b));
    let mut ca = SequenceCache::new(&model.cache_spec(), &dev);
    let mut cb = SequenceCache::new(&model.cache_spec(), &dev);
    let mut chunks = [
        SeqChunk { tokens: a, cache: &mut ca, logits: LogitsWanted::All },
        SeqChunk { tokens: b, cache: &mut cb, logits: LogitsWanted::All },
    ];
    let out = model.forward(&mut chunks).unwrap();
    assert!(rel_err(out[0].as_ref().unwrap(), &la) <= 1e-5);
    assert!(rel_err(out[1].as_ref().unwrap(), &lb) <= 1e-5);
    // Then one decode step for both together vs alone.
    let mut chunks = [
        SeqChunk { tokens: &[7], cache: &mut ca, logits: LogitsWanted::Last },
        SeqChunk { tokens: &[9], cache: &mut cb, logits: LogitsWanted::Last },
    ];
    let out = model.forward(&mut chunks).unwrap();
    let mut c = SequenceCache::new(&model.cache_spec(), &dev);
    forward_one(model.as_ref(), &mut c, a, LogitsWanted::None);
    let da = forward_one(model.as_ref(), &mut c, &[7], LogitsWanted::Last).unwrap();
    assert!(rel_err(out[0].as_ref().unwrap(), &da) <= 1e-5);
}

#[test]
fn out_of_vocab_token_is_an_error_not_a_panic() {
    let model = load("llama");
    let mut cache = SequenceCache::new(&model.cache_spec(), &Device::Cpu);
    let mut chunks = [SeqChunk { tokens: &[1, 100_000], cache: &mut cache, logits: LogitsWanted::Last }];
    assert!(model.forward(&mut chunks).is_err());
}
