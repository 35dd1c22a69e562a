//! GGML weight blocks as they lie in a GGUF file: 32 weights per block, little-endian,
//! `f16` scales kept as raw bits. The layouts are ggml's (`block_q4_1`, `block_q5_0`,
//! `block_q5_1`, `block_q8_0` in `ggml-common.h`, mirrored by candle's `k_quants.rs`):
//!
//! | type | bytes | fields                                   | weight `j` (0..32)            |
//! |------|-------|------------------------------------------|-------------------------------|
//! | Q4_1 | 20    | `d: f16, m: f16, qs: [u8; 16]`           | `d·q + m`, `q` in 0..16       |
//! | Q5_0 | 22    | `d: f16, qh: [u8; 4], qs: [u8; 16]`      | `d·(q - 16)`, `q` in 0..32    |
//! | Q5_1 | 24    | `d: f16, m: f16, qh: [u8; 4], qs: [u8; 16]` | `d·q + m`, `q` in 0..32    |
//! | Q8_0 | 34    | `d: f16, qs: [i8; 32]`                   | `d·q`, `q` in -128..128       |
//!
//! The low nibble of `qs[j]` is weight `j`, the high nibble weight `j + 16`; for the 5-bit
//! types bit `j` of the little-endian `u32` `qh` is the fifth bit of weight `j`.
//!
//! The scalar accessors here ([`WeightBlock::ints`], [`WeightBlock::dequantize`]) are the
//! reference that every SIMD kernel is tested against.

use half::f16;

/// Weights per block, for every type here and for the Q8 activation blocks.
pub const QK: usize = 32;

/// The weight types this module multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantType {
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
}

impl QuantType {
    /// Bytes per block of 32 weights.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q8_0 => 34,
        }
    }

    /// The type for a candle GGML dtype, if this module handles it.
    pub fn from_ggml(dtype: candle_core::quantized::GgmlDType) -> Option<Self> {
        use candle_core::quantized::GgmlDType as G;
        match dtype {
            G::Q4_1 => Some(QuantType::Q4_1),
            G::Q5_0 => Some(QuantType::Q5_0),
            G::Q5_1 => Some(QuantType::Q5_1),
            G::Q8_0 => Some(QuantType::Q8_0),
            _ => None,
        }
    }

    pub fn to_ggml(self) -> candle_core::quantized::GgmlDType {
        use candle_core::quantized::GgmlDType as G;
        match self {
            QuantType::Q4_1 => G::Q4_1,
            QuantType::Q5_0 => G::Q5_0,
            QuantType::Q5_1 => G::Q5_1,
            QuantType::Q8_0 => G::Q8_0,
        }
    }
}

#[inline(always)]
pub(crate) fn f16_bits_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

#[inline(always)]
fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::BlockQ4_1 {}
    impl Sealed for super::BlockQ5_0 {}
    impl Sealed for super::BlockQ5_1 {}
    impl Sealed for super::BlockQ8_0 {}
}

/// One block of 32 quantised weights. Sealed: the SIMD kernels rely on these four layouts.
pub trait WeightBlock: sealed::Sealed + Copy + Send + Sync + std::fmt::Debug + 'static {
    const TYPE: QuantType;
    /// Size in the file, `== size_of::<Self>()`.
    const BYTES: usize;
    /// Whether the block has a minimum `m` (weights `d·q + m`, activations Q8_1) or is
    /// symmetric (weights `d·(q - 16)`, activations Q8_0).
    const HAS_MIN: bool;

    /// Reads a block from exactly `BYTES` little-endian bytes.
    fn parse(bytes: &[u8]) -> Self;
    /// Writes the block back in file layout.
    fn write(&self, out: &mut Vec<u8>);
    /// The scale `d` as f32.
    fn d(&self) -> f32;
    /// The minimum `m` as f32 (0 for symmetric types).
    fn m(&self) -> f32;
    /// The 32 integer weights in activation order: `q` for Q4_1/Q5_1/Q8_0, `q - 16` for Q5_0.
    fn ints(&self) -> [i32; QK];

    /// The 32 weights as f32, exactly as ggml's `dequantize_row_*`.
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d(), self.m());
        for (o, q) in out[..QK].iter_mut().zip(self.ints()) {
            *o = q as f32 * d + m;
        }
    }
}

/// `block_q4_1`: 4-bit weights with a scale and a minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}

/// `block_q5_0`: 5-bit symmetric weights (offset 16) with a scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `block_q5_1`: 5-bit weights with a scale and a minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// `block_q8_0`: 8-bit symmetric weights with a scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}

const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

fn nibbles(b: &[u8]) -> [u8; QK / 2] {
    let mut qs = [0u8; QK / 2];
    qs.copy_from_slice(&b[..QK / 2]);
    qs
}

/// The 5-bit integers from nibbles and high bits, as ggml's `dequantize_row_q5_*`.
#[inline(always)]
fn ints5(qh: [u8; 4], qs: &[u8; QK / 2], offset: i32) -> [i32; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut out = [0i32; QK];
    for j in 0..QK / 2 {
        let xh_0 = ((qh >> j) << 4) & 0x10;
        let xh_1 = (qh >> (j + 12)) & 0x10;
        out[j] = ((qs[j] as u32 & 0x0F) | xh_0) as i32 - offset;
        out[j + QK / 2] = ((qs[j] as u32 >> 4) | xh_1) as i32 - offset;
    }
    out
}

impl WeightBlock for BlockQ4_1 {
    const TYPE: QuantType = QuantType::Q4_1;
    const BYTES: usize = 20;
    const HAS_MIN: bool = true;

    fn parse(b: &[u8]) -> Self {
        assert_eq!(b.len(), Self::BYTES);
        BlockQ4_1 { d: u16_at(b, 0), m: u16_at(b, 2), qs: nibbles(&b[4..]) }
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend_from_slice(&self.m.to_le_bytes());
        out.extend_from_slice(&self.qs);
    }
    fn d(&self) -> f32 {
        f16_bits_to_f32(self.d)
    }
    fn m(&self) -> f32 {
        f16_bits_to_f32(self.m)
    }
    fn ints(&self) -> [i32; QK] {
        let mut out = [0i32; QK];
        for j in 0..QK / 2 {
            out[j] = (self.qs[j] & 0x0F) as i32;
            out[j + QK / 2] = (self.qs[j] >> 4) as i32;
        }
        out
    }
}

impl WeightBlock for BlockQ5_0 {
    const TYPE: QuantType = QuantType::Q5_0;
    const BYTES: usize = 22;
    const HAS_MIN: bool = false;

    fn parse(b: &[u8]) -> Self {
        assert_eq!(b.len(), Self::BYTES);
        BlockQ5_0 { d: u16_at(b, 0), qh: [b[2], b[3], b[4], b[5]], qs: nibbles(&b[6..]) }
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend_from_slice(&self.qh);
        out.extend_from_slice(&self.qs);
    }
    fn d(&self) -> f32 {
        f16_bits_to_f32(self.d)
    }
    fn m(&self) -> f32 {
        0.0
    }
    fn ints(&self) -> [i32; QK] {
        ints5(self.qh, &self.qs, 16)
    }
}

impl WeightBlock for BlockQ5_1 {
    const TYPE: QuantType = QuantType::Q5_1;
    const BYTES: usize = 24;
    const HAS_MIN: bool = true;

    fn parse(b: &[u8]) -> Self {
        assert_eq!(b.len(), Self::BYTES);
        BlockQ5_1 { d: u16_at(b, 0), m: u16_at(b, 2), qh: [b[4], b[5], b[6], b[7]], qs: nibbles(&b[8..]) }
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend_from_slice(&self.m.to_le_bytes());
        out.extend_from_slice(&self.qh);
        out.extend_from_slice(&self.qs);
    }
    fn d(&self) -> f32 {
        f16_bits_to_f32(self.d)
    }
    fn m(&self) -> f32 {
        f16_bits_to_f32(self.m)
    }
    fn ints(&self) -> [i32; QK] {
        ints5(self.qh, &self.qs, 0)
    }
}

impl WeightBlock for BlockQ8_0 {
    const TYPE: QuantType = QuantType::Q8_0;
    const BYTES: usize = 34;
    const HAS_MIN: bool = false;

    fn parse(b: &[u8]) -> Self {
        assert_eq!(b.len(), Self::BYTES);
        let mut qs = [0i8; QK];
        qs.iter_mut().zip(&b[2..]).for_each(|(q, &v)| *q = v as i8);
        BlockQ8_0 { d: u16_at(b, 0), qs }
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend(self.qs.iter().map(|&q| q as u8));
    }
    fn d(&self) -> f32 {
        f16_bits_to_f32(self.d)
    }
    fn m(&self) -> f32 {
        0.0
    }
    fn ints(&self) -> [i32; QK] {
        self.qs.map(i32::from)
    }
}

/// Parses `bytes` (a whole tensor in file layout) into blocks.
pub fn parse_blocks<B: WeightBlock>(bytes: &[u8]) -> Vec<B> {
    debug_assert_eq!(std::mem::size_of::<B>(), B::BYTES);
    bytes.chunks_exact(B::BYTES).map(B::parse).collect()
}
