//! Tensor parallelism's maths on the CPU: the ranks' partial sums put back together are the
//! unsharded model (one rank bit for bit, two and four within float rounding), a sequence
//! gets the same bits alone or in a batch (f32 and Q8_0), a prompt in uneven chunks gives what
//! it gives whole, verify mode's rollback works across the ranks' caches, and shapes that do
//! not divide are refused with a reason.

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};

use super::*;
use crate::arch::qwen_hybrid::random::{preset, random_model, RandomSource};
use crate::arch::qwen_hybrid::LayerKind;
use crate::batch::LogitsWanted;
use crate::kv::SequenceCache;

/// A dense hybrid with heads that split 2 and 4 ways (GDN 4 key / 8 value heads, 4 query / 2
/// KV heads: 4 ranks share each KV head by twos).
fn dense() -> HybridConfig {
    HybridConfig {
        model_type: "qwen3_5_text".into(),
        moe: None,
        intermediate_size: 128,
        num_heads: 4,
        num_kv_heads: 2,
        linear_num_key_heads: 4,
        linear_num_value_heads: 8,
        ..preset("tiny").unwrap()
    }
}

fn source(cfg: &HybridConfig, dtype: GgmlDType) -> RandomSource {
    RandomSource::new(cfg, dtype, &Device::Cpu)
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

/// The last position's logits of feeding `tokens` to a sequence.
fn last_logits(m: &dyn CausalLm, cache: &mut SequenceCache, tokens: &[u32]) -> Vec<f32> {
    let out = m.forward(&mut [SeqChunk { tokens, cache, logits: LogitsWanted::Last }]).unwrap();
    out.into_iter().next().flatten().unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// The last position's logits after a prefill of `prompt`, then after each of `steps` greedy
/// decode steps.
fn run(m: &dyn CausalLm, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = SequenceCache::new(&m.cache_spec(), &Device::Cpu);
    let mut out = Vec::new();
    let mut tokens = prompt.to_vec();
    for _ in 0..=steps {
        let v = last_logits(m, &mut cache, &tokens);
        tokens = vec![argmax(&v)];
        out.push(v);
    }
    out
}

const PROMPT: [u32; 11] = [5, 17, 300, 42, 42, 7, 99, 511, 0, 64, 3];

/// The largest difference between two runs' logits, relative to the largest logit.
fn rel_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let scale = a.iter().flatten().fold(1f32, |m, x| m.max(x.abs()));
    a.iter().flatten().zip(b.iter().flatten()).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn one_rank_is_the_model_bit_for_bit() {
    let cfg = dense();
    for dtype in [GgmlDType::F32, GgmlDType::Q8_0] {
        let plain = random_model(&cfg, dtype, &Device::Cpu).unwrap();
        let tp = TpHybrid::load(&cfg, &source(&cfg, dtype), 1).unwrap();
        assert_eq!(tp.cache_spec(), plain.cache_spec());
        assert_eq!(run(&tp, &PROMPT, 4), run(&plain, &PROMPT, 4), "{dtype:?}");
    }
}

#[test]
fn ranks_put_back_together_are_the_model() {
    let cfg = dense();
    let want = run(&random_model(&cfg, GgmlDType::F32, &Device::Cpu).unwrap(), &PROMPT, 5);
    for world in [2, 4] {
        let tp = TpHybrid::load(&cfg, &source(&cfg, GgmlDType::F32), world).unwrap();
        assert_eq!(tp.world(), world);
        let got = run(&tp, &PROMPT, 5);
        let d = rel_diff(&got, &want);
        assert!(d <= 2e-5, "{world} ranks: logits differ by {d} of the largest");
        let ids = |r: &[Vec<f32>]| r.iter().map(|v| argmax(v)).collect::<Vec<_>>();
        assert_eq!(ids(&got), ids(&want), "{world} ranks: greedy tokens");
    }
}

/// Q8_0 slices compute what the whole matrix does: a column-parallel projection's ranks give
/// the whole output's columns bit for bit, a row-parallel one's partial products add up to
/// the whole product within rounding (the activations' 32-value blocks are the same blocks).
/// (A whole random model in 8 bits moves too far from any small change to compare: 8-bit
/// activations turn the partial sums' last bits into 10% of a logit in this tiny model, as
/// far as the 8-bit model is from the f32 one.)
#[test]
fn q8_0_slices_compute_the_whole_matrix() {
    let cfg = dense();
    let src = source(&cfg, GgmlDType::Q8_0);
    let x: Vec<f32> = (0..3 * 128).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 311.0).collect();
    let x = Tensor::from_vec(x, (3, 128), &Device::Cpu).unwrap();
    let rank = |r: usize, name: &str| {
        let whole = cfg.clone();
        ShardSource::new(&src, r, 2, move |n| split_of(&whole, 2, n)).unwrap().linear(name).unwrap()
    };
    // q_proj (rows): [query | gate] of 4 heads, two heads a rank.
    let name = "blk.3.self_attn.q_proj.weight";
    let whole = src.linear(name).unwrap().forward(&x.narrow(1, 0, 64).unwrap().contiguous().unwrap()).unwrap();
    let parts: Vec<Tensor> =
        (0..2).map(|r| rank(r, name).forward(&x.narrow(1, 0, 64).unwrap().contiguous().unwrap()).unwrap()).collect();
    let joined = Tensor::cat(&parts, 1).unwrap();
    assert_eq!(joined.to_vec2::<f32>().unwrap(), whole.to_vec2::<f32>().unwrap(), "q_proj columns");
    // o_proj (columns): each rank's 64 inputs.
    let name = "blk.3.self_attn.o_proj.weight";
    let whole = src.linear(name).unwrap().forward(&x).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let sum = (0..2)
        .map(|r| rank(r, name).forward(&x.narrow(1, r * 64, 64).unwrap().contiguous().unwrap()).unwrap())
        .reduce(|a, b| (a + b).unwrap())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let d = rel_diff(&[sum], &[whole]);
    assert!(d <= 1e-5, "o_proj partial sums differ by {d} of the largest");
}

#[test]
fn moe_ranks_put_back_together_are_the_model() {
    // Four experts of 32 columns and a shared expert of 32, top 2: every expert cut in two.
    let cfg = HybridConfig { num_heads: 4, num_kv_heads: 2, ..preset("tiny").unwrap() };
    let want = run(&random_model(&cfg, GgmlDType::F32, &Device::Cpu).unwrap(), &PROMPT, 3);
    let got = run(&TpHybrid::load(&cfg, &source(&cfg, GgmlDType::F32), 2).unwrap(), &PROMPT, 3);
    let d = rel_diff(&got, &want);
    assert!(d <= 2e-5, "MoE on 2 ranks: logits differ by {d} of the largest");
}

#[test]
fn each_rank_caches_its_own_heads() {
    let cfg = dense();
    let tp = TpHybrid::load(&cfg, &source(&cfg, GgmlDType::F32), 4).unwrap();
    let spec = tp.cache_spec();
    assert_eq!(spec.len(), 4 * cfg.num_layers(), "every rank's layers, rank after rank");
    // The untied LM head: a quarter of the vocabulary a rank.
    let rows = tp.r.heads().rows().unwrap();
    assert_eq!(rows, vec![cfg.vocab_size / 4; 4]);
    for (i, s) in spec.iter().enumerate() {
        match (s, cfg.layer_kinds[i % cfg.num_layers()]) {
            // Two KV heads over four ranks: each rank keeps the one its query head reads.
            (LayerCacheSpec::Attention { kv_heads, head_dim }, LayerKind::Full) => {
                assert_eq!((*kv_heads, *head_dim), (1, cfg.head_dim))
            }
            (LayerCacheSpec::Recurrent { conv_channels, state_heads, .. }, LayerKind::Linear) => {
                assert_eq!(*state_heads, 2, "8 value heads over 4 ranks");
                assert_eq!(*conv_channels, cfg.conv_channels() / 4);
            }
            (s, k) => panic!("layer {i}: {s:?} for a {k:?} layer"),
        }
    }
}

#[test]
fn a_sequence_gets_the_same_bits_alone_or_in_a_batch() {
    let cfg = dense();
    for dtype in [GgmlDType::F32, GgmlDType::Q8_0] {
        same_bits_alone_or_batched(&TpHybrid::load(&cfg, &source(&cfg, dtype), 2).unwrap());
    }
}

fn same_bits_alone_or_batched(tp: &TpHybrid) {
    let alone = run(tp, &PROMPT, 3);
    let other: Vec<u32> = (0..23).map(|i| (i * 37 + 11) % 512).collect();
    let spec = tp.cache_spec();
    let (mut a, mut b) = (SequenceCache::new(&spec, &Device::Cpu), SequenceCache::new(&spec, &Device::Cpu));
    let (mut ta, mut tb) = (PROMPT.to_vec(), other.clone());
    let mut batched = Vec::new();
    for _ in 0..=3 {
        let out = tp
            .forward(&mut [
                SeqChunk { tokens: &tb, cache: &mut b, logits: LogitsWanted::Last },
                SeqChunk { tokens: &ta, cache: &mut a, logits: LogitsWanted::Last },
            ])
            .unwrap();
        let v: Vec<Vec<f32>> =
            out.into_iter().map(|t| t.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect();
        (tb, ta) = (vec![argmax(&v[0])], vec![argmax(&v[1])]);
        batched.push(v[1].clone());
    }
    assert_eq!(batched, alone, "the batch changed a sequence's bits");
}

#[test]
fn a_prompt_in_uneven_chunks_gives_what_it_gives_whole() {
    let cfg = dense();
    let tp = TpHybrid::load(&cfg, &source(&cfg, GgmlDType::F32), 2).unwrap();
    let spec = tp.cache_spec();
    let last = |c: &mut SequenceCache, t: &[u32]| last_logits(&tp, c, t);
    let mut whole = SequenceCache::new(&spec, &Device::Cpu);
    let want = [last(&mut whole, &PROMPT), last(&mut whole, &[8])];
    let mut cut = SequenceCache::new(&spec, &Device::Cpu);
    last(&mut cut, &PROMPT[..1]);
    last(&mut cut, &PROMPT[1..5]);
    let got = [last(&mut cut, &PROMPT[5..]), last(&mut cut, &[8])];
    let d = rel_diff(&got, &want);
    assert!(d <= 1e-5, "chunks of 1, 4 and 6 differ from one chunk by {d} of the largest logit");
}

#[test]
fn verify_mode_keeps_and_rolls_back_every_ranks_state() {
    let cfg = dense();
    let tp = TpHybrid::load(&cfg, &source(&cfg, GgmlDType::F32), 2).unwrap();
    let spec = tp.cache_spec();
    let last = |m: &TpHybrid, c: &mut SequenceCache, t: &[u32]| last_logits(m, c, t);
    // Plain: the prompt, then 9 and 4 one at a time, then 8.
    let mut plain = SequenceCache::new(&spec, &Device::Cpu);
    last(&tp, &mut plain, &PROMPT);
    last(&tp, &mut plain, &[9]);
    last(&tp, &mut plain, &[4]);
    let want = last(&tp, &mut plain, &[8]);
    // Speculative: 9, 4, 200 verified in one chunk, the last rejected, then 8.
    let mut spec_cache = SequenceCache::new(&spec, &Device::Cpu);
    last(&tp, &mut spec_cache, &PROMPT);
    spec_cache.begin_verify();
    tp.forward(&mut [SeqChunk { tokens: &[9, 4, 200], cache: &mut spec_cache, logits: LogitsWanted::All }]).unwrap();
    spec_cache.commit_speculative(3, 2).unwrap();
    assert_eq!(spec_cache.position(), PROMPT.len() + 2);
    let got = last(&tp, &mut spec_cache, &[8]);
    let d = rel_diff(&[got.clone()], &[want.clone()]);
    assert!(d <= 1e-5, "after a rollback the logits differ by {d} of the largest");
    assert_eq!(argmax(&got), argmax(&want));
}

#[test]
fn shapes_that_do_not_divide_are_refused_with_a_reason() {
    let cfg = dense();
    let err = |r: Result<TpHybrid>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let e = err(TpHybrid::load(&cfg, &source(&cfg, GgmlDType::F32), 3));
    assert!(e.contains("do not divide 3 ways"), "{e}");
    let e = err(TpHybrid::load(&cfg, &source(&cfg, GgmlDType::F32), 8));
    assert!(e.contains("do not divide 8 ways"), "{e}");
    // Q8_0 columns cut inside a block: 128 FFN columns over 8 ranks would be 16.
    let wide = HybridConfig { linear_num_key_heads: 8, linear_num_value_heads: 8, num_heads: 8, ..cfg.clone() };
    let e = err(TpHybrid::load(&wide, &source(&wide, GgmlDType::Q8_0), 8));
    assert!(e.contains("whole pieces of 32"), "{e}");
    // Qwen3-Next's grouped projections and llama.cpp's tiled V heads are cut group by group
    // and tile by tile (the Qwen3-Next fixture and the GGUF tests in tandem-engine).
    let grouped = HybridConfig { grouped_projections: true, ..cfg.clone() };
    assert!(shard_config(&grouped, 2).is_ok());
    let tiled = HybridConfig { v_heads_tiled: true, ..cfg };
    assert!(shard_config(&tiled, 2).is_ok());
}

/// The untied LM head cut by vocabulary gives the whole head's logits bit for bit, and a
/// limit to the first n logits keeps whole slices and cuts the one it ends in.
#[test]
fn the_vocabulary_split_head_is_the_whole_head() {
    use crate::arch::vocab_heads::VocabHeads;
    let cfg = dense();
    let src = source(&cfg, GgmlDType::F32);
    let x: Vec<f32> = (0..2 * 64).map(|i| ((i * 7919 % 1013) as f32 - 506.0) / 311.0).collect();
    let x = Tensor::from_vec(x, (2, 64), &Device::Cpu).unwrap();
    let whole = src.linear("output.weight").unwrap().forward(&x).unwrap().to_vec2::<f32>().unwrap();
    let plain = crate::loader::LoadOptions::default();
    let mut heads = VocabHeads::load(&src, 4, (cfg.vocab_size, cfg.hidden_size), &|s| plain.source(s)).unwrap();
    assert_eq!(heads.rows().unwrap(), vec![128; 4]);
    assert_eq!(heads.logits(&x).unwrap().unwrap().to_vec2::<f32>().unwrap(), whole);
    heads.limit(300).unwrap();
    assert_eq!(heads.rows().unwrap(), vec![128, 128, 44]);
    let first: Vec<Vec<f32>> = whole.iter().map(|r| r[..300].to_vec()).collect();
    assert_eq!(heads.logits(&x).unwrap().unwrap().to_vec2::<f32>().unwrap(), first);
}

/// The embedding table cut by vocabulary: each rank holds a quarter of it, the ranks' rows
/// added are the whole table's rows bit for bit, and a tied table's slices serve as the head
/// (the model's logits as the whole model's, within the ranks' rounding). A vocabulary that
/// does not divide stays whole on every rank.
#[test]
fn the_embedding_table_is_cut_by_vocabulary() {
    let tied = HybridConfig { tie_word_embeddings: true, ..dense() };
    let src = source(&tied, GgmlDType::F32);
    let tp = TpHybrid::load(&tied, &src, 4).unwrap();
    assert_eq!(tp.vocab_size(), tied.vocab_size);
    for r in &tp.r.ranks {
        assert_eq!(r.embed.dims().unwrap(), (tied.vocab_size / 4, tied.hidden_size));
    }
    assert_eq!(tp.r.heads().rows().unwrap(), vec![tied.vocab_size / 4; 4]);
    let ids: Vec<u32> = vec![0, 127, 128, 300, 511, 5, 384];
    let whole = src.embedding("token_embd.weight").unwrap();
    let want = whole.forward(&Tensor::new(ids.as_slice(), &Device::Cpu).unwrap()).unwrap();
    assert_eq!(tp.embed(&ids).unwrap().to_vec2::<f32>().unwrap(), want.to_vec2::<f32>().unwrap());
    assert!(tp.embed(&[512]).is_err(), "an id past the vocabulary");
    let want = run(&random_model(&tied, GgmlDType::F32, &Device::Cpu).unwrap(), &PROMPT, 5);
    let got = run(&tp, &PROMPT, 5);
    let d = rel_diff(&got, &want);
    assert!(d <= 2e-5, "tied table on 4 ranks: logits differ by {d} of the largest");
    // 510 tokens do not divide 4 ways: every rank keeps the whole table, rank 0's serves.
    let odd = HybridConfig { vocab_size: 510, ..dense() };
    let tp = TpHybrid::load(&odd, &source(&odd, GgmlDType::F32), 4).unwrap();
    assert!(tp.r.ranks.iter().all(|r| r.embed.dims().unwrap().0 == 510));
    let want = run(&random_model(&odd, GgmlDType::F32, &Device::Cpu).unwrap(), &PROMPT[..7], 2);
    assert!(rel_diff(&run(&tp, &PROMPT[..7], 2), &want) <= 2e-5);
    assert!(tp.embed(&[510]).is_err(), "an id past the whole table");
}
