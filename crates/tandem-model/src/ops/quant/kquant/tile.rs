//! The Q4K / Q5K weight layout our kernel reads, packed once at load from GGUF's `block_q4_K`s
//! or `block_q5_K`s, and the plain reference of the kernel's arithmetic.
//!
//! A [`Tile`] holds one 256-value superblock of 16 consecutive output columns (weight rows).
//! Its 4-bit values are interleaved so that one 64-byte load gives, for each of the 16 columns
//! (one 32-bit lane each), 8 consecutive values: the low nibbles values `8g .. 8g + 3`, the high
//! nibbles `8g + 4 .. 8g + 7` of group `g`; a VNNI `dpbusd` then multiplies them with 4
//! broadcast activation bytes. The 6-bit scales and mins stay bytes, `d` and `dmin` f16 as in
//! the file: 2,368 bytes for 16 × 256 values (4.625 bits a value, against 4.5 in the file and
//! candle's repacked copy's 6 beside the file's; one-thread decode streams them at memory speed).
//! Q5K's fifth bit of each value goes to a [`HighBits`] plane beside each tile (512 bytes: per
//! group of 8 values, the two 64-bit byte masks under which the kernel adds 16 to the 4-bit
//! values).
//!
//! Per (activation row, column) the result is, with `isum_s` the exact integer dot product of
//! sub-block `s` (32 values) and `bsum_s` the sum of its 32 activation bytes:
//!
//! ```text
//! acc = 0
//! for each superblock:  t = 0
//!     for s in 0..8:    t = fma(f32(isum_s), d · sc_s, t)          (d · sc_s is exact)
//!     ms = Σ_s mn_s · bsum_s                                         (exact integer)
//!     acc = fma(t, d_a, acc);  acc = fma(-(f32(ms) · dmin), d_a, acc)
//! ```
//!
//! which [`dot`] does in scalar code and the SIMD kernel lane by lane: the same bits for every
//! row whatever else the call holds.

use half::f16;

/// Values per superblock.
pub const QK_K: usize = 256;
/// Output columns per tile.
pub const COLS: usize = 16;
/// Bytes of one GGUF `block_q4_K`: d, dmin (f16), 12 bytes of packed scales and mins, 128 of
/// 4-bit values.
pub const BLOCK_BYTES: usize = 144;
/// Bytes of one GGUF `block_q5_K`: as `block_q4_K` with 32 bytes of high bits before the 128.
pub const BLOCK5_BYTES: usize = 176;

/// The fifth bits of a Q5K tile, as the byte masks the kernel adds 16 under: for group `g`,
/// word `2g` has bit `4c + j` set when value `8g + j` of column `c` has its fifth bit (the low
/// nibbles' register), word `2g + 1` the same for value `8g + 4 + j` (the high nibbles').
#[derive(Clone)]
#[repr(C, align(16))]
pub struct HighBits(pub [u64; 2 * QK_K / 8]);

impl HighBits {
    /// 16 if value `i` of column `c` has its fifth bit, else 0.
    pub fn of(&self, c: usize, i: usize) -> u8 {
        let (g, j) = (i / 8, i % 8);
        (((self.0[2 * g + j / 4] >> (4 * c + j % 4)) & 1) as u8) << 4
    }
}

/// 16 columns × one superblock (see the module docs).
#[derive(Clone)]
#[repr(C, align(64))]
pub struct Tile {
    /// Group `g` (0..32), column `c`: bytes `64 g + 4 c ..+ 4`; byte `j`: value `8g + j` in the
    /// low nibble, `8g + 4 + j` in the high one.
    pub qs: [u8; QK_K / 8 * COLS * 4],
    /// `d` and `dmin` of each column as the file stores them (f16 bits).
    pub d: [u16; COLS],
    pub dmin: [u16; COLS],
    /// `sc[s][c]`: the 6-bit scale of sub-block `s` of column `c`.
    pub sc: [[u8; COLS]; 8],
    /// `mn[p][2c]`, `mn[p][2c + 1]`: the 6-bit mins of sub-blocks `2p` and `2p + 1` (widened to
    /// the i16 pairs of a `dpwssd` by the kernel).
    pub mn: [[u8; 2 * COLS]; 4],
}

const _: () = assert!(std::mem::size_of::<Tile>() == 2368);

impl Tile {
    fn zeroed() -> Self {
        Tile { qs: [0; QK_K / 8 * COLS * 4], d: [0; COLS], dmin: [0; COLS], sc: [[0; COLS]; 8], mn: [[0; 2 * COLS]; 4] }
    }

    /// `d` of column `c` as f32.
    pub fn d(&self, c: usize) -> f32 {
        f16::from_bits(self.d[c]).to_f32()
    }

    /// `dmin` of column `c` as f32.
    pub fn dmin(&self, c: usize) -> f32 {
        f16::from_bits(self.dmin[c]).to_f32()
    }

    /// Value `i` (0..256, 0..15) of column `c`.
    pub fn value(&self, c: usize, i: usize) -> u8 {
        nibble(&self.qs, c, i)
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` from the 12 packed bytes.
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Packs an `[n, k]` Q4K matrix (`n` rows of `k / 256` blocks of [`BLOCK_BYTES`], GGUF order)
/// into `ceil(n / 16) · k / 256` tiles, column tile by column tile, each along k (column tiles
/// in parallel). Columns past `n` in the last tile are zero.
pub fn pack(bytes: &[u8], n: usize, k: usize) -> Vec<Tile> {
    pack_tiles(bytes, n, k, BLOCK_BYTES, Tile::zeroed, |t, c, blk| fill(t, c, &blk[..4], &blk[4..16], &blk[16..]))
}

/// [`pack`] for Q5K (`n` rows of `k / 256` blocks of [`BLOCK5_BYTES`]): the tiles of the low 4
/// bits and, beside each, its [`HighBits`].
pub fn pack5(bytes: &[u8], n: usize, k: usize) -> (Vec<Tile>, Vec<HighBits>) {
    let zeroed = || (Tile::zeroed(), HighBits([0; 2 * QK_K / 8]));
    let fill5 = |(t, h): &mut (Tile, HighBits), c: usize, blk: &[u8]| {
        fill(t, c, &blk[..4], &blk[4..16], &blk[48..]);
        // The file: value 64h + l (l < 32) has bit 2h of qh[l], value 64h + 32 + l bit 2h + 1;
        // group g's eight values read bit g / 4 of eight neighbouring qh bytes.
        let qh = &blk[16..48];
        for g in 0..QK_K / 8 {
            let w = u64::from_le_bytes(qh[8 * (g % 4)..][..8].try_into().expect("eight bytes"));
            let bits = (w >> (g / 4)) & 0x0101_0101_0101_0101;
            h.0[2 * g] |= bits4(bits as u32) << (4 * c);
            h.0[2 * g + 1] |= bits4((bits >> 32) as u32) << (4 * c);
        }
    };
    pack_tiles(bytes, n, k, BLOCK5_BYTES, zeroed, fill5).into_iter().unzip()
}

/// The tiles of an `[n, k]` matrix of `block`-byte superblocks (GGUF order), column tile by
/// column tile, each along k, in parallel: tile `i` (column tile `i / nb`, superblock `i % nb`)
/// starts as `zeroed()` and `fill(tile, c, block)` writes column `c` from its block; columns
/// past `n` stay zero. Every K-quant layout packs through here.
pub(super) fn pack_tiles<T: Send>(
    bytes: &[u8],
    n: usize,
    k: usize,
    block: usize,
    zeroed: impl Fn() -> T + Sync,
    fill_col: impl Fn(&mut T, usize, &[u8]) + Sync,
) -> Vec<T> {
    use rayon::prelude::*;
    let nb = k / QK_K;
    (0..n.div_ceil(COLS) * nb)
        .into_par_iter()
        .map(|i| {
            let (ct, b) = (i / nb, i % nb);
            let mut t = zeroed();
            for c in 0..COLS.min(n - ct * COLS) {
                fill_col(&mut t, c, &bytes[((ct * COLS + c) * nb + b) * block..][..block]);
            }
            t
        })
        .collect()
}

/// Column `c` of a tile from one block's `d, dmin` (4 bytes), 12 bytes of scales and 128 of
/// 4-bit values.
fn fill(t: &mut Tile, c: usize, dd: &[u8], scales: &[u8], qs: &[u8]) {
    t.d[c] = u16::from_le_bytes([dd[0], dd[1]]);
    t.dmin[c] = u16::from_le_bytes([dd[2], dd[3]]);
    for s in 0..8 {
        let (sc, mn) = scale_min(s, scales);
        t.sc[s][c] = sc;
        t.mn[s / 2][2 * c + s % 2] = mn;
    }
    // The file: 32-byte chunk `h` holds values 64h .. 64h + 31 in its low nibbles and
    // 64h + 32 .. 64h + 63 in its high ones; group g's eight values are eight neighbouring
    // nibbles of one kind, moved eight at a time.
    for g in 0..QK_K / 8 {
        let (h, l0) = (g / 8, 8 * (g % 8));
        let at = 32 * h + l0 % 32;
        let n = nibbles8(&qs[at..at + 8], if l0 >= 32 { 4 } else { 0 });
        t.qs[64 * g + 4 * c..][..4].copy_from_slice(&interleave(n).to_le_bytes());
    }
}

/// Value `i` of column `c` in interleaved nibbles (the `qs` of every tile layout): group
/// `i / 8`, column `c`'s four bytes, the low nibble for the group's first four values.
#[inline]
pub(super) fn nibble(qs: &[u8; QK_K / 8 * COLS * 4], c: usize, i: usize) -> u8 {
    let (g, j) = (i / 8, i % 8);
    let byte = qs[64 * g + 4 * c + j % 4];
    if j < 4 {
        byte & 0xF
    } else {
        byte >> 4
    }
}

/// Eight bytes' nibbles (the low ones for `shift` 0, the high ones for 4), one to a byte.
#[inline]
pub(super) fn nibbles8(b: &[u8], shift: u32) -> u64 {
    let w = u64::from_le_bytes(b[..8].try_into().expect("eight bytes"));
    (w >> shift) & 0x0F0F_0F0F_0F0F_0F0F
}

/// Values 0..7 of a group (one 4-bit value a byte) as a tile's four bytes: value j in the low
/// nibble of byte j, value 4 + j in its high nibble.
#[inline]
pub(super) fn interleave(n: u64) -> u32 {
    (n as u32) | (((n >> 32) as u32) << 4)
}

/// Bits 0 of the four bytes of `x` (each 0 or 1) as bits 0..3.
#[inline]
pub(super) fn bits4(x: u32) -> u64 {
    ((x as u64 * 0x0102_0408) >> 24) & 0xF
}

/// Value `i` of column `c`: the 4-bit part, plus 16 for a Q5K tile's set fifth bit.
fn value(t: &Tile, h: Option<&HighBits>, c: usize, i: usize) -> u8 {
    t.value(c, i) + h.map_or(0, |h| h.of(c, i))
}

/// The weight value `i` of column `c` of a tile (with its high bits for Q5K) as f32 (for
/// dequantising and tests).
pub fn weight(t: &Tile, h: Option<&HighBits>, c: usize, i: usize) -> f32 {
    let s = i / 32;
    t.d(c) * t.sc[s][c] as f32 * value(t, h, c, i) as f32 - t.dmin(c) * t.mn[s / 2][2 * c + s % 2] as f32
}

/// One activation superblock as the kernel reads it: candle's `BlockQ8K` bytes (`d`, 256
/// values) and the sums of each 32 values as the i16 pairs `dpwssd` broadcasts.
#[derive(Clone, Copy)]
pub struct Act<'a> {
    pub d: f32,
    pub qs: &'a [i8],
    /// Word `p`: the sum of sub-block `2p` in the low 16 bits, of `2p + 1` in the high.
    pub bsum: [u32; 4],
}

/// The product of column `c` of `tiles` (one column tile along k) and one activation row, in
/// the kernel's order (module docs): the reference the SIMD kernel is tested against.
/// `high`: the tiles' [`HighBits`] for Q5K, empty for Q4K.
pub fn dot(tiles: &[Tile], high: &[HighBits], c: usize, acts: &[Act<'_>]) -> f32 {
    let mut acc = 0f32;
    for (b, (t, a)) in tiles.iter().zip(acts).enumerate() {
        let h = high.get(b);
        let mut tt = 0f32;
        let mut ms = 0i32;
        for s in 0..8 {
            let isum: i32 = (32 * s..32 * s + 32).map(|i| value(t, h, c, i) as i32 * a.qs[i] as i32).sum();
            tt = (isum as f32).mul_add(t.d(c) * t.sc[s][c] as f32, tt);
            let word = a.bsum[s / 2];
            let bsum = if s % 2 == 0 { word as u16 as i16 } else { (word >> 16) as u16 as i16 };
            ms += t.mn[s / 2][2 * c + s % 2] as i32 * bsum as i32;
        }
        acc = tt.mul_add(a.d, acc);
        acc = (-(ms as f32 * t.dmin(c))).mul_add(a.d, acc);
    }
    acc
}

/// The `bsum` words of one activation superblock from its 16-value sums (candle's `bsums`).
pub fn bsum_words(bsums: &[i16; 16]) -> [u32; 4] {
    std::array::from_fn(|p| {
        let lo = bsums[4 * p] as i32 + bsums[4 * p + 1] as i32;
        let hi = bsums[4 * p + 2] as i32 + bsums[4 * p + 3] as i32;
        (lo as i16 as u16 as u32) | ((hi as i16 as u16 as u32) << 16)
    })
}
