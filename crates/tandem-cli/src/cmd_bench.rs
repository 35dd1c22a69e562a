//! `tandem bench`: prefill (ppN) and decode (tgN) speed of the model itself, like llama-bench,
//! on a loaded checkpoint or on a random-weight hybrid model built in memory
//! (`--random-hybrid 0.8b`); `tandem bench kernels` times the GDN kernels alone.

use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};
use tandem_model::arch::qwen_hybrid::random;
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::SequenceCache;

use crate::args::ModelArgs;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Benchmark a random-weight hybrid model of this shape instead of loading one
    /// (`0.8b`: Qwen3.5-0.8B-like, 24 layers, hidden 1024, vocab 248320; `tiny`).
    #[arg(long)]
    pub random_hybrid: Option<String>,
    /// Weight type of the random model's matrices: f32, f16, q8_0, q4_0, q4_k, q6_k.
    #[arg(long, default_value = "q8_0")]
    pub random_dtype: String,
    /// Prompt length of the prefill test (ppN).
    #[arg(short = 'p', long, default_value_t = 512)]
    pub prompt_tokens: usize,
    /// Tokens generated in the decode test (tgN).
    #[arg(short = 'g', long, default_value_t = 128)]
    pub gen_tokens: usize,
    /// Repetitions of each test; the mean and spread are reported.
    #[arg(short = 'r', long, default_value_t = 3)]
    pub reps: usize,
    /// Prefill chunk size (the whole prompt in one forward by default).
    #[arg(long, default_value_t = 0)]
    pub chunk: usize,
}

#[derive(Subcommand, Debug)]
pub enum BenchWhat {
    /// Time the Gated DeltaNet kernels (decode step, chunked prefill) against bytes and FLOPs.
    Kernels(crate::cmd_bench_kernels::KernelArgs),
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    if let Some(BenchWhat::Kernels(k)) = a.what {
        return crate::cmd_bench_kernels::run(k);
    }
    crate::args::set_threads(a.model.threads);
    let device = tandem_model::device::default_device()?;
    let t0 = Instant::now();
    let (label, model): (String, Box<dyn CausalLm>) = match &a.random_hybrid {
        Some(p) => {
            let cfg = random::preset(p)?;
            let dt = random::parse_weight_type(&a.random_dtype)?;
            let params = random::parameter_count(&cfg) as f64 / 1e6;
            let m = random::random_model(&cfg, dt, &device).context("building the random model")?;
            (format!("random hybrid `{p}` ({params:.1} M parameters, {dt:?} matrices)"), Box::new(m))
        }
        None => {
            let path = a.model.resolve()?;
            let loaded = tandem_model::loader::load(&path, &device)
                .with_context(|| format!("cannot load {}", path.display()))?;
            (path.display().to_string(), loaded.model)
        }
    };
    let load_s = t0.elapsed().as_secs_f64();
    let vocab = model.vocab_size() as u32;
    // Deterministic pseudo-random prompt (ids away from the special tokens at the ends).
    let prompt: Vec<u32> = (0..a.prompt_tokens as u32).map(|i| 100 + (i * 7919 + 13) % (vocab - 200)).collect();
    let chunk = if a.chunk == 0 { a.prompt_tokens.max(1) } else { a.chunk };
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    for _ in 0..a.reps.max(1) {
        let mut cache = SequenceCache::new(&model.cache_spec(), &device);
        let t = Instant::now();
        for piece in prompt.chunks(chunk) {
            let mut chunks = [SeqChunk { tokens: piece, cache: &mut cache, logits: LogitsWanted::Last }];
            model.forward(&mut chunks)?;
        }
        pp.push(a.prompt_tokens as f64 / t.elapsed().as_secs_f64());
        // Decode from an empty context, as llama-bench's tg test does.
        let mut cache = SequenceCache::new(&model.cache_spec(), &device);
        let mut tok = [1u32];
        let t = Instant::now();
        for _ in 0..a.gen_tokens {
            let mut chunks = [SeqChunk { tokens: &tok, cache: &mut cache, logits: LogitsWanted::Last }];
            let out = model.forward(&mut chunks)?;
            let logits = out.into_iter().next().flatten().context("no logits")?.flatten_all()?.to_vec1::<f32>()?;
            tok[0] = tandem_engine::sampler::argmax(&logits);
        }
        tg.push(a.gen_tokens as f64 / t.elapsed().as_secs_f64());
    }
    let stat = |v: &[f64]| {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        (m, sd)
    };
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into());
    println!("model: {label} | load {load_s:.2} s | threads {threads}");
    println!("| test   | tok/s            |");
    println!("| ------ | ---------------- |");
    let (m, sd) = stat(&pp);
    println!("| pp{:<4} | {:>8.2} ± {:<6.2} |", a.prompt_tokens, m, sd);
    let (m, sd) = stat(&tg);
    println!("| tg{:<4} | {:>8.2} ± {:<6.2} |", a.gen_tokens, m, sd);
    Ok(())
}
