//! Quantised matmul for GGML Q4_1, Q5_0 and Q5_1 weights on the CPU (candle 0.11 only has a
//! scalar dot product for these on x86).
//!
//! * [`blocks`]: the weight blocks in file layout, with scalar decoding;
//! * [`activation`]: activations quantised to Q8_0/Q8_1 exactly as ggml does;
//! * [`reference`]: the plain dot products;
//! * `avx2`: the AVX2 + FMA + F16C kernels (x86_64, picked at run time);
//! * [`matrix`]: [`GgmlMatrix`], its rayon-parallel matmul and the candle integration.
//!
//! Results equal llama.cpp's CPU backend up to f32 summation order: same activation
//! quantisation, same exact integer block sums, same `d_w·d_a·Σ + m_w·s_a` combination.

pub mod activation;
#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod blocks;
pub mod matrix;
mod op;
pub mod reference;
#[cfg(test)]
mod tests;

pub use activation::Q8Block;
pub use blocks::{BlockQ4_1, BlockQ5_0, BlockQ5_1, QuantType, WeightBlock};
pub use matrix::GgmlMatrix;

/// Which implementation runs the dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Plain Rust, any CPU ([`reference`]).
    Reference,
    /// AVX2 + FMA + F16C (x86_64 only).
    Avx2,
}

impl Kernel {
    /// Whether this kernel can run on this CPU.
    pub fn available(self) -> bool {
        match self {
            Kernel::Reference => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
                *DETECTED.get_or_init(avx2::detected)
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The fastest available kernel; `TANDEM_QUANT_KERNEL=reference` forces the plain one.
    pub fn best() -> Kernel {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let forced = std::env::var("TANDEM_QUANT_KERNEL").is_ok_and(|v| v.eq_ignore_ascii_case("reference"));
            if !forced && Kernel::Avx2.available() {
                Kernel::Avx2
            } else {
                Kernel::Reference
            }
        })
    }
}
