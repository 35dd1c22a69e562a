//! The CPU kernel of paged attention on plain slices. Work items are (KV head, tile of up to
//! [`TILE_Q`] query positions, segment of [`SEGMENT_KEYS`] key positions): every query head of
//! a KV group is handled by the same item, so the group shares each key and value row read
//! (GQA), and a long context is split over key positions (flash-decoding) so one sequence's
//! decode uses every thread. Each item computes a partial softmax state
//! ([`super::segment`]); the partial states of a tile are merged in segment order. candle's
//! barrier pool spreads the items over threads.
//!
//! On x86-64 CPUs with AVX2, FMA and F16C the items run a build with eight-key dot products and
//! register-blocked value sums ([`super::avx2`]); elsewhere the plain build
//! ([`super::vec_ops::Plain`]). A row's arithmetic never depends on its tile or on the other
//! rows, and segment boundaries are absolute positions, so results are bit-identical whatever
//! the chunking — but may differ in the last bits between the two instruction sets.

use std::sync::OnceLock;

use super::format::{F32Rows, KvRows};
use super::segment::{segment, Item, Partial};
use super::vec_ops::Plain;

/// Query positions per tile.
const TILE_Q: usize = 16;

/// Key positions per segment (absolute boundaries: positions `s * SEGMENT_KEYS ..`).
pub(super) const SEGMENT_KEYS: usize = 256;

/// Sizes of one paged-attention call.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub n_heads: usize,
    pub n_kv: usize,
    pub t: usize,
    pub hd: usize,
    pub past: usize,
    pub block_size: usize,
    /// Sliding window: query position `p` sees keys `p + 1 - window ..= p` (0: every key
    /// from position 0).
    pub window: usize,
}

impl Dims {
    /// First key position query position `p` sees.
    pub fn first_key(&self, p: usize) -> usize {
        if self.window == 0 {
            0
        } else {
            (p + 1).saturating_sub(self.window)
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn segment_avx2<R: KvRows>(
    q: &[f32],
    k: &[R::Elem],
    v: &[R::Elem],
    blocks: &[u32],
    d: Dims,
    scale: f32,
    it: Item,
) -> Partial {
    segment::<R, super::avx2::Fma>(q, k, v, blocks, d, scale, it)
}

/// Whether this CPU runs the AVX2 build (AVX2, FMA and F16C).
pub(super) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `q: [n_heads, t, hd]`, f32 pools `[rows, n_kv, hd]`; returns `[n_heads, t, hd]`. The
/// block table must cover `past + t` positions inside the pool (checked by
/// `paged_attention`).
pub fn paged_attention_cpu(q: &[f32], k: &[f32], v: &[f32], blocks: &[u32], d: Dims, scale: f32) -> Vec<f32> {
    run::<F32Rows>(q, k, v, blocks, d, scale, has_avx2_fma())
}

/// KV heads per work item: all of them (pool rows read front to back) when there are enough
/// (tile, segment) items for the threads anyway, one otherwise.
fn heads_per_item(d: Dims, threads: usize) -> usize {
    let tiles = d.t.div_ceil(TILE_Q);
    let segments = (d.past + d.t).div_ceil(SEGMENT_KEYS);
    if tiles * segments >= 4 * threads {
        d.n_kv
    } else {
        1
    }
}

/// The work items of a call, each (KV heads, tile)'s segments adjacent and in key order; a
/// sliding window skips the segments no row of the tile sees (segment boundaries stay
/// absolute, so a row gets the same bits in any tile).
fn items(d: Dims, heads_per_item: usize) -> Vec<Item> {
    let mut items = Vec::new();
    for kh in (0..d.n_kv).step_by(heads_per_item) {
        let kh_end = (kh + heads_per_item).min(d.n_kv);
        for i0 in (0..d.t).step_by(TILE_Q) {
            let i1 = (i0 + TILE_Q).min(d.t);
            let len = d.past + i1;
            let first = d.first_key(d.past + i0) / SEGMENT_KEYS * SEGMENT_KEYS;
            for p0 in (first..len).step_by(SEGMENT_KEYS) {
                items.push(Item { kh, kh_end, i0, i1, p0, p1: (p0 + SEGMENT_KEYS).min(len) });
            }
        }
    }
    items
}

/// The kernel with the instruction set chosen by `simd` (AVX2 + FMA when true; the caller
/// checked the CPU). Pools hold rows in format `R`: `[rows, n_kv, R::DTYPE.row_elems(hd)]`.
pub(super) fn run<R: KvRows>(
    q: &[f32],
    k: &[R::Elem],
    v: &[R::Elem],
    blocks: &[u32],
    d: Dims,
    scale: f32,
    simd: bool,
) -> Vec<f32> {
    let threads = crate::ops::cpu_threads::threads();
    run_grouped::<R>(q, k, v, blocks, d, scale, simd, heads_per_item(d, threads))
}

/// [`run`] with `heads_per_item` KV heads per work item (1 ..= n_kv; results do not depend
/// on it).
#[allow(clippy::too_many_arguments)]
pub(super) fn run_grouped<R: KvRows>(
    q: &[f32],
    k: &[R::Elem],
    v: &[R::Elem],
    blocks: &[u32],
    d: Dims,
    scale: f32,
    simd: bool,
    heads_per_item: usize,
) -> Vec<f32> {
    let Dims { n_heads, n_kv, t, hd, .. } = d;
    let group = n_heads / n_kv;
    let items = items(d, heads_per_item.clamp(1, n_kv));
    let one = |it: Item| {
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: `simd` is only true when the CPU reports AVX2 and FMA.
            return unsafe { segment_avx2::<R>(q, k, v, blocks, d, scale, it) };
        }
        let _ = simd;
        segment::<R, Plain>(q, k, v, blocks, d, scale, it)
    };
    // Items run on candle's barrier pool, the workers every other CPU op of a step uses (a
    // second pool would fight it for the same cores), within the thread limit.
    let slots: Vec<OnceLock<Partial>> = items.iter().map(|_| OnceLock::new()).collect();
    crate::ops::cpu_threads::execute_chunked(items.len(), |range| {
        for i in range {
            let _ = slots[i].set(one(items[i]));
        }
    });
    let mut partials = slots.into_iter().zip(&items).map(|(s, &it)| s.into_inner().unwrap_or_else(|| one(it)));
    let mut out = vec![0f32; n_heads * t * hd];
    let mut idx = 0;
    while idx < items.len() {
        let Item { kh, kh_end, i0, i1, .. } = items[idx];
        let mut state = partials.next().expect("one partial per item");
        idx += 1;
        while idx < items.len() && (items[idx].kh, items[idx].i0) == (kh, i0) {
            merge(&mut state, &partials.next().expect("one partial per item"), hd);
            idx += 1;
        }
        let tq = i1 - i0;
        // Rows are [kh_end - kh, group, tq]: query head kh * group + r / tq.
        for hg in 0..(kh_end - kh) * group {
            let h = kh * group + hg;
            for i in 0..tq {
                let r = hg * tq + i;
                let inv = 1.0 / state.l[r];
                let dst = &mut out[(h * t + i0 + i) * hd..][..hd];
                for (o, &a) in dst.iter_mut().zip(&state.acc[r * hd..(r + 1) * hd]) {
                    *o = a * inv;
                }
            }
        }
    }
    out
}

/// Merges the state of the next segment into the running one (rows that saw no key in a
/// segment have `l == 0` there).
fn merge(a: &mut Partial, b: &Partial, hd: usize) {
    for r in 0..a.m.len() {
        if b.l[r] == 0.0 {
            continue;
        }
        let (dst, src) = (&mut a.acc[r * hd..(r + 1) * hd], &b.acc[r * hd..(r + 1) * hd]);
        if a.l[r] == 0.0 {
            a.m[r] = b.m[r];
            a.l[r] = b.l[r];
            dst.copy_from_slice(src);
            continue;
        }
        let m = a.m[r].max(b.m[r]);
        let (ca, cb) = ((a.m[r] - m).exp(), (b.m[r] - m).exp());
        a.l[r] = a.l[r] * ca + b.l[r] * cb;
        for (x, &y) in dst.iter_mut().zip(src) {
            *x = *x * ca + y * cb;
        }
        a.m[r] = m;
    }
}
