//! `tandem-engine`: sequences and their lifecycle, the scheduler loop, sampling and stop rules.
//!
//! Requests enter through [`EngineHandle::submit`] as token ids plus [`SamplingParams`] and
//! [`StopParams`]; the engine thread batches every running sequence into one forward pass per
//! step (chunked prefill under a token budget, then decodes) and streams
//! [`GenerationEvent`]s back over a channel. Dropping the receiving end cancels the request
//! and frees its state. KV lives in a paged pool rationed by `tandem-cache` (block tables,
//! state slots, a prefix tree with recurrent-state checkpoints); when blocks run out the
//! youngest sequence is preempted and later recomputed. Nothing here knows about HTTP or
//! file formats.

pub(crate) mod cache;
pub mod constraint;
pub mod engine;
pub mod request;
pub mod sampler;
mod scheduler;
mod sequence;
pub mod spec;
pub mod stop;
pub mod threads;

pub use cache::disk::{namespaces as disk_cache_namespaces, DiskCacheConfig, DiskStats, NamespaceInfo};
pub use constraint::{Grammar, Grammars};
pub use engine::{EngineConfig, EngineError, EngineHandle, EngineStats, MemoryBudget, ModelInfo};
pub use request::*;
pub use sampler::Sampler;
pub use spec::{SpecConfig, SpecMethod, SpecRequest, SpecUsage};
