//! The Q8_0 layout of the K-quant kernel: 16 columns of a 256-value stretch (eight Q8_0
//! blocks of each) in the 16 lanes of a register, so one `dpbusd` takes four values of all
//! 16 columns and a lane ends with one column's whole 32-value block sum: one float
//! multiply-add per (row, column, block), where the row-major block kernels ([`super::super::avx512`])
//! keep eight lanes a block and column (ggml's order) and spend eight times the float work.
//!
//! A [`Tile8`] holds the values as unsigned bytes `w + 128` (the sign bit flipped) and each
//! block's `d` as the file's f16: 4,352 bytes for 16 x 256 values, 8.5 bits a value as in the
//! file. Activations are quantised per 32-value block as ggml does for its Q8_0 dot product
//! ([`super::tile50::Act50`], as for the Q5_0 tiles: llama.cpp's own activation rounding), so
//! the `+128` comes off as `128 · Σ a` from the block's sum.
//!
//! Per (row, column), with `a` the row's values and `d_a,s` block `s`'s scale, in order over
//! stretches and within each over its eight blocks `s`:
//!
//! ```text
//! i   = Σ_{j<32} (w_j + 128) · a_j  −  128 · Σ_{j<32} a_j      (exact, i32: Σ w_j · a_j)
//! acc = fma(f32(i), d_s · d_a,s, acc)                         (from acc = +0.0)
//! ```
//!
//! Rows whose length is a multiple of 32 but not of 256 (gemma3's 640) are padded to whole
//! stretches as [`super::tile50`]'s are: the missing blocks hold `w = 0` with `d = 0` and the
//! activation rows' padding is zero blocks, so their products are exactly `+0` and leave every
//! sum's bits as they are; the kernels skip them ([`super::avx2::rows8`]'s `last`).
//!
//! `|i| ≤ 32 · 128 · 127`, so `f32(i)` is exact; the kernels ([`super::avx512::rows8`] by
//! `dpbusd` on `w + 128`, [`super::avx2::rows8`] by `vpmaddubsw` on `|w|` and the activations
//! under `w`'s sign) and the reference ([`dot`]) give the same bits, and a row's result never
//! depends on the call.

use super::tile::{COLS, QK_K};
use super::tile50::{pack_blocks32, Act50};

/// Bytes of one GGUF `block_q8_0`: `d` (f16) and 32 signed values.
pub const BLOCK8_BYTES: usize = 34;
/// Bytes of a superblock's stretch of one row: eight blocks.
pub const STRETCH8_BYTES: usize = 8 * BLOCK8_BYTES;

#[derive(Clone)]
#[repr(C, align(64))]
pub struct Tile8 {
    /// Group `g` (0..64), column `c`: bytes `64 g + 4 c ..+ 4` are values `4g .. 4g + 3` of
    /// column `c`, each `w + 128`.
    pub qs: [u8; QK_K * COLS],
    /// `d[s][c]`: block `s`'s scale of column `c` (f16 bits as in the file).
    pub d: [[u16; COLS]; 8],
}

const _: () = assert!(std::mem::size_of::<Tile8>() == 4352);

impl Tile8 {
    fn zeroed() -> Self {
        // A missing column (past `n`) multiplies as weight 0: stored as 128 with d = 0.
        Tile8 { qs: [0x80; QK_K * COLS], d: [[0; COLS]; 8] }
    }
}

/// Packs an `[n, k]` Q8_0 matrix (`n` rows of `k / 32` blocks of [`BLOCK8_BYTES`], `k` a
/// multiple of 32) into `ceil(n / 16) · ceil(k / 256)` tiles, column tile by column tile,
/// superblock stretches in order, the last one padded (module docs).
pub fn pack8(bytes: &[u8], n: usize, k: usize) -> Vec<Tile8> {
    pack_blocks32(bytes, n, k, BLOCK8_BYTES, Tile8::zeroed, fill)
}

/// Block `s` of column `c` of a tile from one `block_q8_0`.
fn fill(t: &mut Tile8, c: usize, s: usize, blk: &[u8]) {
    t.d[s][c] = u16::from_le_bytes([blk[0], blk[1]]);
    for q in 0..8 {
        let g = 8 * s + q;
        let mut four = [0u8; 4];
        for (o, &v) in four.iter_mut().zip(&blk[2 + 4 * q..6 + 4 * q]) {
            *o = v ^ 0x80;
        }
        t.qs[64 * g + 4 * c..][..4].copy_from_slice(&four);
    }
}

/// The weight of value `i` (0..256) of column `c`, as candle dequantises the file's block.
pub fn weight(t: &Tile8, c: usize, i: usize) -> f32 {
    let q = (t.qs[64 * (i / 4) + 4 * c + i % 4] ^ 0x80) as i8;
    half::f16::from_bits(t.d[i / 32][c]).to_f32() * q as f32
}

/// The reference: column `c` of the superblocks `tiles` against one row's stretches (in the
/// order of the module docs).
pub fn dot(tiles: &[Tile8], c: usize, acts: &[Act50]) -> f32 {
    let mut acc = 0f32;
    for (t, a) in tiles.iter().zip(acts) {
        for s in 0..8 {
            let mut i = 0i32;
            for j in 32 * s..32 * s + 32 {
                i += t.qs[64 * (j / 4) + 4 * c + j % 4] as i32 * a.qs[j] as i32;
            }
            i -= 128 * a.sums[s];
            let scale = half::f16::from_bits(t.d[s][c]).to_f32() * a.d[s];
            acc = (i as f32).mul_add(scale, acc);
        }
    }
    acc
}
