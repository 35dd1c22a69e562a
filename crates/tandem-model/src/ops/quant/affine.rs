//! Affine-quantised weights with a per-group bias (mlx's 6- and 8-bit format, `w = s·q + b`,
//! q unsigned) on the symmetric Q8_0 kernels, without widening to f32: with `o = 2^(bits-1)`,
//!
//! `W·x = Σ_g (s_g Σ_{j∈g} (q_j - o) x_j) + Σ_g (b_g + o·s_g) Σ_{j∈g} x_j`,
//!
//! so W is a Q8_0 matrix of `q - o` (in -128..127, exact) with scales `s` (exact when they are
//! f16 values, as mlx-lm writes them), plus a small dense matrix of group biases `b + o·s`
//! `[n, k / group]` applied to the activations' group sums. Both parts are the row-invariant
//! matmuls of the rest of tandem, so a row's bits never depend on the call's row count.
//! [`AffineQ8::dequantize`] gives the effective weights (the plain reference).

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Tensor};
use half::f16;

use super::blocks::QK;
use crate::error::{ModelError, Result};
use crate::loader::LinearWeight;

/// A `[n, k]` affine weight as a Q8_0 part and a group-bias part.
#[derive(Debug, Clone)]
pub struct AffineQ8 {
    /// `[n, k]` Q8_0 of `q - o`.
    q8: Box<LinearWeight>,
    /// `[n, k / group]` f32 biases `b + o·s`, dense.
    bias: Box<LinearWeight>,
    n: usize,
    k: usize,
    group: usize,
}

/// Q8_0 blocks of `q - 2^(bits-1)` with scales `s`, and the biases `b + 2^(bits-1)·s`, for
/// values `q` `[n, k]` of 5 to 8 bits in groups of `group` (a multiple of 32); `None` when a
/// scale is not an f16 value (no exact Q8_0 scale) or the sizes do not fit.
pub fn split(
    q: &[u8],
    scales: &[f32],
    biases: &[f32],
    (n, k, group, bits): (usize, usize, usize, usize),
) -> Option<(Vec<u8>, Vec<f32>)> {
    let exact = |x: f32| f16::from_f32(x).to_f32() == x;
    let groups = k.checked_div(group)?;
    if !(5..=8).contains(&bits)
        || !group.is_multiple_of(QK)
        || !k.is_multiple_of(group)
        || q.len() != n * k
        || scales.len() != n * groups
        || biases.len() != scales.len()
        || !scales.iter().all(|&s| exact(s))
        || q.iter().any(|&v| (v as u32) >> bits != 0)
    {
        return None;
    }
    let o = (1u32 << (bits - 1)) as f32;
    let mut blocks = Vec::with_capacity(n * k / QK * 34);
    for r in 0..n {
        for b in 0..k / QK {
            let g = r * groups + b * QK / group;
            blocks.extend_from_slice(&f16::from_f32(scales[g]).to_le_bytes());
            let vals = &q[r * k + b * QK..r * k + (b + 1) * QK];
            blocks.extend(vals.iter().map(|&v| (v as i32 - o as i32) as i8 as u8));
        }
    }
    let bias = scales.iter().zip(biases).map(|(&s, &b)| b + o * s).collect();
    Some((blocks, bias))
}

impl AffineQ8 {
    /// From [`split`]'s parts, the Q8_0 part on our CPU kernels or (elsewhere) a candle
    /// `QTensor`, the biases a dense matrix, on `device`.
    pub fn new(blocks: &[u8], bias: Vec<f32>, (n, k, group): (usize, usize, usize), device: &Device) -> Result<Self> {
        let groups = k / group.max(1);
        if bias.len() != n * groups || blocks.len() != n * k / QK * 34 {
            return Err(ModelError::Config(format!("affine weight [{n}, {k}] in groups of {group}: parts do not fit")));
        }
        let q8 = if device.is_cpu() {
            LinearWeight::Ggml(std::sync::Arc::new(super::GgmlMatrix::from_bytes(
                super::QuantType::Q8_0,
                n,
                k,
                blocks,
            )?))
        } else {
            LinearWeight::Candle(QMatMul::from_arc(std::sync::Arc::new(
                candle_core::quantized::ggml_file::qtensor_from_ggml(
                    candle_core::quantized::GgmlDType::Q8_0,
                    blocks,
                    vec![n, k],
                    device,
                )?,
            ))?)
        };
        let bias = LinearWeight::Candle(QMatMul::Tensor(Tensor::from_vec(bias, (n, groups), device)?));
        Ok(Self { q8: Box::new(q8), bias: Box::new(bias), n, k, group })
    }

    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// `x · Wᵀ` for `x` `[..., k]`: the Q8_0 part plus the group biases times the group sums.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let rows = x.elem_count() / self.k.max(1);
        let sums = x.to_dtype(DType::F32)?.reshape((rows, self.k / self.group, self.group))?.sum(2)?;
        let y = (self.q8.forward(x)?.reshape((rows, self.n))? + self.bias.forward(&sums)?)?;
        let mut out = dims;
        if let Some(last) = out.last_mut() {
            *last = self.n;
        }
        Ok(y.reshape(out)?)
    }

    /// The first `m` output rows.
    pub fn first_rows(&self, m: usize) -> Result<Self> {
        Ok(Self {
            q8: Box::new(self.q8.first_rows(m)?),
            bias: Box::new(self.bias.first_rows(m)?),
            n: m,
            k: self.k,
            group: self.group,
        })
    }

    /// The effective `[n, k]` f32 weights `s·(q - o) + (b + o·s)` (the reference).
    pub fn dequantize(&self) -> Result<Tensor> {
        let on = |w: &LinearWeight| -> Result<Tensor> {
            Ok(match w {
                LinearWeight::Ggml(m) => Tensor::from_vec(m.dequantize(), (m.n(), m.k()), &Device::Cpu)?,
                LinearWeight::Candle(QMatMul::QTensor(q)) => q.dequantize(&Device::Cpu)?,
                LinearWeight::Candle(QMatMul::Tensor(t)) | LinearWeight::Candle(QMatMul::TensorF16(t)) => {
                    t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?
                }
                LinearWeight::Affine(a) => a.dequantize()?,
                LinearWeight::KQuant(m) => Tensor::from_vec(m.dequantize(), (m.n(), m.k()), &Device::Cpu)?,
            })
        };
        let groups = self.k / self.group;
        let bias = on(&self.bias)?; // [n, groups]
        let bias =
            bias.reshape((self.n, groups, 1))?.broadcast_as((self.n, groups, self.group))?.reshape((self.n, self.k))?;
        Ok((on(&self.q8)? + bias)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The split weights equal `s·q + b` (within one f32 rounding of the bias), and the matmul
    /// equals x times those weights.
    #[test]
    fn split_is_the_affine_weights() {
        let (n, k) = (5, 128);
        for (bits, group) in [(8, 64), (6, 32), (5, 128)] {
            let q: Vec<u8> = (0..n * k).map(|i| ((i * 37 + 11) % (1 << bits)) as u8).collect();
            let groups = n * k / group;
            let scales: Vec<f32> = (0..groups).map(|g| f16::from_f32(0.002 + g as f32 * 0.0007).to_f32()).collect();
            let biases: Vec<f32> = (0..groups).map(|g| f16::from_f32(-0.1 + 0.01 * g as f32).to_f32()).collect();
            let want = crate::loader::mlx::dequantize(&q, &scales, &biases, n, k, group);
            let (blocks, bias) = split(&q, &scales, &biases, (n, k, group, bits)).unwrap();
            let a = AffineQ8::new(&blocks, bias, (n, k, group), &Device::Cpu).unwrap();
            let got = a.dequantize().unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{bits} bits: {g} vs {w}");
            }
            let x = Tensor::from_vec(
                (0..3 * k).map(|i| ((i * 13 % 17) as f32 - 8.0) / 8.0).collect(),
                (3, k),
                &Device::Cpu,
            )
            .unwrap();
            let y = a.forward(&x).unwrap();
            let w = Tensor::from_vec(want, (n, k), &Device::Cpu).unwrap();
            let exact = x.matmul(&w.t().unwrap()).unwrap();
            let err = (y - &exact).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let scale = exact.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            // The Q8_0 kernels quantise activations to 8 bits.
            assert!(err <= 2e-2 * scale, "{bits} bits: matmul error {err} of {scale}");
            // A row's bits do not depend on the call's rows.
            let alone = a.forward(&x.narrow(0, 1, 1).unwrap()).unwrap();
            let inside = a.forward(&x).unwrap().narrow(0, 1, 1).unwrap();
            assert_eq!(alone.to_vec2::<f32>().unwrap(), inside.to_vec2::<f32>().unwrap());
        }
        // A scale f16 cannot hold, or 4 bits: no split.
        let q = vec![0u8; n * k];
        assert!(split(&q, &vec![0.1; n * k / 32], &vec![0.0; n * k / 32], (n, k, 32, 8)).is_none());
        assert!(split(&q, &vec![0.5; n * k / 32], &vec![0.0; n * k / 32], (n, k, 32, 4)).is_none());
    }
}
