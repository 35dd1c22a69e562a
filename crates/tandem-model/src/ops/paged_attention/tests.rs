//! The paged kernel against the plain `causal_attention` on random inputs and random block
//! layouts (decode, prefill, chunks after a past, GQA groups, odd head sizes, block sizes),
//! bit-identical rows whatever the chunking, and clean errors for bad block tables.

use candle_core::{Device, Tensor};

use super::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * amp).collect()
    }
}

/// A pool of `n_blocks` blocks with the sequence's `len` positions scattered over a shuffled
/// subset of them; returns the pools, the block table and the contiguous `[n_kv, len, hd]` KV.
fn scattered(
    rng: &mut Rng,
    n_kv: usize,
    hd: usize,
    len: usize,
    bs: usize,
) -> (Tensor, Tensor, Vec<u32>, Tensor, Tensor) {
    let need = len.div_ceil(bs).max(1);
    let n_blocks = need * 2 + 3;
    let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.next() as usize % (i + 1));
    }
    let blocks = ids[..need].to_vec();
    let rows = n_blocks * bs;
    let mut kp = rng.vec(rows * n_kv * hd, 1.0); // garbage everywhere else
    let mut vp = rng.vec(rows * n_kv * hd, 1.0);
    let k = rng.vec(n_kv * len * hd, 2.0);
    let v = rng.vec(n_kv * len * hd, 1.0);
    for p in 0..len {
        let slot = blocks[p / bs] as usize * bs + p % bs;
        for h in 0..n_kv {
            let src = (h * len + p) * hd;
            let dst = (slot * n_kv + h) * hd;
            kp[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
            vp[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
        }
    }
    let dev = Device::Cpu;
    (
        Tensor::from_vec(kp, (rows, n_kv, hd), &dev).unwrap(),
        Tensor::from_vec(vp, (rows, n_kv, hd), &dev).unwrap(),
        blocks,
        Tensor::from_vec(k, (n_kv, len, hd), &dev).unwrap(),
        Tensor::from_vec(v, (n_kv, len, hd), &dev).unwrap(),
    )
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

#[test]
fn matches_causal_attention_on_random_layouts() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // (n_heads, n_kv, hd, t, past, block_size)
    let cases = [
        (4, 2, 16, 1, 0, 16),
        (4, 2, 16, 1, 37, 16),
        (8, 2, 64, 40, 0, 16),
        (8, 8, 17, 5, 100, 4),
        (6, 3, 32, 33, 15, 16),
        (4, 1, 8, 70, 9, 1),
        (2, 1, 32, 16, 16, 16),
        (12, 4, 24, 1, 500, 32),
    ];
    for (nh, nkv, hd, t, past, bs) in cases {
        let len = past + t;
        let (kp, vp, blocks, k, v) = scattered(&mut rng, nkv, hd, len, bs);
        let q = Tensor::from_vec(rng.vec(nh * t * hd, 1.0), (nh, t, hd), &Device::Cpu).unwrap();
        let scale = 1.0 / (hd as f64).sqrt();
        let kv = PagedKv { blocks: &blocks, block_size: bs, dtype: KvDtype::F32, window: 0 };
        let got = paged_attention(&q, &kp, &vp, kv, past, scale).unwrap();
        let want = causal_attention(&q, &k, &v, scale, 0).unwrap();
        let e = max_abs_diff(&got, &want);
        assert!(e < 1e-5, "nh={nh} nkv={nkv} hd={hd} t={t} past={past} bs={bs}: max diff {e}");
        // The gather used on other devices reads back exactly the contiguous KV.
        assert_eq!(max_abs_diff(&gather_kv(&kp, kv, len, hd).unwrap(), &k), 0.0);
    }
}

#[test]
fn chunking_does_not_change_a_single_bit() {
    let mut rng = Rng(42);
    let (nh, nkv, hd, bs, len) = (4, 2, 16, 16, 75);
    let (kp, vp, blocks, _, _) = scattered(&mut rng, nkv, hd, len, bs);
    let q = Tensor::from_vec(rng.vec(nh * len * hd, 1.0), (nh, len, hd), &Device::Cpu).unwrap();
    let kv = PagedKv { blocks: &blocks, block_size: bs, dtype: KvDtype::F32, window: 0 };
    let whole = paged_attention(&q, &kp, &vp, kv, 0, 0.25).unwrap();
    for sizes in [vec![1usize; 75], vec![7, 64, 4], vec![30, 45]] {
        let mut parts = Vec::new();
        let mut past = 0;
        for n in sizes {
            let qc = q.narrow(1, past, n).unwrap().contiguous().unwrap();
            parts.push(paged_attention(&qc, &kp, &vp, kv, past, 0.25).unwrap());
            past += n;
        }
        let chunked = Tensor::cat(&parts, 1).unwrap();
        assert_eq!(max_abs_diff(&chunked, &whole), 0.0);
    }
}

#[test]
fn bad_block_tables_are_errors() {
    let mut rng = Rng(7);
    let (kp, vp, blocks, _, _) = scattered(&mut rng, 2, 8, 20, 16);
    let q = Tensor::zeros((2, 4, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
    let short = PagedKv { blocks: &blocks[..1], block_size: 16, dtype: KvDtype::F32, window: 0 };
    assert!(paged_attention(&q, &kp, &vp, short, 16, 1.0).is_err(), "table too short");
    let outside = [blocks[0], 1000];
    assert!(paged_attention(
        &q,
        &kp,
        &vp,
        PagedKv { blocks: &outside, block_size: 16, dtype: KvDtype::F32, window: 0 },
        16,
        1.0
    )
    .is_err());
    let q3 = Tensor::zeros((3, 4, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(
        paged_attention(
            &q3,
            &kp,
            &vp,
            PagedKv { blocks: &blocks, block_size: 16, dtype: KvDtype::F32, window: 0 },
            16,
            1.0
        )
        .is_err(),
        "3 heads over 2 KV heads"
    );
}

/// Timing, not a check: the paged kernel against the materialising `causal_attention` at
/// SmolLM2-135M's attention shape (`cargo test -p tandem-model --lib timing -- --ignored --nocapture`).
#[test]
#[ignore]
fn timing_against_causal_attention() {
    let mut rng = Rng(3);
    let (nh, nkv, hd, bs) = (9, 3, 64, 16);
    for (t, past, reps) in [(1usize, 511usize, 300usize), (1, 3199, 100), (1, 5999, 100), (512, 512, 3)] {
        let len = past + t;
        let (kp, vp, blocks, k, v) = scattered(&mut rng, nkv, hd, len, bs);
        let q = Tensor::from_vec(rng.vec(nh * t * hd, 1.0), (nh, t, hd), &Device::Cpu).unwrap();
        let kv = PagedKv { blocks: &blocks, block_size: bs, dtype: KvDtype::F32, window: 0 };
        let (mut best_plain, mut best_paged) = (f64::MAX, f64::MAX);
        for _ in 0..3 {
            let s = std::time::Instant::now();
            for _ in 0..reps {
                causal_attention(&q, &k, &v, 0.125, 0).unwrap();
            }
            best_plain = best_plain.min(s.elapsed().as_secs_f64() / reps as f64);
            let s = std::time::Instant::now();
            for _ in 0..reps {
                paged_attention(&q, &kp, &vp, kv, past, 0.125).unwrap();
            }
            best_paged = best_paged.min(s.elapsed().as_secs_f64() / reps as f64);
        }
        eprintln!("t={t} past={past}: plain {:.3} ms, paged {:.3} ms", best_plain * 1e3, best_paged * 1e3);
    }
}
