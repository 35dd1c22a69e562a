//! Element formats of the paged KV cache ([`KvDtype`]) and the encoding of one head row (the
//! `head_dim` keys or values of one KV head at one position) in each.
//!
//! - `f32`: exact; 4 bytes per value.
//! - `f16`: IEEE half, round to nearest even; 2 bytes per value (llama.cpp's default).
//! - `q8_0`: ggml's `block_q8_0` layout, blocks of 32 values as an f16 scale `d = amax / 127`
//!   and 32 signed bytes `round(x / d)`; 34 bytes per 32 values (8.5 bits).
//! - `q4_0`: ggml's `block_q4_0` layout, blocks of 32 values as an f16 scale `d = max / -8`
//!   (`max` the value of largest magnitude) and 16 bytes of nibbles `q = x / d + 8` clamped to
//!   0..=15, value `j` in the low nibble of byte `j` and value `j + 16` in its high nibble;
//!   18 bytes per 32 values (4.5 bits).
//!
//! A row is encoded once, when its position is written, and never re-encoded, so every reader
//! (decode, a verify chunk, a prefill chunk, a later request that hits the prefix cache) sees
//! the same values: cache transparency and chunk equivalence hold in every format. The
//! quantised formats need a head dimension that is a multiple of 32.

use std::fmt;
use std::str::FromStr;

use candle_core::DType;
use half::f16;

use crate::error::{ModelError, Result};

/// Values per block of the quantised formats.
pub const KV_QBLOCK: usize = 32;

/// How the paged KV cache stores keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    #[default]
    F32,
    F16,
    Q8_0,
    Q4_0,
}

impl KvDtype {
    /// Every format, most precise first.
    pub const ALL: [KvDtype; 4] = [KvDtype::F32, KvDtype::F16, KvDtype::Q8_0, KvDtype::Q4_0];

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    pub fn is_quantized(self) -> bool {
        matches!(self, KvDtype::Q8_0 | KvDtype::Q4_0)
    }

    /// The candle dtype of the pool tensors (`U8` bytes for the quantised formats).
    pub fn storage_dtype(self) -> DType {
        match self {
            KvDtype::F32 => DType::F32,
            KvDtype::F16 => DType::F16,
            KvDtype::Q8_0 | KvDtype::Q4_0 => DType::U8,
        }
    }

    /// Bytes of one quantised block (0 for the float formats).
    pub fn block_bytes(self) -> usize {
        match self {
            KvDtype::Q8_0 => 2 + KV_QBLOCK,
            KvDtype::Q4_0 => 2 + KV_QBLOCK / 2,
            KvDtype::F32 | KvDtype::F16 => 0,
        }
    }

    /// Elements of the pool tensor one head row of `head_dim` values takes (values for the
    /// float formats, bytes for the quantised ones).
    pub fn row_elems(self, head_dim: usize) -> usize {
        match self {
            KvDtype::F32 | KvDtype::F16 => head_dim,
            KvDtype::Q8_0 | KvDtype::Q4_0 => head_dim / KV_QBLOCK * self.block_bytes(),
        }
    }

    /// Bytes one head row of `head_dim` values takes.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        self.row_elems(head_dim) * self.storage_dtype().size_in_bytes()
    }

    /// Whether heads of `head_dim` values can be stored in this format.
    pub fn check_head_dim(self, head_dim: usize) -> Result<()> {
        if self.is_quantized() && (head_dim == 0 || !head_dim.is_multiple_of(KV_QBLOCK)) {
            return Err(ModelError::Input(format!(
                "a {self} KV cache needs a head dimension that is a multiple of {KV_QBLOCK}, this model's is \
                 {head_dim}; use --kv-cache-dtype f16 or f32"
            )));
        }
        Ok(())
    }

    /// Encodes rows of `head_dim` values (`src.len()` a multiple of `head_dim`) in a quantised
    /// format, row after row. The float formats are not byte-encoded here (candle converts
    /// them); they return an error.
    pub fn quantize_rows(self, src: &[f32], head_dim: usize) -> Result<Vec<u8>> {
        self.check_head_dim(head_dim)?;
        if !self.is_quantized() || !src.len().is_multiple_of(head_dim) {
            return Err(ModelError::Input(format!("cannot byte-encode {} values as {self} rows", src.len())));
        }
        let mut out = Vec::with_capacity(src.len() / KV_QBLOCK * self.block_bytes());
        for block in src.chunks_exact(KV_QBLOCK) {
            match self {
                KvDtype::Q8_0 => quantize_q8_0(block, &mut out),
                _ => quantize_q4_0(block, &mut out),
            }
        }
        Ok(out)
    }

    /// Decodes one quantised head row (`out.len()` values) from `src`.
    pub fn dequantize_row(self, src: &[u8], out: &mut [f32]) {
        match self {
            KvDtype::Q8_0 => dequantize_q8_0(src, out),
            KvDtype::Q4_0 => dequantize_q4_0(src, out),
            KvDtype::F32 | KvDtype::F16 => unreachable!("float KV rows are not byte-encoded"),
        }
    }
}

/// The f16 scale at the start of a quantised block.
#[inline(always)]
pub(crate) fn block_scale(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = f16::from_f32(amax / 127.0);
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    out.extend_from_slice(&d.to_bits().to_le_bytes());
    out.extend(x.iter().map(|&v| (v * id).round().clamp(-127.0, 127.0) as i8 as u8));
}

fn quantize_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let max = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_bits().to_le_bytes());
    let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
    let half = KV_QBLOCK / 2;
    out.extend((0..half).map(|j| q(x[j]) | (q(x[j + half]) << 4)));
}

/// `out[j] = d * q[j]` per block; written so the loop vectorises in the caller's instruction
/// set.
#[inline(always)]
pub(crate) fn dequantize_q8_0(src: &[u8], out: &mut [f32]) {
    for (b, o) in src.chunks_exact(2 + KV_QBLOCK).zip(out.chunks_exact_mut(KV_QBLOCK)) {
        let d = block_scale(b);
        for (y, &q) in o.iter_mut().zip(&b[2..]) {
            *y = (q as i8) as f32 * d;
        }
    }
}

/// `out[j] = d * (nibble[j] - 8)` per block.
#[inline(always)]
pub(crate) fn dequantize_q4_0(src: &[u8], out: &mut [f32]) {
    let half = KV_QBLOCK / 2;
    for (b, o) in src.chunks_exact(2 + half).zip(out.chunks_exact_mut(KV_QBLOCK)) {
        let d = block_scale(b);
        let (lo, hi) = o.split_at_mut(half);
        for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[2..]) {
            *l = ((q & 15) as i32 - 8) as f32 * d;
            *h = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvDtype {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => Ok(KvDtype::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(KvDtype::F16),
            "q8_0" | "q8" => Ok(KvDtype::Q8_0),
            "q4_0" | "q4" => Ok(KvDtype::Q4_0),
            other => Err(format!("unknown KV cache dtype {other:?}: expected f32, f16, q8_0 or q4_0")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i as f32) * 0.731).sin() * (1.0 + (i % 7) as f32)).collect()
    }

    /// Round trips stay within half a quantisation step of each block (q4_0: one step, as
    /// its levels reach only 7/8 of the block's largest magnitude on the other sign, like
    /// ggml's); sizes as documented.
    #[test]
    fn quantised_rows_round_trip_within_a_step() {
        let hd = 64;
        let x = ramp(3 * hd);
        for (dt, levels, bytes) in [(KvDtype::Q8_0, 2.0 * 127.0, 68), (KvDtype::Q4_0, 8.0, 36)] {
            assert_eq!(dt.row_bytes(hd), bytes);
            let enc = dt.quantize_rows(&x, hd).unwrap();
            assert_eq!(enc.len(), 3 * bytes);
            for (r, row) in x.chunks(hd).enumerate() {
                let mut out = vec![0f32; hd];
                dt.dequantize_row(&enc[r * bytes..(r + 1) * bytes], &mut out);
                for (blk, (o, w)) in out.chunks(32).zip(row.chunks(32)).enumerate() {
                    let amax = w.iter().fold(0f32, |a, v| a.max(v.abs()));
                    // Half a step plus the f16 rounding of the scale (relative 2^-11).
                    let tol = amax / levels + amax * 1e-3;
                    for (a, b) in o.iter().zip(w) {
                        assert!((a - b).abs() <= tol, "{dt} row {r} block {blk}: {a} vs {b} (tol {tol})");
                    }
                }
            }
        }
        assert_eq!(KvDtype::F16.row_bytes(hd), 128);
        assert_eq!(KvDtype::F32.row_bytes(hd), 256);
    }

    /// Zero blocks encode as zeros; odd head sizes are refused for the quantised formats.
    #[test]
    fn zero_blocks_and_bad_head_dims() {
        for dt in [KvDtype::Q8_0, KvDtype::Q4_0] {
            let enc = dt.quantize_rows(&[0.0; 32], 32).unwrap();
            let mut out = [1f32; 32];
            dt.dequantize_row(&enc, &mut out);
            assert!(out.iter().all(|&v| v == 0.0), "{dt}");
            assert!(dt.check_head_dim(40).is_err());
            assert!(dt.quantize_rows(&[0.0; 40], 40).is_err());
        }
        assert!(KvDtype::F16.check_head_dim(40).is_ok());
        assert_eq!("Q8_0".parse::<KvDtype>(), Ok(KvDtype::Q8_0));
        assert_eq!("f16".parse::<KvDtype>(), Ok(KvDtype::F16));
        assert!("q5".parse::<KvDtype>().is_err());
        for dt in KvDtype::ALL {
            assert_eq!(dt.to_string().parse::<KvDtype>(), Ok(dt));
        }
    }
}
