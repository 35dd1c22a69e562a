//! The Q2K layout of the K-quant kernel and its plain reference. A [`Tile2`] holds one
//! 256-value superblock of 16 columns with the 2-bit values still packed four to a byte, so the
//! kernel reads as many bytes as the file holds (2.625 bits a value: 1,344 bytes for 16 × 256
//! values). Sub-block `s` (16 values) of all 16 columns is one 64-byte register: column `c`'s
//! four bytes `64 s + 4 c ..`, whose bits `2t, 2t + 1` (the `t`-th "crumb") of byte `j` hold
//! value `16 s + 4 t + j`, so shifting the register by `2t` and masking gives, per 32-bit lane,
//! the four values a VNNI `dpbusd` multiplies with four broadcast activation bytes. The scale
//! bytes stay as in the file (the 4-bit scale low, the 4-bit min high), in the pair order a
//! `dpwssd` takes; `d` and `dmin` stay f16.
//!
//! Per (activation row, column), with `isum_s` the exact dot product of the values (0..3) of
//! sub-block `s` and `bsum_s` the sum of its 16 activation bytes:
//!
//! ```text
//! for each superblock:  t = 0
//!     for s in 0..16:   t = fma(f32(isum_s), d · sc_s, t)              (d · sc_s is exact)
//!     ms = Σ_s mn_s · bsum_s                                           (exact integer)
//!     acc = fma(t, d_a, acc);  acc = fma(-(f32(ms) · dmin), d_a, acc)
//! ```

use half::f16;

use super::tile::{pack_tiles, COLS, QK_K};
use super::tile6::Act6;

/// Bytes of one GGUF `block_q2_K`: 16 scale bytes, 64 bytes of 2-bit values, d, dmin.
pub const BLOCK2_BYTES: usize = 84;

#[derive(Clone)]
#[repr(C, align(64))]
pub struct Tile2 {
    /// Sub-block `s`, column `c`: bytes `64 s + 4 c .. + 4`; crumb `t` of byte `j`: value
    /// `16 s + 4 t + j`.
    pub qs: [u8; QK_K / 4 * COLS],
    /// `sc[p][2c]`, `sc[p][2c + 1]`: the file's scale byte (scale | min << 4) of sub-blocks
    /// `2p` and `2p + 1` of column `c`.
    pub sc: [[u8; 2 * COLS]; 8],
    /// The columns' `d` and `dmin`, f16 bits as in the file.
    pub d: [u16; COLS],
    pub dmin: [u16; COLS],
}

const _: () = assert!(std::mem::size_of::<Tile2>() == 1344);

impl Tile2 {
    fn zeroed() -> Self {
        Tile2 { qs: [0; QK_K / 4 * COLS], sc: [[0; 2 * COLS]; 8], d: [0; COLS], dmin: [0; COLS] }
    }

    /// Value `i` (0..256, 0..3) of column `c`.
    pub fn value(&self, c: usize, i: usize) -> u8 {
        let (s, t, j) = (i / 16, (i % 16) / 4, i % 4);
        (self.qs[64 * s + 4 * c + j] >> (2 * t)) & 3
    }

    /// The 4-bit scale and min of sub-block `s` of column `c`.
    pub fn scale_min(&self, c: usize, s: usize) -> (u8, u8) {
        let b = self.sc[s / 2][2 * c + s % 2];
        (b & 15, b >> 4)
    }

    pub fn d(&self, c: usize) -> f32 {
        f16::from_bits(self.d[c]).to_f32()
    }

    pub fn dmin(&self, c: usize) -> f32 {
        f16::from_bits(self.dmin[c]).to_f32()
    }
}

/// Packs an `[n, k]` Q2K matrix (`n` rows of `k / 256` blocks of [`BLOCK2_BYTES`]) as
/// [`super::tile::pack`] does Q4K.
pub fn pack2(bytes: &[u8], n: usize, k: usize) -> Vec<Tile2> {
    pack_tiles(bytes, n, k, BLOCK2_BYTES, Tile2::zeroed, fill)
}

/// Column `c` of a tile from one `block_q2_K` (scales 16, qs 64, d, dmin).
fn fill(t: &mut Tile2, c: usize, blk: &[u8]) {
    let (scales, qs) = (&blk[..16], &blk[16..80]);
    t.d[c] = u16::from_le_bytes([blk[80], blk[81]]);
    t.dmin[c] = u16::from_le_bytes([blk[82], blk[83]]);
    for (s, &b) in scales.iter().enumerate() {
        t.sc[s / 2][2 * c + s % 2] = b;
    }
    // The file: value i (half h = i / 128, j = i % 128 / 32, l = i % 32) is bits 2j, 2j + 1 of
    // qs[32 h + l]. Sub-block s's 16 values are 16 neighbouring bytes' crumb j; the tile wants
    // them as four bytes of four crumbs (value 4t + u in crumb t of byte u).
    for s in 0..QK_K / 16 {
        let (h, j, l0) = (s / 8, (s % 8) / 2, 16 * (s % 2));
        let v: [u8; 16] = std::array::from_fn(|i| (qs[32 * h + l0 + i] >> (2 * j)) & 3);
        for u in 0..4 {
            t.qs[64 * s + 4 * c + u] = v[u] | (v[4 + u] << 2) | (v[8 + u] << 4) | (v[12 + u] << 6);
        }
    }
}

/// The weight value `i` of column `c` as f32.
pub fn weight(t: &Tile2, c: usize, i: usize) -> f32 {
    let (sc, mn) = t.scale_min(c, i / 16);
    t.d(c) * sc as f32 * t.value(c, i) as f32 - t.dmin(c) * mn as f32
}

/// The product of column `c` of `tiles` with one activation row, in the kernel's order.
pub fn dot(tiles: &[Tile2], c: usize, acts: &[Act6<'_>]) -> f32 {
    let mut acc = 0f32;
    for (t, a) in tiles.iter().zip(acts) {
        let mut tt = 0f32;
        let mut ms = 0i32;
        for s in 0..16 {
            let isum: i32 = (16 * s..16 * s + 16).map(|i| t.value(c, i) as i32 * a.qs[i] as i32).sum();
            let (sc, mn) = t.scale_min(c, s);
            tt = (isum as f32).mul_add(t.d(c) * sc as f32, tt);
            ms += mn as i32 * a.bsums[s] as i32;
        }
        acc = tt.mul_add(a.d, acc);
        acc = (-(ms as f32 * t.dmin(c))).mul_add(a.d, acc);
    }
    acc
}
