//! `tandem-kernels`: the sources of tandem's own GPU kernels and, in CUDA builds, their PTX.
//!
//! Each `cuda/<op>.cu` is compiled to PTX by `build.rs` (nvcc, `--features cuda`) and the PTX to
//! SASS for the build's GPU (ptxas, `sm_<CUDA_COMPUTE_CAP>`), both exposed here as a [`Module`];
//! the launchers live beside each op's CPU kernel and reference in `tandem-model::ops`, which
//! load each module once per device (`ops::cuda_module::LoadKernel`): the SASS where the device
//! runs it (no JIT compilation on first use), else the PTX. Nothing here runs on its own: the
//! conformance tests (`tandem check-device`, `tandem-model`'s op tests) compare every kernel
//! with the op's reference on the device at hand.

/// One kernel module of this build: its PTX and the SASS ptxas made of it for the build's
/// compute capability ([`CUBIN_CAP`]).
#[derive(Clone, Copy, Debug)]
pub struct Module {
    /// The module's name (its `cuda/<stem>.cu`).
    pub stem: &'static str,
    /// PTX for `compute_<CUBIN_CAP>`: the driver compiles it for any GPU of that capability or
    /// newer on first use (and caches the result in `~/.nv/ComputeCache`).
    pub ptx: &'static str,
    /// SASS (a cubin) for `sm_<CUBIN_CAP>`: loaded as it is on GPUs it runs on; empty for a
    /// `TANDEM_PTX_DIR` variant, which is only PTX.
    pub cubin: &'static [u8],
}

/// The compute capability the cubins are built for (`CUDA_COMPUTE_CAP`, e.g. 90: sm_90).
#[cfg(feature = "cuda")]
pub const CUBIN_CAP: u32 = {
    let b = env!("TANDEM_CUBIN_CAP").as_bytes();
    let mut v = 0u32;
    let mut i = 0;
    while i < b.len() {
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
};

/// Whether SASS built for `sm_<built>` runs on a device of compute capability `major.minor`:
/// the same major version, a minor at least the build's.
pub fn cubin_runs_on(built: u32, major: u32, minor: u32) -> bool {
    major == built / 10 && minor >= built % 10
}

#[cfg(feature = "cuda")]
macro_rules! module {
    ($stem:literal) => {
        Module {
            stem: $stem,
            ptx: include_str!(concat!(env!("OUT_DIR"), "/", $stem, ".ptx")),
            cubin: include_bytes!(concat!(env!("OUT_DIR"), "/", $stem, ".cubin")),
        }
    };
}

/// `cuda/paged_attention.cu`: attention over a paged KV pool (decode and verify rows).
#[cfg(feature = "cuda")]
pub const PAGED_ATTENTION: Module = module!("paged_attention");

/// `cuda/gdn.cu`: the Gated DeltaNet causal conv and gated delta rule with state.
#[cfg(feature = "cuda")]
pub const GDN: Module = module!("gdn");

/// `cuda/matmul.cu`: row-invariant small-row dense matmul (decode / verify rows).
#[cfg(feature = "cuda")]
pub const MATMUL: Module = module!("matmul");

/// Whether this build carries CUDA kernels.
pub const HAS_CUDA: bool = cfg!(feature = "cuda");

/// `cuda/kv_quant.cu`: encoding KV rows into q8_0 / q4_0 blocks.
#[cfg(feature = "cuda")]
pub const KV_QUANT: Module = module!("kv_quant");

/// `cuda/qmatmul.cu`: row-invariant matmuls over GGML weight rows (dense and quantised)
/// for every call size, and the grouped expert matmuls of MoE layers.
#[cfg(feature = "cuda")]
pub const QMATMUL: Module = module!("qmatmul");

/// `cuda/qmma.cu`: Q8_0 matmuls on the tensor cores (int8 mma) with 8-bit activations,
/// row-invariant for every call size, and the activation quantiser they read.
#[cfg(feature = "cuda")]
pub const QMMA: Module = module!("qmma");

/// `cuda/kqmma.cu`: Q4_K / Q5_K / Q6_K matmuls with 8-bit activations (a warp-per-column
/// GEMV for a few rows, int8 mma for more), row-invariant for every call size.
#[cfg(feature = "cuda")]
pub const KQMMA: Module = module!("kqmma");

/// `cuda/kqgemm.cu`: the Q4_K / Q5_K / Q6_K GEMM for calls of 64+ rows (prefill), on
/// `kqmma.cu`'s chain and activations.
#[cfg(feature = "cuda")]
pub const KQGEMM: Module = module!("kqgemm");

/// `cuda/attn_glue.cu`: the gated attention layer's q / k norms, rotation and head-major
/// copies before attention, and its sigmoid gate after, one launch each.
#[cfg(feature = "cuda")]
pub const ATTN_GLUE: Module = module!("attn_glue");

/// `cuda/q8gemm.cu`: the Q8_0 GEMM for calls of 64+ rows (prefill), on `qmma.cu`'s
/// chain and activations.
#[cfg(feature = "cuda")]
pub const Q8GEMM: Module = module!("q8gemm");

/// `cuda/kqskinny.cu`: the Q4_K / Q5_K / Q6_K matmul of 1-8 rows on int8 mma (verify
/// steps, small batches), on `kqmma.cu`'s chain and activations.
#[cfg(feature = "cuda")]
pub const KQSKINNY: Module = module!("kqskinny");

/// `cuda/moe.cu`: MoE routing (softmax + top-k), slots sorted by expert, weighted combine.
#[cfg(feature = "cuda")]
pub const MOE: Module = module!("moe");

/// `cuda/sampling.cu`: the top candidates and softmax mass of logits rows (sampling).
#[cfg(feature = "cuda")]
pub const SAMPLING: Module = module!("sampling");

/// `cuda/tmma_wg.cu`: `tmma.cu`'s bf16 GEMM chain on Hopper's wgmma and TMA (sm_90a; an
/// empty module in builds for other capabilities).
#[cfg(feature = "cuda")]
pub const TMMA_WG: Module = module!("tmma_wg");

/// `cuda/gdn_chunked.cu`: the GDN step after the conv for prefill chunks, in the chunked
/// WY form (gates and norms included).
#[cfg(feature = "cuda")]
pub const GDN_CHUNKED: Module = module!("gdn_chunked");

/// `cuda/norm.cu`: RMSNorm of rows with the residual add fused in, and SiLU(gate) x up
/// over row views.
#[cfg(feature = "cuda")]
pub const NORM: Module = module!("norm");

/// `cuda/tmma.cu`: bf16 matmuls on the tensor cores (activations split into two bf16
/// halves), row-invariant for every call size.
#[cfg(feature = "cuda")]
pub const TMMA: Module = module!("tmma");

/// `embedded` (this build's module), or with `TANDEM_PTX_DIR` set (a kernel lab's variants,
/// compiled elsewhere with the same nvcc flags as `build.rs`) the PTX of
/// `$TANDEM_PTX_DIR/<stem>.ptx` where it exists (no SASS: the driver compiles it), read once
/// and kept for the process. The conformance tests (`tandem check-device`) then check the
/// variant like the built kernel.
#[cfg(feature = "cuda")]
pub fn ptx(embedded: Module) -> Module {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static DIR: OnceLock<Option<std::ffi::OsString>> = OnceLock::new();
    static LOADED: OnceLock<Mutex<HashMap<&'static str, Module>>> = OnceLock::new();
    // Called on every launch: without the variable, no lookup and no lock.
    let Some(dir) = DIR.get_or_init(|| std::env::var_os("TANDEM_PTX_DIR")) else { return embedded };
    let stem = embedded.stem;
    let mut loaded = LOADED.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&m) = loaded.get(stem) {
        return m;
    }
    let path = std::path::Path::new(&dir).join(format!("{stem}.ptx"));
    let module = match std::fs::read_to_string(&path) {
        Ok(t) => {
            eprintln!("tandem-kernels: {stem} from {}", path.display());
            Module { stem, ptx: Box::leak(t.into_boxed_str()), cubin: &[] }
        }
        Err(_) => embedded,
    };
    loaded.insert(stem, module);
    module
}

#[cfg(test)]
mod tests {
    use super::cubin_runs_on;

    #[test]
    fn sass_runs_on_its_major_version_at_or_past_its_minor() {
        assert!(cubin_runs_on(90, 9, 0));
        assert!(!cubin_runs_on(90, 10, 0));
        assert!(!cubin_runs_on(90, 8, 9));
        assert!(cubin_runs_on(86, 8, 9));
        assert!(!cubin_runs_on(89, 8, 6));
    }
}
