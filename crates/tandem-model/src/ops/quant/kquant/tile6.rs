//! The Q6K layout of the K-quant kernel and its plain reference. A [`Tile6`] holds one
//! 256-value superblock of 16 columns: the low 4 bits of each 6-bit value interleaved as in a
//! Q4K [`super::tile::Tile`], the top two bits as byte masks (per group of 8 values: add 16 /
//! add 32, for the low and the high nibbles' registers), the 16 signed scales of 16 values each
//! in the pair order a `dpwssd` takes (widened to i16 in the kernel), and `d` as the file's f16:
//! 3,392 bytes for 16 × 256 values (6.6 bits a value, against 6.56 in the file; one row at a
//! time the kernel reads about as many bytes as the file holds).
//!
//! Per (activation row, column), with `isum_s` the exact dot product of the unsigned values
//! (0..63) of sub-block `s` (16 values) and `bsum_s` the sum of its activation bytes:
//!
//! ```text
//! for each superblock:  t = 0
//!     for s in 0..16:   t = fma(f32(isum_s), d · sc_s, t)              (d · sc_s is exact)
//!     ms = Σ_s sc_s · bsum_s                                           (exact integer)
//!     acc = fma(t, d_a, acc);  acc = fma(-(f32(ms) · 32 d), d_a, acc)    (the values' -32)
//! ```
//!
//! [`Sub16`] is what the kernel and [`dot`] read: Q3K tiles ([`super::tile3`]) run the same
//! arithmetic with no high-bit masks and an offset of 4.

use half::f16;

use super::tile::{bits4, interleave, nibble, nibbles8, pack_tiles, COLS, QK_K};

/// Bytes of one GGUF `block_q6_K`: 128 bytes of low 4 bits, 64 of high 2 bits, 16 scales, d.
pub const BLOCK6_BYTES: usize = 210;

/// A tile of 16-value sub-blocks with signed scales, as the AVX-512 `rows6` kernel and [`dot`]
/// read it: Q6K ([`Tile6`]) and Q3K ([`super::tile3::Tile3`]). Values are stored unsigned
/// (the low four bits in `qs`, Q6K's top two under the `hm` masks) and shifted down by
/// `OFFSET` through the bsum term.
pub trait Sub16: Sync {
    /// What the stored values are above the signed ones (Q6K 32, Q3K 4).
    const OFFSET: i32;
    fn qs(&self) -> &[u8; QK_K / 8 * COLS * 4];
    /// Q6K's masks of the top two bits; `None` where `qs` holds the whole value.
    fn hm(&self) -> Option<&[u64; 4 * QK_K / 8]>;
    /// The columns' `d` (f16 bits).
    fn d_bits(&self) -> &[u16; COLS];
    /// `sc[p][2c]`, `sc[p][2c + 1]`: the scales of sub-blocks `2p` and `2p + 1` of column `c`.
    fn sc(&self) -> &[[i8; 2 * COLS]; 8];
    /// Value `i` (0..256, unsigned) of column `c`.
    fn value(&self, c: usize, i: usize) -> u8;

    /// The scale of sub-block `s` (16 values) of column `c`.
    fn scale(&self, c: usize, s: usize) -> i16 {
        self.sc()[s / 2][2 * c + s % 2] as i16
    }

    /// Column `c`'s `d`.
    fn d(&self, c: usize) -> f32 {
        f16::from_bits(self.d_bits()[c]).to_f32()
    }
}

#[derive(Clone)]
#[repr(C, align(64))]
pub struct Tile6 {
    /// As [`super::tile::Tile::qs`]: the low 4 bits.
    pub qs: [u8; QK_K / 8 * COLS * 4],
    /// Group `g`: words `4g .. 4g + 4` are the masks of bytes (bit `4c + j`) to add 16 and 32
    /// to in the low nibbles' register (values `8g + j`), then the same for the high nibbles'
    /// (values `8g + 4 + j`).
    pub hm: [u64; 4 * QK_K / 8],
    /// The columns' `d`, f16 bits as in the file.
    pub d: [u16; COLS],
    /// `sc[p][2c]`, `sc[p][2c + 1]`: the scales of sub-blocks `2p` and `2p + 1` of column `c`.
    pub sc: [[i8; 2 * COLS]; 8],
}

const _: () = assert!(std::mem::size_of::<Tile6>() == 3392);

impl Tile6 {
    fn zeroed() -> Self {
        Tile6 { qs: [0; QK_K / 8 * COLS * 4], hm: [0; 4 * QK_K / 8], d: [0; COLS], sc: [[0; 2 * COLS]; 8] }
    }
}

impl Sub16 for Tile6 {
    const OFFSET: i32 = 32;
    fn qs(&self) -> &[u8; QK_K / 8 * COLS * 4] {
        &self.qs
    }
    fn hm(&self) -> Option<&[u64; 4 * QK_K / 8]> {
        Some(&self.hm)
    }
    fn d_bits(&self) -> &[u16; COLS] {
        &self.d
    }
    fn sc(&self) -> &[[i8; 2 * COLS]; 8] {
        &self.sc
    }

    /// Value `i` (0..256, 0..63: the signed weight + 32) of column `c`.
    fn value(&self, c: usize, i: usize) -> u8 {
        let (g, j) = (i / 8, i % 8);
        let low = nibble(&self.qs, c, i);
        let bit = |w: usize| ((self.hm[4 * g + w] >> (4 * c + j % 4)) & 1) as u8;
        let (w16, w32) = if j < 4 { (0, 1) } else { (2, 3) };
        low + 16 * bit(w16) + 32 * bit(w32)
    }
}

/// Packs an `[n, k]` Q6K matrix (`n` rows of `k / 256` blocks of [`BLOCK6_BYTES`]) as
/// [`super::tile::pack`] does Q4K.
pub fn pack6(bytes: &[u8], n: usize, k: usize) -> Vec<Tile6> {
    pack_tiles(bytes, n, k, BLOCK6_BYTES, Tile6::zeroed, fill)
}

/// Column `c` of a tile from one `block_q6_K` (ql 128, qh 64, scales 16, d).
fn fill(t: &mut Tile6, c: usize, blk: &[u8]) {
    let (ql, qh, sc) = (&blk[..128], &blk[128..192], &blk[192..208]);
    t.d[c] = u16::from_le_bytes([blk[208], blk[209]]);
    for (s, &v) in sc.iter().enumerate() {
        t.sc[s / 2][2 * c + s % 2] = v as i8;
    }
    // The file: in half h (128 values), quarter q (32 values), position l: the low 4 bits are
    // ql[64h + l (+ 32 for odd q)] (high nibble for q >= 2), the top two bits qh[32h + l] >> 2q.
    // Group g's eight values are eight neighbouring positions of one quarter.
    for g in 0..QK_K / 8 {
        let (h, q, l0) = (g / 16, (g % 16) / 4, 8 * (g % 4));
        let n = nibbles8(&ql[64 * h + 32 * (q % 2) + l0..], if q >= 2 { 4 } else { 0 });
        t.qs[64 * g + 4 * c..][..4].copy_from_slice(&interleave(n).to_le_bytes());
        let top = (u64::from_le_bytes(qh[32 * h + l0..][..8].try_into().expect("eight bytes")) >> (2 * q))
            & 0x0303_0303_0303_0303;
        let (b16, b32) = (top & 0x0101_0101_0101_0101, (top >> 1) & 0x0101_0101_0101_0101);
        t.hm[4 * g] |= bits4(b16 as u32) << (4 * c);
        t.hm[4 * g + 1] |= bits4(b32 as u32) << (4 * c);
        t.hm[4 * g + 2] |= bits4((b16 >> 32) as u32) << (4 * c);
        t.hm[4 * g + 3] |= bits4((b32 >> 32) as u32) << (4 * c);
    }
}

/// The weight value `i` of column `c` as f32.
pub fn weight<T: Sub16>(t: &T, c: usize, i: usize) -> f32 {
    t.d(c) * t.scale(c, i / 16) as f32 * (t.value(c, i) as i32 - T::OFFSET) as f32
}

/// One activation superblock: `d`, its 256 bytes, and the sums of each 16 (candle's `bsums`).
#[derive(Clone, Copy)]
pub struct Act6<'a> {
    pub d: f32,
    pub qs: &'a [i8],
    pub bsums: [i16; 16],
}

/// The product of column `c` of `tiles` with one activation row, in the kernel's order.
pub fn dot<T: Sub16>(tiles: &[T], c: usize, acts: &[Act6<'_>]) -> f32 {
    let mut acc = 0f32;
    for (t, a) in tiles.iter().zip(acts) {
        let mut tt = 0f32;
        let mut ms = 0i32;
        for s in 0..16 {
            let isum: i32 = (16 * s..16 * s + 16).map(|i| t.value(c, i) as i32 * a.qs[i] as i32).sum();
            tt = (isum as f32).mul_add(t.d(c) * t.scale(c, s) as f32, tt);
            ms += t.scale(c, s) as i32 * a.bsums[s] as i32;
        }
        acc = tt.mul_add(a.d, acc);
        acc = (-(ms as f32 * (T::OFFSET as f32 * t.d(c)))).mul_add(a.d, acc);
    }
    acc
}
