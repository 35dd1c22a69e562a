//! `tandem serve`: the OpenAI- and Anthropic-compatible HTTP server.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use tandem_engine::{DiskCacheConfig, EngineConfig, MemoryBudget};
use tandem_server::config::ToolParserChoice;
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
    /// Name clients use in the `model` field (default: the first --served-model-name, else the
    /// model argument).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Names the model answers to (several allowed, as vLLM's flag): the first is its id in
    /// responses unless --model-id is given; the catalogue alias and the file name are accepted
    /// too. `GET /v1/models` lists them all.
    #[arg(long = "served-model-name", num_args = 1.., value_name = "NAME")]
    pub served_model_name: Vec<String>,
    /// Accept any `model` name in requests (for clients that send their own); without it an
    /// unknown name gets 404.
    #[arg(long)]
    pub any_model: bool,
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
    /// Memory for the paged KV cache: bytes (8GiB, 512MiB) or a fraction (0.25, 25%) of RAM, or
    /// on a GPU of the device memory free after loading the weights.
    #[arg(long, default_value = "20%")]
    pub kv_memory: MemoryBudget,
    /// Token positions per KV block.
    #[arg(long, default_value_t = 16)]
    pub kv_block_size: usize,
    /// Do not reuse the KV and recurrent state of earlier requests with the same prefix.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Checkpoint recurrent state every this many prompt tokens (hybrid models; 0 = only at
    /// prompt ends and message boundaries).
    #[arg(long, default_value_t = 1024)]
    pub checkpoint_interval: usize,
    /// Memory for recurrent-state checkpoints: bytes or a fraction of RAM.
    #[arg(long, default_value = "1GiB")]
    pub checkpoint_memory: MemoryBudget,
    /// Directory of the prefix cache's disk tier, which keeps KV blocks and recurrent
    /// checkpoints across restarts (one namespace per model and cache format below it).
    /// Default: $TANDEM_HOME/prefix-cache.
    #[arg(long, env = "TANDEM_CACHE_DIR")]
    pub cache_dir: Option<std::path::PathBuf>,
    /// Bytes the disk tier may hold for this model (least recently used entries go first);
    /// 0 turns it off.
    #[arg(long, default_value = "4GiB")]
    pub disk_cache_size: MemoryBudget,
    /// Default max_tokens when a request does not set one.
    #[arg(long, default_value_t = 1024)]
    pub default_max_tokens: usize,
    /// Largest accepted request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Largest prompt in tokens (0 = the context length).
    #[arg(long, default_value_t = 0)]
    pub max_prompt_tokens: usize,
    /// Generation requests in flight before new ones get 429 (0 = only the engine queue limits).
    #[arg(long, default_value_t = 256)]
    pub max_concurrent_requests: usize,
    /// Seconds one request may take before it is ended (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub request_timeout: u64,
    /// Open connections at most; keep it below the file-descriptor limit (`ulimit -n`). At the
    /// limit a new client displaces the oldest connection that has not sent a request, or gets
    /// 503 at once when all are serving.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a connection may take to send a request's headers (idle connections close).
    #[arg(long, default_value_t = 10)]
    pub header_read_timeout: u64,
    /// Seconds a request body may take to arrive (then 408).
    #[arg(long, default_value_t = 30)]
    pub body_read_timeout: u64,
    /// Require this key (`Authorization: Bearer KEY` or `x-api-key: KEY`) on every /v1 route.
    #[arg(long, env = "TANDEM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Tool-call format to parse: auto (from the chat template), hermes, qwen-xml, llama3, none.
    #[arg(long, default_value = "auto", value_parser = parse_tool_parser)]
    pub tool_parser: ToolParserChoice,
    /// Do not split `<think>…</think>` into reasoning_content / thinking blocks.
    #[arg(long)]
    pub no_reasoning_parser: bool,
    /// Thinking budget for requests that set none (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub max_thinking_tokens: usize,
    /// Loop detector inside reasoning: n-gram length in tokens (0 = off).
    #[arg(long, default_value_t = 32)]
    pub thinking_loop_ngram: usize,
    /// Loop detector: occurrences of one n-gram that count as a loop.
    #[arg(long, default_value_t = 8)]
    pub thinking_loop_repeats: usize,
    /// Test only: serve scripted answers from this JSON file instead of a model.
    #[arg(long, hide = true)]
    pub test_script: Option<PathBuf>,
}

fn parse_tool_parser(s: &str) -> Result<ToolParserChoice, String> {
    ToolParserChoice::from_name(s)
        .ok_or_else(|| format!("unknown tool parser `{s}` (auto, hermes, qwen-xml, llama3, none)"))
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let id = primary_name(&a);
    let mut server = ServerConfig {
        host: a.host.clone(),
        port: a.port,
        max_body_bytes: a.max_body_bytes,
        default_max_tokens: a.default_max_tokens,
        max_prompt_tokens: a.max_prompt_tokens,
        max_concurrent_requests: a.max_concurrent_requests,
        request_timeout: (a.request_timeout > 0).then(|| Duration::from_secs(a.request_timeout)),
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        tool_parser: a.tool_parser,
        parse_reasoning: !a.no_reasoning_parser,
        default_max_thinking_tokens: a.max_thinking_tokens,
        thinking_loop_ngram: a.thinking_loop_ngram,
        thinking_loop_repeats: a.thinking_loop_repeats,
        max_connections: a.max_connections.max(1),
        header_read_timeout: Duration::from_secs(a.header_read_timeout.max(1)),
        body_read_timeout: Duration::from_secs(a.body_read_timeout.max(1)),
        model_aliases: Vec::new(),
        any_model: a.any_model,
    };
    server.model_aliases = aliases(&a, &id, None);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    if let Some(script) = &a.test_script {
        let backend = tandem_server::scripted::ScriptedBackend::from_file(script)?;
        return rt.block_on(tandem_server::serve(backend, server));
    }
    let cfg = EngineConfig {
        model_id: id.clone(),
        max_queue: a.max_queue,
        max_running: a.max_running,
        prefill_chunk: a.prefill_chunk,
        max_batch_tokens: a.max_batch_tokens,
        context_length: 0,
        kv_memory: a.kv_memory,
        block_size: a.kv_block_size,
        kv_dtype: a.model.kv_cache_dtype,
        prefix_cache: !a.no_prefix_cache,
        checkpoint_interval: a.checkpoint_interval,
        checkpoint_memory: a.checkpoint_memory,
        speculative: a.model.spec.config(),
        // TANDEM_DEVICE_SAMPLING=0 reads every sampled row whole (for comparisons).
        device_sampling: std::env::var("TANDEM_DEVICE_SAMPLING").map_or(true, |v| v != "0"),
        disk_cache: disk_cache(a.cache_dir.clone(), a.disk_cache_size)?,
        // Steps of prefill chunks beside decodes fill whole GEMM row tiles: the device's
        // choice (128 on CUDA, none on the CPU) unless TANDEM_STEP_ALIGN sets it.
        step_align: EngineConfig::default_step_align(),
    };
    let engine = a.model.start_engine(cfg)?;
    {
        // The grammar compiler reads the whole vocabulary (about a second for 150k tokens):
        // build it in the background so that the first structured request does not wait.
        let e = engine.clone();
        std::thread::spawn(move || match e.grammars() {
            Ok(_) => tracing::debug!("constrained decoding ready"),
            Err(msg) => tracing::warn!("constrained decoding is not available for this model: {msg}"),
        });
    }
    let file = a.model.resolve().ok().map(|p| crate::args::model_id(&p.to_string_lossy()));
    server.model_aliases = aliases(&a, &id, file.as_deref());
    if !server.model_aliases.is_empty() {
        tracing::info!("serving `{id}`, also as {}", server.model_aliases.join(", "));
    }
    let st = engine.stats();
    let blocks = st.kv_blocks_total.load(std::sync::atomic::Ordering::Relaxed);
    tracing::info!(
        "the KV cache holds {} tokens ({blocks} blocks of {}, {}, at most --max-running + 1 full contexts of {}); --kv-memory changes it",
        blocks * a.kv_block_size,
        a.kv_block_size,
        a.model.kv_cache_dtype,
        engine.info().context_length,
    );
    rt.block_on(tandem_server::serve(engine, server))
}

/// The model's id: --model-id, else the first --served-model-name, else the model argument
/// (a catalogue alias, or the file or directory name).
fn primary_name(a: &ServeArgs) -> String {
    a.model_id
        .clone()
        .or_else(|| a.served_model_name.first().cloned())
        .unwrap_or_else(|| crate::args::model_id(&a.model.model))
}

/// The other names the model answers to: the served names, the model argument (alias or file
/// name) and the resolved file's name, without `id` and without repeats.
fn aliases(a: &ServeArgs, id: &str, file: Option<&str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let arg = crate::args::model_id(&a.model.model);
    for n in a.served_model_name.iter().map(String::as_str).chain([arg.as_str()]).chain(file) {
        if !n.is_empty() && n != id && !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    }
    out
}

/// The disk tier's settings from `--cache-dir` / `--disk-cache-size` (`None`: off).
pub fn disk_cache(dir: Option<std::path::PathBuf>, size: MemoryBudget) -> anyhow::Result<Option<DiskCacheConfig>> {
    let MemoryBudget::Bytes(budget) = size else {
        anyhow::bail!("--disk-cache-size takes bytes (e.g. 4GiB or 0), not a fraction");
    };
    if budget == 0 {
        return Ok(None);
    }
    let dir = dir.unwrap_or_else(|| tandem_model::catalogue::tandem_home().join("prefix-cache"));
    Ok(Some(DiskCacheConfig { dir, budget }))
}

#[cfg(test)]
mod name_tests {
    use clap::Parser;

    use super::{aliases, primary_name, ServeArgs};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn args(a: &[&str]) -> ServeArgs {
        Cli::parse_from(std::iter::once("tandem").chain(a.iter().copied())).serve
    }

    #[test]
    fn served_names_id_and_aliases() {
        // The model argument alone: it is the id, nothing else.
        let a = args(&["-m", "qwen2.5-coder-0.5b"]);
        assert_eq!(primary_name(&a), "qwen2.5-coder-0.5b");
        assert!(aliases(&a, &primary_name(&a), None).is_empty());
        // Served names (several after one flag, as vLLM takes them): the first is the id; the
        // alias and the resolved file's name are accepted too, each once.
        let a = args(&["-m", "qwen2.5-coder-0.5b", "--served-model-name", "gpt-4o-mini", "coder", "--any-model"]);
        let id = primary_name(&a);
        assert_eq!(id, "gpt-4o-mini");
        assert!(a.any_model);
        assert_eq!(
            aliases(&a, &id, Some("qwen2.5-coder-0.5b-instruct-q4_k_m")),
            ["coder", "qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m"]
        );
        // --model-id wins as the id; a served name equal to it is not repeated.
        let a = args(&["-m", "m", "--model-id", "x", "--served-model-name", "x", "--served-model-name", "y"]);
        assert_eq!(primary_name(&a), "x");
        assert_eq!(aliases(&a, "x", Some("m")), ["y", "m"]);
        assert!(!a.any_model);
    }
}
