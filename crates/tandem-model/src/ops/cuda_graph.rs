//! CUDA graphs: a decode step's few hundred launches recorded once and replayed with one
//! launch, so that the host no longer queues them one by one (on the 9B shape the host spent
//! 85-91% of a batch-1 step queueing). What a graph may hold: kernels, device copies and the
//! allocations candle makes inside the step (graph memory nodes, freed inside it too). What it
//! may not: anything that reads host memory at capture time and would be baked in. So every
//! value that changes from step to step (token ids, RoPE rows, block tables, state addresses)
//! lives in device buffers the graph's owner rewrites before each launch ([`write_host`]), and
//! candle's small uploads of shapes and strides come from its capture cache (filled by a run of
//! the same step outside the capture, [`capture`]'s `warm`).
//!
//! [`write_host`]: super::cuda_util::write_host

use candle_core::cuda_backend::cudarc::driver::{sys, CudaGraph};
use candle_core::cuda_backend::CudaDevice;

use super::cuda_util::err;
use crate::error::{ModelError, Result};

/// Whether decode steps may run as CUDA graphs (`TANDEM_CUDA_GRAPHS=0` turns them off).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_CUDA_GRAPHS").map_or(true, |v| v != "0"))
}

/// A captured and instantiated graph on a device's stream.
pub struct Graph(CudaGraph);

// SAFETY: a CUDA graph may be used from any thread as long as no two threads use it at once;
// its owners keep it behind a mutex (the model's graph cache), so uses are serialised.
unsafe impl Send for Graph {}

impl Graph {
    /// Queues one replay on the stream it was captured on.
    pub fn launch(&self) -> Result<()> {
        self.0.launch().map_err(err("CUDA graph launch"))
    }
}

/// Runs `body` once as usual (so that its kernel modules are loaded and candle's upload cache
/// holds its shapes and strides: `body` must be idempotent), then records it on `dev`'s stream
/// into a graph. Nothing `body` queues runs during the capture; the graph replays it. A capture
/// that fails leaves the stream out of capture mode and returns the error.
pub fn capture(dev: &CudaDevice, body: impl Fn() -> Result<()>) -> Result<Graph> {
    let _cache = dev.enable_cuda_graph_htod_cache();
    body()?;
    // No other thread queues work on the stream while it records.
    let _share = crate::device::stream_share();
    let stream = dev.cuda_stream();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(err("CUDA graph capture"))?;
    let recorded = body();
    // Always end the capture, also when the body failed: the stream must leave capture mode.
    let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    recorded?;
    let graph = ended.map_err(err("CUDA graph instantiate"))?;
    let graph = graph.ok_or_else(|| ModelError::Input("CUDA graph capture recorded nothing".into()))?;
    graph.upload().map_err(err("CUDA graph upload"))?;
    Ok(Graph(graph))
}
