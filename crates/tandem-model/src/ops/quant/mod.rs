//! Quantised matmul for GGML Q4_1, Q5_0, Q5_1 and Q8_0 weights on the CPU (candle 0.11 only
//! has a scalar dot product for the first three on x86, and an AVX2 one for Q8_0 on its own
//! threading).
//!
//! * [`blocks`]: the weight blocks in file layout, with scalar decoding;
//! * [`activation`]: activations quantised to Q8_0/Q8_1 exactly as ggml does;
//! * [`reference`]: the plain dot products;
//! * `avx2`: the AVX2 + FMA + F16C kernels, with an AVX-VNNI variant (signed weights offset
//!   to unsigned instead of ggml's sign trick: the same integers) and that variant built for
//!   AVX-512's 32 registers with the EVEX `vpdpbusd` (x86_64, picked at run time);
//! * `avx512`: AVX-512 VNNI, two weight columns per 512-bit register (each half one column's
//!   AVX2 chain: the same bits, half the instructions per column);
//! * `neon`: the aarch64 kernels (NEON, with `sdot` where the CPU has `dotprod`), in the
//!   reference's order: the reference's bits (tested under emulation, `make test-neon`);
//! * [`matrix`]: [`GgmlMatrix`] and its rayon-parallel matmul;
//! * [`kquant`]: [`KQuantMatrix`], Q4K packed at load and its AVX-512 VNNI kernel (every call size);
//! * `op`: [`GgmlMatrix::forward`] on candle tensors (a CPU `CustomOp1`);
//! * [`row_stable`]: candle's `QMatMul` routed so every row's result is independent of the
//!   number of rows in the call (decode step = row of a speculative verify chunk), with
//!   `q6k`: a row-tiled Q6K kernel giving candle's decode bits for any number of rows, and
//!   [`dense`]: a row-invariant f32 matmul for dense weights.
//!
//! The SIMD kernels do per (row, column) exactly what ggml's x86 `ggml_vec_dot_q4_1_q8_1`,
//! `q5_0_q8_0` and `q5_1_q8_1` do (same activation quantisation, same exact integer block
//! sums, same f32 accumulation order), so a matmul equals llama.cpp's AVX2 CPU backend given
//! the same input. The reference only differs in f32 summation order.

pub mod activation;
pub mod affine;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod bf16_act;
pub mod blocks;
#[cfg(feature = "cuda")]
pub mod cuda_dense;
#[cfg(feature = "cuda")]
pub mod cuda_fused;
#[cfg(feature = "cuda")]
pub mod cuda_kqmma;
#[cfg(feature = "cuda")]
pub mod cuda_qmma;
#[cfg(feature = "cuda")]
pub mod cuda_quant;
#[cfg(feature = "cuda")]
pub mod cuda_tmma;
#[cfg(feature = "cuda")]
pub mod cuda_tmma_wg;
pub mod dense;
pub mod gemm_tile;
pub mod kquant;
pub mod matrix;
#[cfg(target_arch = "aarch64")]
mod neon;
mod op;
#[cfg(target_arch = "x86_64")]
pub mod q6k;
pub mod reference;
pub mod row_stable;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_candle;

pub use activation::Q8Block;
pub use blocks::{BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, QuantType, WeightBlock};
pub use kquant::KQuantMatrix;
pub use matrix::GgmlMatrix;

/// Whether this x86 CPU is an AMD one (cpuid vendor "AuthenticAMD"): the prefetch distances
/// below were measured apart on Intel (Sapphire Rapids) and AMD (Zen 3, Zen 4) cores, and
/// where they disagree the default follows the vendor.
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_is_amd() -> bool {
    static AMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMD.get_or_init(|| {
        let r = std::arch::x86_64::__cpuid(0);
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        &v == b"AuthenticAMD"
    })
}

/// The x86 CPU family (cpuid leaf 1: the base family, plus the extended family when the base
/// is 0xF): AMD Zen 3 / Zen 4 are 0x19, Zen 5 0x1A.
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_family() -> u32 {
    static FAMILY: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *FAMILY.get_or_init(|| family_of(std::arch::x86_64::__cpuid(1).eax))
}

/// The family in cpuid leaf 1's eax.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn family_of(eax: u32) -> u32 {
    let base = (eax >> 8) & 0xf;
    if base == 0xf {
        base + ((eax >> 20) & 0xff)
    } else {
        base
    }
}

/// The model in cpuid leaf 1's eax: the base model, with the extended model above it for
/// families 6 and 0xF (every AMD Zen and Intel core).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn model_of(eax: u32) -> u32 {
    let base = (eax >> 4) & 0xf;
    if matches!((eax >> 8) & 0xf, 6 | 0xf) {
        base | (((eax >> 16) & 0xf) << 4)
    } else {
        base
    }
}

/// Whether family 0x19 with this model is Zen 3 (Milan 0x01, Chagall 0x08, Vermeer 0x21,
/// Rembrandt 0x44, Cezanne 0x50) rather than Zen 4 (0x10-0x1F, 0x60-0x7F, 0xA0-0xAF).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn zen3_model(model: u32) -> bool {
    model < 0x10 || (0x20..0x60).contains(&model)
}

/// Whether the CPU's decode streams best with the tile kernels' prefetches ahead and spread
/// over a tile's steps (Zen 5's defaults below): AMD family 0x1A (Zen 5) and later, and Zen 3
/// (family 0x19, [`zen3_model`]; measured on an EPYC Milan, 2026-12-07: one thread
/// qwen2.5-coder-1.5b Q4_K_M decode 8.4-9.6 -> 13.6-15.8 tok/s, two threads 13.8-17.1 ->
/// 19.8-23.3). Zen 4, the other half of family 0x19, keeps the tiles unprefetched (measured
/// there: a prefetch 1-8 tiles ahead lost 15-30%).
#[cfg(target_arch = "x86_64")]
pub(crate) fn amd_prefetch_ahead() -> bool {
    static YES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *YES.get_or_init(|| {
        let eax = std::arch::x86_64::__cpuid(1).eax;
        cpu_is_amd() && (family_of(eax) >= 0x1a || (family_of(eax) == 0x19 && zen3_model(model_of(eax))))
    })
}

#[cfg(test)]
mod family_tests {
    /// cpuid leaf 1 signatures: Zen 4 (EPYC 9004), Zen 5 (EPYC 9005), Sapphire Rapids.
    #[test]
    fn families_of_known_signatures() {
        assert_eq!(super::family_of(0x00a1_0f11), 0x19);
        assert_eq!(super::family_of(0x00b0_0f21), 0x1a);
        assert_eq!(super::family_of(0x0008_06f8), 6);
    }

    /// Zen 3 and Zen 4 share family 0x19 and differ in the model: EPYC Milan (7003), Ryzen
    /// 5000 (Vermeer) and Ryzen 5000G (Cezanne) against EPYC 9004 (Genoa), Ryzen 7000
    /// (Raphael), Ryzen 7040 (Phoenix) and EPYC 9004 Bergamo; Sapphire Rapids' model is 0x8F.
    #[test]
    fn zen3_is_told_from_zen4_by_model() {
        for zen3 in [0x00a0_0f11, 0x00a2_0f10, 0x00a5_0f00] {
            assert_eq!(super::family_of(zen3), 0x19);
            assert!(super::zen3_model(super::model_of(zen3)), "{zen3:#x}");
        }
        for zen4 in [0x00a1_0f11, 0x00a6_0f12, 0x00a7_0f41, 0x00aa_0f01] {
            assert_eq!(super::family_of(zen4), 0x19);
            assert!(!super::zen3_model(super::model_of(zen4)), "{zen4:#x}");
        }
        assert_eq!(super::model_of(0x0008_06f8), 0x8f);
        assert_eq!(super::model_of(0x00a0_0f11), 0x01);
    }
}

/// A prefetch distance: `TANDEM_*_PREFETCH` where set (0 turns it off), else the default.
#[cfg(target_arch = "x86_64")]
fn prefetch_setting(var: &str, default: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// How many tiles ahead of the one being read the CPU K-quant tile kernels prefetch (into L2)
/// in calls of up to four rows (`TANDEM_KQ_PREFETCH=N`; 0 off). Default 1 on Intel, 2 on Zen 3
/// and on Zen 5 (family 0x1A) and later ([`amd_prefetch_ahead`]), 0 on other AMD cores (Zen 4,
/// Zen 2 and older). Sapphire Rapids, qwen2.5-coder-1.5b Q4_K_M decode: one ahead +16-18%, 2-16
/// ahead 3-5% below one (the hardware prefetcher alone leaves the core waiting at each tile's
/// start). Zen 4 the other way round, 1 thread: off 21.4-22.3 tok/s, 1 ahead 15.3, 4 ahead 17.5,
/// 8 ahead 18.7
/// (issued across the superblock's sub-block loop instead of in one burst, 4 ahead gained 5% on
/// one thread and lost 5% on two). Zen 5 the other way again: the random MoE preset in Q4_K,
/// decode tok/s at 0 / 1 / 2 ahead, 1 thread 37.3-38.1 / 49.9-52.0 / 52.6-55.4, 2 threads (0 /
/// 2 / 3 / 4) 54.6-56.1 / 63.9-68.7 / 57.3-67.4 / 56.9-63.9. Zen 3 as Zen 5 (EPYC Milan,
/// 2026-12-07, coder-1.5b with the spread below, decode tok/s at 0 / 1 / 2 / 4 ahead: 1 thread
/// 8.4-9.6 / 11.8-14.3 / 13.6-15.8 / 12.9-15.2; 2 threads (0 / 1 / 2 / 3) 13.8-17.1 / 21.5-23.3
/// / 19.8-20.7 / 21.1-22.9; 2 ahead in one burst 9.8-10.9 on one thread).
/// (docs/PERFORMANCE.md.)
#[cfg(target_arch = "x86_64")]
pub(crate) fn kernel_prefetch() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let default = match (cpu_is_amd(), amd_prefetch_ahead()) {
        (false, _) => 1,
        (true, true) => 2,
        (true, false) => 0,
    };
    *N.get_or_init(|| prefetch_setting("TANDEM_KQ_PREFETCH", default))
}

/// Over how many of a tile's eight sub-block steps the tile kernels spread the prefetch of a
/// tile's cache lines (`TANDEM_KQ_PREFETCH_SPREAD=N`, 1..8): 8 where [`amd_prefetch_ahead`]
/// (Zen 3, Zen 5 and later), 1 (every line at the tile's first step) elsewhere. Zen 3 (EPYC
/// Milan, 2026-12-07), qwen2.5-coder-0.5b (Q5_0 tiles 4 ahead) one thread 18.1-19.0 tok/s in one
/// burst against 23.4-24.8 spread over 8 steps (21.1-24.6 over 4). Zen 5, 2026-12-06, decode tok/s
/// with the lines spread against in one burst, interleaved with llama-bench: qwen2.5-coder-1.5b
/// Q4_K_M 1 thread 29.4-29.8 against 25.4-26.4 (llama.cpp 26.2-26.6), 2 threads 35.9-37.2
/// against 32.6-33.8; the 0.8B hybrid Q4_K_M 48.2-50.9 against 42.8-47.1; the MoE preset Q4_K
/// 1 thread 58.6-60.2 against 51.3-51.9, 2 threads 75.8-77.1 against 65.7-65.8; AVX2 kernels
/// (`TANDEM_KQUANT_SIMD=avx2`) +10-15%. Zen 4 (2026-12-02, 4 ahead) gained 5% on one thread and
/// lost 5% on two, and prefetches nothing by default; Intel not measured.
#[cfg(target_arch = "x86_64")]
pub(crate) fn kernel_prefetch_spread() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let default = if amd_prefetch_ahead() { 8 } else { 1 };
        std::env::var("TANDEM_KQ_PREFETCH_SPREAD")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(default, |n: usize| n.clamp(1, 8))
    })
}

/// How many tiles ahead the Q5_0 tile kernel prefetches in calls of up to four rows
/// (`TANDEM_Q50_PREFETCH=N`, default 4, 2 where [`amd_prefetch_ahead`]; 0 off). Its
/// column tiles are short (qwen2.5's 896-value rows: four 2,816-byte tiles), so the hardware
/// prefetcher alone starts each one cold. Zen 4, qwen2.5-coder-0.5b Q4_K_M decode, tok/s at 0 /
/// 1 / 2 / 3 / 4 / 8 ahead: 1 thread 23.7 / 35.9 / 40.5 / 41.0 / 43.1 / 41.9; 2 threads (0 / 1
/// / 2 / 4) 45.4 / 62.1 / 65.7 / 64.2. Zen 5, the same file, two rounds: 1 thread at 0 / 1 / 2
/// / 3 / 4 / 8 / 16 ahead 39.0-40.1 / 53.1-54.9 / **54.9-56.2** / 53.7-53.9 / 52.6-54.9 /
/// 52.7-52.9 / 52.0-52.1; 2 threads (2 / 4, three rounds) 68.9-71.7 / 65.7-69.4; gemma3-270m
/// one thread 89.9-95.0 / 88.2-94.1. Zen 3 (EPYC Milan, 2026-12-07), the lines spread, coder-0.5b
/// 2 threads at 2 / 4 / 6 ahead 36.1-48.0 / 40.9-42.4 / 39.2-41.6 (within the VM's drift),
/// gemma3-270m one thread (2 / 4) 42.4-42.9 / 39.6-43.6. Not measured on Intel.
#[cfg(target_arch = "x86_64")]
pub(crate) fn q50_prefetch() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        let default = if amd_prefetch_ahead() { 2 } else { 4 };
        prefetch_setting("TANDEM_Q50_PREFETCH", default)
    })
}

/// The blocks ahead of each column that the 32-value block kernels prefetch in one-row calls
/// (`TANDEM_BLOCK_PREFETCH=N`, default 1024, about 20-35 KB of a column's stream; 0 turns it
/// off). Zen 4, 1 thread, decode tok/s at 128 / 256 / 512 / 1024 / 2048 blocks ahead: random
/// 0.8B hybrid Q8_0 17.7 / 25.0 / 25.5 / 28.4 / 28.0; qwen2.5-coder-0.5b 29.3 / 36.3 / 36.9 /
/// 37.4 / 36.7; SmolLM2 (128 / 1024) 92 / 147-158; gemma3-270m 45 / 68-74. On Zen 3 the
/// hybrid rose from 64 to 256 ahead (7.2-8.5, 10.6-11.0, 12.5 tok/s), gemma3-270m was flat.
#[cfg(target_arch = "x86_64")]
pub(crate) fn block_prefetch() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| prefetch_setting("TANDEM_BLOCK_PREFETCH", 1024))
}

/// The same for the Q6K pair kernel, in blocks of a column pair (`TANDEM_Q6K_PREFETCH=N`,
/// default 32): its two 210-byte streams a pair start anew every 1,260 bytes on 1,536-wide rows,
/// so it wants to run further ahead than the tiles. coder-1.5b Q4_K_M, 1 thread: Sapphire
/// Rapids 1 ahead 11.5 tok/s, 4 12.4, 8 12.8-12.9, 12-32 12.8; Zen 4 0 ahead 13.4, 4 17.0,
/// 8 20.0, 16 22.6-22.8, 32 22.5-23.4, 64 21.7-22.6, 128 23.2.
#[cfg(target_arch = "x86_64")]
pub(crate) fn pair_prefetch() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| prefetch_setting("TANDEM_Q6K_PREFETCH", 32))
}

/// candle's `BlockQ8K::from_float` of `row` into `out` (the AVX-512 copy in [`q6k`] where the
/// CPU has it: the same bytes).
pub(crate) fn q6k_quantize_q8k(row: &[f32], out: &mut [candle_core::quantized::k_quants::BlockQ8K]) {
    #[cfg(target_arch = "x86_64")]
    q6k::quantize_q8k(row, out);
    #[cfg(not(target_arch = "x86_64"))]
    <candle_core::quantized::k_quants::BlockQ8K as candle_core::quantized::k_quants::GgmlType>::from_float(row, out);
}

/// Which implementation runs the dot products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Plain Rust, any CPU ([`reference`]).
    Reference,
    /// AVX2 + FMA + F16C (x86_64 only).
    Avx2,
    /// [`Kernel::Avx2`] with AVX-VNNI for the integer dot products (same results).
    AvxVnni,
    /// AVX-512 F / BW / VL / VNNI (no AVX-VNNI needed: Zen 4 and Ice Lake have none): two
    /// weight columns per 512-bit register, each with [`Kernel::AvxVnni`]'s arithmetic (same
    /// results).
    Avx512Vnni,
    /// NEON (aarch64): integer sums by `smull` / `sadalp`, f32 in [`reference`]'s order (the
    /// reference's bits).
    Neon,
    /// [`Kernel::Neon`] with the integer sums by `sdot` (ARMv8.2 `dotprod`; same results).
    NeonDot,
}

impl Kernel {
    /// Whether this kernel can run on this CPU.
    pub fn available(self) -> bool {
        match self {
            Kernel::Reference => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
                *DETECTED.get_or_init(|| avx2::detected(false))
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni => {
                static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
                *DETECTED.get_or_init(|| avx2::detected(true))
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512Vnni => {
                static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
                *DETECTED.get_or_init(avx512::detected)
            }
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => true,
            #[cfg(target_arch = "aarch64")]
            Kernel::NeonDot => {
                static DETECTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
                *DETECTED.get_or_init(neon::has_dotprod)
            }
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Whether `TANDEM_QUANT_KERNEL=candle` asks for candle's own quantised kernels everywhere
    /// (for comparisons): no GgmlMatrix on the CPU, no tandem kernels on CUDA.
    pub fn candle_only() -> bool {
        static CANDLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *CANDLE.get_or_init(|| std::env::var("TANDEM_QUANT_KERNEL").is_ok_and(|v| v.eq_ignore_ascii_case("candle")))
    }

    /// Every kernel, fastest last (within one architecture).
    pub const ALL: [Kernel; 6] =
        [Kernel::Reference, Kernel::Avx2, Kernel::AvxVnni, Kernel::Avx512Vnni, Kernel::Neon, Kernel::NeonDot];

    /// The SIMD kernels (every one but the reference), available here or not.
    pub const SIMD: [Kernel; 5] = [Kernel::Avx2, Kernel::AvxVnni, Kernel::Avx512Vnni, Kernel::Neon, Kernel::NeonDot];

    /// Whether this kernel forms its integer sums with VNNI instructions.
    pub fn is_vnni(self) -> bool {
        matches!(self, Kernel::AvxVnni | Kernel::Avx512Vnni)
    }

    /// The fastest available kernel. `TANDEM_QUANT_KERNEL=reference`, `=avx2`, `=avxvnni` or
    /// `=neon` caps the choice (for comparisons).
    pub fn best() -> Kernel {
        static BEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = match std::env::var("TANDEM_QUANT_KERNEL").map(|v| v.to_ascii_lowercase()).as_deref() {
                Ok("reference") => Kernel::Reference,
                Ok("avx2") => Kernel::Avx2,
                Ok("avxvnni") => Kernel::AvxVnni,
                Ok("neon") => Kernel::Neon,
                _ => Kernel::NeonDot,
            };
            let allowed = &Kernel::ALL[..=Kernel::ALL.iter().position(|&k| k == cap).unwrap_or(0)];
            allowed.iter().rev().copied().find(|k| k.available()).unwrap_or(Kernel::Reference)
        })
    }
}

/// Whether the CPU kernels may use AVX-512 where the CPU has it: `TANDEM_AVX512=0` keeps every
/// kernel on its AVX2 path (the block and K-quant tiles, Q6K, the Q8K quantiser, dense f32/16-bit
/// rows, candle's AMX path), so an AVX-512 machine runs, and measures, what an AVX2-only CPU
/// runs. Read once: a process takes one path for every call, so batch invariance and lossless
/// speculation hold either way (the K-quant, Q6K and dense kernels give the AVX-512 bits; the
/// 32-value block types' AVX2 kernels follow ggml's order, not the AVX-512 tiles').
pub fn avx512_allowed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_AVX512").map_or(true, |v| v != "0"))
}
