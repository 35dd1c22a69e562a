//! Rotary position embeddings: inverse frequencies (with the scaling variants the Llama family
//! uses) and the rotation itself for both pairing styles.

use candle_core::{DType, Device, Tensor};

use crate::config::{RopeScaling, RopeStyle};
use crate::error::Result;

/// Precomputed inverse frequencies; cos/sin are built per forward for the positions it needs.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    /// Multiplier on cos/sin (YaRN attention factor; 1 otherwise).
    mscale: f32,
    style: RopeStyle,
    rot_dim: usize,
}

impl Rope {
    /// `rot_dim` is the number of rotated dimensions per head (the whole head for Llama).
    /// `freq_factors` divides each inverse frequency (GGUF `rope_freqs.weight`).
    pub fn new(
        rot_dim: usize,
        theta: f64,
        scaling: &RopeScaling,
        style: RopeStyle,
        freq_factors: Option<&[f32]>,
    ) -> Self {
        let half = rot_dim / 2;
        let base: Vec<f64> = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f64 / rot_dim as f64)).collect();
        let mut mscale = 1.0f64;
        let inv: Vec<f64> = match *scaling {
            RopeScaling::None => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position } => {
                let orig = original_max_position as f64;
                let low_wavelen = orig / low_freq_factor;
                let high_wavelen = orig / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn { factor, original_max_position, beta_fast, beta_slow } => {
                mscale = if factor > 1.0 { 0.1 * factor.ln() + 1.0 } else { 1.0 };
                let d = rot_dim as f64;
                let corr = |rot: f64| {
                    d * (original_max_position as f64 / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln())
                };
                let low = corr(beta_fast).floor().max(0.0);
                let mut high = corr(beta_slow).ceil().min(d - 1.0);
                if (high - low).abs() < f64::EPSILON {
                    high += 0.001;
                }
                base.iter()
                    .enumerate()
                    .map(|(i, &f)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extra = 1.0 - ramp;
                        (f / factor) * (1.0 - extra) + f * extra
                    })
                    .collect()
            }
        };
        let inv_freq = inv
            .iter()
            .enumerate()
            .map(|(i, &f)| {
                let div = freq_factors.and_then(|ff| ff.get(i)).copied().unwrap_or(1.0) as f64;
                (f / div) as f32
            })
            .collect();
        Rope { inv_freq, mscale: mscale as f32, style, rot_dim }
    }

    /// cos and sin tables `[positions.len(), rot_dim / 2]` for the given absolute positions.
    pub fn tables(&self, positions: &[usize], device: &Device) -> Result<(Tensor, Tensor)> {
        let half = self.inv_freq.len();
        let (cos, sin) = self.values(positions);
        let cos = Tensor::from_vec(cos, (positions.len(), half), device)?;
        let sin = Tensor::from_vec(sin, (positions.len(), half), device)?;
        Ok((cos, sin))
    }

    /// The values of [`Self::tables`] on the host, `[positions.len(), rot_dim / 2]` each.
    pub fn values(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let a = p as f32 * f;
                cos.push(a.cos() * self.mscale);
                sin.push(a.sin() * self.mscale);
            }
        }
        (cos, sin)
    }

    /// Rotates `x: [1, heads, t, head_dim]` (contiguous) with tables for its t positions.
    pub fn apply(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let head_dim = x.dim(3)?;
        let x = x.to_dtype(DType::F32)?;
        if self.rot_dim == head_dim {
            return Ok(match self.style {
                RopeStyle::Half => candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin)?,
                RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x.contiguous()?, cos, sin)?,
            });
        }
        // Partial rotary: rotate the first rot_dim dims, pass the rest through.
        let rot = x.narrow(3, 0, self.rot_dim)?.contiguous()?;
        let pass = x.narrow(3, self.rot_dim, head_dim - self.rot_dim)?;
        let rot = match self.style {
            RopeStyle::Half => candle_nn::rotary_emb::rope(&rot, cos, sin)?,
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&rot, cos, sin)?,
        };
        Ok(Tensor::cat(&[&rot, &pass], 3)?)
    }

    /// How the rotated dims pair up.
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// Rotated dims per head (the first ones; the rest pass through).
    pub fn rot_dim(&self) -> usize {
        self.rot_dim
    }

    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }
}

/// Plain reference rotation of one head vector (used by tests).
pub fn rope_reference(x: &[f32], pos: usize, inv_freq: &[f32], style: RopeStyle) -> Vec<f32> {
    let half = inv_freq.len();
    let mut out = x.to_vec();
    for (i, &f) in inv_freq.iter().enumerate() {
        let (c, s) = ((pos as f32 * f).cos(), (pos as f32 * f).sin());
        let (a, b) = match style {
            RopeStyle::Half => (i, i + half),
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
        };
        out[a] = x[a] * c - x[b] * s;
        out[b] = x[b] * c + x[a] * s;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_matches_reference_both_styles() -> Result<()> {
        let dev = Device::Cpu;
        let hd = 8;
        let data: Vec<f32> = (0..3 * hd).map(|i| (i as f32 * 0.37).sin()).collect();
        for style in [RopeStyle::Half, RopeStyle::Interleaved] {
            let rope = Rope::new(hd, 10000.0, &RopeScaling::None, style, None);
            let positions = [5usize, 6, 7];
            let (c, s) = rope.tables(&positions, &dev)?;
            let x = Tensor::from_vec(data.clone(), (1, 1, 3, hd), &dev)?;
            let y = rope.apply(&x, &c, &s)?.flatten_all()?.to_vec1::<f32>()?;
            for (t, &p) in positions.iter().enumerate() {
                let r = rope_reference(&data[t * hd..(t + 1) * hd], p, rope.inv_freq(), style);
                for (a, b) in r.iter().zip(&y[t * hd..(t + 1) * hd]) {
                    assert!((a - b).abs() < 1e-5, "{style:?}: {a} vs {b}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn llama3_scaling_keeps_high_freqs_and_scales_low() {
        let s =
            RopeScaling::Llama3 { factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 64 };
        let plain = Rope::new(16, 10000.0, &RopeScaling::None, RopeStyle::Half, None);
        let scaled = Rope::new(16, 10000.0, &s, RopeStyle::Half, None);
        assert_eq!(plain.inv_freq()[0], scaled.inv_freq()[0]);
        let last = plain.inv_freq().len() - 1;
        assert!((plain.inv_freq()[last] / 8.0 - scaled.inv_freq()[last]).abs() < 1e-9);
    }
}
