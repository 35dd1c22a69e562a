//! Kernels the architectures run on. Each has a plain reference beside it where a fused or
//! tiled version exists.

pub mod act;
pub mod attention;
pub mod attention_blocks;
pub mod attn_glue;
pub mod cpu_threads;
#[cfg(feature = "cuda")]
pub mod cuda_graph;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_module;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_util;
pub mod gdn;
pub(crate) mod gemm;
pub(crate) mod host;
pub mod moe;
pub mod norm;
pub mod paged_attention;
pub mod quant;
pub mod rope;
pub mod sampling;

pub use attention::causal_attention;
pub use rope::Rope;
