//! NEON kernels (aarch64: Apple Silicon's CPU, Graviton, Ampere) for Q4_1 / Q5_0 / Q5_1 / Q8_0
//! weights against Q8 activation blocks, and the activation quantiser.
//!
//! Each (row, column) result is computed in exactly [`super::reference`]'s order: per block
//! the exact integer sum `Σ q_w · q_a`, then `acc += (d_w · d_a) · sum` and, for the types
//! with a minimum, `acc += m_w · s_a`, each a separate multiply and add (no fusing) from
//! `acc = 0` in block order. So these kernels give the reference's bits for any number of rows
//! and columns (row-invariant, tested under emulation in `make test-neon`); only the way the
//! integer sums are formed differs:
//!
//! * [`Flavor::Base`] (every ARMv8 CPU): `smull` / `smull2` (i8 · i8 → i16) and `sadalp`
//!   (pairwise add into i32 lanes);
//! * [`Flavor::Dot`] (ARMv8.2 `dotprod`: Apple M1 and later, Graviton 2 and later): `sdot`, four
//!   products per i32 lane in one instruction (through `asm!`: the intrinsic is unstable).
//!
//! Tiles are 4 columns x up to 4 rows: a block of each of the 4 columns is unpacked once into
//! two 16-byte vectors and multiplied with every row of the tile; the 4 columns' lane sums
//! reduce to one vector `[Σ₀, Σ₁, Σ₂, Σ₃]` with two pairwise adds, so the f32 work is one
//! vector per (row, block) for 4 columns. Columns past a multiple of 4 go to the reference
//! (the same bits).

use std::arch::aarch64::*;
use std::arch::asm;
use std::ops::Range;

use super::activation::Q8Block;
use super::blocks::{QuantType, WeightBlock, QK};

/// How the integer block sums are formed (the results are the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flavor {
    Base,
    Dot,
}

/// Whether this CPU has the `dotprod` extension ([`Flavor::Dot`]).
pub(super) fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// `acc + Σ a·b` per group of four bytes (`sdot`).
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only arithmetic; the caller's CPU has dotprod (target feature above).
    unsafe {
        asm!("sdot {0:v}.4s, {1:v}.16b, {2:v}.16b", inout(vreg) acc, in(vreg) a, in(vreg) b,
             options(pure, nomem, nostack, preserves_flags));
    }
    acc
}

/// Lane-wise partial sums of `w · a` over 32 bytes (two 16-byte halves); the lanes add up to
/// the exact block sum.
#[inline(always)]
unsafe fn block_dot<const DOT: bool>(w: (int8x16_t, int8x16_t), a: (int8x16_t, int8x16_t)) -> int32x4_t {
    // SAFETY: NEON is part of every aarch64 target; `sdot` only when DOT (checked by callers).
    unsafe {
        if DOT {
            sdot(sdot(vdupq_n_s32(0), w.0, a.0), w.1, a.1)
        } else {
            let mut p = vpaddlq_s16(vmull_s8(vget_low_s8(w.0), vget_low_s8(a.0)));
            p = vpadalq_s16(p, vmull_high_s8(w.0, a.0));
            p = vpadalq_s16(p, vmull_s8(vget_low_s8(w.1), vget_low_s8(a.1)));
            vpadalq_s16(p, vmull_high_s8(w.1, a.1))
        }
    }
}

/// `0x10` in byte `j` where bit `j` of the two bytes `lo, hi` (bits 0..8, 8..16) is set.
#[inline(always)]
unsafe fn fifth_bits(lo: u8, hi: u8) -> uint8x16_t {
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: NEON arithmetic on values; BITS is 16 bytes.
    unsafe {
        let v = vcombine_u8(vdup_n_u8(lo), vdup_n_u8(hi));
        vandq_u8(vtstq_u8(v, vld1q_u8(BITS.as_ptr())), vdupq_n_u8(0x10))
    }
}

/// The 32 integer weights of the block at `p` ([`WeightBlock::ints`]) as two signed vectors
/// (weights 0..16 and 16..32). `B::TYPE` is a constant, so one arm remains.
#[inline(always)]
unsafe fn weights<B: WeightBlock>(p: *const B) -> (int8x16_t, int8x16_t) {
    let b = p as *const u8;
    // SAFETY: `p` points at a whole block of B's layout (blocks.rs), read unaligned by vld1.
    unsafe {
        let nib = |qs: *const u8| {
            let v = vld1q_u8(qs);
            (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
        };
        let five = |qh: *const u8, qs: *const u8| {
            let (lo, hi) = nib(qs);
            let h = [*qh, *qh.wrapping_add(1), *qh.wrapping_add(2), *qh.wrapping_add(3)];
            (vorrq_u8(lo, fifth_bits(h[0], h[1])), vorrq_u8(hi, fifth_bits(h[2], h[3])))
        };
        match B::TYPE {
            QuantType::Q4_1 => {
                let (lo, hi) = nib(b.wrapping_add(4));
                (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
            }
            QuantType::Q5_0 => {
                let (lo, hi) = five(b.wrapping_add(2), b.wrapping_add(6));
                let o = vdupq_n_s8(16);
                (vsubq_s8(vreinterpretq_s8_u8(lo), o), vsubq_s8(vreinterpretq_s8_u8(hi), o))
            }
            QuantType::Q5_1 => {
                let (lo, hi) = five(b.wrapping_add(4), b.wrapping_add(8));
                (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
            }
            QuantType::Q8_0 => {
                let q = b.wrapping_add(2) as *const i8;
                (vld1q_s8(q), vld1q_s8(q.wrapping_add(16)))
            }
        }
    }
}

/// The activation block's 32 values as two signed vectors.
#[inline(always)]
unsafe fn acts(a: *const Q8Block) -> (int8x16_t, int8x16_t) {
    // SAFETY: `a` points at a Q8Block, whose first 32 bytes are `qs`.
    unsafe {
        let q = a as *const i8;
        (vld1q_s8(q), vld1q_s8(q.wrapping_add(16)))
    }
}

/// Rows of one tile.
const TILE_ROWS: usize = 4;
/// Rows whose activations are walked against all of a task's columns before the next ones
/// (they stay in L2: 64 rows of k = 4096 are 320 KiB of blocks).
const ROW_BLOCK: usize = 64;

/// `y[r, c] = reference::vec_dot(w[c], a[r])` for all rows `r < m` and columns `c` in `cols`,
/// bit for bit; `w` holds `n` rows of `nb` blocks, `a` holds `m` rows of `nb` blocks, `y` is
/// `m × n`.
///
/// # Safety
/// NEON (every aarch64 CPU), and `dotprod` for [`Flavor::Dot`]. `y` must be valid for writes
/// at `r * n + c` for every `r < m`, `c` in `cols`, and no other thread may access those
/// elements meanwhile.
pub(super) unsafe fn matmul_cols<B: WeightBlock>(
    flavor: Flavor,
    w: &[B],
    nb: usize,
    a: &[Q8Block],
    m: usize,
    cols: Range<usize>,
    y: *mut f32,
    n: usize,
) {
    assert!(w.len() >= cols.end * nb && a.len() >= m * nb, "neon matmul: short inputs");
    let tiled = cols.start..cols.start + cols.len() / 4 * 4;
    // SAFETY: bounds asserted above; the flavor's CPU features are the caller's contract.
    unsafe {
        match flavor {
            Flavor::Base => tiles::<B, false>(w, nb, a, m, tiled.clone(), y, n),
            Flavor::Dot => tiles_dot::<B>(w, nb, a, m, tiled.clone(), y, n),
        }
        super::reference::matmul_cols(w, nb, a, m, tiled.end..cols.end, y, n);
    }
}

#[target_feature(enable = "neon,dotprod")]
unsafe fn tiles_dot<B: WeightBlock>(
    w: &[B],
    nb: usize,
    a: &[Q8Block],
    m: usize,
    cols: Range<usize>,
    y: *mut f32,
    n: usize,
) {
    // SAFETY: forwarded.
    unsafe { tiles::<B, true>(w, nb, a, m, cols, y, n) }
}

/// The 4-column tiles of `cols` (a multiple of 4 long) for every row.
#[inline(always)]
unsafe fn tiles<B: WeightBlock, const DOT: bool>(
    w: &[B],
    nb: usize,
    a: &[Q8Block],
    m: usize,
    cols: Range<usize>,
    y: *mut f32,
    n: usize,
) {
    for r0 in (0..m).step_by(ROW_BLOCK) {
        let rows = r0..(r0 + ROW_BLOCK).min(m);
        for c0 in cols.clone().step_by(4) {
            let mut r = rows.start;
            while r < rows.end {
                let tr = (rows.end - r).min(TILE_ROWS);
                // SAFETY: columns c0..c0+4 and rows r..r+tr are in bounds (caller).
                unsafe { tile::<B, DOT>(w, nb, a, r, tr, c0, y, n) };
                r += tr;
            }
        }
    }
}

/// One tile: columns `c0..c0 + 4`, rows `r0..r0 + tr` (`tr <= 4`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<B: WeightBlock, const DOT: bool>(
    w: &[B],
    nb: usize,
    a: &[Q8Block],
    r0: usize,
    tr: usize,
    c0: usize,
    y: *mut f32,
    n: usize,
) {
    // SAFETY: every pointer below is inside `w` / `a` / the caller's `y` range.
    unsafe {
        let zero = vdupq_n_f32(0.0);
        let mut acc = [zero; TILE_ROWS];
        let wp = w.as_ptr();
        let ap = a.as_ptr();
        for b in 0..nb {
            let blk = |c: usize| wp.wrapping_add((c0 + c) * nb + b);
            let q = [weights(blk(0)), weights(blk(1)), weights(blk(2)), weights(blk(3))];
            let (w0, w1, w2, w3) = (&*blk(0), &*blk(1), &*blk(2), &*blk(3));
            let dw = vld1q_f32([w0.d(), w1.d(), w2.d(), w3.d()].as_ptr());
            let mw = if B::HAS_MIN { vld1q_f32([w0.m(), w1.m(), w2.m(), w3.m()].as_ptr()) } else { zero };
            for (i, acc) in acc.iter_mut().enumerate().take(tr) {
                let ab = ap.wrapping_add((r0 + i) * nb + b);
                let x = acts(ab);
                let s01 = vpaddq_s32(block_dot::<DOT>(q[0], x), block_dot::<DOT>(q[1], x));
                let s23 = vpaddq_s32(block_dot::<DOT>(q[2], x), block_dot::<DOT>(q[3], x));
                let sum = vcvtq_f32_s32(vpaddq_s32(s01, s23));
                let (d, s) = ((*ab).d, (*ab).s);
                *acc = vaddq_f32(*acc, vmulq_f32(vmulq_n_f32(dw, d), sum));
                if B::HAS_MIN {
                    *acc = vaddq_f32(*acc, vmulq_n_f32(mw, s));
                }
            }
        }
        for (i, acc) in acc.iter().enumerate().take(tr) {
            vst1q_f32(y.wrapping_add((r0 + i) * n + c0), *acc);
        }
    }
}

/// [`super::activation::quantize_row_scalar`] in NEON, bit for bit: `amax` with `fmaxnm`
/// (NaN ignored, as `f32::max`), `fcvtns` (round half to even, NaN to 0, saturating, as
/// `round_ties_even() as i32`). Caller guarantees `x.len() == out.len() * 32`.
pub(super) fn quantize_row(x: &[f32], out: &mut [Q8Block]) {
    assert_eq!(x.len(), out.len() * QK, "quantize_row: {} values for {} blocks", x.len(), out.len());
    for (blk, xs) in out.iter_mut().zip(x.chunks_exact(QK)) {
        // SAFETY: `xs` holds 32 floats, `blk.qs` 32 bytes.
        unsafe {
            let p = xs.as_ptr();
            let v: [float32x4_t; 8] = std::array::from_fn(|i| vld1q_f32(p.wrapping_add(4 * i)));
            let mut ma = vdupq_n_f32(0.0);
            for vi in &v {
                ma = vmaxnmq_f32(ma, vabsq_f32(*vi));
            }
            let amax = vmaxnmvq_f32(ma);
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let q: [int32x4_t; 8] = std::array::from_fn(|i| vcvtnq_s32_f32(vmulq_n_f32(v[i], id)));
            let mut sum = vaddq_s32(q[0], q[1]);
            for qi in &q[2..] {
                sum = vaddq_s32(sum, *qi);
            }
            let h: [int16x8_t; 4] = std::array::from_fn(|i| vcombine_s16(vmovn_s32(q[2 * i]), vmovn_s32(q[2 * i + 1])));
            let dst = blk.qs.as_mut_ptr();
            vst1q_s8(dst, vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1])));
            vst1q_s8(dst.wrapping_add(16), vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3])));
            (blk.d, blk.s) = super::activation::finish(d, vaddvq_s32(sum));
        }
    }
}
