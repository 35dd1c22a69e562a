//! The plain reference of the GPU's K-quant matmul chain (`tandem-kernels/cuda/kqmma.cu`'s
//! header): Q4_K / Q5_K / Q6_K weights from their GGML blocks, activations quantised per
//! 256-value superblock as candle's Q8K, per superblock exact integer sums I = sum_j sc_j isum_j
//! and M = sum_j m_j xs_j, one float term T_s = fma(I, d, -(M dmin)) dx_s, and
//! y = ((0 + T_0) + T_1) + ... . check-device compares every CUDA K-quant kernel with it bit
//! for bit.

use candle_core::quantized::k_quants::{BlockQ8K, GgmlType};
use candle_core::quantized::GgmlDType;

/// One weight superblock decoded: the 256 integer codes (q6_k with its -32 offset applied),
/// the per-sub-block scales (q4_k / q5_k: 8 of 32 values; q6_k: 16 of 16 values), the mins
/// (q4_k / q5_k, 8) and d, dmin.
struct Super {
    q: [i32; 256],
    sc: Vec<i32>,
    mn: [i32; 8],
    d: f32,
    dmin: f32,
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// ggml's get_scale_min_k4.
fn scale_min_k4(j: usize, q: &[u8]) -> (i32, i32) {
    if j < 4 {
        ((q[j] & 63) as i32, (q[j + 4] & 63) as i32)
    } else {
        (((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as i32, ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as i32)
    }
}

/// The superblock at the start of `b` (its GGML bytes).
fn decode(dt: GgmlDType, b: &[u8]) -> Super {
    let mut s = Super { q: [0; 256], sc: Vec::new(), mn: [0; 8], d: 0.0, dmin: 0.0 };
    match dt {
        GgmlDType::Q4K | GgmlDType::Q5K => {
            s.d = f16_at(b, 0);
            s.dmin = f16_at(b, 2);
            let scales = &b[4..16];
            let (qh, qs) = if dt == GgmlDType::Q5K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for j in 0..8 {
                let (sc, mn) = scale_min_k4(j, scales);
                s.sc.push(sc);
                s.mn[j] = mn;
                for i in 0..32 {
                    let byte = qs[(j / 2) * 32 + i];
                    let lo = if j % 2 == 0 { byte & 0xF } else { byte >> 4 } as i32;
                    let hi = qh.map_or(0, |h| ((h[i] >> j) & 1) as i32);
                    s.q[32 * j + i] = lo | (hi << 4);
                }
            }
        }
        _ => {
            // Q6K: ql[128], qh[64], scales[16] (int8), d.
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            s.d = f16_at(b, 208);
            s.sc = scales.iter().map(|&v| v as i8 as i32).collect();
            for half in 0..2 {
                let (l, h) = (&ql[64 * half..], &qh[32 * half..]);
                for i in 0..32 {
                    let base = 128 * half + i;
                    s.q[base] = ((l[i] & 0xF) | ((h[i] & 3) << 4)) as i32 - 32;
                    s.q[base + 32] = ((l[i + 32] & 0xF) | (((h[i] >> 2) & 3) << 4)) as i32 - 32;
                    s.q[base + 64] = ((l[i] >> 4) | (((h[i] >> 4) & 3) << 4)) as i32 - 32;
                    s.q[base + 96] = ((l[i + 32] >> 4) | (((h[i] >> 6) & 3) << 4)) as i32 - 32;
                }
            }
        }
    }
    s
}

/// Bytes of one superblock of `dt`.
fn block_bytes(dt: GgmlDType) -> usize {
    match dt {
        GgmlDType::Q4K => 144,
        GgmlDType::Q5K => 176,
        _ => 210,
    }
}

/// The activation row `x` (a multiple of 256 values) as candle's Q8K: per superblock the codes,
/// the scale and the 32-value code sums.
fn quantize(x: &[f32]) -> Vec<(Vec<i32>, f32, [i32; 8])> {
    let mut blocks = vec![BlockQ8K::zeros(); x.len() / 256];
    BlockQ8K::from_float(x, &mut blocks);
    blocks
        .iter()
        .map(|blk| {
            let a = crate::ops::quant::kquant::act(blk, [0; 4]);
            let (d, qs) = (a.d, a.qs);
            let codes: Vec<i32> = qs.iter().map(|&v| v as i32).collect();
            let xs = std::array::from_fn(|j| codes[32 * j..32 * j + 32].iter().sum());
            (codes, d, xs)
        })
        .collect()
}

/// y [m, n] = x [m, k] . W^T on the chain, W `n` rows of `k` values as GGML `dt` blocks
/// (`data`, row after row).
pub fn matmul(dt: GgmlDType, data: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> candle_core::Result<Vec<f32>> {
    let sbs = k / 256;
    let bb = block_bytes(dt);
    if data.len() < n * sbs * bb || x.len() < m * k || !k.is_multiple_of(256) {
        candle_core::bail!(
            "kq_chain: W of {} bytes for [{n}, {k}] {dt:?}, x of {} for [{m}, {k}]",
            data.len(),
            x.len()
        );
    }
    let acts: Vec<_> = (0..m).map(|r| quantize(&x[r * k..(r + 1) * k])).collect();
    let mut y = vec![0f32; m * n];
    for c in 0..n {
        let sup: Vec<Super> = (0..sbs).map(|s| decode(dt, &data[(c * sbs + s) * bb..])).collect();
        for (r, act) in acts.iter().enumerate() {
            let mut acc = 0f32;
            for (w, (codes, dx, xs)) in sup.iter().zip(act) {
                let per = 256 / w.sc.len();
                let isum: i32 = (0..w.sc.len())
                    .map(|j| w.sc[j] * (per * j..per * j + per).map(|i| w.q[i] * codes[i]).sum::<i32>())
                    .sum();
                let msum: i32 = if dt == GgmlDType::Q6K { 0 } else { (0..8).map(|j| w.mn[j] * xs[j]).sum() };
                let t = (isum as f32).mul_add(w.d, -(msum as f32 * w.dmin));
                acc += t * dx;
            }
            y[r * n + c] = acc;
        }
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    /// The chain against the dequantised weights times the dequantised activations in f64:
    /// the decoding of every superblock layout is right (the chain only rounds).
    #[test]
    fn chain_matches_dequantised_product() {
        for dt in [super::GgmlDType::Q4K, super::GgmlDType::Q5K, super::GgmlDType::Q6K] {
            let (n, k, m) = (5, 512, 3);
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 0.2).collect();
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 104_729 % 997) as f32 / 997.0 - 0.5) * 3.0).collect();
            let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
            let qt = QTensor::quantize(&wt, dt).unwrap();
            let deq: Vec<f32> = qt.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let y = super::matmul(dt, &qt.data().unwrap(), n, k, &x, m).unwrap();
            for r in 0..m {
                let acts = super::quantize(&x[r * k..(r + 1) * k]);
                let xq: Vec<f64> =
                    acts.iter().flat_map(|(c, d, _)| c.iter().map(move |&v| v as f64 * *d as f64)).collect();
                for c in 0..n {
                    let want: f64 = (0..k).map(|i| deq[c * k + i] as f64 * xq[i]).sum();
                    let got = y[r * n + c] as f64;
                    assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{dt:?} ({r}, {c}): {got} vs {want}");
                }
            }
        }
    }
}
