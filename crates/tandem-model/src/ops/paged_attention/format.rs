//! How the kernel reads the pool rows of each KV cache format ([`crate::kv::KvDtype`]).
//!
//! f32 rows are used in place. Rows of the other formats are decoded to f32 once per work
//! item — eight key rows or sixteen value rows at a time into a small buffer that stays in L1
//! — and then every query row of the item (the whole GQA group, the whole query tile) uses the
//! decoded values with the f32 arithmetic of the f32 format. A format only changes which
//! values the kernel sees, never the order in which it adds them, so every invariant of the
//! f32 kernel (chunk and tile independence) holds in every format.

use half::f16;

use super::vec_ops::VecOps;
use crate::kv::dtype::{dequantize_q4_0, dequantize_q8_0, KvDtype};

/// The pool element type and row decoding of one format.
pub(super) trait KvRows {
    type Elem: Copy + Sync;
    const DTYPE: KvDtype;

    /// The pool as f32 values when rows can be used in place (the f32 format).
    fn direct(pool: &[Self::Elem]) -> Option<&[f32]>;

    /// Decodes one head row (`out.len()` values) from `row`.
    fn decode<M: VecOps>(row: &[Self::Elem], out: &mut [f32]);
}

pub(super) struct F32Rows;
pub(super) struct F16Rows;
pub(super) struct Q8Rows;
pub(super) struct Q4Rows;

impl KvRows for F32Rows {
    type Elem = f32;
    const DTYPE: KvDtype = KvDtype::F32;

    #[inline(always)]
    fn direct(pool: &[f32]) -> Option<&[f32]> {
        Some(pool)
    }

    #[inline(always)]
    fn decode<M: VecOps>(row: &[f32], out: &mut [f32]) {
        out.copy_from_slice(&row[..out.len()]);
    }
}

impl KvRows for F16Rows {
    type Elem = f16;
    const DTYPE: KvDtype = KvDtype::F16;

    #[inline(always)]
    fn direct(_: &[f16]) -> Option<&[f32]> {
        None
    }

    #[inline(always)]
    fn decode<M: VecOps>(row: &[f16], out: &mut [f32]) {
        M::f16_to_f32(&row[..out.len()], out);
    }
}

impl KvRows for Q8Rows {
    type Elem = u8;
    const DTYPE: KvDtype = KvDtype::Q8_0;

    #[inline(always)]
    fn direct(_: &[u8]) -> Option<&[f32]> {
        None
    }

    #[inline(always)]
    fn decode<M: VecOps>(row: &[u8], out: &mut [f32]) {
        dequantize_q8_0(row, out);
    }
}

impl KvRows for Q4Rows {
    type Elem = u8;
    const DTYPE: KvDtype = KvDtype::Q4_0;

    #[inline(always)]
    fn direct(_: &[u8]) -> Option<&[f32]> {
        None
    }

    #[inline(always)]
    fn decode<M: VecOps>(row: &[u8], out: &mut [f32]) {
        dequantize_q4_0(row, out);
    }
}

/// `N` head rows of `hd` values, the pool rows at element offsets `offs` (the first `count`
/// of them; the other lanes repeat the first row): in place for the f32 format, else decoded
/// into `buf` (`N * hd` values).
#[inline(always)]
pub(super) fn rows<'a, R: KvRows, M: VecOps, const N: usize>(
    pool: &'a [R::Elem],
    offs: &[usize],
    count: usize,
    hd: usize,
    buf: &'a mut [f32],
) -> [&'a [f32]; N] {
    if let Some(p) = R::direct(pool) {
        return std::array::from_fn(|i| &p[offs[if i < count { i } else { 0 }]..][..hd]);
    }
    let elems = R::DTYPE.row_elems(hd);
    for (i, out) in buf.chunks_exact_mut(hd).take(count).enumerate() {
        R::decode::<M>(&pool[offs[i]..][..elems], out);
    }
    let buf: &'a [f32] = buf;
    std::array::from_fn(|i| &buf[if i < count { i } else { 0 } * hd..][..hd])
}
