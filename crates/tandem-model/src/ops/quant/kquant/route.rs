//! Which weight matrices load onto the kernel of [`super::KQuantMatrix`]: the types it packs,
//! the loaders' choice per type and CPU (and the environment switches that override it), and
//! the row lengths each type's tiles take.

use candle_core::quantized::GgmlDType;

use super::tile::QK_K;
#[cfg(target_arch = "x86_64")]
use super::{available, simd, Simd};

/// Whether [`KQuantMatrix`] takes weights of this type.
pub fn supports(dtype: GgmlDType) -> bool {
    matches!(
        dtype,
        GgmlDType::Q2K
            | GgmlDType::Q3K
            | GgmlDType::Q4K
            | GgmlDType::Q5K
            | GgmlDType::Q6K
            | GgmlDType::Q8_0
            | GgmlDType::Q5_0
            | GgmlDType::Q4_0
    )
}

/// Whether the loaders put a matrix of `dtype` on this kernel (on a CPU where it runs): Q2K,
/// Q4K and Q5K always (Q2K tiles hold as many bytes as the file), Q3K for layers (not `head`,
/// the LM head: it multiplies one row per sequence, where the file's 3.4-bit blocks read fewer
/// bytes than the 4.6-bit tiles), Q6K only for layers and where [`q6k_layers`], Q8_0 where
/// [`q8_tiles`] (the caller checks `k` with [`q8_tiles_for`]), Q5_0 and Q4_0 where
/// [`q50_tiles`] (any `k` that is a multiple of 32: [`fits`]).
pub fn takes(dtype: GgmlDType, head: bool) -> bool {
    supports(dtype)
        && match dtype {
            GgmlDType::Q6K => !head && q6k_layers(),
            GgmlDType::Q3K => !head,
            GgmlDType::Q8_0 => q8_tiles(),
            GgmlDType::Q5_0 | GgmlDType::Q4_0 => q50_tiles(),
            _ => true,
        }
}

/// Whether Q8_0 matrices load as [`tile8::Tile8`]s (rows of whole superblocks; other rows:
/// [`q8_tiles_for`]): on CPUs that run the AVX-512 kernel, and on AVX2 CPUs that prefetch the
/// tiles ahead ([`crate::ops::quant::amd_prefetch_ahead`]: Zen 3), unless `TANDEM_Q8_KERNEL`
/// picks another (`ours`: the row-major block kernels, `candle`: candle's; `tiles` forces
/// these). The AVX2 build of the tiles (`avx2::rows8`) measured no faster than the AVX2 block
/// kernels on a Zen 4 forced to AVX2, without tile prefetches (random 0.8B hybrid Q8_0: pp256
/// 104 / 101 tok/s, tg32 27.6 / 30.6 on 2 threads), but on Zen 3 with them it prefills 1.2-1.4x
/// as fast and decodes as fast (EPYC Milan, 2026-12-07, the same file: 2 threads pp256 82-88
/// against 64-73 tok/s, tg64 20.1-21.4 against 21.1-21.2; 1 thread pp128 50.6-51.8 against
/// 40.5-40.9, tg32 12.8-13.5 against 12.3-12.9), so other AVX2 CPUs keep the block kernels.
pub fn q8_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| match std::env::var("TANDEM_Q8_KERNEL").as_deref() {
            Ok("tiles") => available(),
            Ok("ours" | "candle") => false,
            _ => avx512_kernel() || (available() && crate::ops::quant::amd_prefetch_ahead()),
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether Q5_0 and Q4_0 matrices load as [`tile50::Tile50`]s and [`tile40::Tile40`]s: on
/// CPUs that run the kernel (AVX-512 VNNI or AVX2), unless `TANDEM_Q5_0_TILES=0` keeps Q5_0
/// on the row-major block kernels (ggml's order) and Q4_0 on candle's.
pub fn q50_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            let off = std::env::var("TANDEM_Q5_0_TILES").as_deref() == Ok("0");
            available() && !off
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether a `dtype` matrix with rows of `k` values can be packed: whole superblocks, or for
/// Q5_0 and Q4_0 whole 32-value blocks (padded to superblocks).
pub fn fits(dtype: GgmlDType, k: usize) -> bool {
    k > 0 && if block32(dtype) { k.is_multiple_of(32) } else { k.is_multiple_of(QK_K) }
}

/// Whether `dtype`'s rows may be any multiple of 32 values (padded to whole stretches).
pub(super) fn block32(dtype: GgmlDType) -> bool {
    matches!(dtype, GgmlDType::Q8_0 | GgmlDType::Q5_0 | GgmlDType::Q4_0)
}

/// Whether a Q8_0 matrix of rows of `k` values loads as [`super::tile8::Tile8`]s: where [`q8_tiles`]
/// holds, for rows of whole superblocks, and for rows of other multiples of 32 (padded, as
/// gemma3's 640) where the AVX2 kernel runs, whose last stretch reads only the row's own
/// blocks (`avx2::rows8`). The AVX-512 kernel would read the padding too (bit-neutral, a fifth
/// more bytes at k = 640, not measured), so there such rows stay on the block kernels.
pub fn q8_tiles_for(k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        q8_tiles() && k > 0 && k.is_multiple_of(32) && (k.is_multiple_of(QK_K) || super::simd() == Some(Simd::Avx2))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = k;
        false
    }
}

/// Whether a GGUF's Q6K layer matrices load onto this kernel: by default on AVX-512 VNNI CPUs of
/// AMD's family 0x1A (Zen 5) and later, where its tiles prefill 1.09-1.25x faster than the Q6K
/// pair kernel that reads the file's blocks and decode as fast (0.94-1.09x, within the host's
/// drift; coder-1.5b Q4_K_M and the 0.8B hybrid in Q5_K_M on 1 and 2 threads, docs/PERFORMANCE.md
/// 2026-12-06 13:14); elsewhere not, since on Zen 4 and Sapphire Rapids the
/// tiles' one-row kernel, bound by its mask arithmetic, decoded 3-5% slower (2026-12-04).
/// `TANDEM_KQUANT_Q6K=1` puts them on the tiles on any CPU with the kernel, `=0` never.
pub fn q6k_layers() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("TANDEM_KQUANT_Q6K").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => q6k_tiles_by_default(),
    })
}

/// [`q6k_layers`]' default: [`avx512_kernel`] on an AMD family 0x1A+.
fn q6k_tiles_by_default() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx512_kernel() && crate::ops::quant::cpu_is_amd() && crate::ops::quant::cpu_family() >= 0x1a
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the kernel runs here in its AVX-512 VNNI build (not its AVX2 one, nor switched off):
/// where the Q8_0 and, on Zen 5, the Q6K tiles are the default.
#[cfg(target_arch = "x86_64")]
fn avx512_kernel() -> bool {
    available() && simd() == Some(Simd::Avx512)
}
