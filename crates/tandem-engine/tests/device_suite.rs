//! The engine's invariant suites in one test binary, for devices this machine's CI has not:
//! `make test-cuda` builds it with `--features cuda`, and on a GPU machine it runs with
//! `TANDEM_DEVICE=cuda` so every engine the suites start (`EngineHandle::load`, the loaders in
//! `speculative.rs`) runs on the GPU: cache transparency with hybrid checkpoints, chunk
//! equivalence, batch invariance, lossless speculation (ngram, draft, MTP; prefix hits,
//! batches of 8), no leaks after cancellations, KV formats, sliding-window rings, the disk tier, constrained decoding, tensor-parallel ranks. The same files run one by
//! one on the CPU in `cargo test`.

#[path = "constrained.rs"]
mod constrained;
#[path = "disk_cache.rs"]
mod disk_cache;
#[path = "engine.rs"]
mod engine;
#[path = "failure_isolation.rs"]
mod failure_isolation;
#[path = "kv_dtype.rs"]
mod kv_dtype;
#[path = "memory.rs"]
mod memory;
#[path = "prefix_cache.rs"]
mod prefix_cache;
#[path = "sliding_window.rs"]
mod sliding_window;
#[path = "speculative.rs"]
mod speculative;
#[path = "tensor_parallel.rs"]
mod tensor_parallel;
