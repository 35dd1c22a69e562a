//! `tandem-kernels`: the sources of tandem's own GPU kernels and, in CUDA builds, their PTX.
//!
//! Each `cuda/<op>.cu` is compiled to PTX by `build.rs` (nvcc, `--features cuda`) and exposed
//! here as a string; the launchers live beside each op's CPU kernel and reference in
//! `tandem-model::ops`, which loads the PTX once per device through candle
//! (`CudaDevice::get_or_load_custom_func`). Nothing here runs on its own: the conformance
//! tests (`tandem check-device`, `tandem-model`'s op tests) compare every kernel with the
//! op's reference on the device at hand.

/// PTX of `cuda/paged_attention.cu`: attention over a paged KV pool (decode and verify rows).
#[cfg(feature = "cuda")]
pub const PAGED_ATTENTION: &str = include_str!(concat!(env!("OUT_DIR"), "/paged_attention.ptx"));

/// PTX of `cuda/gdn.cu`: the Gated DeltaNet causal conv and gated delta rule with state.
#[cfg(feature = "cuda")]
pub const GDN: &str = include_str!(concat!(env!("OUT_DIR"), "/gdn.ptx"));

/// PTX of `cuda/matmul.cu`: row-invariant small-row dense matmul (decode / verify rows).
#[cfg(feature = "cuda")]
pub const MATMUL: &str = include_str!(concat!(env!("OUT_DIR"), "/matmul.ptx"));

/// Whether this build carries CUDA kernels.
pub const HAS_CUDA: bool = cfg!(feature = "cuda");

/// PTX of `cuda/kv_quant.cu`: encoding KV rows into q8_0 / q4_0 blocks.
#[cfg(feature = "cuda")]
pub const KV_QUANT: &str = include_str!(concat!(env!("OUT_DIR"), "/kv_quant.ptx"));

/// PTX of `cuda/qmatmul.cu`: row-invariant matmuls over GGML weight rows (dense and quantised)
/// for every call size, and the grouped expert matmuls of MoE layers.
#[cfg(feature = "cuda")]
pub const QMATMUL: &str = include_str!(concat!(env!("OUT_DIR"), "/qmatmul.ptx"));

/// PTX of `cuda/qmma.cu`: Q8_0 matmuls on the tensor cores (int8 mma) with 8-bit activations,
/// row-invariant for every call size, and the activation quantiser they read.
#[cfg(feature = "cuda")]
pub const QMMA: &str = include_str!(concat!(env!("OUT_DIR"), "/qmma.ptx"));

/// PTX of `cuda/kqmma.cu`: Q4_K / Q5_K / Q6_K matmuls with 8-bit activations (a warp-per-column
/// GEMV for a few rows, int8 mma for more), row-invariant for every call size.
#[cfg(feature = "cuda")]
pub const KQMMA: &str = include_str!(concat!(env!("OUT_DIR"), "/kqmma.ptx"));

/// PTX of `cuda/kqgemm.cu`: the Q4_K / Q5_K / Q6_K GEMM for calls of 64+ rows (prefill), on
/// `kqmma.cu`'s chain and activations.
#[cfg(feature = "cuda")]
pub const KQGEMM: &str = include_str!(concat!(env!("OUT_DIR"), "/kqgemm.ptx"));

/// PTX of `cuda/attn_glue.cu`: the gated attention layer's q / k norms, rotation and head-major
/// copies before attention, and its sigmoid gate after, one launch each.
#[cfg(feature = "cuda")]
pub const ATTN_GLUE: &str = include_str!(concat!(env!("OUT_DIR"), "/attn_glue.ptx"));

/// PTX of `cuda/q8gemm.cu`: the Q8_0 GEMM for calls of 64+ rows (prefill), on `qmma.cu`'s
/// chain and activations.
#[cfg(feature = "cuda")]
pub const Q8GEMM: &str = include_str!(concat!(env!("OUT_DIR"), "/q8gemm.ptx"));

/// PTX of `cuda/kqskinny.cu`: the Q4_K / Q5_K / Q6_K matmul of 1-8 rows on int8 mma (verify
/// steps, small batches), on `kqmma.cu`'s chain and activations.
#[cfg(feature = "cuda")]
pub const KQSKINNY: &str = include_str!(concat!(env!("OUT_DIR"), "/kqskinny.ptx"));

/// PTX of `cuda/moe.cu`: MoE routing (softmax + top-k), slots sorted by expert, weighted combine.
#[cfg(feature = "cuda")]
pub const MOE: &str = include_str!(concat!(env!("OUT_DIR"), "/moe.ptx"));

/// PTX of `cuda/sampling.cu`: the top candidates and softmax mass of logits rows (sampling).
#[cfg(feature = "cuda")]
pub const SAMPLING: &str = include_str!(concat!(env!("OUT_DIR"), "/sampling.ptx"));

/// PTX of `cuda/gdn_chunked.cu`: the GDN step after the conv for prefill chunks, in the chunked
/// WY form (gates and norms included).
#[cfg(feature = "cuda")]
pub const GDN_CHUNKED: &str = include_str!(concat!(env!("OUT_DIR"), "/gdn_chunked.ptx"));

/// PTX of `cuda/norm.cu`: RMSNorm of rows with the residual add fused in, and SiLU(gate) x up
/// over row views.
#[cfg(feature = "cuda")]
pub const NORM: &str = include_str!(concat!(env!("OUT_DIR"), "/norm.ptx"));

/// PTX of `cuda/tmma.cu`: bf16 matmuls on the tensor cores (activations split into two bf16
/// halves), row-invariant for every call size.
#[cfg(feature = "cuda")]
pub const TMMA: &str = include_str!(concat!(env!("OUT_DIR"), "/tmma.ptx"));

/// The PTX of module `stem`: `embedded` (this build's), or with `TANDEM_PTX_DIR` set (a kernel
/// lab's variants, compiled elsewhere with the same nvcc flags as `build.rs`) the file
/// `$TANDEM_PTX_DIR/<stem>.ptx` where it exists, read once and kept for the process. The
/// conformance tests (`tandem check-device`) then check the variant like the built kernel.
#[cfg(feature = "cuda")]
pub fn ptx(stem: &str, embedded: &'static str) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static DIR: OnceLock<Option<std::ffi::OsString>> = OnceLock::new();
    static LOADED: OnceLock<Mutex<HashMap<String, &'static str>>> = OnceLock::new();
    // Called on every launch: without the variable, no lookup and no lock.
    let Some(dir) = DIR.get_or_init(|| std::env::var_os("TANDEM_PTX_DIR")) else { return embedded };
    let mut loaded = LOADED.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&p) = loaded.get(stem) {
        return p;
    }
    let path = std::path::Path::new(&dir).join(format!("{stem}.ptx"));
    let text: &'static str = match std::fs::read_to_string(&path) {
        Ok(t) => {
            eprintln!("tandem-kernels: {stem} from {}", path.display());
            Box::leak(t.into_boxed_str())
        }
        Err(_) => embedded,
    };
    loaded.insert(stem.to_string(), text);
    text
}
