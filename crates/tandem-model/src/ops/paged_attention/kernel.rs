//! The CPU kernel of paged attention on plain slices: tiles of (query heads sharing one KV
//! head) x (up to [`TILE_Q`] query positions) walk the sequence's key blocks in order with an
//! online softmax, in segments of [`SEGMENT_KEYS`] keys whose partial states are merged in
//! order. candle's barrier pool spreads (tile, segment) items over threads; on x86-64 CPUs with AVX2 and FMA
//! the same code is compiled a second time with those features (fused multiply-adds, 8
//! lanes). A row's arithmetic never depends on its tile, so results are bit-identical whatever
//! the chunking — but may differ in the last bits between the two instruction sets.

/// Query positions per tile.
const TILE_Q: usize = 16;

/// Sizes of one paged-attention call.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub n_heads: usize,
    pub n_kv: usize,
    pub t: usize,
    pub hd: usize,
    pub past: usize,
    pub block_size: usize,
}

/// The two vector primitives of the kernel.
trait VecOps {
    /// `sum(a[i] * b[i])`.
    fn dot(a: &[f32], b: &[f32]) -> f32;
    /// `y[i] += p * x[i]`.
    fn axpy(y: &mut [f32], p: f32, x: &[f32]);
}

/// Plain loops (any CPU); eight accumulators so that SSE can still vectorise the dot.
struct Plain;
impl VecOps for Plain {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0f32; 8];
        let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
        let mut tail = 0f32;
        for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
            tail += x * y;
        }
        for (x, y) in ca.zip(cb) {
            for i in 0..8 {
                acc[i] += x[i] * y[i];
            }
        }
        ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
    }
    #[inline(always)]
    fn axpy(y: &mut [f32], p: f32, x: &[f32]) {
        for (a, &b) in y.iter_mut().zip(x) {
            *a += p * b;
        }
    }
}

/// AVX2 + FMA: the dot product with intrinsics ([`dot_fma`]), the update as 8-lane array
/// code that LLVM turns into FMA instructions once inlined into [`tile_avx2`]. Outside that
/// function `mul_add` would be a libm call, so this type is never used elsewhere.
#[cfg(target_arch = "x86_64")]
struct Fma8;

#[cfg(target_arch = "x86_64")]
impl VecOps for Fma8 {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: `Fma8` is only used inside `tile_avx2`, chosen when the CPU has AVX2 + FMA.
        unsafe { dot_fma(a, b) }
    }
    #[inline(always)]
    fn axpy(y: &mut [f32], p: f32, x: &[f32]) {
        let mut cy = y.chunks_exact_mut(8);
        let cx = x.chunks_exact(8);
        let rx = cx.remainder();
        for (yy, xx) in (&mut cy).zip(cx) {
            if let (Ok(yy), Ok(xx)) = (<&mut [f32; 8]>::try_from(yy), <&[f32; 8]>::try_from(xx)) {
                for i in 0..8 {
                    yy[i] = p.mul_add(xx[i], yy[i]);
                }
            }
        }
        for (yy, xx) in cy.into_remainder().iter_mut().zip(rx) {
            *yy = p.mul_add(*xx, *yy);
        }
    }
}

/// The dot product with AVX2 FMAs, two accumulators. Loads go through `lddqu`, which (unlike
/// `_mm256_loadu_ps`) carries no per-load checks in debug builds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let load = |x: &[f32]| _mm256_castsi256_ps(_mm256_lddqu_si256(x.as_ptr().cast::<__m256i>()));
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (x, y) in ca.zip(cb) {
        let ((x0, x1), (y0, y1)) = (x.split_at(8), y.split_at(8));
        acc0 = _mm256_fmadd_ps(load(x0), load(y0), acc0);
        acc1 = _mm256_fmadd_ps(load(x1), load(y1), acc1);
    }
    let (ca, cb) = (ra.chunks_exact(8), rb.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        acc0 = _mm256_fmadd_ps(load(x), load(y), acc0);
    }
    let acc = _mm256_add_ps(acc0, acc1);
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    let mut r = _mm_cvtss_f32(s);
    for (x, y) in ra.iter().zip(rb) {
        r = x.mul_add(*y, r);
    }
    r
}

/// `exp(x)` for `x <= 0` from Cephes' `expf` (about one ulp, flushes below `e^-87` to
/// ~1e-38): pure arithmetic, so loops over it vectorise.
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting rounds to an integer
    let x = x.max(-87.0);
    let k = (x * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
    let r = x - k * 0.693_359_4 + k * 2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 0.166_666_65) * r
        + 0.5;
    let y = p * r * r + r + 1.0;
    // Wrapping add: no overflow check in the loop body, so it vectorises in every profile.
    y * f32::from_bits(((k as i32).wrapping_add(127) as u32) << 23)
}

/// Key positions per segment: a tile's keys are split at these absolute boundaries into
/// independent work items whose partial softmax states are merged in order, so one long
/// sequence's decode uses every thread and the split never depends on the chunking.
const SEGMENT_KEYS: usize = 512;

/// The running softmax state of a tile's rows over some keys: max, normaliser, weighted sum.
struct Partial {
    m: Vec<f32>,
    l: Vec<f32>,
    acc: Vec<f32>,
}

/// One tile's rows (`[group, tq]`) over key blocks `b0..b1`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile<M: VecOps>(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    blocks: &[u32],
    d: Dims,
    scale: f32,
    kh: usize,
    i0: usize,
    i1: usize,
    b0: usize,
    b1: usize,
) -> Partial {
    let Dims { n_heads, n_kv, t, hd, past, block_size: bs } = d;
    let group = n_heads / n_kv;
    let row_stride = n_kv * hd;
    let tq = i1 - i0;
    let n_rows = group * tq;
    let mut m = vec![f32::NEG_INFINITY; n_rows];
    let mut l = vec![0f32; n_rows];
    let mut acc = vec![0f32; n_rows * hd];
    let mut s = vec![0f32; bs];
    let (koff, kend) = (kh * hd, kh * hd + hd);
    for (blk, &block) in blocks[b0..b1].iter().enumerate() {
        let start = (b0 + blk) * bs;
        let base = block as usize * bs * row_stride;
        let (kblk, vblk) = (&k[base..base + bs * row_stride], &v[base..base + bs * row_stride]);
        for r in 0..n_rows {
            let (g, i) = (r / tq, i0 + r % tq);
            let visible = past + i + 1;
            if start >= visible {
                continue;
            }
            let n = bs.min(visible - start);
            let qrow = &q[((kh * group + g) * t + i) * hd..][..hd];
            let s = &mut s[..n];
            for (sj, krow) in s.iter_mut().zip(kblk.chunks_exact(row_stride)) {
                *sj = M::dot(qrow, &krow[koff..kend]) * scale;
            }
            let bmax = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let m_new = m[r].max(bmax);
            let a = &mut acc[r * hd..(r + 1) * hd];
            if m[r] != m_new {
                let corr = (m[r] - m_new).exp();
                l[r] *= corr;
                a.iter_mut().for_each(|x| *x *= corr);
            }
            for sj in s.iter_mut() {
                *sj = exp_neg(*sj - m_new);
            }
            for (&p, vrow) in s.iter().zip(vblk.chunks_exact(row_stride)) {
                l[r] += p;
                M::axpy(a, p, &vrow[koff..kend]);
            }
            m[r] = m_new;
        }
    }
    Partial { m, l, acc }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx2(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    blocks: &[u32],
    d: Dims,
    scale: f32,
    kh: usize,
    i0: usize,
    i1: usize,
    b0: usize,
    b1: usize,
) -> Partial {
    tile::<Fma8>(q, k, v, blocks, d, scale, kh, i0, i1, b0, b1)
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `q: [n_heads, t, hd]`, pools `[rows, n_kv, hd]`; returns `[n_heads, t, hd]`. The block
/// table must cover `past + t` positions inside the pool (checked by `paged_attention`).
pub fn paged_attention_cpu(q: &[f32], k: &[f32], v: &[f32], blocks: &[u32], d: Dims, scale: f32) -> Vec<f32> {
    run(q, k, v, blocks, d, scale, has_avx2_fma())
}

fn run(q: &[f32], k: &[f32], v: &[f32], blocks: &[u32], d: Dims, scale: f32, simd: bool) -> Vec<f32> {
    let Dims { n_heads, n_kv, t, hd, past, block_size: bs } = d;
    let group = n_heads / n_kv;
    let tiles = t.div_ceil(TILE_Q);
    let seg_blocks = SEGMENT_KEYS.div_ceil(bs).max(1);
    // Work items (kv head, tile, segment), ordered so each tile's segments are adjacent.
    let mut items = Vec::new();
    for kh in 0..n_kv {
        for ti in 0..tiles {
            let i1 = ((ti + 1) * TILE_Q).min(t);
            let n_blocks = (past + i1).div_ceil(bs);
            for seg in 0..n_blocks.div_ceil(seg_blocks) {
                items.push((kh, ti, seg * seg_blocks, ((seg + 1) * seg_blocks).min(n_blocks)));
            }
        }
    }
    let one = |&(kh, ti, b0, b1): &(usize, usize, usize, usize)| {
        let (i0, i1) = (ti * TILE_Q, ((ti + 1) * TILE_Q).min(t));
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: only chosen when the CPU reports AVX2 and FMA.
            return unsafe { tile_avx2(q, k, v, blocks, d, scale, kh, i0, i1, b0, b1) };
        }
        let _ = simd;
        tile::<Plain>(q, k, v, blocks, d, scale, kh, i0, i1, b0, b1)
    };
    // Items run on candle's barrier pool, the workers every other CPU op of a step uses (a
    // second pool would fight it for the same cores).
    let slots: Vec<std::sync::OnceLock<Partial>> = items.iter().map(|_| std::sync::OnceLock::new()).collect();
    candle_core::utils::barrier_pool().execute_chunked(items.len(), |range| {
        for i in range {
            let _ = slots[i].set(one(&items[i]));
        }
    });
    let partials: Vec<Partial> =
        slots.into_iter().zip(&items).map(|(s, item)| s.into_inner().unwrap_or_else(|| one(item))).collect();
    let mut out = vec![0f32; n_heads * t * hd];
    let mut idx = 0;
    while idx < items.len() {
        let (kh, ti, _, _) = items[idx];
        let mut state = Partial { m: Vec::new(), l: Vec::new(), acc: Vec::new() };
        while idx < items.len() && (items[idx].0, items[idx].1) == (kh, ti) {
            let p = std::mem::replace(&mut state, Partial { m: Vec::new(), l: Vec::new(), acc: Vec::new() });
            state = if p.m.is_empty() { partials_take(&partials, idx) } else { merge(p, &partials[idx], hd) };
            idx += 1;
        }
        let (i0, i1) = (ti * TILE_Q, ((ti + 1) * TILE_Q).min(t));
        let tq = i1 - i0;
        for g in 0..group {
            let h = kh * group + g;
            for i in 0..tq {
                let r = g * tq + i;
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

fn partials_take(partials: &[Partial], i: usize) -> Partial {
    let p = &partials[i];
    Partial { m: p.m.clone(), l: p.l.clone(), acc: p.acc.clone() }
}

/// Merges the state of the next segment into the running one (rows that saw no key in a
/// segment have `l == 0` there).
fn merge(mut a: Partial, b: &Partial, hd: usize) -> Partial {
    for r in 0..a.m.len() {
        if b.l[r] == 0.0 {
            continue;
        }
        if a.l[r] == 0.0 {
            a.m[r] = b.m[r];
            a.l[r] = b.l[r];
            a.acc[r * hd..(r + 1) * hd].copy_from_slice(&b.acc[r * hd..(r + 1) * hd]);
            continue;
        }
        let m = a.m[r].max(b.m[r]);
        let (ca, cb) = ((a.m[r] - m).exp(), (b.m[r] - m).exp());
        a.l[r] = a.l[r] * ca + b.l[r] * cb;
        for (x, &y) in a.acc[r * hd..(r + 1) * hd].iter_mut().zip(&b.acc[r * hd..(r + 1) * hd]) {
            *x = *x * ca + y * cb;
        }
        a.m[r] = m;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain and the AVX2/FMA builds agree to rounding.
    #[test]
    fn instruction_sets_agree() {
        if !has_avx2_fma() {
            return;
        }
        let d = Dims { n_heads: 4, n_kv: 2, t: 20, hd: 36, past: 13, block_size: 8 };
        let f = |n: usize, s: f32| (0..n).map(|i| (i as f32 * 0.61 + s).sin()).collect::<Vec<f32>>();
        let rows = 6 * 8;
        let (q, k, v) = (f(4 * 20 * 36, 0.1), f(rows * 2 * 36, 0.2), f(rows * 2 * 36, 0.3));
        let blocks = [5u32, 0, 3, 1, 4];
        let a = run(&q, &k, &v, &blocks, d, 0.2, false);
        for x in [-0.0f32, -1e-3, -0.5, -3.3, -20.0, -86.0, -100.0, f32::NEG_INFINITY] {
            let (got, want) = (exp_neg(x), x.exp());
            assert!((got - want).abs() <= 2.5e-7 * want + 1e-37, "exp({x}): {got} vs {want}");
        }
        let b = run(&q, &k, &v, &blocks, d, 0.2, true);
        let e = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(e < 1e-5, "{e}");
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    /// Timing, not a check: the plain and AVX2 builds on one decode and one prefill shape.
    #[test]
    #[ignore]
    fn timing_instruction_sets() {
        let f = |n: usize, s: f32| (0..n).map(|i| (i as f32 * 0.61 + s).sin()).collect::<Vec<f32>>();
        for (t, past) in [(1usize, 1023usize), (128, 896)] {
            let d = Dims { n_heads: 9, n_kv: 3, t, hd: 64, past, block_size: 16 };
            let rows = (past + t).div_ceil(16) * 16;
            let (q, k, v) = (f(9 * t * 64, 0.1), f(rows * 3 * 64, 0.2), f(rows * 3 * 64, 0.3));
            let blocks: Vec<u32> = (0..rows as u32 / 16).collect();
            for simd in [false, true, false, true] {
                let s = std::time::Instant::now();
                let reps = if t == 1 { 200 } else { 5 };
                for _ in 0..reps {
                    std::hint::black_box(run(&q, &k, &v, &blocks, d, 0.125, simd));
                }
                let pairs = 9.0 * t as f64 * (past as f64 + t as f64 / 2.0);
                let ns = s.elapsed().as_secs_f64() / reps as f64 * 1e9;
                eprintln!("t={t} simd={simd}: {:.3} ms, {:.1} ns per (row, key)", ns / 1e6, ns / pairs);
            }
        }
    }
}
