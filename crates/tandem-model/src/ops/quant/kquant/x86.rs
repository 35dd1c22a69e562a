//! What the x86 K-quant kernels ([`super::avx512`], [`super::avx2`]) share: how they find an
//! activation row's superblocks and how far ahead they prefetch the weights.

/// Calls of up to this many rows prefetch (decode, verify chunks: a tile serves few rows, so
/// its bytes come faster than it is used; prefill passes of 8 rows measured no gain).
pub(super) const PREFETCH_ROWS: usize = 4;

/// The tiles ahead a kernel of `R` rows prefetches: [`crate::ops::quant::kernel_prefetch`] for
/// calls of up to [`PREFETCH_ROWS`], else none. Read once per call, outside the loop: a call
/// inside it would make the compiler save every live vector register around it.
#[inline]
pub(super) fn ahead<const R: usize>() -> usize {
    if R <= PREFETCH_ROWS {
        crate::ops::quant::kernel_prefetch()
    } else {
        0
    }
}

/// [`ahead`] for the Q5_0 tiles: [`crate::ops::quant::q50_prefetch`].
#[inline]
pub(super) fn ahead50<const R: usize>() -> usize {
    if R <= PREFETCH_ROWS {
        crate::ops::quant::q50_prefetch()
    } else {
        0
    }
}

/// Prefetches the cache lines of `items[b + ahead]` while item `b` is read; a macro, so that
/// nothing is called in the loop. A column tile's superblocks lie one after another and the
/// next tile's follow, so near a tile's end this fetches the start of the tile a thread reads
/// next (on a 1,536-wide matrix, one superblock in six was otherwise a cold miss); past the
/// matrix's end it fetches nothing useful, and a prefetch never faults.
macro_rules! prefetch_next {
    ($items:expr, $b:expr, $nb:expr, $ahead:expr) => {
        if $ahead > 0 {
            let p = $items.wrapping_add($b + $ahead) as *const i8;
            let lines = std::mem::size_of_val(&*$items).div_ceil(64);
            for line in 0..lines {
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * line));
            }
        }
    };
}

/// [`prefetch_next`]'s lines spread over a tile's sub-block steps: step `part` of the `steps`
/// (8, fewer on a shortened last tile) the loop runs prefetches its share of `items[b +
/// ahead]`'s cache lines, the lines cut into `spread` shares ([`spread`]: 8 on Zen 5, 1
/// elsewhere, where step 0 takes them all); the last step takes every share left. A 2,368-byte Q4K tile
/// is 37 lines; in one burst at the top of the tile they measured 12-22% slower one-thread
/// decode on Zen 5 than five or so a step (docs/PERFORMANCE.md, 2026-12-06): the burst holds
/// the miss queue the demand loads then wait behind.
macro_rules! prefetch_part {
    ($items:expr, $b:expr, $ahead:expr, $part:expr, $steps:expr, $spread:expr) => {
        if $ahead > 0 {
            let p = $items.wrapping_add($b + $ahead) as *const i8;
            let lines = std::mem::size_of_val(&*$items).div_ceil(64);
            let per = lines.div_ceil($spread);
            let end = if $part + 1 == $steps { lines } else { (($part + 1) * per).min(lines) };
            for line in $part * per..end {
                _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64 * line));
            }
        }
    };
}

/// [`crate::ops::quant::kernel_prefetch_spread`], read once per call outside the loop (as
/// [`ahead`]).
#[inline]
pub(super) fn spread() -> usize {
    crate::ops::quant::kernel_prefetch_spread()
}

/// One activation row's superblocks as the kernel reads them: `nb` blocks of candle's
/// `BlockQ8K` layout (`d` f32, 256 i8, 16 i16 sums) and `nb` words-of-four of sub-block sums.
#[derive(Clone, Copy)]
pub struct RowPtr {
    pub q8: *const u8,
    pub bsum: *const [u32; 4],
}

/// Byte offsets inside candle's `BlockQ8K`.
pub(super) const Q8_BYTES: usize = 292;
pub(super) const Q8_QS: usize = 4;
pub(super) const Q8_BSUMS: usize = 260;

pub(super) use {prefetch_next, prefetch_part};
