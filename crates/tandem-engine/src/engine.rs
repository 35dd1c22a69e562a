//! The engine handle: validates and queues requests, owns the thread that runs the model.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

pub use tandem_cache::MemoryBudget;
use tandem_model::chat_template::ChatTemplate;
use tandem_model::kv::KvDtype;
use tandem_model::loader::{LoadedModel, ModelSummary};
use tandem_model::tokenizer::Tokenizer;

use crate::cache::disk::{DiskCacheConfig, DiskStats};
use tokio::sync::mpsc;

use crate::request::{GenerateRequest, GenerationEvent, SubmitError};
use crate::sampler::Sampler;
use crate::scheduler::{Scheduler, Submission};
use crate::spec::{SpecConfig, SpecMethod, MAX_DRAFT_TOKENS};

/// Static facts about the loaded model that API layers report.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The name clients use in the `model` field.
    pub id: String,
    pub context_length: usize,
    pub vocab_size: usize,
    /// Unix time the model was loaded.
    pub created: u64,
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Name reported as the model id.
    pub model_id: String,
    /// Maximum number of requests waiting to be admitted.
    pub max_queue: usize,
    /// Maximum sequences decoded together.
    pub max_running: usize,
    /// Prompt tokens processed per sequence per step (chunked prefill).
    pub prefill_chunk: usize,
    /// Token budget of one forward step (prefill chunks plus decodes).
    pub max_batch_tokens: usize,
    /// Override of the context length (0 = the model's own).
    pub context_length: usize,
    /// Memory for the paged KV pool: bytes or a fraction of RAM. Never unbounded.
    pub kv_memory: MemoryBudget,
    /// Token positions per KV block.
    pub block_size: usize,
    /// How the KV cache stores keys and values (f32, f16, q8_0, q4_0).
    pub kv_dtype: KvDtype,
    /// Reuse the KV (and recurrent-state checkpoints) of earlier requests with the same prefix.
    pub prefix_cache: bool,
    /// Checkpoint recurrent state every this many prompt tokens (rounded up to whole blocks;
    /// 0 = only at prompt ends and message boundaries).
    pub checkpoint_interval: usize,
    /// Memory for recurrent-state checkpoints in the prefix cache.
    pub checkpoint_memory: MemoryBudget,
    /// Speculative decoding (method, draft length, n-gram sizes).
    pub speculative: SpecConfig,
    /// On a GPU, sample from the device's top candidates where they decide the token
    /// (`sampler/candidates.rs`); false reads every sampled row whole.
    pub device_sampling: bool,
    /// The prefix cache's disk tier (`--cache-dir`, `--disk-cache-size`); `None` keeps prefix
    /// state in memory only.
    pub disk_cache: Option<DiskCacheConfig>,
    /// A step of more rows than this carries a whole number of them: its last prefill chunk
    /// gives the excess back to the next step (a GPU's prefill GEMMs run 128-row tiles; a
    /// 512-token chunk beside 8 decodes is 520 rows). 1 = never trims; 0 = the device decides
    /// (128 on CUDA, 1 elsewhere; [`EngineHandle::step_align`] says what the engine uses). Default:
    /// `TANDEM_STEP_ALIGN`, else 0. Outputs never depend on it.
    pub step_align: usize,
}

impl EngineConfig {
    /// [`EngineConfig::step_align`]'s default: `TANDEM_STEP_ALIGN` (read once), else 0 (auto).
    pub fn default_step_align() -> usize {
        crate::scheduler::align::step_align()
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            model_id: "default".into(),
            max_queue: 64,
            max_running: 16,
            prefill_chunk: 512,
            max_batch_tokens: 2048,
            context_length: 0,
            kv_memory: MemoryBudget::FractionOfRam(0.2),
            block_size: tandem_cache::DEFAULT_BLOCK_SIZE,
            kv_dtype: KvDtype::F32,
            prefix_cache: true,
            checkpoint_interval: 1024,
            checkpoint_memory: MemoryBudget::Bytes(1 << 30),
            speculative: SpecConfig::default(),
            device_sampling: true,
            disk_cache: None,
            step_align: Self::default_step_align(),
        }
    }
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] tandem_model::ModelError),
    #[error("invalid engine config: {0}")]
    Config(String),
    #[error("cannot start the engine thread: {0}")]
    Thread(std::io::Error),
}

/// Counters the engine keeps for metrics and tests. Gauges are refreshed after every
/// scheduler step; counters only grow.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Requests admitted and holding a state slot.
    pub running: AtomicUsize,
    /// Requests queued or preempted, not yet (re)admitted.
    pub waiting: AtomicUsize,
    pub finished: AtomicUsize,
    pub cancelled: AtomicUsize,
    /// Bytes of KV blocks and recurrent state held by live sequences (shared blocks counted
    /// once per sequence; the prefix cache's own blocks not at all).
    pub kv_bytes: AtomicUsize,
    /// The most `kv_bytes` has been since the engine started (for sizing `--kv-memory`).
    pub kv_bytes_peak: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    pub kv_blocks_free: AtomicUsize,
    pub kv_block_bytes: AtomicUsize,
    /// Bytes of the sliding-window rings one running sequence holds (fixed, whatever its
    /// length; 0 for models without sliding-window layers). Included in `kv_bytes`.
    pub kv_ring_bytes: AtomicUsize,
    /// Blocks the prefix cache references (some may also be used by live sequences).
    pub prefix_cache_blocks: AtomicUsize,
    pub state_slots_total: AtomicUsize,
    pub state_slots_free: AtomicUsize,
    /// Recurrent-state checkpoints held by the prefix cache, and their bytes.
    pub checkpoints: AtomicUsize,
    pub checkpoint_bytes: AtomicUsize,
    /// Prompt tokens of admitted requests, and how many of them came from the prefix cache.
    pub prompt_tokens: AtomicUsize,
    pub prefix_hit_tokens: AtomicUsize,
    /// Sequences preempted (their KV dropped, to be recomputed) because blocks ran out.
    pub preemptions: AtomicUsize,
    /// Forward passes that failed for a batch of several sequences and were rerun one
    /// sequence at a time (the results stay right; the batch's speed is lost). A working
    /// backend keeps this at 0: the invariant tests assert it.
    pub batch_fallbacks: AtomicUsize,
    /// Prompt tokens a step gave back to the next so that its rows filled whole GEMM tiles
    /// (`EngineConfig::step_align`).
    pub step_rows_trimmed: AtomicUsize,
    /// Speculative decoding: verification steps that carried drafts, drafted and accepted
    /// tokens, and per draft position how often a draft was proposed and accepted there.
    pub spec_steps: AtomicUsize,
    pub spec_drafted: AtomicUsize,
    pub spec_accepted: AtomicUsize,
    pub spec_drafted_at: [AtomicUsize; MAX_DRAFT_TOKENS],
    pub spec_accepted_at: [AtomicUsize; MAX_DRAFT_TOKENS],
    /// Sampled tokens picked from a device's top candidates (without reading the row).
    pub candidate_samples: AtomicUsize,
    /// The prefix cache's disk tier (all zero when it is off).
    pub disk: Arc<DiskStats>,
}

impl EngineStats {
    pub fn kv_blocks_used(&self) -> usize {
        self.kv_blocks_total.load(Ordering::Relaxed).saturating_sub(self.kv_blocks_free.load(Ordering::Relaxed))
    }

    /// Accepted share of drafted tokens.
    pub fn spec_acceptance_rate(&self) -> f64 {
        let d = self.spec_drafted.load(Ordering::Relaxed);
        if d == 0 {
            0.0
        } else {
            self.spec_accepted.load(Ordering::Relaxed) as f64 / d as f64
        }
    }

    /// Mean tokens per verification step (accepted drafts plus the target's own).
    pub fn spec_mean_accepted_length(&self) -> f64 {
        let s = self.spec_steps.load(Ordering::Relaxed);
        if s == 0 {
            0.0
        } else {
            (self.spec_accepted.load(Ordering::Relaxed) + s) as f64 / s as f64
        }
    }

    /// Share of admitted prompt tokens served from the prefix cache.
    pub fn prefix_hit_ratio(&self) -> f64 {
        let p = self.prompt_tokens.load(Ordering::Relaxed);
        if p == 0 {
            0.0
        } else {
            self.prefix_hit_tokens.load(Ordering::Relaxed) as f64 / p as f64
        }
    }
}

/// A cheap, cloneable handle to the running engine. The engine thread stops when the last
/// handle is dropped.
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

struct Inner {
    info: ModelInfo,
    summary: ModelSummary,
    tokenizer: Arc<Tokenizer>,
    template: Option<Arc<ChatTemplate>>,
    tx: std_mpsc::SyncSender<Submission>,
    stats: Arc<EngineStats>,
    eos_ids: Vec<u32>,
    /// Speculation methods requests may ask for.
    spec_methods: Vec<SpecMethod>,
    /// The row alignment steps are trimmed to ([`EngineConfig::step_align`], resolved).
    step_align: usize,
    /// Grammar compiler for constrained decoding, built on first use (it reads the whole
    /// vocabulary); the error says why this model cannot have one.
    grammars: std::sync::OnceLock<Result<Arc<crate::constraint::Grammars>, String>>,
}

impl EngineHandle {
    /// Loads a model from a GGUF file or HF directory on the default device and starts it.
    pub fn load(path: &Path, cfg: EngineConfig) -> Result<Self, EngineError> {
        let device = tandem_model::device::default_device()?;
        let loaded = tandem_model::loader::load(path, &device)?;
        Self::start(loaded, cfg)
    }

    /// Starts the engine thread on an already loaded model.
    pub fn start(loaded: LoadedModel, cfg: EngineConfig) -> Result<Self, EngineError> {
        Self::start_with_draft(loaded, None, cfg)
    }

    /// Starts the engine with a draft model for speculative decoding (`--speculative draft`).
    /// The draft model must share the target's vocabulary and keep attention KV only.
    pub fn start_with_draft(
        loaded: LoadedModel,
        draft: Option<LoadedModel>,
        cfg: EngineConfig,
    ) -> Result<Self, EngineError> {
        if cfg.max_queue == 0
            || cfg.max_running == 0
            || cfg.prefill_chunk == 0
            || cfg.max_batch_tokens == 0
            || cfg.block_size == 0
        {
            return Err(EngineError::Config(
                "max_queue, max_running, prefill_chunk, max_batch_tokens and block_size must be positive".into(),
            ));
        }
        let LoadedModel { model, tokenizer, chat_template, summary } = loaded;
        let draft_model = match draft {
            Some(d) => {
                if d.model.vocab_size() != model.vocab_size() {
                    return Err(EngineError::Config(format!(
                        "the draft model's vocabulary ({}) differs from the target's ({})",
                        d.model.vocab_size(),
                        model.vocab_size()
                    )));
                }
                if d.model.cache_spec().iter().any(|l| matches!(l, tandem_model::kv::LayerCacheSpec::Recurrent { .. }))
                {
                    return Err(EngineError::Config("a draft model with recurrent layers is not supported".into()));
                }
                let mut m = d.model;
                let n = cfg.speculative.draft_vocab;
                if n > 0 && m.limit_logits(n)? {
                    tracing::info!(draft_vocab = n, "the draft model drafts from the first {n} token ids");
                }
                Some(m)
            }
            None => None,
        };
        let sc = &cfg.speculative;
        if sc.num_draft_tokens > MAX_DRAFT_TOKENS {
            return Err(EngineError::Config(format!("at most {MAX_DRAFT_TOKENS} draft tokens per step")));
        }
        if sc.ngram_min == 0 || sc.ngram_min > sc.ngram_max {
            return Err(EngineError::Config("n-gram sizes must satisfy 1 <= min <= max".into()));
        }
        let mut spec_methods = vec![SpecMethod::Off, SpecMethod::Ngram];
        if draft_model.is_some() {
            spec_methods.push(SpecMethod::Draft);
        }
        if model.mtp().is_some() {
            spec_methods.push(SpecMethod::Mtp);
        }
        match sc.method {
            SpecMethod::Draft if draft_model.is_none() => {
                return Err(EngineError::Config("--speculative draft needs a draft model (--draft-model)".into()))
            }
            SpecMethod::Mtp if model.mtp().is_none() => {
                return Err(EngineError::Config(
                    "--speculative mtp needs a model with an MTP head; this one has none".into(),
                ))
            }
            _ => {}
        }
        let context_length = if cfg.context_length > 0 {
            cfg.context_length.min(model.context_length())
        } else {
            model.context_length()
        };
        let info = ModelInfo {
            id: cfg.model_id.clone(),
            context_length,
            vocab_size: model.vocab_size(),
            created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        };
        let template = match chat_template {
            Some(src) => match ChatTemplate::new(&src, tokenizer.bos_token(), tokenizer.eos_token()) {
                Ok(t) => Some(Arc::new(t)),
                Err(e) => {
                    tracing::warn!("the model's chat template does not compile ({e}); using ChatML");
                    None
                }
            },
            None => None,
        };
        let template = match template {
            Some(t) => Some(t),
            None => ChatTemplate::new(
                tandem_model::chat_template::CHATML_TEMPLATE,
                tokenizer.bos_token(),
                tokenizer.eos_token(),
            )
            .ok()
            .map(Arc::new),
        };
        let tokenizer = Arc::new(tokenizer);
        let eos_ids = tokenizer.eos_ids().to_vec();
        let stats = Arc::new(EngineStats::default());
        let disk = match (&cfg.disk_cache, cfg.prefix_cache) {
            (Some(d), true) => open_disk_tier(d, &cfg, &summary, model.as_ref(), &tokenizer, stats.disk.clone()),
            _ => None,
        };
        let (tx, rx) = std_mpsc::sync_channel(cfg.max_queue);
        let device = model.device().clone();
        let mut cfg = cfg;
        cfg.step_align = crate::scheduler::align::resolve(cfg.step_align, &device);
        let step_align = cfg.step_align;
        let scheduler =
            Scheduler::new(model, draft_model, tokenizer.clone(), cfg.clone(), context_length, stats.clone(), disk)?;
        std::thread::Builder::new()
            .name("tandem-engine".into())
            .spawn(move || {
                // The thread frees device memory when it ends: the device's context must be
                // current on it even if it never ran a step.
                tandem_model::device::bind_thread(&device);
                scheduler.run(rx)
            })
            .map_err(EngineError::Thread)?;
        Ok(Self {
            inner: Arc::new(Inner {
                info,
                summary,
                tokenizer,
                template,
                tx,
                stats,
                eos_ids,
                spec_methods,
                step_align,
                grammars: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Validates and queues a request; events arrive on the returned receiver. Dropping the
    /// receiver cancels the request and frees everything it held.
    pub fn submit(&self, req: GenerateRequest) -> Result<mpsc::Receiver<GenerationEvent>, SubmitError> {
        let ctx = self.inner.info.context_length;
        let n = req.prompt_ids.len();
        if n == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if n >= ctx {
            return Err(SubmitError::PromptTooLong { prompt: n, context: ctx });
        }
        if n + req.stop.max_tokens > ctx {
            return Err(SubmitError::MaxTokensTooLarge { prompt: n, max_tokens: req.stop.max_tokens, context: ctx });
        }
        if req.stop.max_tokens == 0 {
            return Err(SubmitError::InvalidParam("max_tokens must be at least 1".into()));
        }
        if let Some(&bad) = req.prompt_ids.iter().find(|&&t| t as usize >= self.inner.info.vocab_size) {
            return Err(SubmitError::InvalidToken(bad));
        }
        if let Some(sr) = &req.speculative {
            if let Some(m) = sr.method {
                if !self.inner.spec_methods.contains(&m) {
                    return Err(SubmitError::InvalidParam(format!(
                        "speculative method `{}` is not available on this server (available: {})",
                        m.as_str(),
                        self.inner.spec_methods.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
                    )));
                }
            }
            if sr.num_draft_tokens.is_some_and(|k| k > MAX_DRAFT_TOKENS) {
                return Err(SubmitError::InvalidParam(format!("num_draft_tokens must be at most {MAX_DRAFT_TOKENS}")));
            }
        }
        let sampler = Sampler::new(req.sampling.clone()).map_err(SubmitError::InvalidParam)?;
        let constraint = match &req.grammar {
            Some(g) => Some(
                self.grammars()
                    .map_err(SubmitError::InvalidGrammar)?
                    .compile(g)
                    .map_err(SubmitError::InvalidGrammar)?,
            ),
            None => None,
        };
        // Capacity covers every event the request can produce, so the engine never blocks.
        let (etx, erx) = mpsc::channel(req.stop.max_tokens + 2);
        let mut stop_ids = req.stop.stop_token_ids.clone();
        if !req.stop.ignore_eos {
            stop_ids.extend_from_slice(&self.inner.eos_ids);
        }
        let sub = Submission { req, sampler, constraint, stop_ids, events: etx, submitted: Instant::now() };
        self.inner.stats.waiting.fetch_add(1, Ordering::Relaxed);
        match self.inner.tx.try_send(sub) {
            Ok(()) => Ok(erx),
            Err(e) => {
                self.inner.stats.waiting.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    std_mpsc::TrySendError::Full(_) => SubmitError::QueueFull,
                    std_mpsc::TrySendError::Disconnected(_) => SubmitError::Stopped,
                })
            }
        }
    }

    /// This model's grammar compiler (built on the first call; later calls share it), or why
    /// constrained decoding is not available for its tokenizer.
    pub fn grammars(&self) -> Result<Arc<crate::constraint::Grammars>, String> {
        let inner = &self.inner;
        inner
            .grammars
            .get_or_init(|| {
                crate::constraint::Grammars::new(inner.tokenizer.clone(), inner.info.vocab_size).map(Arc::new)
            })
            .clone()
    }

    /// The row alignment this engine trims its steps to (its config's, 0 resolved for the
    /// device: 128 on CUDA, 1 elsewhere).
    pub fn step_align(&self) -> usize {
        self.inner.step_align
    }

    pub fn info(&self) -> &ModelInfo {
        &self.inner.info
    }
    pub fn summary(&self) -> &ModelSummary {
        &self.inner.summary
    }
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.inner.tokenizer
    }
    pub fn chat_template(&self) -> Option<&Arc<ChatTemplate>> {
        self.inner.template.as_ref()
    }
    pub fn stats(&self) -> &EngineStats {
        &self.inner.stats
    }
    /// Speculation methods requests may ask for (`off` and `ngram` always).
    pub fn spec_methods(&self) -> &[SpecMethod] {
        &self.inner.spec_methods
    }
}

/// The disk tier of this model's prefix cache, in the namespace its fingerprint names.
fn open_disk_tier(
    d: &DiskCacheConfig,
    cfg: &EngineConfig,
    summary: &tandem_model::loader::ModelSummary,
    model: &dyn tandem_model::arch::CausalLm,
    tokenizer: &tandem_model::tokenizer::Tokenizer,
    stats: Arc<DiskStats>,
) -> Option<crate::cache::disk::DiskTier> {
    use crate::cache::disk::fingerprint;
    let started = std::time::Instant::now();
    let weights = match fingerprint::weights(summary) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("prefix disk cache off: cannot fingerprint {}: {e}", summary.path);
            return None;
        }
    };
    let ns = fingerprint::namespace(
        weights,
        summary,
        &model.cache_spec(),
        model.vocab_size(),
        tokenizer.eos_ids(),
        cfg.kv_dtype,
        cfg.block_size,
    );
    tracing::debug!(ms = started.elapsed().as_millis() as u64, "fingerprinted the model for the disk cache");
    crate::cache::disk::DiskTier::open(d, ns, &cfg.model_id, stats)
}
