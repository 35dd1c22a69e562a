//! Paged KV at the model level: every Llama-family and hybrid fixture gives the same logits
//! with its attention KV in scattered blocks of a shared pool as with contiguous buffers,
//! chunked unevenly and batched with another sequence; a sequence that shares another's
//! blocks and resumes at a prefix (with a recurrent snapshot for hybrid models) continues
//! exactly as if it had computed the prefix itself.

use std::path::PathBuf;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::{KvDtype, PagedKvStore, SequenceCache};

const BS: usize = 16;

fn fixture(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures").join(path)
}

const MODELS: [&str; 6] =
    ["tiny/llama", "tiny/qwen2", "tiny/qwen3", "tiny/mistral", "hybrid/qwen3_5", "hybrid/qwen3_next"];

fn load(path: &str) -> Box<dyn CausalLm> {
    tandem_model::loader::load(&fixture(path), &Device::Cpu).expect("load fixture").model
}

fn prompt(path: &str) -> Vec<u32> {
    let r =
        candle_core::safetensors::load(fixture(path).join("reference.safetensors"), &Device::Cpu).expect("reference");
    r["prompt_ids"].to_vec1::<i64>().expect("ids").into_iter().map(|x| x as u32).collect()
}

fn rel_err(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    diff / b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-6)
}

/// Feeds `tokens` in chunks of `sizes` (cycled), returning all logits.
fn run(m: &dyn CausalLm, cache: &mut SequenceCache, tokens: &[u32], sizes: &[usize]) -> Tensor {
    let mut out = Vec::new();
    let (mut off, mut i) = (0, 0);
    while off < tokens.len() {
        let n = sizes[i % sizes.len()].min(tokens.len() - off);
        let mut chunks = [SeqChunk { tokens: &tokens[off..off + n], cache: &mut *cache, logits: LogitsWanted::All }];
        out.push(m.forward(&mut chunks).expect("forward").pop().flatten().expect("logits"));
        off += n;
        i += 1;
    }
    Tensor::cat(&out, 0).unwrap()
}

/// Blocks for `len` positions spread over the pool, not in order.
fn scattered_table(len: usize, offset: u32) -> Vec<u32> {
    (0..len.div_ceil(BS) as u32).map(|i| (i * 7 + offset) % 64).collect()
}

#[test]
fn paged_equals_contiguous_on_every_fixture() {
    for path in MODELS {
        let m = load(path);
        let spec = m.cache_spec();
        let p = prompt(path);
        let want = run(m.as_ref(), &mut SequenceCache::new(&spec, &Device::Cpu), &p, &[p.len()]);
        let store = Arc::new(PagedKvStore::new(&spec, 64, BS, KvDtype::F32, &Device::Cpu).unwrap());
        for sizes in [vec![p.len()], vec![7, 1, 20], vec![16]] {
            let mut cache = SequenceCache::new_paged(&spec, store.clone());
            cache.set_block_table(&scattered_table(p.len(), 3));
            let got = run(m.as_ref(), &mut cache, &p, &sizes);
            let e = rel_err(&got, &want);
            assert!(e <= 1e-5, "{path} chunks {sizes:?}: relative error {e}");
        }
        // Two paged sequences in one ragged batch.
        let (a, b) = (&p[..p.len() / 2], &p[5..]);
        let la = run(m.as_ref(), &mut SequenceCache::new(&spec, &Device::Cpu), a, &[a.len()]);
        let lb = run(m.as_ref(), &mut SequenceCache::new(&spec, &Device::Cpu), b, &[b.len()]);
        let mut ca = SequenceCache::new_paged(&spec, store.clone());
        let mut cb = SequenceCache::new_paged(&spec, store.clone());
        ca.set_block_table(&scattered_table(a.len(), 1));
        cb.set_block_table(&scattered_table(b.len(), 2));
        let mut chunks = [
            SeqChunk { tokens: a, cache: &mut ca, logits: LogitsWanted::All },
            SeqChunk { tokens: b, cache: &mut cb, logits: LogitsWanted::All },
        ];
        let out = m.forward(&mut chunks).unwrap();
        assert!(rel_err(out[0].as_ref().unwrap(), &la) <= 1e-5, "{path}: batched a");
        assert!(rel_err(out[1].as_ref().unwrap(), &lb) <= 1e-5, "{path}: batched b");
    }
}

#[test]
fn resuming_on_shared_blocks_continues_exactly() {
    for path in MODELS {
        let m = load(path);
        let spec = m.cache_spec();
        let p = prompt(path);
        let split = 2 * BS;
        let want = run(m.as_ref(), &mut SequenceCache::new(&spec, &Device::Cpu), &p, &[p.len()])
            .narrow(0, split, p.len() - split)
            .unwrap();
        let store = Arc::new(PagedKvStore::new(&spec, 64, BS, KvDtype::F32, &Device::Cpu).unwrap());
        // A computes the prefix and snapshots its recurrent state there.
        let table_a = scattered_table(p.len(), 5);
        let mut a = SequenceCache::new_paged(&spec, store.clone());
        a.set_block_table(&table_a);
        run(m.as_ref(), &mut a, &p[..split], &[split]);
        let snap = a.snapshot();
        // B shares A's two full blocks, continues in blocks of its own.
        let mut table_b = table_a[..2].to_vec();
        table_b.extend(scattered_table(p.len() - split, 40));
        let mut b = SequenceCache::new_paged(&spec, store.clone());
        b.set_block_table(&table_b);
        let needs_snapshot = b.has_recurrent();
        if needs_snapshot {
            assert!(b.resume(split, None).is_err(), "{path}: a hybrid resume needs the snapshot");
        }
        b.resume(split, needs_snapshot.then_some(&snap)).unwrap();
        let got = run(m.as_ref(), &mut b, &p[split..], &[9, 30]);
        let e = rel_err(&got, &want);
        assert!(e <= 1e-5, "{path}: resumed relative error {e}");
    }
}

/// Timing, not a check: prefill and decode of SmolLM2-135M with contiguous and paged KV
/// (`cargo test --release -p tandem-model --test paged -- --ignored --nocapture`).
#[test]
#[ignore]
fn timing_contiguous_vs_paged_smollm2() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m.gguf");
    if !path.exists() {
        eprintln!("models/smollm2-135m.gguf missing; skipped");
        return;
    }
    let m = tandem_model::loader::load(&path, &Device::Cpu).expect("load").model;
    let spec = m.cache_spec();
    let prompt: Vec<u32> = (0..1024u32).map(|i| 100 + (i * 7919 + 13) % 40000).collect();
    let store = Arc::new(PagedKvStore::new(&spec, 128, BS, KvDtype::F32, &Device::Cpu).unwrap());
    for paged in [false, true, false, true] {
        let mut cache = if paged {
            let mut c = SequenceCache::new_paged(&spec, store.clone());
            c.set_block_table(&(0..80).collect::<Vec<u32>>());
            c
        } else {
            SequenceCache::new(&spec, &Device::Cpu)
        };
        let t = std::time::Instant::now();
        let mut chunks = [SeqChunk { tokens: &prompt, cache: &mut cache, logits: LogitsWanted::Last }];
        m.forward(&mut chunks).unwrap();
        let pp = t.elapsed().as_secs_f64();
        let t = std::time::Instant::now();
        for i in 0..64u32 {
            let tok = [100 + i];
            let mut chunks = [SeqChunk { tokens: &tok, cache: &mut cache, logits: LogitsWanted::Last }];
            m.forward(&mut chunks).unwrap();
        }
        let tg = t.elapsed().as_secs_f64();
        eprintln!("paged {paged}: pp1024 {:.1} tok/s, tg64 at 1024 context {:.1} tok/s", 1024.0 / pp, 64.0 / tg);
    }
}
