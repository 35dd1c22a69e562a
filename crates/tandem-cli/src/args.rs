//! Flags shared by several subcommands, and turning them into engine settings.

use std::path::PathBuf;
use tandem_model::loader::LoadOptions;

use anyhow::Context;
use clap::Args;
use tandem_engine::{EngineConfig, EngineHandle, SamplingParams, SpecConfig, SpecMethod};
use tandem_model::kv::KvDtype;

/// Which model to load and how to run it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model: GGUF file, HF directory, HF cache repo id (org/name) or catalogue alias.
    #[arg(short = 'm', long = "model", default_value = "smollm2-135m")]
    pub model: String,
    /// Context length override (0 = the model's own).
    #[arg(long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// Do not fetch a missing catalogue model automatically.
    #[arg(long)]
    pub no_pull: bool,
    /// Worker threads for the CPU kernels (0 = the cores other processes leave free, measured
    /// at start; all of them on an idle machine).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// How the KV cache stores keys and values: f16 (the default, like llama.cpp's), f32
    /// (exact), q8_0 or q4_0. The smaller formats hold more tokens in the same --kv-memory and
    /// decode faster at long contexts; q8_0 and q4_0 need a head dimension that is a multiple
    /// of 32.
    #[arg(long, default_value = "f16")]
    pub kv_cache_dtype: KvDtype,
    /// Quantise the weights at load time: q8_0, q6_k, q5_k, q5_1, q5_0, q4_k, q4_1, q4_0, q3_k,
    /// q2_k (or f16 / bf16 to keep a GPU's matmul weights 16-bit), for safetensors and GGUF
    /// inputs alike. The LM head takes Q6_K below six bits; rows that do not fit a K-quant take
    /// Q8_0.
    #[arg(long, value_parser = parse_quant)]
    pub quantize: Option<tandem_model::loader::quantize::WeightQuant>,
    /// Take the MTP head from this checkpoint (an HF directory or GGUF of the same hybrid
    /// model that kept it), for checkpoints whose converter dropped theirs (mlx-lm does).
    #[arg(long, value_name = "PATH")]
    pub mtp_from: Option<std::path::PathBuf>,
    /// Tensor parallelism: cut the model into this many ranks by attention / GDN heads and
    /// FFN columns, their partial sums added per layer in rank order. Hybrid (Qwen3.5 /
    /// Qwen3.6) and Llama-family checkpoints, Hugging Face or GGUF, so far, and every rank on
    /// the one device: the sharded path checked against the whole model, not yet a way to use
    /// more GPUs.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub tensor_parallel: usize,
    #[command(flatten)]
    pub spec: SpecArgs,
}

/// The random-weight presets `tandem bench` and `tandem bench mixed` take instead of `-m`.
#[derive(Args, Debug, Clone)]
pub struct RandomModelArgs {
    /// Benchmark a random-weight hybrid model of this shape instead of loading one
    /// (`0.8b`: Qwen3.5-0.8B-like, 24 layers, hidden 1024, vocab 248320; `9b`, `27b`, `moe`, `tiny`).
    #[arg(long, conflicts_with = "random_llama")]
    pub random_hybrid: Option<String>,
    /// Benchmark a random-weight Llama-family model of this shape instead of loading one
    /// (`8b`: Llama-3-8B's shape, 32 layers, hidden 4096, 32 / 8 heads, vocab 128256; `tiny`).
    #[arg(long)]
    pub random_llama: Option<String>,
    /// Weight type of the random model's matrices: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k.
    #[arg(long, default_value = "q8_0")]
    pub random_dtype: String,
}

fn parse_quant(s: &str) -> Result<tandem_model::loader::quantize::WeightQuant, String> {
    s.parse().map_err(|e: tandem_model::ModelError| e.to_string())
}

/// Speculative decoding flags.
#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: off, ngram (prompt lookup), draft (needs --draft-model) or mtp
    /// (the model's own multi-token-prediction head). Output is unchanged either way.
    #[arg(long, default_value = "off", value_parser = parse_method)]
    pub speculative: SpecMethod,
    /// Most tokens drafted per step; each sequence adapts its own count to its acceptance.
    #[arg(long, default_value_t = 4)]
    pub num_draft_tokens: usize,
    /// Draft model for --speculative draft (same vocabulary as the model; file, dir or alias).
    #[arg(long)]
    pub draft_model: Option<String>,
    /// Shortest and longest n-gram prompt lookup matches.
    #[arg(long, default_value_t = 2)]
    pub ngram_min: usize,
    #[arg(long, default_value_t = 4)]
    pub ngram_max: usize,
    /// Always draft --num-draft-tokens (no adaptation to acceptance).
    #[arg(long)]
    pub fixed_draft_length: bool,
    /// The draft model drafts from the first N token ids only, skipping most of its LM head
    /// (BPE vocabularies list frequent tokens first); 0 = the whole vocabulary. Output is
    /// unchanged either way.
    #[arg(long, default_value_t = tandem_engine::spec::DEFAULT_DRAFT_VOCAB)]
    pub draft_vocab: usize,
}

fn parse_method(s: &str) -> Result<SpecMethod, String> {
    SpecMethod::parse(s).ok_or_else(|| format!("unknown speculative method `{s}` (off, ngram, draft, mtp)"))
}

impl SpecArgs {
    pub fn config(&self) -> SpecConfig {
        SpecConfig {
            method: self.speculative,
            num_draft_tokens: self.num_draft_tokens,
            ngram_min: self.ngram_min,
            ngram_max: self.ngram_max,
            adaptive: !self.fixed_draft_length,
            draft_vocab: self.draft_vocab,
        }
    }
}

impl ModelArgs {
    /// Resolves the model argument to a path, fetching a catalogue alias if needed.
    pub fn resolve(&self) -> anyhow::Result<PathBuf> {
        let reporter = crate::progress::pull_reporter();
        let src = tandem_model::resolve::resolve(&self.model, !self.no_pull, &reporter)
            .with_context(|| format!("cannot find model `{}`", self.model))?;
        Ok(src.path().to_path_buf())
    }

    /// What `--quantize` asks of the loader.
    pub fn load_options(&self) -> tandem_model::loader::LoadOptions {
        tandem_model::loader::LoadOptions {
            quantize: self.quantize,
            mtp_from: self.mtp_from.clone(),
            tensor_parallel: self.tensor_parallel,
        }
    }

    /// What these flags set on an engine whatever model it runs (a file or a random preset):
    /// the CPU threads, the context length, speculation and the KV cache's format.
    pub fn engine_settings(&self, cfg: &mut EngineConfig) {
        set_threads(self.threads);
        cfg.context_length = self.ctx_size;
        cfg.speculative = self.spec.config();
        cfg.kv_dtype = self.kv_cache_dtype;
    }

    /// Loads the model and starts an engine on it.
    pub fn start_engine(&self, mut cfg: EngineConfig) -> anyhow::Result<EngineHandle> {
        self.engine_settings(&mut cfg);
        let path = self.resolve()?;
        if cfg.model_id == "default" {
            cfg.model_id = model_id(&self.model);
        }
        let device = tandem_model::device::default_device()?;
        let loaded = tandem_model::loader::load_with(&path, &device, &self.load_options())
            .with_context(|| format!("cannot load {}", path.display()))?;
        let draft = match &self.spec.draft_model {
            Some(d) => {
                let reporter = crate::progress::pull_reporter();
                let src = tandem_model::resolve::resolve(d, !self.no_pull, &reporter)
                    .with_context(|| format!("cannot find draft model `{d}`"))?;
                let p = src.path();
                Some(
                    tandem_model::loader::load_with(
                        p,
                        &device,
                        &LoadOptions { mtp_from: None, tensor_parallel: 1, ..self.load_options() },
                    )
                    .with_context(|| format!("cannot load {}", p.display()))?,
                )
            }
            None => None,
        };
        EngineHandle::start_with_draft(loaded, draft, cfg).context("cannot start the engine")
    }
}

/// The id clients see: the alias or the file/directory name.
pub fn model_id(arg: &str) -> String {
    let p = std::path::Path::new(arg);
    if p.exists() {
        p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| arg.to_string())
    } else {
        arg.to_string()
    }
}

/// Sizes the CPU thread pools used by the kernels (`-t N`), or with `n = 0` caps the kernels'
/// threads at the free cores and starts the watch that keeps the cap there.
pub fn set_threads(n: usize) {
    // Candle's CPU kernels (its worker pool and rayon's) read this on first use.
    if n > 0 {
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        return;
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return;
    }
    // -t 0: the pools get every core, and the kernels' thread cap (`cpu_threads`) follows the
    // cores other processes leave free, now and (watched every 200 ms) later, so a busy
    // neighbour, also one that starts or stops later, never makes every op wait for the
    // worker that shares its core.
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let mut current = cores;
    if let Some(t) = tandem_engine::threads::threads_for_free_cores(std::time::Duration::from_millis(150)) {
        if t < cores {
            tracing::info!(
                "other processes keep {} of the {cores} cores busy: running on {t} thread(s) (-t N sets the count)",
                cores - t
            );
            tandem_model::ops::cpu_threads::set_limit(t);
            current = t;
        }
    }
    // 200 ms: a neighbour that starts late costs the two-thread rate until a sample sees it;
    // SmolLM2 on Zen 5 with one starting 0.4 s in, the default's decode 0.89-0.98x of `-t 1`
    // (0.83-0.88x when going down waited for two samples, 0.73-0.82x at 500 ms;
    // docs/PERFORMANCE.md, 2026-12-06).
    tandem_engine::threads::watch(cores, current, std::time::Duration::from_millis(200));
}

/// Sampling flags.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: keep the smallest set of tokens with this total probability (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalise tokens already seen: logits divided (positive) or multiplied (negative) by this (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtract this from the logit of every token already seen.
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this times the count of each token already seen.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties consider (0 = all).
    #[arg(long, default_value_t = 64)]
    pub penalty_last_n: usize,
    /// RNG seed: the same seed gives the same output.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this string appears (repeatable); it is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Maximum tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 256)]
    pub max_tokens: usize,
}

impl SamplingArgs {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.penalty_last_n,
            seed: self.seed,
            logit_bias: Vec::new(),
        }
    }
}
