//! The Q4_0 layout of the K-quant kernel: [`super::tile50`]'s Q5_0 tiles without the fifth
//! bits. 16 columns of a 256-value stretch (eight Q4_0 blocks of each) in the 16 lanes of a
//! register, each lane summing one column's whole 32-value block, so a (row, column, block)
//! costs one float multiply-add (candle's Q4_0 dot product keeps eight lanes a block).
//!
//! A [`Tile40`] keeps 4.5 bits a value, as the file does: the values' four bits in
//! [`super::tile`]'s interleaved nibbles and each block's f16 `d`, 2,304 bytes for 16 x 256
//! values. The value `q` (0..15) stands for `d · (q − 8)`; the `−8` comes off as `8 · Σ a`.
//! Activations are ggml's for its Q4_0 dot product (`quantize_row_q8_0`), the Q5_0 tiles'
//! [`super::tile50::Act50`]. Per (row, column), in order over stretches and blocks `s`:
//!
//! ```text
//! i   = Σ_{j<32} q_j · a_j  −  8 · Σ_{j<32} a_j       (exact, i32)
//! acc = fma(f32(i), d_s · d_a,s, acc)                 (from acc = +0.0)
//! ```
//!
//! the order of [`super::tile50::dot`], which is this tile's reference too; rows whose length
//! is not a multiple of 256 are padded as there (blocks of `d = 0` against zero activations).

use super::tile::{nibble, COLS, QK_K};
use super::tile50::{fill_nibbles, pack_blocks32, Tile32};

/// Bytes of one GGUF `block_q4_0`: `d` (f16), 16 bytes of nibbles (value `j` low, `j + 16` high).
pub const BLOCK40_BYTES: usize = 18;

#[derive(Clone)]
#[repr(C, align(64))]
pub struct Tile40 {
    /// The values, interleaved as [`super::tile::Tile`]'s `qs`.
    pub qs: [u8; QK_K / 8 * COLS * 4],
    /// `d[s][c]`: block `s`'s scale of column `c` (f16 bits as in the file).
    pub d: [[u16; COLS]; 8],
}

const _: () = assert!(std::mem::size_of::<Tile40>() == 2304);

impl Tile32 for Tile40 {
    const OFFSET: i32 = 8;
    const HIGH: bool = false;
    fn qs(&self) -> &[u8; QK_K / 8 * COLS * 4] {
        &self.qs
    }
    fn d(&self) -> &[[u16; COLS]; 8] {
        &self.d
    }
    fn high(&self, _w: usize) -> u64 {
        0
    }
    fn value(&self, c: usize, i: usize) -> u8 {
        nibble(&self.qs, c, i)
    }
}

/// Packs an `[n, k]` Q4_0 matrix (`n` rows of `k / 32` blocks of [`BLOCK40_BYTES`], GGUF
/// order; `k` a multiple of 32) into `ceil(n / 16) · ceil(k / 256)` tiles, column tile by
/// column tile, stretches in order (column tiles in parallel). Missing columns and the padding
/// past `k` are blocks of `d = 0`.
pub fn pack40(bytes: &[u8], n: usize, k: usize) -> Vec<Tile40> {
    let zeroed = || Tile40 { qs: [0; QK_K / 8 * COLS * 4], d: [[0; COLS]; 8] };
    pack_blocks32(bytes, n, k, BLOCK40_BYTES, zeroed, |t, c, s, blk| {
        t.d[s][c] = u16::from_le_bytes([blk[0], blk[1]]);
        fill_nibbles(&mut t.qs, c, s, &blk[2..18]);
    })
}
