//! The Q5_0 layout of the K-quant kernel: 16 columns of a 256-value stretch (eight Q5_0 blocks
//! of each) in the 16 lanes of a register, as [`super::tile8`] does for Q8_0, so a lane ends
//! with one column's whole 32-value block sum and pays one float multiply-add per (row,
//! column, block), where the row-major block kernels ([`super::super::avx512`]) keep eight lanes
//! a block and column (ggml's order) and spend eight times the float work.
//!
//! A [`Tile50`] keeps 5.5 bits a value, as the file does: the low four bits of each value in
//! [`super::tile`]'s interleaved nibbles, the fifth in a [`HighBits`] plane (the byte masks
//! under which the kernel adds 16), and each block's f16 `d`: 2,816 bytes for 16 x 256 values.
//! The unsigned value `q` (0..31) stands for the weight `d · (q − 16)`; the `−16` comes off
//! as `16 · Σ a` from the activation row's sums. Activations are quantised per 32-value block
//! as ggml quantises them for its Q5_0 dot product (`quantize_row_q8_0`: `d_a = amax / 127`
//! through f16, [`super::super::activation`]), laid out a stretch at a time as [`Act50`]: one
//! scale per 256 values (the other K-quants' Q8K rows) lost too much on Gemma's outlier
//! activations (gemma3-270m left llama.cpp's greedy tokens at a decisive position).
//!
//! Rows whose length is not a multiple of 256 (qwen2.5's 896) are padded to whole stretches:
//! the missing blocks hold `q = 16` with `d = 0`, whose integer sum is exactly 0, and the
//! activation rows are padded with zeros before they are quantised
//! ([`super::KQuantMatrix::matmul`]).
//!
//! Per (row, column), with `a` the row's Q8K values and `D` its superblock scale, in order
//! over stretches and within each over its eight blocks `s`:
//!
//! ```text
//! i   = Σ_{j<32} q_j · a_j  −  16 · Σ_{j<32} a_j      (exact, i32)
//! acc = fma(f32(i), d_s · d_a,s, acc)                 (from acc = +0.0)
//! ```
//!
//! `|i| ≤ 32 · 31 · 128`, so `f32(i)` is exact; the kernel ([`super::avx512::rows50`]) and the
//! reference ([`dot`]) give the same bits, and a row's result never depends on the call.
//!
//! [`Tile32`] is what the kernels and the reference read of such a tile, so that Q4_0
//! ([`super::tile40`]: the same nibbles and scales, no fifth bits, `q − 8`) shares them.

use super::tile::{bits4, interleave, nibble, nibbles8, HighBits, COLS, QK_K};

/// Bytes of one GGUF `block_q5_0`: `d` (f16), 32 fifth bits (`qh`, little-endian u32), 16
/// bytes of nibbles (value `j` low, `j + 16` high).
pub const BLOCK50_BYTES: usize = 22;

#[derive(Clone)]
#[repr(C, align(64))]
pub struct Tile50 {
    /// The low four bits, interleaved as [`super::tile::Tile`]'s `qs`.
    pub qs: [u8; QK_K / 8 * COLS * 4],
    /// The fifth bits.
    pub high: HighBits,
    /// `d[s][c]`: block `s`'s scale of column `c` (f16 bits as in the file).
    pub d: [[u16; COLS]; 8],
}

const _: () = assert!(std::mem::size_of::<Tile50>() == 2816);

impl Tile50 {
    /// Every value `q = 16` (nibble 0, fifth bit set) with `d = 0`: a weight of 0 whose block
    /// sums are exactly 0 (missing columns and the padding past `k`).
    fn zeroed() -> Self {
        Tile50 { qs: [0; QK_K / 8 * COLS * 4], high: HighBits([u64::MAX; 2 * QK_K / 8]), d: [[0; COLS]; 8] }
    }

    /// The unsigned value `q` (0..31) of value `i` of column `c`.
    pub fn value(&self, c: usize, i: usize) -> u8 {
        nibble(&self.qs, c, i) + self.high.of(c, i)
    }
}

/// A tile of 16 columns by eight 32-value blocks, each block with its f16 scale `d` and
/// unsigned values `q` standing for `d · (q − OFFSET)`: Q5_0 ([`Tile50`]) and Q4_0
/// ([`super::tile40::Tile40`]), read alike by the kernels and by [`dot`].
pub trait Tile32: Sync {
    /// What a value is offset by (16 for Q5_0, 8 for Q4_0).
    const OFFSET: i32;
    /// Whether the tile has a fifth-bit plane ([`Tile32::high`]).
    const HIGH: bool;
    /// The low four bits of the values, interleaved as [`super::tile::Tile`]'s `qs`.
    fn qs(&self) -> &[u8; QK_K / 8 * COLS * 4];
    /// `d[s][c]`: block `s`'s scale of column `c` (f16 bits as in the file).
    fn d(&self) -> &[[u16; COLS]; 8];
    /// Word `w` of the fifth-bit masks (0 where there is no plane).
    fn high(&self, w: usize) -> u64;
    /// The unsigned value `q` of value `i` of column `c`.
    fn value(&self, c: usize, i: usize) -> u8;
}

impl Tile32 for Tile50 {
    const OFFSET: i32 = 16;
    const HIGH: bool = true;
    fn qs(&self) -> &[u8; QK_K / 8 * COLS * 4] {
        &self.qs
    }
    fn d(&self) -> &[[u16; COLS]; 8] {
        &self.d
    }
    fn high(&self, w: usize) -> u64 {
        self.high.0[w]
    }
    fn value(&self, c: usize, i: usize) -> u8 {
        Tile50::value(self, c, i)
    }
}

/// Packs an `[n, k]` Q5_0 matrix (`n` rows of `k / 32` blocks of [`BLOCK50_BYTES`], GGUF
/// order; `k` a multiple of 32) into `ceil(n / 16) · ceil(k / 256)` tiles, column tile by
/// column tile, stretches in order (column tiles in parallel).
pub fn pack50(bytes: &[u8], n: usize, k: usize) -> Vec<Tile50> {
    pack_blocks32(bytes, n, k, BLOCK50_BYTES, Tile50::zeroed, fill)
}

/// The packing of [`pack50`] for any tile of 32-value blocks of `block` bytes: `zeroed` makes
/// a tile (missing columns and the padding past `k` stay as it leaves them), `fill(t, c, s,
/// blk)` writes block `s` of column `c` from the file's bytes `blk`.
pub(super) fn pack_blocks32<T: Send>(
    bytes: &[u8],
    n: usize,
    k: usize,
    block: usize,
    zeroed: impl Fn() -> T + Sync,
    fill: impl Fn(&mut T, usize, usize, &[u8]) + Sync,
) -> Vec<T> {
    use rayon::prelude::*;
    let (blocks, nb) = (k / 32, k.div_ceil(QK_K));
    (0..n.div_ceil(COLS) * nb)
        .into_par_iter()
        .map(|i| {
            let (ct, b) = (i / nb, i % nb);
            let mut t = zeroed();
            for c in 0..COLS.min(n - ct * COLS) {
                let row = &bytes[(ct * COLS + c) * blocks * block..][..blocks * block];
                for s in 0..8.min(blocks - 8 * b) {
                    fill(&mut t, c, s, &row[(8 * b + s) * block..][..block]);
                }
            }
            t
        })
        .collect()
}

/// Block `s` of column `c` from the 16 nibble bytes of a Q5_0 / Q4_0 block (values 0..15 in
/// the low nibbles, 16..31 in the high ones) into interleaved `qs`: the block's four groups of
/// eight are groups 4s .. 4s + 3 of the tile.
pub(super) fn fill_nibbles(qs: &mut [u8; QK_K / 8 * COLS * 4], c: usize, s: usize, nibbles: &[u8]) {
    for q in 0..4 {
        let (at, shift) = (8 * (q % 2), if q < 2 { 0 } else { 4 });
        let v = interleave(nibbles8(&nibbles[at..at + 8], shift));
        qs[64 * (4 * s + q) + 4 * c..][..4].copy_from_slice(&v.to_le_bytes());
    }
}

/// Block `s` of column `c` from one `block_q5_0`.
fn fill(t: &mut Tile50, c: usize, s: usize, blk: &[u8]) {
    t.d[s][c] = u16::from_le_bytes([blk[0], blk[1]]);
    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
    fill_nibbles(&mut t.qs, c, s, &blk[6..22]);
    for q in 0..4 {
        let g = 4 * s + q;
        // Fifth bits of values 8q .. 8q + 7, one to a byte, then as the two masks' nibbles.
        let bits = (0..8).fold(0u64, |acc, j| acc | ((((qh >> (8 * q + j)) & 1) as u64) << (8 * j)));
        for (word, part) in [(2 * g, bits as u32), (2 * g + 1, (bits >> 32) as u32)] {
            t.high.0[word] = (t.high.0[word] & !(0xF << (4 * c))) | (bits4(part) << (4 * c));
        }
    }
}

/// The weight of value `i` (0..256) of column `c`, as candle dequantises the file's block.
pub fn weight<T: Tile32>(t: &T, c: usize, i: usize) -> f32 {
    half::f16::from_bits(t.d()[i / 32][c]).to_f32() * (t.value(c, i) as i32 - T::OFFSET) as f32
}

/// One 256-value stretch of an activation row as the Q5_0 kernels read it: each 32-value
/// block's scale (ggml's f16-rounded `d`, as f32), the values, each block's value sum.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Act50 {
    pub d: [f32; 8],
    pub qs: [i8; QK_K],
    pub sums: [i32; 8],
}

const _: () = assert!(std::mem::size_of::<Act50>() == 320);

/// Byte offsets in an [`Act50`] (for the kernels).
pub const ACT50_BYTES: usize = 320;
pub const ACT50_QS: usize = 32;
pub const ACT50_SUMS: usize = 288;

/// `m` rows of `k` values (`k` a multiple of 32) as `m · ceil(k / 256)` stretches, each row
/// padded with zero blocks (`d = 0`, values 0) to whole stretches; ggml's quantiser on the
/// CPU's best kernel (the scalar one gives the same bits).
pub fn quantize_rows(x: &[f32], m: usize, k: usize) -> Vec<Act50> {
    use super::super::activation::{quantize_row, Q8Block};
    let nb = k.div_ceil(QK_K);
    let zero = Act50 { d: [0.0; 8], qs: [0; QK_K], sums: [0; 8] };
    let mut out = vec![zero; m * nb];
    let one = |row: &[f32], acts: &mut [Act50]| {
        let mut blocks = vec![Q8Block::ZERO; k / 32];
        quantize_row(super::super::Kernel::best(), row, &mut blocks);
        for (i, b) in blocks.iter().enumerate() {
            let a = &mut acts[i / 8];
            let s = i % 8;
            a.d[s] = b.d;
            a.qs[32 * s..32 * s + 32].copy_from_slice(&b.qs);
            a.sums[s] = b.qs.iter().map(|&q| q as i32).sum();
        }
    };
    if m >= 4 && rayon::current_num_threads() > 1 && crate::ops::cpu_threads::limit() > 1 {
        use rayon::prelude::*;
        out.par_chunks_exact_mut(nb).zip(x.par_chunks_exact(k)).for_each(|(a, row)| one(row, a));
    } else {
        out.chunks_exact_mut(nb).zip(x.chunks_exact(k)).for_each(|(a, row)| one(row, a));
    }
    out
}

/// The reference: column `c` of the stretches `tiles` against one row's stretches (in the
/// order of the module docs).
pub fn dot<T: Tile32>(tiles: &[T], c: usize, acts: &[Act50]) -> f32 {
    let mut acc = 0f32;
    for (t, a) in tiles.iter().zip(acts) {
        for s in 0..8 {
            let mut i = 0i32;
            for j in 32 * s..32 * s + 32 {
                i += t.value(c, j) as i32 * a.qs[j] as i32;
            }
            i -= T::OFFSET * a.sums[s];
            let scale = half::f16::from_bits(t.d()[s][c]).to_f32() * a.d[s];
            acc = (i as f32).mul_add(scale, acc);
        }
    }
    acc
}
