//! The slice kernel (plain and AVX2 builds) against the f64 reference in
//! [`super::reference`]: GQA ratios 1, 3 and 4, odd head sizes, contexts that are not block or
//! segment multiples, several sequences sharing one pool, the split over key segments and its
//! merge (decode and multi-query tiles straddling segment boundaries); plus the exponential,
//! and a timing of decode at depth (ignored).

use super::format::F32Rows;
use super::kernel::{has_avx2_fma, run, run_grouped, Dims, SEGMENT_KEYS};
use super::reference::paged_attention_reference;
use super::vec_ops::exp_neg;

pub(super) struct Rng(pub u64);

impl Rng {
    pub fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * amp).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        ((self.uniform() * 0.5 + 0.5) * n as f32) as usize % n
    }
}

/// The instruction sets to test on this CPU.
pub(super) fn builds() -> Vec<bool> {
    if has_avx2_fma() {
        vec![false, true]
    } else {
        vec![false]
    }
}

/// Max over elements of `|got - want| / (1 + |want|)`.
pub(super) fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(g, w)| (g - w).abs() / (1.0 + w.abs())).fold(0f32, f32::max)
}

/// A shuffled block table for `len` positions out of a pool of `n_blocks` blocks.
pub(super) fn table(rng: &mut Rng, n_blocks: usize, len: usize, bs: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i + 1));
    }
    ids.truncate(len.div_ceil(bs));
    ids
}

/// One call against the reference in every build; a large key amplitude makes the softmax
/// peaked, so the running maximum changes between segments.
fn check(rng: &mut Rng, d: Dims, label: &str) {
    let len = d.past + d.t;
    let n_blocks = len.div_ceil(d.block_size) + 5;
    let rows = n_blocks * d.block_size;
    let (k, v) = (rng.vec(rows * d.n_kv * d.hd, 2.5), rng.vec(rows * d.n_kv * d.hd, 1.0));
    let q = rng.vec(d.n_heads * d.t * d.hd, 1.0);
    let blocks = table(rng, n_blocks, len, d.block_size);
    let scale = 1.0 / (d.hd as f32).sqrt();
    let want = paged_attention_reference(&q, &k, &v, &blocks, d, scale);
    for simd in builds() {
        let got = run::<F32Rows>(&q, &k, &v, &blocks, d, scale, simd);
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "{label} {d:?} simd={simd}: relative error {e}");
        // One KV head per work item or all of them: the same bits.
        for heads in [1, d.n_kv] {
            let other = run_grouped::<F32Rows>(&q, &k, &v, &blocks, d, scale, simd, heads);
            assert!(other == got, "{label} {d:?} simd={simd}: {heads} KV heads per item changed the result");
        }
    }
}

#[test]
fn decode_matches_reference_for_gqa_ratios_and_odd_sizes() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for (n_heads, n_kv) in [(3, 3), (9, 3), (8, 2), (4, 1)] {
        for hd in [64, 17, 40, 96, 128] {
            for (past, bs) in [(0, 16), (36, 16), (100, 7), (SEGMENT_KEYS - 1, 16), (SEGMENT_KEYS, 16), (1000, 16)] {
                let d = Dims { n_heads, n_kv, t: 1, hd, past, block_size: bs, window: 0 };
                check(&mut rng, d, "decode");
            }
        }
    }
}

#[test]
fn long_decode_splits_over_segments_and_merges() {
    let mut rng = Rng(99);
    // SmolLM2-135M's shape at the depths of the agent benchmark, and a GQA-4 head of 128.
    for (n_heads, n_kv, hd, past) in [(9, 3, 64, 3199), (9, 3, 64, 5999), (8, 2, 128, 2 * SEGMENT_KEYS + 3)] {
        let d = Dims { n_heads, n_kv, t: 1, hd, past, block_size: 16, window: 0 };
        check(&mut rng, d, "long decode");
    }
}

#[test]
fn multi_query_chunks_match_reference() {
    let mut rng = Rng(5);
    // Chunks that straddle segment boundaries, several tiles, block sizes that are not
    // multiples of the eight-key step.
    for (n_heads, n_kv, hd, t, past, bs) in [
        (9, 3, 64, 37, SEGMENT_KEYS - 20, 16),
        (4, 4, 33, 20, 0, 5),
        (8, 2, 64, 70, 2 * SEGMENT_KEYS - 1, 16),
        (12, 3, 24, 17, 13, 1),
        (6, 2, 8, 3, 400, 32),
    ] {
        let d = Dims { n_heads, n_kv, t, hd, past, block_size: bs, window: 0 };
        check(&mut rng, d, "chunk");
    }
}

/// Sequences of different lengths sharing one pool, each through its own block table, equal
/// the reference on their own blocks and are not disturbed by the others' data.
#[test]
fn sequences_sharing_a_pool_match_reference() {
    let mut rng = Rng(31);
    let (n_heads, n_kv, hd, bs) = (9, 3, 64, 16);
    let lens = [1usize, 17, 300, 777];
    let n_blocks: usize = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 3;
    let rows = n_blocks * bs;
    let (k, v) = (rng.vec(rows * n_kv * hd, 2.0), rng.vec(rows * n_kv * hd, 1.0));
    let all = table(&mut rng, n_blocks, n_blocks * bs, bs);
    let mut next = 0;
    for len in lens {
        let blocks = &all[next..next + len.div_ceil(bs)];
        next += blocks.len();
        let d = Dims { n_heads, n_kv, t: 1, hd, past: len - 1, block_size: bs, window: 0 };
        let q = rng.vec(n_heads * hd, 1.0);
        let want = paged_attention_reference(&q, &k, &v, blocks, d, 0.125);
        for simd in builds() {
            let e = rel_err(&run::<F32Rows>(&q, &k, &v, blocks, d, 0.125, simd), &want);
            assert!(e < 1e-5, "len {len} simd={simd}: {e}");
        }
    }
}

/// Decode row by row equals the rows of one multi-query call, bit for bit, in every build
/// (segment boundaries are absolute, rows independent of their tile).
#[test]
fn decode_rows_equal_chunk_rows_bit_for_bit() {
    let mut rng = Rng(77);
    let (n_heads, n_kv, hd, bs, len) = (9, 3, 40, 16, SEGMENT_KEYS + 40);
    let n_blocks = len.div_ceil(bs);
    let (k, v) = (rng.vec(n_blocks * bs * n_kv * hd, 2.0), rng.vec(n_blocks * bs * n_kv * hd, 1.0));
    let blocks = table(&mut rng, n_blocks, len, bs);
    let (t, past) = (60, len - 60);
    let q = rng.vec(n_heads * t * hd, 1.0);
    for simd in builds() {
        let whole = run::<F32Rows>(
            &q,
            &k,
            &v,
            &blocks,
            Dims { n_heads, n_kv, t, hd, past, block_size: bs, window: 0 },
            0.2,
            simd,
        );
        for i in 0..t {
            let qi: Vec<f32> = (0..n_heads).flat_map(|h| q[(h * t + i) * hd..][..hd].to_vec()).collect();
            let d = Dims { n_heads, n_kv, t: 1, hd, past: past + i, block_size: bs, window: 0 };
            let one = run::<F32Rows>(&qi, &k, &v, &blocks, d, 0.2, simd);
            for h in 0..n_heads {
                assert_eq!(&one[h * hd..][..hd], &whole[(h * t + i) * hd..][..hd], "row {i} head {h} simd={simd}");
            }
        }
    }
}

/// Sliding windows (Gemma 3's local layers): decode and chunks against the reference, with
/// windows shorter than the chunk, across segment and block boundaries, and longer than the
/// sequence; and every row of a chunk equals the same row decoded alone, bit for bit (the
/// skipped segments change nothing).
#[test]
fn sliding_window_matches_reference_and_decode_rows() {
    let mut rng = Rng(4242);
    for (n_heads, n_kv, hd, t, past, bs, window) in [
        (4, 2, 32, 1, 40, 16, 8),
        (4, 2, 32, 40, 0, 16, 8),
        (9, 3, 64, 37, SEGMENT_KEYS - 20, 16, 30),
        (8, 2, 64, 70, 2 * SEGMENT_KEYS - 1, 16, SEGMENT_KEYS + 7),
        (4, 1, 40, 17, 1000, 7, 512),
        (4, 4, 16, 5, 3, 4, 100),
        (2, 1, 8, 3, 600, 16, 1),
    ] {
        let d = Dims { n_heads, n_kv, t, hd, past, block_size: bs, window };
        check(&mut rng, d, "window");
        let len = past + t;
        let n_blocks = len.div_ceil(bs);
        let (k, v) = (rng.vec(n_blocks * bs * n_kv * hd, 2.0), rng.vec(n_blocks * bs * n_kv * hd, 1.0));
        let blocks = table(&mut rng, n_blocks, len, bs);
        let q = rng.vec(n_heads * t * hd, 1.0);
        for simd in builds() {
            let whole = run::<F32Rows>(&q, &k, &v, &blocks, d, 0.2, simd);
            for i in 0..t {
                let qi: Vec<f32> = (0..n_heads).flat_map(|h| q[(h * t + i) * hd..][..hd].to_vec()).collect();
                let one = run::<F32Rows>(&qi, &k, &v, &blocks, Dims { t: 1, past: past + i, ..d }, 0.2, simd);
                for h in 0..n_heads {
                    let row = &whole[(h * t + i) * hd..][..hd];
                    assert_eq!(&one[h * hd..][..hd], row, "window {window} row {i} head {h} simd={simd}");
                }
            }
        }
    }
}

#[test]
fn exp_neg_is_accurate() {
    for x in [-0.0f32, -1e-3, -0.5, -3.3, -20.0, -86.0, -100.0, f32::NEG_INFINITY] {
        let (got, want) = (exp_neg(x), x.exp());
        assert!((got - want).abs() <= 2.5e-7 * want + 1e-37, "exp({x}): {got} vs {want}");
    }
}

/// Time the calling thread spent on a CPU so far (ns), from the scheduler's statistics.
pub(super) fn on_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
