//! The Q3K layout of the K-quant kernel. A [`Tile3`] holds one 256-value superblock of 16
//! columns as a [`super::tile6::Tile6`] does, without the high-bit masks: a Q3K value (two low
//! bits and the `hmask` bit, 0..7 once the file's -4 is taken off) fits the 4-bit nibbles
//! whole. The 16 six-bit scales (stored +32 in the file) become signed bytes, `d` stays the
//! file's f16: 2,368 bytes for 16 × 256 values (4.6 bits a value, against 3.44 in the file).
//! The arithmetic is [`super::tile6`]'s with an offset of 4 ([`Sub16`]).

use super::tile::{interleave, nibble, pack_tiles, COLS, QK_K};
use super::tile6::Sub16;

/// Bytes of one GGUF `block_q3_K`: 32 bytes of high bits, 64 of low 2 bits, 12 of scales, d.
pub const BLOCK3_BYTES: usize = 110;

#[derive(Clone)]
#[repr(C, align(64))]
pub struct Tile3 {
    /// As [`super::tile::Tile::qs`]: the values 0..7 (the weight + 4).
    pub qs: [u8; QK_K / 8 * COLS * 4],
    /// The columns' `d`, f16 bits as in the file.
    pub d: [u16; COLS],
    /// `sc[p][2c]`, `sc[p][2c + 1]`: the signed scales of sub-blocks `2p` and `2p + 1` of column `c`.
    pub sc: [[i8; 2 * COLS]; 8],
}

const _: () = assert!(std::mem::size_of::<Tile3>() == 2368);

impl Tile3 {
    fn zeroed() -> Self {
        Tile3 { qs: [0; QK_K / 8 * COLS * 4], d: [0; COLS], sc: [[0; 2 * COLS]; 8] }
    }
}

impl Sub16 for Tile3 {
    const OFFSET: i32 = 4;
    fn qs(&self) -> &[u8; QK_K / 8 * COLS * 4] {
        &self.qs
    }
    fn hm(&self) -> Option<&[u64; 4 * QK_K / 8]> {
        None
    }
    fn d_bits(&self) -> &[u16; COLS] {
        &self.d
    }
    fn sc(&self) -> &[[i8; 2 * COLS]; 8] {
        &self.sc
    }
    fn value(&self, c: usize, i: usize) -> u8 {
        nibble(&self.qs, c, i)
    }
}

/// Packs an `[n, k]` Q3K matrix (`n` rows of `k / 256` blocks of [`BLOCK3_BYTES`]) as
/// [`super::tile::pack`] does Q4K.
pub fn pack3(bytes: &[u8], n: usize, k: usize) -> Vec<Tile3> {
    pack_tiles(bytes, n, k, BLOCK3_BYTES, Tile3::zeroed, fill)
}

/// Column `c` of a tile from one `block_q3_K` (hmask 32, qs 64, scales 12, d).
fn fill(t: &mut Tile3, c: usize, blk: &[u8]) {
    let (hmask, qs, sb) = (&blk[..32], &blk[32..96], &blk[96..108]);
    t.d[c] = u16::from_le_bytes([blk[108], blk[109]]);
    // Scale s (one per 16 values): its low nibble in byte s % 8 (the high nibble for s >= 8),
    // its top two bits in byte 8 + s % 4 at bit 2 (s / 4); stored +32.
    for s in 0..16 {
        let lo = if s < 8 { sb[s] & 15 } else { sb[s - 8] >> 4 };
        let hi = (sb[8 + s % 4] >> (2 * (s / 4))) & 3;
        t.sc[s / 2][2 * c + s % 2] = ((lo | (hi << 4)) as i8).wrapping_sub(32);
    }
    // Value i: in half h = i / 128, quarter q = i % 128 / 32, position l = i % 32, the two low
    // bits are qs[32h + l] >> 2q, the third hmask[l] >> (i / 32); group g's eight values are
    // eight neighbouring positions of one quarter.
    for g in 0..QK_K / 8 {
        let (j, l0) = (g / 4, 8 * (g % 4));
        let (h, q) = (j / 4, j % 4);
        let word = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().expect("eight bytes"));
        let low = (word(&qs[32 * h + l0..]) >> (2 * q)) & 0x0303_0303_0303_0303;
        let top = (word(&hmask[l0..]) >> j) & 0x0101_0101_0101_0101;
        t.qs[64 * g + 4 * c..][..4].copy_from_slice(&interleave(low | (top << 2)).to_le_bytes());
    }
}
