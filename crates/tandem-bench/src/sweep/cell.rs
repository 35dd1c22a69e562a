//! Running one sweep cell in the current process: load, perplexity, then TTFT / prefill /
//! decode at each prompt length through the engine, and the process's peak memory.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use tandem_engine::{EngineConfig, EngineHandle, GenerateRequest, GenerationEvent, MemoryBudget, StopParams};
use tandem_model::kv::PagedKvStore;

use super::grid::CellSpec;
use super::results::{CellMeasurement, PromptRun};
use crate::machine::{current_rss_bytes, peak_rss_bytes};
use crate::perplexity::{perplexity, SHIPPED_TEXT};

/// A deterministic prompt of `n` ids away from the special tokens at both ends of the vocabulary.
pub fn synthetic_prompt(n: usize, vocab: usize, salt: u32) -> Vec<u32> {
    let lo = (vocab / 8).min(100) as u32;
    let span = (vocab as u32).saturating_sub(2 * lo).max(1);
    (0..n as u32).map(|i| lo + (i.wrapping_mul(7919).wrapping_add(13 + salt * 104_729)) % span).collect()
}

/// What the process holds before any model is loaded (the estimate's baseline).
pub fn run_probe() -> anyhow::Result<CellMeasurement> {
    let _device = tandem_model::device::default_device()?;
    let rss = current_rss_bytes().unwrap_or(0);
    Ok(CellMeasurement {
        baseline_rss_bytes: rss,
        peak_rss_bytes: peak_rss_bytes().unwrap_or(rss),
        ..Default::default()
    })
}

/// Runs the cell here. Call it in a fresh process: the peak memory is the process's.
pub fn run_cell(spec: &CellSpec) -> anyhow::Result<CellMeasurement> {
    if let Err(reason) = spec.supported() {
        bail!("cell {} cannot run: {reason}", spec.id());
    }
    let device = tandem_model::device::default_device()?;
    let baseline_rss_bytes = current_rss_bytes().unwrap_or(0);
    let t0 = Instant::now();
    let path = Path::new(&spec.model);
    let opts = tandem_model::loader::LoadOptions { quantize: spec.quantize(), ..Default::default() };
    let loaded =
        tandem_model::loader::load_with(path, &device, &opts).with_context(|| format!("cannot load {}", spec.model))?;
    let load_s = t0.elapsed().as_secs_f64();
    let context = loaded.model.context_length();
    let vocab = loaded.model.vocab_size();

    let (perplexity, ppl_tokens) = if spec.ppl_tokens > 1 {
        let tok = &loaded.tokenizer;
        let mut ids = tok.encode(SHIPPED_TEXT, tok.add_bos_by_default())?;
        ids.truncate(spec.ppl_tokens.min(context));
        (perplexity(&*loaded.model, &ids, spec.ppl_window, spec.kv_dtype())?, ids.len())
    } else {
        (None, 0)
    };

    let bs = spec.kv_block_size.max(1);
    let block_bytes = PagedKvStore::bytes_per_block(&loaded.model.cache_spec(), bs, spec.kv_dtype()) as u64;
    let fit_len = spec.max_len().min(context);
    let blocks = fit_len.div_ceil(bs) as u64 + 2;
    let cfg = EngineConfig {
        model_id: "bench".into(),
        max_running: 1,
        prefill_chunk: spec.prefill_chunk,
        max_batch_tokens: spec.prefill_chunk,
        kv_memory: MemoryBudget::Bytes((blocks * block_bytes).max(1)),
        block_size: bs,
        kv_dtype: spec.kv_dtype(),
        prefix_cache: false,
        ..Default::default()
    };
    let engine = EngineHandle::start(loaded, cfg)?;
    // Warm-up: first-touch page faults and thread start-up are not part of the numbers.
    generate(&engine, synthetic_prompt(16.min(context / 2).max(1), vocab, 0), 2)?;
    let mut runs = Vec::new();
    for (i, &n) in spec.prompt_lens.iter().enumerate() {
        if n == 0 || n + spec.gen_tokens > context {
            runs.push(PromptRun {
                prompt_tokens: n,
                gen_tokens: spec.gen_tokens,
                skipped: Some(format!("{n} + {} tokens do not fit the context of {context}", spec.gen_tokens)),
                ..Default::default()
            });
            continue;
        }
        let (usage, t) = generate(&engine, synthetic_prompt(n, vocab, i as u32 + 1), spec.gen_tokens)?;
        runs.push(PromptRun {
            prompt_tokens: usage.prompt_tokens,
            gen_tokens: usage.completion_tokens,
            ttft_s: t.ttft_s,
            prefill_tok_s: t.prefill_tok_per_s(usage.prompt_tokens),
            decode_tok_s: t.decode_tok_per_s(usage.completion_tokens),
            skipped: None,
        });
    }
    drop(engine);
    Ok(CellMeasurement {
        baseline_rss_bytes,
        peak_rss_bytes: peak_rss_bytes().unwrap_or(0),
        load_s,
        perplexity,
        ppl_tokens,
        runs,
    })
}

fn generate(
    engine: &EngineHandle,
    prompt_ids: Vec<u32>,
    max_tokens: usize,
) -> anyhow::Result<(tandem_engine::Usage, tandem_engine::Timings)> {
    let req = GenerateRequest {
        prompt_ids,
        stop: StopParams { max_tokens: max_tokens.max(1), ignore_eos: true, ..Default::default() },
        ..Default::default()
    };
    let mut rx = engine.submit(req)?;
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            GenerationEvent::Token { .. } => {}
            GenerationEvent::Finished { usage, timings, .. } => return Ok((usage, timings)),
            GenerationEvent::Error(e) => bail!("generation failed: {e}"),
        }
    }
    bail!("the engine stopped before the request finished")
}
