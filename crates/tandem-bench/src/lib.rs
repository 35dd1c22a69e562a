//! tandem-bench: benchmarks of what a user of a long agent session feels.
//!
//! * [`workload`]: seeded multi-turn agent workloads (shared prefix, per-session context, tool
//!   results), sized in tokens with the model's tokenizer ([`tokens`]).
//! * [`client`] + [`sse`]: a streaming OpenAI chat client that timestamps every chunk;
//!   [`timing`] turns the timestamps into TTFT, TPOT and inter-token latencies; [`stats`]
//!   summarises them (mean, p50/p90/p99).
//! * [`agent`]: runs a workload against any OpenAI-compatible endpoint, sessions concurrently,
//!   replaying the whole growing history every turn.
//! * [`sweep`]: the matrix of weight precision × KV precision × prefill chunk, each cell in its
//!   own process with a memory estimate first, resumable through its JSON results file.
//! * [`report`]: JSON (raw), Markdown tables and PNG/SVG charts.

pub mod agent;
pub mod client;
pub mod machine;
pub mod perplexity;
pub mod report;
pub mod sse;
pub mod stats;
pub mod sweep;
pub mod timing;
pub mod tokens;
pub mod workload;
