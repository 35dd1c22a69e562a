//! Gated activations on the CPU: GELU (the tanh approximation, `gelu_pytorch_tanh`) times up,
//! Gemma's GeGLU, and SiLU times up (SwiGLU, `x / (1 + exp(-x))`).
//!
//! One pass over f32 values with an exp of our own (Cephes' range reduction and polynomial,
//! ~1 ulp) that the compiler vectorises (AVX2 + FMA where the CPU has them, picked at run
//! time), through `0.5 x (1 + tanh(y)) = x / (1 + exp(-2y))`, `y = sqrt(2 / pi) (x + 0.044715
//! x^3)`: candle's `gelu` calls libm's `tanhf` per value, 10% of Gemma 3 270M's prefill on the
//! build machine. Every value depends only on its own `(g, u)`, so rows are independent of the
//! call's row count (speculation stays lossless). Other devices keep candle's ops. [`gelu_ref`]
//! is the plain formula in f64, the reference the tests hold the fast path to. Contiguous
//! operands (matmul outputs) are read in place, not copied.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use super::host::with_values;
use crate::error::Result;

/// `gelu_tanh(g) * u`, elementwise (same shapes).
pub fn gelu_mul(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    match gated_cpu(g, u, gelu_mul_slice)? {
        Some(t) => Ok(t),
        None => Ok((g.gelu()? * u)?),
    }
}

/// `silu(g) * u` (SwiGLU) for CPU f32 operands of one shape, in one parallel pass with
/// [`exp`]; `None` for anything else (the caller keeps candle's ops).
pub fn silu_mul_cpu(g: &Tensor, u: &Tensor) -> Result<Option<Tensor>> {
    gated_cpu(g, u, silu_mul_slice)
}

/// `f` over CPU f32 operands of one shape (read in place where contiguous); `None` for
/// anything else.
fn gated_cpu(g: &Tensor, u: &Tensor, f: fn(&[f32], &[f32], &mut [f32])) -> Result<Option<Tensor>> {
    let cpu_f32 = matches!(g.device(), Device::Cpu)
        && matches!(u.device(), Device::Cpu)
        && g.dtype() == DType::F32
        && u.dtype() == DType::F32;
    if !cpu_f32 || g.shape() != u.shape() {
        return Ok(None);
    }
    with_values(g, |gv| with_values(u, |uv| gated(g, gv, uv, f))).map(Some)
}

/// `o[i] = silu(g[i]) * u[i]` on the fastest path this CPU has (the same formula on each).
pub fn silu_mul_slice(g: &[f32], u: &[f32], o: &mut [f32]) {
    pairwise(g, u, o, silu_times)
}

/// The scalar build of the pass (the tests' comparison).
#[cfg(test)]
fn silu_mul_plain(g: &[f32], u: &[f32], o: &mut [f32]) {
    pairwise_plain(g, u, o, silu_times)
}

#[inline(always)]
fn silu_times(g: f32, u: f32) -> f32 {
    g / (1.0 + exp(-g)) * u
}

/// `o[i] = f(g[i], u[i])`, compiled for AVX2 + FMA where the CPU has them (the same formula,
/// vectorised: the same bits as [`pairwise_plain`]); generic, so `f` is inlined, not called.
#[inline(always)]
fn pairwise<F: Fn(f32, f32) -> f32>(g: &[f32], u: &[f32], o: &mut [f32], f: F) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        unsafe { pairwise_avx2(g, u, o, f) };
        return;
    }
    pairwise_plain(g, u, o, f);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pairwise_avx2<F: Fn(f32, f32) -> f32>(g: &[f32], u: &[f32], o: &mut [f32], f: F) {
    pairwise_plain(g, u, o, f);
}

#[inline(always)]
fn pairwise_plain<F: Fn(f32, f32) -> f32>(g: &[f32], u: &[f32], o: &mut [f32], f: F) {
    for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
        *o = f(g, u);
    }
}

/// `f` over chunks of the operands on rayon's threads, as a tensor of `like`'s shape.
fn gated(like: &Tensor, gv: &[f32], uv: &[f32], f: fn(&[f32], &[f32], &mut [f32])) -> Result<Tensor> {
    let mut out = vec![0f32; gv.len()];
    const CHUNK: usize = 1 << 14;
    if gv.len() <= CHUNK {
        // A decode step's row: handing it to the pool costs more than the pass (a wake-up).
        f(gv, uv, &mut out);
    } else {
        out.par_chunks_mut(CHUNK)
            .zip(gv.par_chunks(CHUNK))
            .zip(uv.par_chunks(CHUNK))
            .for_each(|((o, g), u)| f(g, u, o));
    }
    Ok(Tensor::from_vec(out, like.shape(), &Device::Cpu)?)
}

/// `o[i] = gelu_tanh(g[i]) * u[i]` on the fastest path this CPU has (the same formula on each).
pub fn gelu_mul_slice(g: &[f32], u: &[f32], o: &mut [f32]) {
    pairwise(g, u, o, gelu_times)
}

/// The scalar build of the pass (the tests' comparison).
#[cfg(test)]
fn gelu_mul_plain(g: &[f32], u: &[f32], o: &mut [f32]) {
    pairwise_plain(g, u, o, gelu_times)
}

#[inline(always)]
fn gelu_times(g: f32, u: f32) -> f32 {
    gelu(g) * u
}

/// `gelu_tanh(x)` as `x / (1 + exp(-2y))`.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let y = SQRT_2_OVER_PI * x * (0.044_715 * x).mul_add(x, 1.0);
    x / (1.0 + exp(-2.0 * y))
}

/// `e^x` for f32 within ~1 ulp where it neither overflows nor underflows (arguments are clamped
/// to [-87, 88]: e^-87 is a normal number, e^88 finite), in plain arithmetic the compiler can
/// vectorise: `x = n ln 2 + r`, `|r| <= ln 2 / 2`, Cephes' degree-5 polynomial for `e^r`,
/// `2^n` built in the exponent bits.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let p = 1.987_569_1e-4_f32
        .mul_add(r, 1.398_199_9e-3)
        .mul_add(r, 8.333_452e-3)
        .mul_add(r, 4.166_579_6e-2)
        .mul_add(r, 0.166_666_65)
        .mul_add(r, 0.5);
    let e = p.mul_add(r * r, r) + 1.0;
    // n in [-126, 127] after the clamp: a normal power of two.
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The plain formula in f64: `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
pub fn gelu_ref(x: f64) -> f64 {
    let y = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + y.tanh())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulps_of_f64() {
        let mut worst = 0f64;
        // The clamp's range (beyond it the value is e^-87 or e^88).
        for i in -87_000..88_000 {
            let x = i as f32 / 1000.0 + 0.000_37;
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 2.5e-7, "worst relative error {worst:e}");
    }

    #[test]
    fn gelu_matches_the_f64_formula() {
        let xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 / 2000.0 + 0.000_13).collect();
        let us: Vec<f32> = xs.iter().map(|&x| 1.0 - 0.25 * x).collect();
        let mut fast = vec![0f32; xs.len()];
        gelu_mul_slice(&xs, &us, &mut fast);
        let mut plain = vec![0f32; xs.len()];
        gelu_mul_plain(&xs, &us, &mut plain);
        for i in 0..xs.len() {
            let x = xs[i] as f64;
            let want = gelu_ref(x) * us[i] as f64;
            let err = (fast[i] as f64 - want).abs();
            // y = sqrt(2 / pi) (x + 0.044715 x^3) is rounded to f32 before the exponential, so
            // the relative error grows with |x|^3 in the tail (candle's f32 formula too).
            let tol = 1e-6 * (1.0 + 0.1 * x * x * x.abs()) * want.abs() + 1e-12;
            assert!(err <= tol, "x = {}: {} vs {want}", xs[i], fast[i]);
            // The SIMD path is the plain formula, vectorised: the same bits.
            assert_eq!(fast[i].to_bits(), plain[i].to_bits(), "x = {}", xs[i]);
        }
        // Tails: large negative values go to (nearly) zero, large positive ones to x.
        assert!(gelu(-100.0).abs() < 1e-30);
        assert_eq!(gelu(100.0), 100.0);
        assert!(gelu(f32::NAN).is_nan());
    }

    #[test]
    fn silu_mul_matches_the_f64_formula() -> Result<()> {
        let xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 / 400.0 + 0.000_13).collect();
        let us: Vec<f32> = xs.iter().map(|&x| 1.0 - 0.25 * x).collect();
        let (mut fast, mut plain) = (vec![0f32; xs.len()], vec![0f32; xs.len()]);
        silu_mul_slice(&xs, &us, &mut fast);
        silu_mul_plain(&xs, &us, &mut plain);
        for i in 0..xs.len() {
            let x = xs[i] as f64;
            let want = x / (1.0 + (-x).exp()) * us[i] as f64;
            assert!((fast[i] as f64 - want).abs() <= 1e-6 * want.abs() + 1e-30, "x = {}: {} vs {want}", xs[i], fast[i]);
            assert_eq!(fast[i].to_bits(), plain[i].to_bits(), "x = {}", xs[i]);
        }
        // Through tensors: contiguous operands and a strided view give the same values.
        let g = Tensor::from_vec(xs[..6000].to_vec(), (10, 600), &Device::Cpu)?;
        let u = Tensor::from_vec(us[..6000].to_vec(), (10, 600), &Device::Cpu)?;
        let t = silu_mul_cpu(&g, &u)?.expect("CPU f32").flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(t, fast[..6000].to_vec());
        let (gt, ut) = (g.t()?, u.t()?);
        let strided = silu_mul_cpu(&gt, &ut)?.expect("CPU f32").t()?.flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(strided, t);
        Ok(())
    }

    #[test]
    fn tensor_path_is_never_further_from_f64_than_candle() -> Result<()> {
        let g = Tensor::arange(-3000f32, 3000f32, &Device::Cpu)?.affine(1.0 / 500.0, 0.0)?.reshape((10, 600))?;
        let u = g.affine(-0.5, 1.0)?;
        let ours = gelu_mul(&g, &u)?.flatten_all()?.to_vec1::<f32>()?;
        let candle = (g.gelu()? * &u)?.flatten_all()?.to_vec1::<f32>()?;
        let (gv, uv) = (g.flatten_all()?.to_vec1::<f32>()?, u.flatten_all()?.to_vec1::<f32>()?);
        for i in 0..ours.len() {
            // candle's tanh saturates to -1 below y ~ -9 (giving -0 there); ours keeps the tail.
            let want = gelu_ref(gv[i] as f64) * uv[i] as f64;
            let (e_ours, e_candle) = ((ours[i] as f64 - want).abs(), (candle[i] as f64 - want).abs());
            assert!(e_ours <= e_candle + 2e-6 * want.abs() + 1e-12, "{} vs candle {} (f64 {want})", ours[i], candle[i]);
        }
        Ok(())
    }
}
