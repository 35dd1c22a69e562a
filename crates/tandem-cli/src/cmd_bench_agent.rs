//! `tandem bench agent`: the multi-turn agent workload against one or more OpenAI-compatible
//! endpoints (see `tandem_bench::agent`), one report with every system on the same charts.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use tandem_bench::agent::{run_system, SystemConfig};
use tandem_bench::client::ClientConfig;
use tandem_bench::report::{self, AgentReport};
use tandem_bench::tokens::{ApproxCounter, ModelTokenizer, TokenCounter};
use tandem_bench::workload::{self, WorkloadConfig};

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// OpenAI-compatible server (`http://127.0.0.1:8080`, `.../v1`); repeat to compare systems.
    #[arg(long = "endpoint", required = true)]
    pub endpoints: Vec<String>,
    /// Name of each endpoint in reports, in the same order (default: the endpoint).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// The `model` field sent (default: the first model `GET /v1/models` lists).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Count workload tokens with this model's tokenizer (GGUF file, HF directory or alias);
    /// without it, token counts are approximate (4 characters per token).
    #[arg(long)]
    pub tokenizer: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 1)]
    pub sessions: usize,
    /// Tokens of the shared system prompt + tool schemas.
    #[arg(long, default_value_t = 8192)]
    pub shared_prefix: usize,
    /// Tokens of each session's own task context.
    #[arg(long, default_value_t = 512)]
    pub context: usize,
    /// Turns per session: N or MIN-MAX.
    #[arg(long, default_value = "10-20")]
    pub turns: String,
    /// Tokens of each tool result: N or MIN-MAX.
    #[arg(long, default_value = "100-600")]
    pub tool_tokens: String,
    /// Tokens of the user message after each tool result.
    #[arg(long, default_value_t = 24)]
    pub user_tokens: usize,
    /// Tokens generated per turn.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Pause between a turn's answer and the next request (ms).
    #[arg(long, default_value_t = 0)]
    pub think_ms: u64,
    /// Carry on each conversation with a reply of up to --max-tokens tokens from the workload
    /// instead of the server's answer, so that every server gets the same prompts (random
    /// weights answer differently on every server).
    #[arg(long)]
    pub fixed_replies: bool,
    /// The classic single-turn number instead: one short prompt per session, no shared prefix.
    #[arg(long)]
    pub single_turn: bool,
    /// Prompt tokens in --single-turn mode.
    #[arg(long, default_value_t = 128)]
    pub single_turn_prompt: usize,
    /// Bearer token for the endpoints.
    #[arg(long, env = "TANDEM_BENCH_API_KEY")]
    pub api_key: Option<String>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Extra JSON fields merged into every request body (e.g. '{"cache_prompt": true}').
    #[arg(long)]
    pub extra_body: Option<String>,
    /// Output directory: agent.json, agent.md, charts.
    #[arg(short = 'o', long, default_value = "bench-results/agent")]
    pub out: PathBuf,
}

fn parse_range(s: &str) -> anyhow::Result<(usize, usize)> {
    let p = |x: &str| x.trim().parse::<usize>().with_context(|| format!("`{s}` is not N or MIN-MAX"));
    match s.split_once('-') {
        Some((a, b)) => Ok((p(a)?, p(b)?)),
        None => {
            let n = p(s)?;
            Ok((n, n))
        }
    }
}

pub fn run(a: AgentArgs) -> anyhow::Result<()> {
    let (turns_min, turns_max) = parse_range(&a.turns)?;
    let (tool_min, tool_max) = parse_range(&a.tool_tokens)?;
    let cfg = WorkloadConfig {
        seed: a.seed,
        sessions: a.sessions,
        shared_prefix_tokens: a.shared_prefix,
        session_context_tokens: a.context,
        turns_min,
        turns_max,
        tool_result_tokens_min: tool_min,
        tool_result_tokens_max: tool_max,
        user_tokens: a.user_tokens,
        max_tokens: a.max_tokens,
        think_time_ms: a.think_ms,
        single_turn: a.single_turn,
        single_turn_prompt_tokens: a.single_turn_prompt,
        fixed_replies: a.fixed_replies,
    };
    let counter: Arc<dyn TokenCounter> = match &a.tokenizer {
        Some(m) => {
            let reporter = crate::progress::pull_reporter();
            let src =
                tandem_model::resolve::resolve(m, true, &reporter).with_context(|| format!("cannot find `{m}`"))?;
            Arc::new(ModelTokenizer::load(src.path())?)
        }
        None => {
            eprintln!("no --tokenizer: workload token counts are approximate (4 characters per token)");
            Arc::new(ApproxCounter)
        }
    };
    let wl = Arc::new(workload::generate(&cfg, &*counter)?);
    let extra_body = match &a.extra_body {
        Some(s) => serde_json::from_str(s).context("--extra-body is not JSON")?,
        None => serde_json::Value::Null,
    };
    if !a.labels.is_empty() && a.labels.len() != a.endpoints.len() {
        bail!("give one --label per --endpoint ({} labels, {} endpoints)", a.labels.len(), a.endpoints.len());
    }
    let machine = tandem_bench::machine::MachineInfo::current();
    let created_unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut systems = Vec::new();
    for (i, ep) in a.endpoints.iter().enumerate() {
        let sys = SystemConfig {
            label: a.labels.get(i).cloned().unwrap_or_else(|| ep.clone()),
            client: ClientConfig {
                base_url: ep.clone(),
                api_key: a.api_key.clone(),
                timeout: Duration::from_secs(a.timeout),
                extra_body: extra_body.clone(),
            },
            model: a.model_name.clone(),
        };
        let pb = indicatif::ProgressBar::new(wl.requests() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} requests ({elapsed})")
        {
            pb.set_style(style.progress_chars("=> "));
        }
        pb.set_message(sys.label.clone());
        let res = rt.block_on(run_system(wl.clone(), &sys, counter.clone(), pb.clone()))?;
        pb.finish_and_clear();
        systems.push(res);
    }
    let r = AgentReport {
        created_unix,
        machine,
        workload: Some(cfg),
        counter: wl.counter.clone(),
        exact_counts: wl.exact_counts,
        shared_prefix_tokens: wl.shared_prefix.tokens,
        systems,
    };
    let files = report::write_agent_report(&a.out, &r)?;
    println!("{}", report::agent_markdown(&r));
    eprintln!("wrote {}", files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", "));
    Ok(())
}
