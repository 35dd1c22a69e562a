//! `tandem-model`: everything about a model that is independent of serving.
//!
//! It owns model configuration ([`config`]), weight loading from GGUF and Hugging Face
//! safetensors ([`loader`]), the catalogue of fetchable models and path resolution
//! ([`catalogue`], [`resolve`]), the tokenizer and chat template ([`tokenizer`],
//! [`chat_template`]), the architectures ([`arch`]) and the kernels they run on ([`ops`]).
//!
//! Data enters as a [`batch::ForwardBatch`] (a ragged batch of token ids with positions,
//! one entry per sequence, each with its own KV cache) and leaves as logits for the
//! positions the caller asked for. Nothing here knows about requests, HTTP or scheduling.

pub mod arch;
pub mod batch;
pub mod catalogue;
pub mod chat_template;
pub mod config;
pub mod conformance;
pub mod device;
pub mod error;
pub mod fuzzing;
pub mod kv;
pub mod loader;
pub mod ops;
pub mod resolve;
pub mod tokenizer;

pub use error::{ModelError, Result};
