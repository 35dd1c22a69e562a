//! Activation rows as the [`super::KQuantMatrix`] kernels read them: candle's Q8K superblocks
//! with their sub-block sums, or ggml's per-block rounding laid out by stretch
//! ([`super::tile50::Act50`]), and the per-superblock views the scalar references take.

use super::{tile, tile50, tile6, QK_K};

/// Activation rows quantised for a [`KQuantMatrix`]'s kernel: candle's Q8K superblocks and
/// their sub-block sums (every type but Q5_0), or ggml's per-block quantisation laid out by
/// stretch ([`tile50::Act50`], Q5_0).
pub(super) enum Acts {
    Q8K(Vec<candle_core::quantized::k_quants::BlockQ8K>, Vec<[u32; 4]>),
    Block(Vec<tile50::Act50>),
}

/// One activation superblock for [`tile::dot`] (also read by `conformance::kq_chain`).
pub(crate) fn act(q: &candle_core::quantized::k_quants::BlockQ8K, bsum: [u32; 4]) -> tile::Act<'_> {
    // SAFETY: `BlockQ8K` is `repr(C)` { d: f32, qs: [i8; 256], bsums: [i16; 16] } (asserted in
    // `q6k`); read through its bytes since the fields are crate-private.
    let p = q as *const _ as *const u8;
    unsafe {
        tile::Act {
            d: (p as *const f32).read_unaligned(),
            qs: std::slice::from_raw_parts(p.add(4) as *const i8, QK_K),
            bsum,
        }
    }
}

/// One activation superblock for [`tile6::dot`]: `d`, the values and the 16-value sums.
pub(super) fn act6(q: &candle_core::quantized::k_quants::BlockQ8K) -> tile6::Act6<'_> {
    let a = act(q, [0; 4]);
    // SAFETY: as in `act`: the 16 i16 sums sit at byte 260 of the block.
    let bsums = unsafe { ((q as *const _ as *const u8).add(260) as *const [i16; 16]).read_unaligned() };
    tile6::Act6 { d: a.d, qs: a.qs, bsums }
}

/// The rows of `x` as candle's `BlockQ8K`s (the same bytes as its `from_float`, in parallel for
/// prefill) and the sub-block sums of each.
pub(super) fn quantize(
    x: &[f32],
    m: usize,
    nb: usize,
) -> (Vec<candle_core::quantized::k_quants::BlockQ8K>, Vec<[u32; 4]>) {
    use candle_core::quantized::k_quants::{BlockQ8K, GgmlType};
    let k = nb * QK_K;
    let mut q8 = vec![BlockQ8K::zeros(); m * nb];
    let mut bsum = vec![[0u32; 4]; m * nb];
    let one = |row: &[f32], q: &mut [BlockQ8K], s: &mut [[u32; 4]]| {
        super::super::q6k_quantize_q8k(row, q);
        for (qb, w) in q.iter().zip(s.iter_mut()) {
            // SAFETY: as in `act`: the 16 i16 sums sit at byte 260 of the block.
            let sums = unsafe { ((qb as *const BlockQ8K as *const u8).add(260) as *const [i16; 16]).read_unaligned() };
            *w = tile::bsum_words(&sums);
        }
    };
    if m >= 4 && rayon::current_num_threads() > 1 && crate::ops::cpu_threads::limit() > 1 {
        use rayon::prelude::*;
        q8.par_chunks_exact_mut(nb)
            .zip(bsum.par_chunks_exact_mut(nb))
            .zip(x.par_chunks_exact(k))
            .for_each(|((q, s), row)| one(row, q, s));
    } else {
        for ((q, s), row) in q8.chunks_exact_mut(nb).zip(bsum.chunks_exact_mut(nb)).zip(x.chunks_exact(k)) {
            one(row, q, s);
        }
    }
    (q8, bsum)
}
