//! MLX-quantised safetensors (mlx-lm's format, the usual one on Apple Silicon): a quantised
//! linear `X` is stored as `X.weight` (uint32 words, `32 / bits` values each, low bits
//! first), `X.scales` and `X.biases` (one per group of `group_size` values of a row), with
//! `w = scale * q + bias`; `config.json`'s `quantization` block gives `bits` and `group_size`,
//! with per-module overrides keyed by the module's path.
//!
//! Weights whose scales and biases are exact in f16 (mlx-lm writes them in the model's dtype:
//! f16 exactly, bf16 almost always) are repacked at load into GGML blocks of 32 values that
//! hold exactly the same `scale * q + bias` (a group of 64 or 128 is two or four blocks with the
//! same scale and bias), with no f32 copy of the model: 2, 3 and 4 bits as Q4_1 (`d·q + m`, q
//! in 0..16: a 2- or 3-bit value is a nibble whose top bits are zero), 5 bits as Q5_1. 6 and 8
//! bits (no GGML block type is `d·q + m` at those widths) and inexact scales are dequantised
//! to f32 for that tensor, with a warning naming it. [`dequantize`] is the plain reference the
//! repacking is tested against. The floating-point modes (mxfp4, nvfp4, mxfp8) are
//! `loader/mlx_fp.rs`.

use std::collections::HashMap;

use half::f16;

use crate::error::{ModelError, Result};
use crate::ops::quant::QuantType;

/// Bits and group size of each quantised module.
#[derive(Debug, Clone, PartialEq)]
pub struct MlxQuant {
    bits: usize,
    group: usize,
    overrides: HashMap<String, (usize, usize)>,
    /// A floating-point mode (`loader/mlx_fp.rs`), or `None` for affine.
    fp: Option<super::mlx_fp::FpMode>,
}

impl MlxQuant {
    /// From a parsed `config.json`: `None` when it has no `quantization` block.
    pub fn from_config(v: &serde_json::Value) -> Result<Option<Self>> {
        let Some(q) = v.get("quantization").and_then(|q| q.as_object()) else { return Ok(None) };
        let pair = |o: &serde_json::Map<String, serde_json::Value>| -> Option<(usize, usize)> {
            Some((o.get("bits")?.as_u64()? as usize, o.get("group_size")?.as_u64()? as usize))
        };
        let (bits, group) = pair(q)
            .ok_or_else(|| ModelError::Config("config.json: `quantization` without bits / group_size".into()))?;
        let fp = match q.get("mode").and_then(|m| m.as_str()) {
            None | Some("affine") => None,
            Some(m) => Some(super::mlx_fp::FpMode::parse(m).ok_or_else(|| {
                ModelError::Config(format!("MLX `{m}` quantisation is not supported (affine, mxfp4, nvfp4, mxfp8)"))
            })?),
        };
        let overrides = q.iter().filter_map(|(k, v)| Some((k.clone(), pair(v.as_object()?)?))).collect();
        let me = Self { bits, group, overrides, fp };
        me.check(bits, group)?;
        Ok(Some(me))
    }

    /// The floating-point mode, `None` for affine.
    pub fn fp_mode(&self) -> Option<super::mlx_fp::FpMode> {
        self.fp
    }

    fn check(&self, bits: usize, group: usize) -> Result<()> {
        if let Some(fp) = self.fp {
            if (bits, group) != fp.shape() {
                let (b, g) = fp.shape();
                return Err(ModelError::Config(format!(
                    "MLX {}: {bits} bits in groups of {group} (the mode is {b} bits in groups of {g})",
                    fp.name()
                )));
            }
            return Ok(());
        }
        if !matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) || !matches!(group, 32 | 64 | 128) {
            return Err(ModelError::Config(format!(
                "MLX quantisation: {bits} bits in groups of {group} (unsupported)"
            )));
        }
        Ok(())
    }

    /// `(bits, group)` of the module whose weight is `hf_weight` (`model.layers.0.mlp.up_proj.weight`).
    pub fn params(&self, hf_weight: &str) -> Result<(usize, usize)> {
        let module = hf_weight.strip_suffix(".weight").unwrap_or(hf_weight);
        let p = self.overrides.get(module).copied().unwrap_or((self.bits, self.group));
        self.check(p.0, p.1)?;
        Ok(p)
    }
}

/// mlx-lm's zero-centred norms of the hybrids (its `norm_keys`), stored as 1 + w in its
/// sanitised layout: `mlx_write` bakes them, the readers take the 1 back off.
pub fn is_baked_norm(name: &str) -> bool {
    [
        ".input_layernorm.weight",
        ".post_attention_layernorm.weight",
        "model.norm.weight",
        ".q_norm.weight",
        ".k_norm.weight",
    ]
    .iter()
    .any(|s| name.ends_with(s))
}

/// Unpacks rows of `k` `bits`-bit values from `words` (`[n, k * bits / 32]`).
pub fn unpack(words: &[u32], n: usize, k: usize, bits: usize) -> Result<Vec<u8>> {
    let per_row = k * bits / 32;
    if !(k * bits).is_multiple_of(32) || words.len() != n * per_row {
        return Err(ModelError::Config(format!("MLX weight: {} words for [{n}, {k}] at {bits} bits", words.len())));
    }
    let mask = (1u64 << bits) - 1;
    let mut out = Vec::with_capacity(n * k);
    for row in words.chunks(per_row) {
        for j in 0..k {
            // Value j starts at bit j * bits of the row (it may straddle two words at 3, 5, 6 bits).
            let bit = j * bits;
            let (w, o) = (bit / 32, bit % 32);
            let lo = row[w] as u64;
            let hi = if o + bits > 32 { row[w + 1] as u64 } else { 0 };
            out.push((((lo | (hi << 32)) >> o) & mask) as u8);
        }
    }
    Ok(out)
}

/// The plain reference: `[n, k]` f32 values `scale * q + bias`.
pub fn dequantize(q: &[u8], scales: &[f32], biases: &[f32], n: usize, k: usize, group: usize) -> Vec<f32> {
    let groups = k / group;
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        for j in 0..k {
            let g = r * groups + j / group;
            out.push(scales[g] * q[r * k + j] as f32 + biases[g]);
        }
    }
    out
}

/// GGML blocks holding exactly the MLX values `q` `[n, k]` (`bits` wide) with their groups'
/// scales and biases: Q4_1 for up to 4 bits, Q5_1 for 5 (the block type and its bytes), when
/// every scale and bias is exact in f16; `None` otherwise (and for 6 and 8 bits).
pub fn repack(
    q: &[u8],
    scales: &[f32],
    biases: &[f32],
    (n, k, group, bits): (usize, usize, usize, usize),
) -> Option<(QuantType, Vec<u8>)> {
    let ty = match bits {
        1..=4 => QuantType::Q4_1,
        5 => QuantType::Q5_1,
        _ => return None,
    };
    let exact = |x: f32| f16::from_f32(x).to_f32() == x;
    if !scales.iter().chain(biases).all(|&x| exact(x))
        || !group.is_multiple_of(32)
        || !k.is_multiple_of(group)
        || q.len() != n * k
        || q.iter().any(|&v| v >> bits != 0)
    {
        return None;
    }
    let groups = k / group;
    let mut out = Vec::with_capacity(n * k / 32 * ty.block_bytes());
    for r in 0..n {
        for b in 0..k / 32 {
            let g = r * groups + b * 32 / group;
            out.extend_from_slice(&f16::from_f32(scales[g]).to_le_bytes());
            out.extend_from_slice(&f16::from_f32(biases[g]).to_le_bytes());
            let vals = &q[r * k + b * 32..r * k + b * 32 + 32];
            if ty == QuantType::Q5_1 {
                // qh: bit j is the fifth bit of value j (little-endian u32).
                let qh = vals.iter().enumerate().fold(0u32, |h, (j, &v)| h | (((v >> 4) as u32 & 1) << j));
                out.extend_from_slice(&qh.to_le_bytes());
            }
            out.extend((0..16).map(|i| (vals[i] & 0xF) | ((vals[i + 16] & 0xF) << 4)));
        }
    }
    Some((ty, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::quant::GgmlMatrix;

    #[test]
    fn unpacks_every_width_low_bits_first() {
        // 3 bits straddle words: value 10 sits in bits 30..33.
        for bits in [2usize, 3, 4, 5, 6, 8] {
            let k = 64;
            let vals: Vec<u8> = (0..k).map(|j| ((j * 7 + 3) % (1 << bits)) as u8).collect();
            let mut words = vec![0u32; k * bits / 32];
            for (j, &v) in vals.iter().enumerate() {
                let bit = j * bits;
                words[bit / 32] |= (v as u32) << (bit % 32);
                if bit % 32 + bits > 32 {
                    words[bit / 32 + 1] |= (v as u32) >> (32 - bit % 32);
                }
            }
            assert_eq!(unpack(&words, 1, k, bits).unwrap(), vals, "{bits} bits");
        }
        assert!(unpack(&[0; 3], 1, 64, 4).is_err());
    }

    /// Repacked blocks decode to exactly the MLX values: 2, 3 and 4 bits as Q4_1, 5 bits as
    /// Q5_1, for groups of 32, 64 and 128.
    #[test]
    fn repack_is_exact() {
        let (n, k) = (3, 256);
        for (bits, ty) in [(2, QuantType::Q4_1), (3, QuantType::Q4_1), (4, QuantType::Q4_1), (5, QuantType::Q5_1)] {
            let q: Vec<u8> = (0..n * k).map(|i| ((i * 11 + 5) % (1 << bits)) as u8).collect();
            for group in [32, 64, 128] {
                let groups = n * k / group;
                let scales: Vec<f32> = (0..groups).map(|g| f16::from_f32(0.01 + g as f32 * 0.003).to_f32()).collect();
                let biases: Vec<f32> = (0..groups).map(|g| f16::from_f32(-0.05 * g as f32).to_f32()).collect();
                let want = dequantize(&q, &scales, &biases, n, k, group);
                let (got_ty, bytes) = repack(&q, &scales, &biases, (n, k, group, bits)).expect("exact in f16");
                assert_eq!(got_ty, ty);
                let m = GgmlMatrix::from_bytes(ty, n, k, &bytes).unwrap();
                assert_eq!(m.dequantize(), want, "{bits} bits, group {group}");
            }
        }
        let q: Vec<u8> = (0..n * k).map(|i| (i % 16) as u8).collect();
        // A scale f16 cannot hold: no repack.
        let scales = vec![0.1f32; n * k / 32];
        assert!(repack(&q, &scales, &vec![0.0; n * k / 32], (n, k, 32, 4)).is_none());
        // 6 and 8 bits have no exact block type; a value wider than `bits` is refused.
        let ok = vec![0.5f32; n * k / 32];
        assert!(repack(&q, &ok, &ok, (n, k, 32, 8)).is_none());
        assert!(repack(&q, &ok, &ok, (n, k, 32, 3)).is_none());
    }

    #[test]
    fn reads_the_config_block() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"quantization": {"group_size": 64, "bits": 4, "mode": "affine",
                "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}}}"#,
        )
        .unwrap();
        let q = MlxQuant::from_config(&v).unwrap().unwrap();
        assert_eq!(q.params("model.layers.1.mlp.up_proj.weight").unwrap(), (4, 64));
        assert_eq!(q.params("model.layers.0.mlp.down_proj.weight").unwrap(), (8, 32));
        assert!(MlxQuant::from_config(&serde_json::json!({})).unwrap().is_none());
        let fp = serde_json::json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}});
        assert_eq!(MlxQuant::from_config(&fp).unwrap().unwrap().fp_mode(), Some(super::super::mlx_fp::FpMode::Mxfp4));
        let bad = serde_json::json!({"quantization": {"group_size": 64, "bits": 4, "mode": "nvfp4"}});
        assert!(MlxQuant::from_config(&bad).unwrap_err().to_string().contains("nvfp4"));
        let unknown = serde_json::json!({"quantization": {"group_size": 32, "bits": 4, "mode": "fp3"}});
        assert!(MlxQuant::from_config(&unknown).unwrap_err().to_string().contains("fp3"));
    }
}
