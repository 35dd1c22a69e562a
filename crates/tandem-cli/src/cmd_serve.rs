//! `tandem serve`: the OpenAI-compatible HTTP server.

use clap::Args;
use tandem_engine::EngineConfig;
use tandem_server::ServerConfig;

use crate::args::ModelArgs;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to bind (loopback by default; use 0.0.0.0 to expose it on the network).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Name clients use in the `model` field (default: the model argument).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Requests that may wait for admission before new ones get 429.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Sequences decoded together in one batch.
    #[arg(long, default_value_t = 16)]
    pub max_running: usize,
    /// Prompt tokens processed per sequence per step (chunked prefill).
    #[arg(long, default_value_t = 512)]
    pub prefill_chunk: usize,
    /// Token budget of one forward step.
    #[arg(long, default_value_t = 2048)]
    pub max_batch_tokens: usize,
    /// Default max_tokens when a request does not set one.
    #[arg(long, default_value_t = 1024)]
    pub default_max_tokens: usize,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let cfg = EngineConfig {
        model_id: a.model_id.clone().unwrap_or_else(|| crate::args::model_id(&a.model.model)),
        max_queue: a.max_queue,
        max_running: a.max_running,
        prefill_chunk: a.prefill_chunk,
        max_batch_tokens: a.max_batch_tokens,
        context_length: 0,
    };
    let engine = a.model.start_engine(cfg)?;
    let server = ServerConfig {
        host: a.host,
        port: a.port,
        max_body_bytes: a.max_body_bytes,
        default_max_tokens: a.default_max_tokens,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(tandem_server::serve(engine, server))
}
