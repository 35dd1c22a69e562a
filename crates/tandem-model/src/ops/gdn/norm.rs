//! The normalisations of a GDN layer: L2 norm of each q/k head (eps inside the square root)
//! and the gated RMSNorm of the output (`norm(o) * w * silu(z)`, plain weight, shared by heads).

/// `x / sqrt(sum(x²) + eps)` over each consecutive run of `dim` values, in place.
pub fn l2_normalize(x: &mut [f32], dim: usize, eps: f32) {
    for row in x.chunks_mut(dim) {
        let ss: f32 = row.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss + eps).sqrt();
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// Per row of `dim` values: `o / sqrt(mean(o²) + eps) * w * silu(z)`, in place on `o`.
pub fn gated_rms_norm(o: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let dim = w.len();
    for (row, zr) in o.chunks_mut(dim).zip(z.chunks(dim)) {
        let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((v, &wi), &zi) in row.iter_mut().zip(w).zip(zr) {
            *v = *v * inv * wi * silu(zi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_and_gated_norm_match_definitions() {
        let mut x = vec![3.0f32, 4.0, 0.0, 0.0];
        l2_normalize(&mut x, 2, 1e-12);
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
        assert_eq!(&x[2..], &[0.0, 0.0]);
        let mut o = vec![1.0f32, -1.0];
        gated_rms_norm(&mut o, &[0.0, 2.0], &[2.0, 0.5], 0.0);
        // rms = 1; silu(0) = 0, silu(2) = 2 * sigmoid(2)
        assert!(o[0].abs() < 1e-7);
        let want = -0.5 * 2.0 / (1.0 + (-2.0f32).exp());
        assert!((o[1] - want).abs() < 1e-6);
    }
}
