//! `tandem bench spec`: decode speed with speculation off and on, on one engine (the
//! per-request override switches the method), for a random-weight hybrid model with an MTP head
//! (`--random-hybrid 0.8b-mtp`: the mechanism's cost, acceptance there is meaningless) or any
//! model given with `-m` (token-id prompts; the text workloads are in `scripts/spec_bench.py`).

use std::time::Instant;

use anyhow::bail;
use clap::Args;
use tandem_engine::{
    EngineConfig, EngineHandle, GenerateRequest, GenerationEvent, SpecMethod, SpecRequest, StopParams,
};

use crate::args::ModelArgs;

#[derive(Args, Debug, Clone)]
pub struct SpecBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Use a random-weight hybrid model of this preset instead of `-m` (e.g. `0.8b-mtp`).
    #[arg(long)]
    pub random_hybrid: Option<String>,
    /// Weight type of the random model's matrices (f32, f16, q8_0, q4_0, q4_k, q6_k).
    #[arg(long, default_value = "q8_0")]
    pub random_dtype: String,
    /// Prompt length in tokens.
    #[arg(short = 'p', long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens generated per run.
    #[arg(short = 'g', long, default_value_t = 64)]
    pub gen_tokens: usize,
    /// Runs per variant (the median is reported).
    #[arg(short = 'r', long, default_value_t = 3)]
    pub reps: usize,
}

/// Decode tok/s and speculation numbers of one request.
struct RunResult {
    decode: f64,
    drafted: usize,
    accepted: usize,
}

fn run_once(e: &EngineHandle, prompt: &[u32], n: usize, method: SpecMethod) -> anyhow::Result<RunResult> {
    let req = GenerateRequest {
        prompt_ids: prompt.to_vec(),
        stop: StopParams { max_tokens: n, ignore_eos: true, ..Default::default() },
        speculative: Some(SpecRequest { method: Some(method), num_draft_tokens: None }),
        ..Default::default()
    };
    let mut rx = e.submit(req)?;
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Finished { usage, timings, .. } => {
                return Ok(RunResult {
                    decode: timings.decode_tok_per_s(usage.completion_tokens),
                    drafted: usage.speculative.drafted_tokens,
                    accepted: usage.speculative.accepted_tokens,
                })
            }
            GenerationEvent::Error(e) => bail!("generation failed: {e}"),
            GenerationEvent::Token { .. } => {}
        }
    }
    bail!("the engine stopped")
}

pub fn run(a: SpecBenchArgs) -> anyhow::Result<()> {
    crate::args::set_threads(a.model.threads);
    let method = a.model.spec.speculative;
    if method == SpecMethod::Off {
        bail!("choose a method to compare with plain decoding: --speculative ngram|draft|mtp");
    }
    let mut cfg = EngineConfig::default();
    let t0 = Instant::now();
    if let Some(p) = &a.random_hybrid {
        cfg.model_id = format!("random-{p}");
    }
    let engine = match crate::cmd_bench_mixed::random_engine(
        &a.model,
        a.random_hybrid.as_deref(),
        None,
        &a.random_dtype,
        cfg.clone(),
    )? {
        Some(e) => e,
        None => a.model.start_engine(cfg)?,
    };
    eprintln!("model ready in {:.1} s", t0.elapsed().as_secs_f64());
    let vocab = engine.info().vocab_size as u32;
    let prompt: Vec<u32> = (0..a.prompt_tokens as u32).map(|i| 100 + (i * 7919 + 13) % (vocab - 200)).collect();
    println!("| method | k | decode tok/s (median of {}) | speedup | drafted | accepted |", a.reps);
    println!("|---|---|---|---|---|---|");
    let mut base = 0.0;
    for m in [SpecMethod::Off, method] {
        let mut runs = Vec::new();
        for _ in 0..a.reps.max(1) {
            runs.push(run_once(&engine, &prompt, a.gen_tokens, m)?);
        }
        runs.sort_by(|x, y| x.decode.total_cmp(&y.decode));
        let r = &runs[runs.len() / 2];
        if m == SpecMethod::Off {
            base = r.decode;
        }
        let k = if m == SpecMethod::Off { 0 } else { a.model.spec.num_draft_tokens };
        println!(
            "| {} | {k} | {:.2} | {:.2}x | {} | {} |",
            m.as_str(),
            r.decode,
            if base > 0.0 { r.decode / base } else { 0.0 },
            r.drafted,
            r.accepted
        );
    }
    Ok(())
}
