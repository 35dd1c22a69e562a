//! One work item of the kernel: the query rows of some KV heads' groups (for each KV head, all
//! the query heads that share it, times a tile of query positions) over one segment of key
//! positions, in three passes:
//!
//! 1. scores of every row against the segment's keys, eight keys at a time; the eight key rows
//!    stay in L1 while every query head of the group (and every query position of the tile)
//!    uses them, so each key row is fetched from memory once per KV head, not once per query
//!    head, and with several KV heads per item the pool rows are read front to back;
//! 2. per row, the softmax numerators `exp(s - m)` with the segment's maximum `m` and their
//!    sum;
//! 3. the weighted sum of value rows, sixteen keys at a time, again shared by all rows.
//!
//! The result is the segment's partial softmax state (max, normaliser, unnormalised sum),
//! merged with the other segments' by the caller. Row `r`'s arithmetic depends only on its
//! query, the keys it sees and the segment boundaries (absolute positions), never on the other
//! rows of the item, so any chunking of the queries gives bit-identical rows.

use super::format::{rows as kv_rows, KvRows};
use super::kernel::Dims;
use super::vec_ops::{exp_sub, max, sum8, VecOps};

/// Keys per step of the value pass (the value rows reused from L1 by every row of the item).
const VALUE_STEP: usize = 16;

/// A softmax state over some keys, per row: the maximum score, the normaliser and the
/// unnormalised weighted sum of values (`[rows, hd]`). Rows that saw no key have `l == 0`.
pub(super) struct Partial {
    pub m: Vec<f32>,
    pub l: Vec<f32>,
    pub acc: Vec<f32>,
}

/// The rows and keys of one work item: KV heads `kh..kh_end`, query positions `i0..i1` of the
/// chunk, key positions `p0..p1`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Item {
    pub kh: usize,
    pub kh_end: usize,
    pub i0: usize,
    pub i1: usize,
    pub p0: usize,
    pub p1: usize,
}

/// The partial state of one item (rows ordered `[kh_end - kh, group, i1 - i0]`).
#[inline(always)]
pub(super) fn segment<R: KvRows, M: VecOps>(
    q: &[f32],
    k: &[R::Elem],
    v: &[R::Elem],
    blocks: &[u32],
    d: Dims,
    scale: f32,
    it: Item,
) -> Partial {
    let Dims { n_heads, n_kv, t, hd, past, block_size: bs, .. } = d;
    let group = n_heads / n_kv;
    // Pool elements per head row and per position.
    let row_elems = R::DTYPE.row_elems(hd);
    let row_stride = n_kv * row_elems;
    let tq = it.i1 - it.i0;
    let per_head = group * tq;
    let n_rows = (it.kh_end - it.kh) * per_head;
    // Row r sees key positions p0 + from[r] .. p0 + seen[r] of this segment (a sliding
    // window starts it later; the lanes before `from` become exact zeros like those after).
    let seen: Vec<usize> = (0..n_rows).map(|r| (past + it.i0 + r % tq + 1).min(it.p1).saturating_sub(it.p0)).collect();
    let from: Vec<usize> =
        (0..n_rows).map(|r| d.first_key(past + it.i0 + r % tq).saturating_sub(it.p0).min(seen[r])).collect();
    let n = seen.iter().copied().max().unwrap_or(0);
    let mut part = Partial { m: vec![f32::NEG_INFINITY; n_rows], l: vec![0f32; n_rows], acc: vec![0f32; n_rows * hd] };
    if n == 0 {
        return part;
    }
    // Offsets of the pool rows for positions p0.., the last one repeated to a multiple of
    // eight (those lanes' scores are never used).
    let cap = n.next_multiple_of(8);
    let off: Vec<usize> = (0..cap)
        .map(|j| {
            let p = it.p0 + j.min(n - 1);
            (blocks[p / bs] as usize * bs + p % bs) * row_stride
        })
        .collect();
    // Query heads are numbered kh * group + g, so row r's head is it.kh * group + r / tq.
    let qrow = |r: usize| &q[((it.kh * group + r / tq) * t + it.i0 + r % tq) * hd..][..hd];
    let heads = || (0..it.kh_end - it.kh).map(|h| ((it.kh + h) * row_elems, h * per_head..(h + 1) * per_head));
    // Decoded rows of the formats that are not read in place (empty for f32).
    let mut buf = vec![0f32; if R::direct(k).is_some() { 0 } else { VALUE_STEP.max(8) * hd }];
    let mut hoff = [0usize; VALUE_STEP];

    // 1. Scores, [rows, cap].
    let mut s = vec![0f32; n_rows * cap];
    for j0 in (0..n).step_by(8) {
        for (head, rows) in heads() {
            for (h, &o) in hoff.iter_mut().zip(&off[j0..j0 + 8]) {
                *h = o + head;
            }
            let keys: [&[f32]; 8] = kv_rows::<R, M, 8>(k, &hoff, 8, hd, &mut buf);
            for r in rows {
                if j0 < seen[r] {
                    let dots = M::dot8(qrow(r), &keys);
                    for (x, y) in s[r * cap + j0..][..8].iter_mut().zip(dots) {
                        *x = y * scale;
                    }
                }
            }
        }
    }
    // 2. Numerators and normaliser; the lanes a row does not see become exact zeros.
    for (r, &nr) in seen.iter().enumerate() {
        let f = from[r];
        if nr == f {
            continue;
        }
        let sr = &mut s[r * cap..(r + 1) * cap];
        let m = max(&sr[f..nr]);
        exp_sub(&mut sr[f..nr], m);
        sr[..f].fill(0.0);
        sr[nr..].fill(0.0);
        part.m[r] = m;
        part.l[r] = sum8(sr);
    }
    // 3. Weighted values.
    for j0 in (0..n).step_by(VALUE_STEP) {
        let jn = (n - j0).min(VALUE_STEP);
        for (head, item_rows) in heads() {
            for (h, &o) in hoff.iter_mut().zip(&off[j0..j0 + jn]) {
                *h = o + head;
            }
            let vrows: [&[f32]; VALUE_STEP] = kv_rows::<R, M, VALUE_STEP>(v, &hoff, jn, hd, &mut buf);
            for r in item_rows {
                let take = seen[r].saturating_sub(j0).min(jn);
                if take > 0 {
                    M::accumulate(&mut part.acc[r * hd..(r + 1) * hd], &s[r * cap + j0..][..take], &vrows[..take]);
                }
            }
        }
    }
    part
}
