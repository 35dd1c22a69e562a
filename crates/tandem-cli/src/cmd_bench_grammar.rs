//! `tandem bench grammar`: the cost of constrained decoding. The same prompt decoded freely and
//! under a JSON schema (a list of at least 40 records, so that the grammar binds at every token
//! and every request runs to `-g`), alone and as a batch of concurrent requests, on one engine; decode
//! tok/s per request and in total, and the slowdown. Issue 19's goal: at most 10% slower.

use std::time::Instant;

use anyhow::bail;
use clap::Args;
use serde_json::json;
use tandem_engine::{
    EngineConfig, EngineHandle, GenerateRequest, GenerationEvent, Grammar, SamplingParams, StopParams,
};

use crate::args::ModelArgs;

#[derive(Args, Debug, Clone)]
pub struct GrammarBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most tokens generated per request.
    #[arg(short = 'g', long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Batch sizes (concurrent requests), comma-separated.
    #[arg(short = 'b', long, default_value = "1,8", value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// Runs per cell (the median is reported).
    #[arg(short = 'r', long, default_value_t = 3)]
    pub reps: usize,
}

const PROMPT: &str = "A JSON list of 40 people, each with an id, a name, an age and a city:\n";

fn schema() -> serde_json::Value {
    json!({"type": "array", "minItems": 40, "items": {"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "age": {"type": "integer"},
        "city": {"type": "string"}}, "required": ["id", "name", "age", "city"], "additionalProperties": false}})
}

/// (mean per-request decode tok/s, total generated tokens / wall seconds, mean tokens).
fn run_batch(e: &EngineHandle, prompt: &[u32], n: usize, b: usize, grammar: bool) -> anyhow::Result<(f64, f64, f64)> {
    let t0 = Instant::now();
    let mut rxs = Vec::new();
    for i in 0..b {
        let req = GenerateRequest {
            prompt_ids: prompt.to_vec(),
            sampling: SamplingParams { temperature: 0.7, seed: Some(i as u64), ..Default::default() },
            // Every request runs to max_tokens (the schema's 40 records do not fit), so both
            // variants decode the same number of tokens in the same batch.
            stop: StopParams { max_tokens: n, ignore_eos: true, ..Default::default() },
            grammar: grammar.then(|| Grammar::JsonSchema(schema())),
            ..Default::default()
        };
        rxs.push(e.submit(req)?);
    }
    let (mut rate, mut toks) = (0.0, 0usize);
    for mut rx in rxs {
        loop {
            match rx.blocking_recv() {
                Some(GenerationEvent::Finished { usage, timings, .. }) => {
                    rate += timings.decode_tok_per_s(usage.completion_tokens);
                    toks += usage.completion_tokens;
                    break;
                }
                Some(GenerationEvent::Error(e)) => bail!("generation failed: {e}"),
                Some(GenerationEvent::Token { .. }) => {}
                None => bail!("the engine stopped"),
            }
        }
    }
    Ok((rate / b as f64, toks as f64 / t0.elapsed().as_secs_f64(), toks as f64 / b as f64))
}

pub fn run(a: GrammarBenchArgs) -> anyhow::Result<()> {
    crate::args::set_threads(a.model.threads);
    let max_b = a.batch.iter().copied().max().unwrap_or(1);
    let cfg = EngineConfig { max_running: max_b.max(1), prefix_cache: false, ..Default::default() };
    let engine = a.model.start_engine(cfg)?;
    let prompt = engine.tokenizer().encode(PROMPT, true)?;
    let t = Instant::now();
    engine.grammars().map_err(anyhow::Error::msg)?;
    eprintln!("grammar compiler built in {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    println!("| batch | output | decode tok/s per request | total tok/s | tokens per request | slowdown |");
    println!("|---|---|---|---|---|---|");
    for &b in &a.batch {
        let mut free = 0.0;
        for grammar in [false, true] {
            let mut runs = Vec::new();
            for _ in 0..a.reps.max(1) {
                runs.push(run_batch(&engine, &prompt, a.gen_tokens, b.max(1), grammar)?);
            }
            runs.sort_by(|x, y| x.0.total_cmp(&y.0));
            let (rate, total, toks) = runs[runs.len() / 2];
            if !grammar {
                free = rate;
            }
            let slow = if grammar && rate > 0.0 { format!("{:.1}%", (free / rate - 1.0) * 100.0) } else { "-".into() };
            let what = if grammar { "JSON schema" } else { "free" };
            println!("| {b} | {what} | {rate:.2} | {total:.2} | {toks:.0} | {slow} |");
        }
    }
    Ok(())
}
