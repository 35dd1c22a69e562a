//! `tandem run`: one prompt, streamed to stdout, then timings on stderr.

use std::io::Write;

use anyhow::{anyhow, bail};
use clap::Args;
use tandem_engine::{EngineConfig, EngineHandle, GenerateRequest, GenerationEvent, MemoryBudget, StopParams};

use crate::args::{ModelArgs, SamplingArgs};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Keep generating after end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print the generated token ids after the text.
    #[arg(long)]
    pub print_ids: bool,
    /// Memory for the paged KV cache: bytes (2GiB, 512MiB) or a fraction (0.25, 25%) of RAM, or
    /// on a GPU of the device memory free after loading the weights. It never takes more
    /// than two full contexts (the conversation's and one of cached prefixes).
    #[arg(long, default_value = "20%")]
    pub kv_memory: MemoryBudget,
    /// The prompt text.
    pub prompt: String,
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let engine =
        a.model.start_engine(EngineConfig { max_running: 1, kv_memory: a.kv_memory, ..EngineConfig::default() })?;
    let text = if a.chat {
        let msgs = vec![serde_json::json!({"role": "user", "content": a.prompt})];
        render_chat(&engine, &msgs)?
    } else {
        a.prompt.clone()
    };
    let tok = engine.tokenizer();
    let prompt_ids = tok.encode(&text, tok.add_bos_by_default() && !a.chat)?;
    let req = GenerateRequest {
        prompt_ids,
        sampling: a.sampling.params(),
        stop: StopParams {
            max_tokens: a.sampling.max_tokens,
            stop_strings: a.sampling.stop.clone(),
            ignore_eos: a.ignore_eos,
            ..Default::default()
        },
        ..Default::default()
    };
    let (ids, usage, timings) = stream_to_stdout(&engine, req)?;
    if a.print_ids {
        println!("\n{ids:?}");
    }
    eprintln!(
        "\n\nprompt tokens: {} | generated: {} | TTFT: {:.1} ms | prefill: {:.1} tok/s | decode: {:.1} tok/s",
        usage.prompt_tokens,
        usage.completion_tokens,
        timings.ttft_s * 1e3,
        timings.prefill_tok_per_s(usage.prompt_tokens),
        timings.decode_tok_per_s(usage.completion_tokens)
    );
    let sp = usage.speculative;
    if sp.drafted_tokens > 0 {
        eprintln!(
            "speculative: {} drafted, {} accepted ({:.0}%), {:.2} tokens per step",
            sp.drafted_tokens,
            sp.accepted_tokens,
            sp.acceptance_rate() * 100.0,
            sp.mean_accepted_length()
        );
    }
    Ok(())
}

/// Renders messages with the engine's chat template (generation prompt added).
pub fn render_chat(engine: &EngineHandle, msgs: &[serde_json::Value]) -> anyhow::Result<String> {
    let tpl = engine.chat_template().ok_or_else(|| anyhow!("the model has no chat template"))?;
    let opts = tandem_model::chat_template::RenderOptions { add_generation_prompt: true, ..Default::default() };
    Ok(tpl.render(msgs, &opts)?.text)
}

/// Submits and prints text as it arrives; returns the ids, usage and timings.
pub fn stream_to_stdout(
    engine: &EngineHandle,
    req: GenerateRequest,
) -> anyhow::Result<(Vec<u32>, tandem_engine::Usage, tandem_engine::Timings)> {
    let mut rx = engine.submit(req)?;
    let mut out = std::io::stdout();
    let mut ids = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Token { id, text, .. } => {
                ids.push(id);
                write!(out, "{text}")?;
                out.flush()?;
            }
            GenerationEvent::Finished { text, usage, timings, .. } => {
                write!(out, "{text}")?;
                out.flush()?;
                return Ok((ids, usage, timings));
            }
            GenerationEvent::Error(e) => bail!("generation failed: {e}"),
        }
    }
    bail!("the engine stopped before the request finished")
}
