//! `tandem chat`: an interactive conversation that keeps its history.

use std::io::{BufRead, Write};

use clap::Args;
use tandem_engine::{EngineConfig, GenerateRequest, MemoryBudget, StopParams};

use crate::args::{ModelArgs, SamplingArgs};
use crate::cmd_run::{render_chat, stream_to_stdout};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Memory for the paged KV cache: bytes (2GiB, 512MiB) or a fraction (0.25, 25%) of RAM, or
    /// on a GPU of the device memory free after loading the weights. It never takes more
    /// than two full contexts (the conversation's and one of cached prefixes).
    #[arg(long, default_value = "20%")]
    pub kv_memory: MemoryBudget,
    /// System prompt placed before the conversation.
    #[arg(long)]
    pub system: Option<String>,
}

pub fn run(a: ChatArgs) -> anyhow::Result<()> {
    let engine =
        a.model.start_engine(EngineConfig { max_running: 1, kv_memory: a.kv_memory, ..EngineConfig::default() })?;
    let mut history = Vec::new();
    if let Some(s) = &a.system {
        history.push(serde_json::json!({"role": "system", "content": s}));
    }
    eprintln!("chatting with {} — /reset clears the history, /exit or Ctrl-D quits", engine.info().id);
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        std::io::stderr().flush()?;
        let Some(line) = lines.next() else { break };
        let line = line?;
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history.retain(|m| m["role"] == "system");
                eprintln!("(history cleared)");
                continue;
            }
            _ => {}
        }
        history.push(serde_json::json!({"role": "user", "content": line}));
        let text = render_chat(&engine, &history)?;
        let prompt_ids = engine.tokenizer().encode(&text, false)?;
        let room = engine.info().context_length.saturating_sub(prompt_ids.len() + 1);
        if room == 0 {
            eprintln!("the conversation no longer fits in the context; /reset to start over");
            history.pop();
            continue;
        }
        let req = GenerateRequest {
            prompt_ids,
            sampling: a.sampling.params(),
            stop: StopParams {
                max_tokens: a.sampling.max_tokens.min(room),
                stop_strings: a.sampling.stop.clone(),
                ..Default::default()
            },
            ..Default::default()
        };
        let (ids, usage, timings) = stream_to_stdout(&engine, req)?;
        println!();
        let reply = engine.tokenizer().decode(&ids, true);
        history.push(serde_json::json!({"role": "assistant", "content": reply}));
        eprintln!(
            "[{} prompt tokens, {} generated, TTFT {:.0} ms, {:.1} tok/s]",
            usage.prompt_tokens,
            usage.completion_tokens,
            timings.ttft_s * 1e3,
            timings.decode_tok_per_s(usage.completion_tokens)
        );
    }
    Ok(())
}
