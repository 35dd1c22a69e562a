//! `tandem bench mixed`: a long prompt arriving while other requests decode (issue 16, target
//! 4's second half: chunked prefill beside decodes without stalling them). `-b` requests decode
//! until their inter-token gaps settle; then a `-p`-token prompt arrives and is prefilled in
//! chunks of `--chunk` tokens, each step carrying every decode as well (the scheduler plans
//! decodes first). Per chunk size: the decodes' inter-token gap before the prompt (median) and
//! while it is prefilled (median, 99th percentile, largest), the tokens they got in that time,
//! and the prompt's time to first token, on one engine per chunk size (one model build each);
//! and how many steps failed as a batch and ran one sequence at a time (should be 0).

use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use tandem_engine::{EngineConfig, EngineHandle, GenerateRequest, GenerationEvent, StopParams};
use tandem_model::arch::qwen_hybrid::random;
use tandem_model::loader::{LoadedModel, ModelSummary};
use tandem_model::tokenizer::Tokenizer;

use crate::args::{ModelArgs, RandomModelArgs};

#[derive(Args, Debug, Clone)]
pub struct MixedBenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub random: RandomModelArgs,
    /// Requests decoding when the long prompt arrives.
    #[arg(short = 'b', long, default_value_t = 8)]
    pub decoders: usize,
    /// Tokens of each decoding request's own prompt.
    #[arg(long, default_value_t = 64)]
    pub decode_prompt: usize,
    /// Tokens of the long prompt that arrives.
    #[arg(short = 'p', long, default_value_t = 4096)]
    pub prompt_tokens: usize,
    /// Prefill chunk sizes to compare (comma-separated): one engine each.
    #[arg(long, value_delimiter = ',', default_value = "512,1024,2048")]
    pub chunk: Vec<usize>,
    /// Decode steps timed before the prompt arrives (after as many for warm-up).
    #[arg(long, default_value_t = 32)]
    pub steady: usize,
    /// Step row alignments to compare (comma-separated; `EngineConfig::step_align`: a step of
    /// more rows carries a whole number of them, its last chunk giving the rest to the next
    /// step; 1 = never; 0 = the device's choice, 128 on CUDA and 1 elsewhere). Unset: the
    /// engine's default (`TANDEM_STEP_ALIGN`, else the device's choice).
    #[arg(long, value_delimiter = ',')]
    pub step_align: Vec<usize>,
}

/// What a request's watcher thread reports.
enum Msg {
    /// Request `i` got a token at this time.
    Token(usize, Instant),
    /// A request ended (an error says why it failed).
    End(Option<String>),
}

/// The model for one engine: a random preset or `-m`, built anew for every chunk size (an
/// engine owns its model).
fn start(a: &MixedBenchArgs, cfg: EngineConfig) -> anyhow::Result<EngineHandle> {
    let r = &a.random;
    match random_engine(&a.model, r.random_hybrid.as_deref(), r.random_llama.as_deref(), &r.random_dtype, cfg.clone())?
    {
        Some(e) => Ok(e),
        None => a.model.start_engine(cfg),
    }
}

/// An engine on a random-weight preset (a hybrid's, else a Llama-family one's) with a
/// placeholder tokenizer of its vocabulary, under the same flags a file's engine takes
/// (`ModelArgs::engine_settings`: `--kv-cache-dtype`, `--ctx-size`, `-t`, speculation); `None`
/// when no preset is named (the benches that take `--random-hybrid` / `--random-llama` beside
/// `-m`).
pub(crate) fn random_engine(
    flags: &ModelArgs,
    hybrid: Option<&str>,
    llama: Option<&str>,
    dtype: &str,
    mut cfg: EngineConfig,
) -> anyhow::Result<Option<EngineHandle>> {
    if hybrid.is_none() && llama.is_none() {
        return Ok(None);
    }
    flags.engine_settings(&mut cfg);
    let device = tandem_model::device::default_device()?;
    let dt = random::parse_weight_type(dtype)?;
    let (model, vocab): (Box<dyn tandem_model::arch::CausalLm>, usize) = match (hybrid, llama) {
        (Some(p), _) => {
            let hc = random::preset(p)?;
            (Box::new(random::random_model(&hc, dt, &device).context("building the random model")?), hc.vocab_size)
        }
        (None, Some(p)) => {
            let lc = tandem_model::arch::random_llama::preset(p)?;
            let m = tandem_model::arch::random_llama::random_model(&lc, dt, &device)
                .context("building the random model")?;
            (Box::new(m), lc.vocab_size)
        }
        (None, None) => return Ok(None),
    };
    let loaded = LoadedModel {
        model,
        tokenizer: Tokenizer::placeholder(vocab)?,
        chat_template: None,
        summary: ModelSummary::default(),
    };
    Ok(Some(EngineHandle::start(loaded, cfg)?))
}

/// Deterministic pseudo-random prompt ids away from the special tokens at the vocabulary's ends.
fn prompt(vocab: u32, n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 100 + (i.wrapping_mul(7919) + 13 + salt.wrapping_mul(104729)) % (vocab - 200)).collect()
}

/// Forwards request `i`'s events from a thread: each token's arrival time, then its end.
fn watch(i: usize, mut rx: tokio::sync::mpsc::Receiver<GenerationEvent>, out: std_mpsc::Sender<Msg>) {
    std::thread::spawn(move || loop {
        let msg = match rx.blocking_recv() {
            Some(GenerationEvent::Token { .. }) => Msg::Token(i, Instant::now()),
            Some(GenerationEvent::Finished { .. }) => Msg::End(None),
            Some(GenerationEvent::Error(e)) => Msg::End(Some(format!("generation failed: {e}"))),
            None => Msg::End(Some("the engine stopped".into())),
        };
        let end = matches!(msg, Msg::End(..));
        if out.send(msg).is_err() || end {
            break;
        }
    });
}

/// The gaps between consecutive arrivals whose later token came in `[from, to)`, in seconds,
/// sorted.
fn gaps(all: &[Vec<Instant>], from: Instant, to: Instant) -> Vec<f64> {
    let mut g: Vec<f64> = all
        .iter()
        .flat_map(|a| a.windows(2).filter(|w| w[1] >= from && w[1] < to).map(|w| (w[1] - w[0]).as_secs_f64()))
        .collect();
    g.sort_by(f64::total_cmp);
    g
}

/// The `q`-quantile of sorted values (0 when there are none).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// One engine's run: the decodes' gaps before the prompt and while it is prefilled (seconds,
/// sorted), the prompt's TTFT in seconds, batch fallbacks, the step alignment it ran and the
/// prompt tokens its steps gave to the next one for whole tiles.
struct ChunkRun {
    steady: Vec<f64>,
    during: Vec<f64>,
    ttft: f64,
    fallbacks: usize,
    align: usize,
    trimmed: usize,
}

/// One chunk size (and step alignment, `None`: the engine's default).
fn run_chunk(a: &MixedBenchArgs, chunk: usize, align: Option<usize>) -> anyhow::Result<ChunkRun> {
    let b = a.decoders.max(1);
    let mut cfg = EngineConfig {
        max_running: b + 1,
        prefill_chunk: chunk,
        // One step holds a whole chunk beside every decode: the budget never pushes a decode out.
        max_batch_tokens: chunk + b,
        prefix_cache: false,
        ..Default::default()
    };
    if let Some(align) = align {
        cfg.step_align = align;
    }
    let t0 = Instant::now();
    let engine = start(a, cfg)?;
    let align = engine.step_align();
    eprintln!("chunk {chunk}: model ready in {:.1} s", t0.elapsed().as_secs_f64());
    let vocab = engine.info().vocab_size as u32;
    if vocab <= 200 {
        bail!("the model's vocabulary ({vocab}) is too small for this bench's prompts");
    }
    // Warm-up, the steady window, one token a step while the prompt is prefilled, and a margin.
    let steps = a.prompt_tokens.div_ceil(chunk);
    let decode_tokens = 2 * a.steady + steps + 16;
    let (tx, rx) = std_mpsc::channel();
    for i in 0..b {
        let req = GenerateRequest {
            prompt_ids: prompt(vocab, a.decode_prompt, i as u32 + 1),
            stop: StopParams { max_tokens: decode_tokens, ignore_eos: true, ..Default::default() },
            ..Default::default()
        };
        watch(i, engine.submit(req)?, tx.clone());
    }
    let mut seen: Vec<Vec<Instant>> = vec![Vec::new(); b];
    let (mut warm, mut arrived, mut first): (Option<Instant>, Option<Instant>, Option<Instant>) = (None, None, None);
    let mut ended = 0;
    while ended < b + usize::from(arrived.is_some()) {
        let msg = rx.recv_timeout(Duration::from_secs(600)).context("no token for 10 minutes")?;
        match msg {
            Msg::Token(i, t) if i < b => seen[i].push(t),
            Msg::Token(_, t) => first = first.or(Some(t)),
            Msg::End(Some(e)) => bail!(e),
            Msg::End(None) => ended += 1,
        }
        let least = seen.iter().map(Vec::len).min().unwrap_or(0);
        if warm.is_none() && least >= a.steady {
            warm = Some(Instant::now());
        }
        if arrived.is_none() && least >= 2 * a.steady {
            // Every decoder has had its warm-up and steady steps: the long prompt arrives.
            let long = GenerateRequest {
                prompt_ids: prompt(vocab, a.prompt_tokens, 0),
                stop: StopParams { max_tokens: 1, ignore_eos: true, ..Default::default() },
                ..Default::default()
            };
            arrived = Some(Instant::now());
            watch(b, engine.submit(long)?, tx.clone());
        }
    }
    let (Some(warm), Some(arrived), Some(first)) = (warm, arrived, first) else {
        bail!("the decoders ended before the long prompt was answered: raise --steady or lower -p")
    };
    if seen.iter().any(|s| s.last().is_some_and(|&t| t < first)) {
        bail!("a decoder ended before the long prompt was answered: raise --steady");
    }
    let steady = gaps(&seen, warm, arrived);
    // The step that ends the prefill also gives every decoder its token: count it in.
    let slack = Duration::from_secs_f64(quantile(&steady, 0.5) / 2.0);
    let during = gaps(&seen, arrived, first + slack);
    // A step that failed as a batch and ran its sequences one at a time (right answers, the
    // batch's speed lost): a backend bug this bench exists to show.
    let st = engine.stats();
    let fallbacks = st.batch_fallbacks.load(std::sync::atomic::Ordering::Relaxed);
    let trimmed = st.step_rows_trimmed.load(std::sync::atomic::Ordering::Relaxed);
    Ok(ChunkRun { steady, during, ttft: (first - arrived).as_secs_f64(), fallbacks, align, trimmed })
}

pub fn run(a: MixedBenchArgs) -> anyhow::Result<()> {
    crate::args::set_threads(a.model.threads);
    if a.chunk.iter().any(|&c| c == 0) {
        bail!("--chunk: give chunk sizes of at least one token");
    }
    println!(
        "{} requests decoding, a {}-token prompt arriving; KV cache {}",
        a.decoders.max(1),
        a.prompt_tokens,
        a.model.kv_cache_dtype
    );
    println!(
        "| chunk | step align (rows moved on) | decode gap before, ms (median) | while prefilling: median / p99 / max ms | decode tokens then | prompt TTFT s | prefill tok/s | batch fallbacks |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let aligns: Vec<Option<usize>> =
        if a.step_align.is_empty() { vec![None] } else { a.step_align.iter().map(|&x| Some(x)).collect() };
    for &c in &a.chunk {
        for &al in &aligns {
            let r = run_chunk(&a, c, al)?;
            println!(
                "| {c} | {} ({}) | {:.1} | {:.1} / {:.1} / {:.1} | {} | {:.2} | {:.0} | {} |",
                r.align,
                r.trimmed,
                quantile(&r.steady, 0.5) * 1e3,
                quantile(&r.during, 0.5) * 1e3,
                quantile(&r.during, 0.99) * 1e3,
                r.during.last().copied().unwrap_or(0.0) * 1e3,
                r.during.len(),
                r.ttft,
                a.prompt_tokens as f64 / r.ttft.max(1e-9),
                r.fallbacks,
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_take_the_tokens_that_arrive_in_the_window() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Two decoders: one steady at 10 ms, one with a 40 ms stall at 50 -> 90.
        let all =
            vec![vec![at(0), at(10), at(20), at(30), at(40), at(50)], vec![at(5), at(15), at(50), at(90), at(100)]];
        let g = gaps(&all, at(20), at(60));
        let ms: Vec<u64> = g.iter().map(|s| (s * 1e3).round() as u64).collect();
        // Later tokens at 20, 30, 40, 50 (first) and 50 (second: 15 -> 50), sorted.
        assert_eq!(ms, vec![10, 10, 10, 10, 35]);
        assert_eq!((quantile(&g, 0.5) * 1e3).round() as u64, 10);
        assert_eq!((quantile(&g, 1.0) * 1e3).round() as u64, 35);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn prompts_stay_inside_the_vocabulary_and_differ_by_salt() {
        let a = prompt(1000, 64, 1);
        let b = prompt(1000, 64, 2);
        assert!(a.iter().chain(&b).all(|&t| (100..900).contains(&t)));
        assert_ne!(a, b);
    }
}
