//! MLX's floating-point quantisation modes (`quantization.mode` in `config.json`), read exactly:
//!
//! | mode  | code (packed like affine, low bits first) | scale per group (uint8)        | group |
//! |-------|-------------------------------------------|--------------------------------|-------|
//! | mxfp4 | E2M1 (0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6)   | E8M0: 2^(s - 127)              | 32    |
//! | nvfp4 | E2M1                                      | E4M3 (OCP fp8, no infinities)  | 16    |
//! | mxfp8 | E4M3                                      | E8M0                           | 32    |
//!
//! `w = code value * scale`. mxfp4 weights are repacked into GGML Q5_0 blocks, exactly: twice an
//! E2M1 value is an integer in -12..12, so `w = d·(q - 16)` with `q = 2·value + 16` and
//! `d = 2^(s - 128)` (an f16 value for every scale real checkpoints use; a tensor with a scale
//! outside f16's range falls back). nvfp4 and mxfp8 values (at most 6 significant bits) and any
//! mxfp4 fallback are exact in bf16: those tensors load as bf16 matrices (our dense kernels),
//! never widened to f32. [`dequantize`] is the plain reference (checked against mlx's own
//! `mx.dequantize` by the fixtures' test).

use half::{bf16, f16};

/// An MLX floating-point mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FpMode {
    Mxfp4,
    Nvfp4,
    Mxfp8,
}

impl FpMode {
    /// The mode named in `config.json` (`None` for `affine` and unknown names).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "mxfp4" => FpMode::Mxfp4,
            "nvfp4" => FpMode::Nvfp4,
            "mxfp8" => FpMode::Mxfp8,
            _ => return None,
        })
    }

    /// `(bits, group size)` the mode fixes.
    pub fn shape(self) -> (usize, usize) {
        match self {
            FpMode::Mxfp4 => (4, 32),
            FpMode::Nvfp4 => (4, 16),
            FpMode::Mxfp8 => (8, 32),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FpMode::Mxfp4 => "mxfp4",
            FpMode::Nvfp4 => "nvfp4",
            FpMode::Mxfp8 => "mxfp8",
        }
    }

    fn value(self, code: u8) -> f32 {
        match self {
            FpMode::Mxfp4 | FpMode::Nvfp4 => e2m1(code),
            FpMode::Mxfp8 => e4m3(code),
        }
    }

    fn scale(self, s: u8) -> f32 {
        match self {
            FpMode::Mxfp4 | FpMode::Mxfp8 => e8m0(s),
            FpMode::Nvfp4 => e4m3(s),
        }
    }
}

/// E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit.
pub fn e2m1(c: u8) -> f32 {
    let (e, m) = ((c >> 1) & 3, (c & 1) as f32);
    let v = if e == 0 { m * 0.5 } else { (1.0 + m / 2.0) * f32::powi(2.0, e as i32 - 1) };
    if c & 8 != 0 {
        -v
    } else {
        v
    }
}

/// E4M3 (OCP FN): sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7F / 0xFF are NaN.
pub fn e4m3(c: u8) -> f32 {
    if c & 0x7F == 0x7F {
        return f32::NAN;
    }
    let (e, m) = ((c >> 3) & 15, (c & 7) as f32);
    let v = if e == 0 { m / 8.0 * f32::powi(2.0, -6) } else { (1.0 + m / 8.0) * f32::powi(2.0, e as i32 - 7) };
    if c & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// E8M0: 2^(s - 127); 255 is NaN.
pub fn e8m0(s: u8) -> f32 {
    if s == 255 {
        f32::NAN
    } else {
        f32::powi(2.0, s as i32 - 127)
    }
}

/// The plain reference: `[n, k]` f32 values `code value * group scale`.
pub fn dequantize(codes: &[u8], scales: &[u8], n: usize, k: usize, mode: FpMode) -> Vec<f32> {
    let group = mode.shape().1;
    let groups = k / group;
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        for j in 0..k {
            out.push(mode.value(codes[r * k + j]) * mode.scale(scales[r * groups + j / group]));
        }
    }
    out
}

/// mxfp4 codes `[n, k]` with their E8M0 scales as GGML Q5_0 blocks holding exactly the same
/// values; `None` when a scale's `2^(s - 128)` is not an f16 value (or sizes do not fit).
pub fn mxfp4_to_q5_0(codes: &[u8], scales: &[u8], n: usize, k: usize) -> Option<Vec<u8>> {
    if !k.is_multiple_of(32) || codes.len() != n * k || scales.len() != n * k / 32 {
        return None;
    }
    // 2^-24 (f16's smallest subnormal) ..= 2^15.
    if scales.iter().any(|&s| !(104..=143).contains(&s)) {
        return None;
    }
    let mut out = Vec::with_capacity(n * k / 32 * 22);
    for (b, &s) in scales.iter().enumerate() {
        let d = f16::from_f32(f32::powi(2.0, s as i32 - 128));
        out.extend_from_slice(&d.to_le_bytes());
        let q: Vec<u8> = codes[b * 32..(b + 1) * 32].iter().map(|&c| (2.0 * e2m1(c) + 16.0) as u8).collect();
        let qh = q.iter().enumerate().fold(0u32, |h, (j, &v)| h | (((v >> 4) as u32 & 1) << j));
        out.extend_from_slice(&qh.to_le_bytes());
        out.extend((0..16).map(|i| (q[i] & 0xF) | ((q[i + 16] & 0xF) << 4)));
    }
    Some(out)
}

/// The values as bf16 when every one is exact in bf16 (always for these modes' finite values
/// in bf16's range); `None` otherwise.
pub fn exact_bf16(vals: &[f32]) -> Option<Vec<bf16>> {
    let out: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
    out.iter().zip(vals).all(|(b, &v)| b.to_f32() == v).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::quant::{GgmlMatrix, QuantType};

    #[test]
    fn decoders_match_the_formats() {
        let e2: Vec<f32> = (0..16).map(e2m1).collect();
        assert_eq!(&e2[..8], &[0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]);
        assert_eq!(e2[9], -0.5);
        assert_eq!(e4m3(0x7E), 448.0);
        assert_eq!(e4m3(0x01), f32::powi(2.0, -9));
        assert_eq!(e4m3(0x38), 1.0);
        assert!(e4m3(0xFF).is_nan());
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(120), 1.0 / 128.0);
    }

    /// Repacked mxfp4 blocks decode to exactly the reference values.
    #[test]
    fn mxfp4_repack_is_exact() {
        let (n, k) = (3, 128);
        let codes: Vec<u8> = (0..n * k).map(|i| ((i * 7 + 3) % 16) as u8).collect();
        let scales: Vec<u8> = (0..n * k / 32).map(|g| 110 + (g % 20) as u8).collect();
        let want = dequantize(&codes, &scales, n, k, FpMode::Mxfp4);
        let bytes = mxfp4_to_q5_0(&codes, &scales, n, k).unwrap();
        let m = GgmlMatrix::from_bytes(QuantType::Q5_0, n, k, &bytes).unwrap();
        assert_eq!(m.dequantize(), want);
        // A scale f16 cannot hold: no repack; the bf16 fallback is exact.
        let mut far = scales.clone();
        far[0] = 30;
        assert!(mxfp4_to_q5_0(&codes, &far, n, k).is_none());
        let vals = dequantize(&codes, &far, n, k, FpMode::Mxfp4);
        assert!(exact_bf16(&vals).is_some());
        // nvfp4 / mxfp8 values are exact in bf16.
        let s16: Vec<u8> = (0..n * k / 16).map(|g| 0x30 + (g % 9) as u8).collect();
        assert!(exact_bf16(&dequantize(&codes, &s16, n, k, FpMode::Nvfp4)).is_some());
        let c8: Vec<u8> = (0..n * k).map(|i| (i * 13 % 255) as u8 & 0xFE).collect();
        let v8 = dequantize(&c8, &scales, n, k, FpMode::Mxfp8);
        assert!(v8.iter().all(|v| v.is_finite()) && exact_bf16(&v8).is_some());
    }
}
