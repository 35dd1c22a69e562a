//! `tandem bench`: prefill (ppN) and decode (tgN) speed of the model itself, like llama-bench,
//! on a loaded checkpoint or on a random-weight hybrid model built in memory
//! (`--random-hybrid 0.8b`); `tandem bench kernels` times the GDN kernels alone;
//! `tandem bench sweep` and `tandem bench agent` are the suites of `tandem-bench`. Like the
//! engine, the tests keep their KV in a paged store (blocks of 16); `-d 0,3200,6000` repeats
//! them after that many context tokens, like llama-bench's `-d`.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use tandem_model::arch::qwen_hybrid::random;
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};
use tandem_model::kv::{PagedKvStore, SequenceCache};

use crate::args::ModelArgs;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: Option<BenchWhat>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub random: crate::args::RandomModelArgs,
    /// With `--random-hybrid`: write the random model as a llama.cpp-style GGUF to this file
    /// (the same weights the in-memory model has) and exit, so that `tandem bench -m FILE` and
    /// llama.cpp's `llama-bench -m FILE` measure the same model.
    #[arg(long, requires = "random_hybrid")]
    pub save_gguf: Option<std::path::PathBuf>,
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
    /// The device's memory bandwidth in TB/s (a device-to-device copy's bytes read and written
    /// a second), or `auto` to measure it here first (a GPU: a 1 GiB device copy; the CPU: the
    /// read bandwidth at the kernels' thread count, as `tandem bench memory`): with it each
    /// decode test also prints the bound a step's bytes set at that bandwidth (weights,
    /// recurrent states, the context's keys and values) and the measured rate as a share of it
    /// (`cmd_bench_bound`).
    #[arg(long)]
    pub bandwidth: Option<String>,
    /// Context depths, comma-separated: each test runs after that many tokens were prefilled
    /// (untimed, in chunks of `--chunk` or 512), like llama-bench's `-d`.
    #[arg(short = 'd', long, value_delimiter = ',', default_value = "0")]
    pub depth: Vec<usize>,
    /// Also time batched decode at these batch sizes (comma-separated; 1 = only the plain
    /// test): each step decodes one token for every sequence of the batch in one forward, and
    /// `tgN xB` reports the total tokens per second.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub batch: Vec<usize>,
    /// Also time speculative verify steps of these many positions (comma-separated; 0: off):
    /// each step is a forward of K tokens in verify mode (every position's logits, recurrent
    /// states kept per position) that keeps one, as a fully rejected draft of K - 1 tokens
    /// does. Prints the steps per second (`tvK`) and the step's cost in decode steps (`tvK / tg`).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub verify: Vec<usize>,
}

/// KV block size of the bench's paged store (the engine's default).
const BLOCK: usize = 16;

#[derive(Subcommand, Debug)]
pub enum BenchWhat {
    /// Time the Gated DeltaNet kernels (decode step, chunked prefill) against bytes and FLOPs.
    Kernels(crate::cmd_bench_kernels::KernelArgs),
    /// The CPU's read bandwidth with 1..N threads: the `--bandwidth` a CPU decode is bound by.
    Memory(crate::cmd_bench_memory::MemoryArgs),
    /// Matrix of weight precision x KV precision x prefill chunk: memory, load time, TTFT,
    /// prefill and decode speed, perplexity; resumable, over-budget cells skipped.
    Sweep(crate::cmd_bench_sweep::SweepArgs),
    /// Multi-turn agent sessions against OpenAI-compatible endpoints: TTFT, TPOT, ITL per turn.
    Agent(crate::cmd_bench_agent::AgentArgs),
    /// Decode speed with speculative decoding off and on (`--speculative`), e.g. the MTP
    /// mechanism on `--random-hybrid 0.8b-mtp`.
    Spec(crate::cmd_bench_spec::SpecBenchArgs),
    /// A long prompt arriving while other requests decode: their inter-token gaps while it is
    /// prefilled in chunks, against before, per chunk size.
    Mixed(crate::cmd_bench_mixed::MixedBenchArgs),
    /// Decode speed free and under a JSON schema (constrained decoding), alone and batched.
    Grammar(crate::cmd_bench_grammar::GrammarBenchArgs),
    /// TTFT of a long shared prefix after a restart, served from the prefix cache's disk tier.
    Restart(crate::cmd_bench_restart::RestartBenchArgs),
    /// Redraws reports from raw JSON; merges agent runs of several systems into one report.
    Report(crate::cmd_bench_report::ReportArgs),
    /// Runs one sweep cell in this process and prints its result as JSON (used by `sweep`).
    #[command(hide = true)]
    Cell(crate::cmd_bench_sweep::CellArgs),
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    match a.what {
        Some(BenchWhat::Kernels(k)) => return crate::cmd_bench_kernels::run(k),
        Some(BenchWhat::Memory(m)) => return crate::cmd_bench_memory::run(m),
        Some(BenchWhat::Sweep(s)) => return crate::cmd_bench_sweep::run(s),
        Some(BenchWhat::Agent(g)) => return crate::cmd_bench_agent::run(g),
        Some(BenchWhat::Cell(c)) => return crate::cmd_bench_sweep::run_cell(c),
        Some(BenchWhat::Report(r)) => return crate::cmd_bench_report::run(r),
        Some(BenchWhat::Spec(s)) => return crate::cmd_bench_spec::run(s),
        Some(BenchWhat::Grammar(g)) => return crate::cmd_bench_grammar::run(g),
        Some(BenchWhat::Mixed(m)) => return crate::cmd_bench_mixed::run(m),
        Some(BenchWhat::Restart(r)) => return crate::cmd_bench_restart::run(r),
        None => {}
    }
    crate::args::set_threads(a.model.threads);
    let auto = a.bandwidth.as_deref() == Some("auto");
    let given = match a.bandwidth.as_deref().filter(|_| !auto).map(str::parse::<f64>) {
        None => None,
        Some(Ok(bw)) if bw.is_finite() && bw > 0.0 => Some(bw),
        Some(_) => anyhow::bail!(
            "--bandwidth {}: give the device's copy bandwidth in TB/s, a positive number (e.g. 4.2), or `auto`",
            a.bandwidth.as_deref().unwrap_or_default()
        ),
    };
    if let (Some(out), Some(p)) = (&a.save_gguf, &a.random.random_hybrid) {
        return save_gguf(p, &a.random.random_dtype, out);
    }
    let device = tandem_model::device::default_device()?;
    let bandwidth = if auto { Some(measure_bandwidth(&device)?) } else { given };
    let t0 = Instant::now();
    use crate::cmd_bench_bound as bound;
    // The model, and the weight bytes a decode step reads (None where unknown: a checkpoint
    // other than GGUF).
    type Built = (String, Box<dyn CausalLm>, Option<u64>);
    let (label, model, weight_bytes): Built = match (&a.random.random_hybrid, &a.random.random_llama) {
        (None, Some(p)) => {
            let cfg = tandem_model::arch::random_llama::preset(p)?;
            let dt = random::parse_weight_type(&a.random.random_dtype)?;
            let n = tandem_model::arch::random_llama::parameter_count(&cfg);
            let embedding = (cfg.vocab_size * cfg.hidden_size) as u64;
            let ranks = a.model.tensor_parallel;
            let m: Box<dyn CausalLm> = if ranks > 1 {
                Box::new(
                    tandem_model::arch::random_llama::random_model_ranks(&cfg, dt, &device, ranks)
                        .context("building the random model's ranks")?,
                )
            } else {
                Box::new(
                    tandem_model::arch::random_llama::random_model(&cfg, dt, &device)
                        .context("building the random model")?,
                )
            };
            let params = n as f64 / 1e6;
            let w = bound::random_weights(n, embedding, cfg.tie_word_embeddings, dt);
            let on = if ranks > 1 { format!(", {ranks} tensor-parallel ranks") } else { String::new() };
            (format!("random Llama `{p}` ({params:.1} M parameters, {dt:?} matrices{on})"), m, Some(w))
        }
        (Some(p), _) => {
            let cfg = random::preset(p)?;
            let dt = random::parse_weight_type(&a.random.random_dtype)?;
            let n = random::parameter_count(&cfg);
            let embedding = (cfg.vocab_size * cfg.hidden_size) as u64;
            let ranks = a.model.tensor_parallel;
            let m: Box<dyn CausalLm> = if ranks > 1 {
                // The sharded path (`--tensor-parallel`), every rank on this device.
                let src = random::RandomSource::new(&cfg, dt, &device);
                Box::new(
                    tandem_model::arch::qwen_hybrid::tp::TpHybrid::load(&cfg, &src, ranks)
                        .context("building the random model's ranks")?,
                )
            } else {
                Box::new(random::random_model(&cfg, dt, &device).context("building the random model")?)
            };
            let params = n as f64 / 1e6;
            let w = bound::random_weights(n, embedding, cfg.tie_word_embeddings, dt);
            let on = if ranks > 1 { format!(", {ranks} tensor-parallel ranks") } else { String::new() };
            (format!("random hybrid `{p}` ({params:.1} M parameters, {dt:?} matrices{on})"), m, Some(w))
        }
        (None, None) => {
            let path = a.model.resolve()?;
            let loaded = tandem_model::loader::load_with(&path, &device, &a.model.load_options())
                .with_context(|| format!("cannot load {}", path.display()))?;
            let gguf = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
            let w = if gguf && a.bandwidth.is_some() { bound::gguf_weights(&path).ok() } else { None };
            (path.display().to_string(), loaded.model, w)
        }
    };
    let spec = model.cache_spec();
    let step_bytes = weight_bytes.map(|weights| bound::StepBytes { weights, state: bound::state_bytes(&spec) });
    let load_s = t0.elapsed().as_secs_f64();
    let vocab = model.vocab_size() as u32;
    // Deterministic pseudo-random prompt (ids away from the special tokens at the ends).
    let tokens = |n: usize, salt: u32| -> Vec<u32> {
        (0..n as u32).map(|i| 100 + (i * 7919 + 13 + salt) % (vocab - 200)).collect()
    };
    let prompt = tokens(a.prompt_tokens, 0);
    let chunk = if a.chunk == 0 { a.prompt_tokens.max(1) } else { a.chunk };
    let depth_chunk = if a.chunk == 0 { 512 } else { a.chunk };
    // A paged cache holding `context` (prefilled untimed), with room for `room` more positions.
    // `b` such caches share one store, as an engine's sequences do (batched attention needs it).
    let caches_at_depth = |b: usize, context: &[u32], room: usize| -> anyhow::Result<Vec<SequenceCache>> {
        let spec = model.cache_spec();
        let n_blocks = (context.len() + room).div_ceil(BLOCK).max(1);
        let pool = PagedKvStore::new(&spec, b * n_blocks, BLOCK, a.model.kv_cache_dtype, &device)?;
        let store = std::sync::Arc::new(pool);
        let mut caches = Vec::with_capacity(b);
        for i in 0..b {
            let mut cache = SequenceCache::new_paged(&spec, store.clone());
            let first = (i * n_blocks) as u32;
            cache.set_block_table(&(first..first + n_blocks as u32).collect::<Vec<_>>());
            for piece in context.chunks(depth_chunk) {
                model.forward(&mut [SeqChunk { tokens: piece, cache: &mut cache, logits: LogitsWanted::Last }])?;
            }
            caches.push(cache);
        }
        Ok(caches)
    };
    let cache_at_depth = |context: &[u32], room: usize| -> anyhow::Result<SequenceCache> {
        Ok(caches_at_depth(1, context, room)?.remove(0))
    };
    // Untimed decode steps before each timed decode test: on a GPU a decode shape's first
    // step captures its CUDA graph (once per batch size and 256-key segment bucket).
    const WARM_STEPS: usize = 2;
    // One untimed prefill chunk and decode step first, like llama-bench's warm-up run: the
    // first use of a GPU kernel module JIT-compiles it (seconds), which no repetition should pay.
    {
        let warm = tokens(chunk.min(a.prompt_tokens.max(1)), 2);
        let mut cache = cache_at_depth(&[], warm.len() + 1)?;
        model.forward(&mut [SeqChunk { tokens: &warm, cache: &mut cache, logits: LogitsWanted::Last }])?;
        model.forward(&mut [SeqChunk { tokens: &[1], cache: &mut cache, logits: LogitsWanted::Last }])?;
        // The verify and batched tests call matmuls of other row counts (other kernels).
        for &k in a.verify.iter().filter(|&&k| k > 0) {
            let mut cache = cache_at_depth(&[], k)?;
            let chunk = tokens(k, 3);
            model.forward(&mut [SeqChunk { tokens: &chunk, cache: &mut cache, logits: LogitsWanted::All }])?;
        }
        for &b in a.batch.iter().filter(|&&b| b > 1) {
            let mut caches = caches_at_depth(b, &[], 1)?;
            let mut chunks: Vec<SeqChunk<'_>> =
                caches.iter_mut().map(|cache| SeqChunk { tokens: &[1], cache, logits: LogitsWanted::Last }).collect();
            model.forward(&mut chunks)?;
        }
        device.synchronize()?;
    }
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into());
    // On a GPU the bf16 matmuls' activation mode changes the numbers: say which ran.
    let act = if device.is_cuda() {
        format!(" | bf16 activations {:?}", tandem_model::ops::quant::bf16_act::activations()).to_lowercase()
    } else {
        String::new()
    };
    println!("model: {label} | load {load_s:.2} s | threads {threads}{act}");
    if let (Some(bw), Some(sb)) = (bandwidth, step_bytes) {
        println!(
            "decode step reads {} of weights, {} of recurrent state (read and written) and {} of KV a position; \
             bound at {bw:.4} TB/s",
            bound::human(sb.weights),
            bound::human(sb.state),
            bound::human(bound::kv_bytes(&spec, a.model.kv_cache_dtype, 1))
        );
    } else if bandwidth.is_some() {
        println!("(--bandwidth: the weights a step reads are known for random presets and GGUF files only)");
    }
    println!("| test            | tok/s            |");
    println!("| --------------- | ---------------- |");
    let mut rows = Rows;
    for &depth in &a.depth {
        let context = tokens(depth, 1);
        let mut pp = Vec::new();
        let mut tg = Vec::new();
        let mut host = Vec::new();
        let verify: Vec<usize> = a.verify.iter().copied().filter(|&k| k > 0).collect();
        let mut tv = vec![Vec::new(); verify.len()];
        for _ in 0..a.reps.max(1) {
            if a.prompt_tokens > 0 {
                let mut cache = cache_at_depth(&context, a.prompt_tokens)?;
                // A GPU runs asynchronously: the untimed depth prefill must be done before the
                // clock starts, and the timed one before it stops.
                device.synchronize()?;
                // `TANDEM_PROFILE_PREFILL=1`: the profiler captures the first repetition's timed
                // prefill (for `ncu --profile-from-start off`, as TANDEM_PROFILE_DECODE below).
                let profile = pp.is_empty() && std::env::var("TANDEM_PROFILE_PREFILL").is_ok_and(|v| v == "1");
                if profile {
                    tandem_model::device::profiler_capture(&device, true);
                }
                let t = Instant::now();
                for piece in prompt.chunks(chunk) {
                    let mut chunks = [SeqChunk { tokens: piece, cache: &mut cache, logits: LogitsWanted::Last }];
                    model.forward(&mut chunks)?;
                }
                device.synchronize()?;
                if profile {
                    tandem_model::device::profiler_capture(&device, false);
                }
                pp.push(a.prompt_tokens as f64 / t.elapsed().as_secs_f64());
            }
            // Decode after `depth` tokens of context (none by default, as llama-bench's tg test).
            let mut cache = cache_at_depth(&context, a.gen_tokens + WARM_STEPS)?;
            let mut tok = [1u32];
            for _ in 0..WARM_STEPS {
                model.forward(&mut [SeqChunk { tokens: &tok, cache: &mut cache, logits: LogitsWanted::Last }])?;
            }
            device.synchronize()?;
            let t = Instant::now();
            let mut enqueue = 0f64;
            // `TANDEM_PROFILE_DECODE=N`: the profiler captures N decode steps (after two) of each
            // depth's first repetition, for `ncu --profile-from-start off`.
            let mut capture = StepCapture::new(&device, "TANDEM_PROFILE_DECODE", tg.is_empty());
            // `TANDEM_PPROF=FILE` (with the `pprof` feature): host stacks over the same steps.
            let host_profile = if tg.is_empty() { crate::host_profile::start() } else { None };
            for step in 0..a.gen_tokens {
                capture.before(step)?;
                let mut chunks = [SeqChunk { tokens: &tok, cache: &mut cache, logits: LogitsWanted::Last }];
                let step = Instant::now();
                let out = model.forward(&mut chunks)?;
                // On a GPU `forward` returns once its kernels are queued: the time until then is
                // the host's, the rest of the step is waiting for the device (and the readback).
                enqueue += step.elapsed().as_secs_f64();
                let logits = out.into_iter().next().flatten().context("no logits")?.flatten_all()?;
                tok[0] = if device.is_cpu() {
                    tandem_engine::sampler::argmax(&logits.to_vec1::<f32>()?)
                } else {
                    // Greedy where the logits live, as the engine does on a device: one id read
                    // back instead of the whole row.
                    tandem_model::ops::sampling::argmax_rows(&logits.unsqueeze(0)?)?[0]
                };
            }
            capture.end()?;
            let wall = t.elapsed().as_secs_f64();
            crate::host_profile::finish(host_profile);
            tg.push(a.gen_tokens as f64 / wall);
            host.push(100.0 * enqueue / wall);
            for (vi, &k) in verify.iter().enumerate() {
                // Verify steps per second: forwards of `k` tokens in verify mode, each reading
                // every position's argmax (the whole rows on the CPU) and keeping one position
                // (the context grows as in the decode test). Untimed warm-up steps first, as
                // for decode: the first step of a shape captures its CUDA graph (milliseconds,
                // which spread over the timed steps made a verify step look ~0.5 ms dearer).
                let mut cache = cache_at_depth(&context, a.gen_tokens + WARM_STEPS + k)?;
                let chunk: Vec<u32> = (0..k as u32).map(|i| 1 + i % 7).collect();
                let verify_step = |cache: &mut SequenceCache| -> anyhow::Result<()> {
                    if cache.has_recurrent() {
                        cache.begin_verify();
                    }
                    let mut chunks = [SeqChunk { tokens: &chunk, cache, logits: LogitsWanted::All }];
                    let out = model.forward(&mut chunks)?;
                    let logits = out.into_iter().next().flatten().context("no logits")?;
                    if device.is_cpu() {
                        let _ = logits.flatten_all()?.to_vec1::<f32>()?;
                    } else {
                        // Every position's argmax on the device, as the engine reads a greedy
                        // verify chunk.
                        let vocab = logits.dims().last().copied().unwrap_or(1).max(1);
                        let rows = logits.reshape((logits.elem_count() / vocab, vocab))?;
                        let _ = tandem_model::ops::sampling::argmax_rows(&rows)?;
                    }
                    chunks[0].cache.commit_speculative(chunk.len(), 1)?;
                    Ok(())
                };
                for _ in 0..WARM_STEPS {
                    verify_step(&mut cache)?;
                }
                device.synchronize()?;
                // `TANDEM_PROFILE_VERIFY=N`: the profiler captures N verify steps (after two) of
                // each size's first repetition, as TANDEM_PROFILE_DECODE does for decode steps.
                let mut capture = StepCapture::new(&device, "TANDEM_PROFILE_VERIFY", tv[vi].is_empty());
                let t = Instant::now();
                for step in 0..a.gen_tokens {
                    capture.before(step)?;
                    verify_step(&mut cache)?;
                }
                capture.end()?;
                tv[vi].push(a.gen_tokens as f64 / t.elapsed().as_secs_f64());
            }
        }
        let at = if depth > 0 { format!(" @ d{depth}") } else { String::new() };
        if a.prompt_tokens > 0 {
            rows.push((format!("pp{}{at}", a.prompt_tokens), pp));
        }
        let tg_rates = tg.clone();
        rows.push((format!("tg{}{at}", a.gen_tokens), tg));
        if let (Some(bw), Some(sb)) = (bandwidth, step_bytes) {
            // The timed steps see depth + WARM_STEPS .. + gen_tokens positions: their mean.
            let context = depth + WARM_STEPS + a.gen_tokens / 2;
            let limit = bw * 1e12 / sb.at(&spec, a.model.kv_cache_dtype, context) as f64;
            rows.push((format!("tg{} bound{at}", a.gen_tokens), vec![limit]));
            rows.push((
                format!("tg{} % bound{at}", a.gen_tokens),
                tg_rates.iter().map(|r| 100.0 * r / limit).collect(),
            ));
        }
        for (&k, tv) in verify.iter().zip(tv) {
            let cost: Vec<f64> = tg_rates.iter().zip(&tv).map(|(g, v)| g / v).collect();
            rows.push((format!("tv{k}{at}"), tv));
            rows.push((format!("tv{k} / tg{at}"), cost));
        }
        for &b in a.batch.iter().filter(|&&b| b > 1) {
            let mut totals = Vec::new();
            for _ in 0..a.reps.max(1) {
                let mut caches = caches_at_depth(b, &context, a.gen_tokens + WARM_STEPS)?;
                let mut toks: Vec<[u32; 1]> = (0..b as u32).map(|i| [1 + i % 7]).collect();
                // `TANDEM_PROFILE_BATCH=N`: the profiler captures N batched steps of each batch
                // size's first repetition (from the third step on), as TANDEM_PROFILE_DECODE does.
                let mut capture = StepCapture::new(&device, "TANDEM_PROFILE_BATCH", totals.is_empty());
                let mut t = Instant::now();
                for step in 0..WARM_STEPS + a.gen_tokens {
                    capture.before(step)?;
                    if step == WARM_STEPS {
                        device.synchronize()?;
                        t = Instant::now();
                    }
                    let mut chunks: Vec<SeqChunk<'_>> = caches
                        .iter_mut()
                        .zip(&toks)
                        .map(|(cache, tok)| SeqChunk { tokens: tok, cache, logits: LogitsWanted::Last })
                        .collect();
                    let out = model.forward(&mut chunks)?;
                    drop(chunks);
                    // Greedy, as the engine does on a device: every row's argmax where the
                    // logits live, one read back for the batch.
                    let rows = out.into_iter().map(|l| l.context("no logits")?.flatten_all().map_err(Into::into));
                    let rows = rows.collect::<anyhow::Result<Vec<_>>>()?;
                    let ids = tandem_model::ops::sampling::argmax_rows(&candle_core::Tensor::stack(&rows, 0)?)?;
                    for (tok, id) in toks.iter_mut().zip(ids) {
                        tok[0] = id;
                    }
                }
                capture.end()?;
                totals.push((b * a.gen_tokens) as f64 / t.elapsed().as_secs_f64());
            }
            if let (Some(bw), Some(sb)) = (bandwidth, step_bytes) {
                // Every sequence at the timed steps' mean context, as for the plain test.
                let context = depth + WARM_STEPS + a.gen_tokens / 2;
                let limit = b as f64 * bw * 1e12 / sb.batch_at(&spec, a.model.kv_cache_dtype, context, b) as f64;
                let share = totals.iter().map(|r| 100.0 * r / limit).collect();
                rows.push((format!("tg{} x{b}{at}", a.gen_tokens), totals));
                rows.push((format!("tg{} x{b} bound{at}", a.gen_tokens), vec![limit]));
                rows.push((format!("tg{} x{b} % bound{at}", a.gen_tokens), share));
            } else {
                rows.push((format!("tg{} x{b}{at}", a.gen_tokens), totals));
            }
        }
        if !device.is_cpu() {
            // Percent of the decode wall time the host spent queueing work: near 100 means the
            // step is bound by host overhead (launches, allocations), not by the device.
            rows.push((format!("tg host %{at}"), host));
        }
    }
    Ok(())
}

/// Result rows, each printed (mean ± sd) as soon as it is measured, so that a run cut short
/// (a time limit on a GPU machine) keeps what it had.
/// The profiler's capture of `N` timed steps after two (`TANDEM_PROFILE_DECODE=N`,
/// `TANDEM_PROFILE_VERIFY=N`; for `ncu --profile-from-start off`): started before step 2,
/// stopped before step 2 + N, or after the last step if they run out first.
struct StepCapture<'a> {
    device: &'a candle_core::Device,
    steps: Option<usize>,
    on: bool,
}

impl<'a> StepCapture<'a> {
    /// Off unless `var` holds a count and this is the `first` repetition.
    fn new(device: &'a candle_core::Device, var: &str, first: bool) -> Self {
        let steps = std::env::var(var).ok().and_then(|v| v.parse::<usize>().ok()).filter(|_| first);
        Self { device, steps, on: false }
    }

    fn before(&mut self, step: usize) -> anyhow::Result<()> {
        let Some(n) = self.steps else { return Ok(()) };
        if step == 2 && !self.on {
            self.set(true)?;
        } else if step == 2 + n && self.on {
            self.set(false)?;
        }
        Ok(())
    }

    fn end(&mut self) -> anyhow::Result<()> {
        if self.on {
            self.set(false)?;
        }
        Ok(())
    }

    fn set(&mut self, on: bool) -> anyhow::Result<()> {
        self.device.synchronize()?;
        tandem_model::device::profiler_capture(self.device, on);
        self.on = on;
        Ok(())
    }
}

struct Rows;

impl Rows {
    fn push(&mut self, (name, v): (String, Vec<f64>)) {
        let m = v.iter().sum::<f64>() / v.len().max(1) as f64;
        let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / v.len().max(1) as f64).sqrt();
        println!("| {name:<15} | {m:>8.2} ± {sd:<6.2} |");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
}

/// `--save-gguf`: the random preset `preset` with `dtype` matrices, written to `out`.
fn save_gguf(preset: &str, dtype: &str, out: &std::path::Path) -> anyhow::Result<()> {
    let cfg = random::preset(preset)?;
    let dt = random::parse_weight_type(dtype)?;
    let t = Instant::now();
    let pb = indicatif::ProgressBar::new(0).with_message(format!("writing `{preset}` ({dt:?}) as GGUF"));
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tensors {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let report = tandem_model::arch::qwen_hybrid::random_gguf::export_random(&cfg, dt, out, |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    })
    .with_context(|| format!("cannot write {}", out.display()))?;
    pb.finish_and_clear();
    println!(
        "wrote {} ({} `{}` tensors, {:.2} GB) in {:.1} s",
        out.display(),
        report.tensors,
        report.architecture,
        report.bytes as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--bandwidth auto`: TB/s measured on `device` now. A GPU (or Metal): a 1 GiB device-to-device
/// copy, bytes read and written (what issue 16's bounds use); the CPU: the median read bandwidth
/// of `tandem bench memory` at the kernels' current thread count (a decode step only reads).
fn measure_bandwidth(device: &candle_core::Device) -> anyhow::Result<f64> {
    let tbs = if device.is_cpu() {
        let threads = tandem_model::ops::cpu_threads::threads();
        let gbs = crate::cmd_bench_memory::read_bandwidth(threads, 1024, 7)?;
        println!("bandwidth: {gbs:.1} GB/s read by {threads} thread(s) (median of 7), the bound's rate");
        gbs / 1e3
    } else {
        let n = 1usize << 28; // u32 values: 1 GiB
        let x = candle_core::Tensor::zeros(n, candle_core::DType::U32, device)?;
        // Copies for a quarter of a second before the clock starts: an idle GPU's clocks take
        // that long to come up, and ten copies (8 ms on an H100) read 2.66 TB/s where a warm
        // card copies at 3.02 (2026-12-06).
        let copies = |until: Duration| -> anyhow::Result<(usize, f64)> {
            let start = Instant::now();
            let mut reps = 0;
            while start.elapsed() < until {
                for _ in 0..4 {
                    let _y = x.copy()?;
                }
                device.synchronize()?;
                reps += 4;
            }
            Ok((reps, start.elapsed().as_secs_f64().max(1e-9)))
        };
        copies(Duration::from_millis(250))?;
        let (reps, secs) = copies(Duration::from_millis(250))?;
        let tbs = 2.0 * (4 * n * reps) as f64 / secs / 1e12;
        println!(
            "bandwidth: {tbs:.2} TB/s device-to-device copy (1 GiB x {reps} after 0.25 s of the same, read + \
             written), the bound's rate"
        );
        tbs
    };
    if !(tbs.is_finite() && tbs > 0.0) {
        anyhow::bail!("--bandwidth auto measured {tbs} TB/s; give the bandwidth as a number instead");
    }
    Ok(tbs)
}
