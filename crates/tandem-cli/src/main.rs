//! `tandem`: the command-line front end (run, chat, serve, inspect, pull, bench).

mod allocator;
mod args;
mod cmd_bench;
mod cmd_bench_agent;
mod cmd_bench_bound;
mod cmd_bench_grammar;
mod cmd_bench_kernels;
mod cmd_bench_memory;
mod cmd_bench_mixed;
mod cmd_bench_report;
mod cmd_bench_restart;
mod cmd_bench_spec;
mod cmd_bench_sweep;
mod cmd_cache;
mod cmd_chat;
mod cmd_check_device;
mod cmd_convert;
mod cmd_inspect;
mod cmd_pull;
mod cmd_run;
mod cmd_serve;
mod host_profile;
mod progress;

use clap::{Parser, Subcommand};

/// tandem: a local LLM inference engine and OpenAI-compatible server.
///
/// MODEL arguments accept a GGUF file, a Hugging Face model directory, a repo id found in the
/// local Hugging Face cache (org/name), or a catalogue alias (see `tandem pull --list`); a
/// missing alias is fetched automatically into $TANDEM_HOME (default ~/.cache/tandem).
#[derive(Parser)]
#[command(name = "tandem", version, about, long_about = None)]
struct Cli {
    /// Where the model runs: auto (a usable GPU, else the CPU with a warning), cpu, cuda[:N]
    /// or metal[:N].
    #[arg(long, global = true, env = "TANDEM_DEVICE", default_value = "auto")]
    device: tandem_model::device::DeviceChoice,
    /// How CUDA's bf16 tensor-core matmuls carry f32 activations: `split` (two bf16 halves,
    /// about 16 significant bits, two products each; the default) or `bf16` (rounded to bf16
    /// as other engines' bf16 GEMMs do: one product each, for faster prefill and batches).
    /// Either way a row gets the same bits at every batch size.
    #[arg(long, global = true, env = "TANDEM_BF16_ACTIVATIONS", default_value = "split", value_name = "MODE")]
    bf16_activations: tandem_model::ops::quant::bf16_act::Bf16Activations,
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a completion for one prompt, streaming it to stdout, then print timings.
    Run(cmd_run::RunArgs),
    /// Interactive multi-turn chat using the model's chat template.
    Chat(cmd_chat::ChatArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(cmd_serve::ServeArgs),
    /// Show a model's architecture, size, tensor types, context length and chat template.
    Inspect(cmd_inspect::InspectArgs),
    /// Fetch a catalogue model into $TANDEM_HOME/models, verifying its SHA-256.
    Pull(cmd_pull::PullArgs),
    /// Measure prefill and decode speed (like llama-bench's pp/tg); `bench sweep` and
    /// `bench agent` run the benchmark suites.
    Bench(cmd_bench::BenchArgs),
    /// Check every op and the fixture models on the selected device against the CPU
    /// references; exits non-zero on any failure.
    CheckDevice(cmd_check_device::CheckDeviceArgs),
    /// The prefix cache's disk tier: `stats`, `ls`, `clear`.
    Cache(cmd_cache::CacheArgs),
    /// Write a hybrid model's Hugging Face checkpoint as GGUF, keeping its MTP head.
    Convert(cmd_convert::ConvertArgs),
}

fn main() {
    allocator::tune();
    // A chat-template render worker (tandem_model::chat_template::sandbox): nothing else here.
    if std::env::args().nth(1).as_deref() == Some(tandem_model::chat_template::sandbox::WORKER_ARG) {
        tandem_model::chat_template::sandbox::worker_main();
    }
    // Templates from model files render in those workers, under memory and time limits
    // (TANDEM_TEMPLATE_SANDBOX=0 renders them in this process).
    if !std::env::var("TANDEM_TEMPLATE_SANDBOX").is_ok_and(|v| v == "0") {
        if let Ok(exe) = std::env::current_exe() {
            tandem_model::chat_template::sandbox::enable(exe);
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TANDEM_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    tandem_model::device::set_device_choice(cli.device);
    tandem_model::ops::quant::bf16_act::set_activations(cli.bf16_activations);
    let result = match cli.cmd {
        Command::Run(a) => cmd_run::run(a),
        Command::Chat(a) => cmd_chat::run(a),
        Command::Serve(a) => cmd_serve::run(a),
        Command::Inspect(a) => cmd_inspect::run(a),
        Command::Pull(a) => cmd_pull::run(a),
        Command::Bench(a) => cmd_bench::run(a),
        Command::CheckDevice(a) => cmd_check_device::run(a),
        Command::Cache(a) => cmd_cache::run(a),
        Command::Convert(a) => cmd_convert::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
