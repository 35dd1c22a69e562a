//! Weight loading: a [`WeightSource`] hands out tensors by GGUF-style name
//! (`blk.N.attn_q.weight`) whatever the file format, and [`load`] builds a ready model,
//! tokenizer and chat template from a GGUF file or a Hugging Face directory.

pub mod gguf;
pub mod gguf_check;
pub mod graft;
pub mod mlx;
pub mod mlx_fp;
pub mod mlx_to_hf;
pub mod mlx_write;
pub mod quantize;
pub mod safetensors;
pub mod shard;
pub mod summary;
mod weights;

use candle_core::Device;
use std::path::Path;

use crate::arch::CausalLm;
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;
pub use summary::ModelSummary;
pub use weights::{Embedding, Linear, LinearSet, LinearWeight, SliceRanges, StackedExperts, WeightSource};

/// A model ready to run, with everything needed to talk to it.
pub struct LoadedModel {
    pub model: Box<dyn CausalLm>,
    pub tokenizer: Tokenizer,
    /// Jinja chat template shipped with the model, if any.
    pub chat_template: Option<String>,
    pub summary: ModelSummary,
}

/// How to load: what to do to the weights on the way in.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Quantise every matmul weight (and the embedding) to this type at load time.
    pub quantize: Option<quantize::WeightQuant>,
    /// Take the MTP head from this checkpoint (hybrid models; see [`graft`]).
    pub mtp_from: Option<std::path::PathBuf>,
    /// Tensor parallelism: the model cut into this many ranks by heads and FFN columns
    /// (0 and 1: off). Hybrid and Llama-family checkpoints (Hugging Face and GGUF) so far,
    /// every rank on the one device ([`crate::arch::qwen_hybrid::tp`], [`crate::arch::llama::tp`]).
    pub tensor_parallel: usize,
}

impl LoadOptions {
    /// `src` with the MTP head grafted from `--mtp-from` where asked, then as [`Self::source`]
    /// makes it; `donor` holds the open donor for as long as the source is used.
    pub fn hybrid_source<'a>(
        &self,
        src: &'a dyn WeightSource,
        donor: &'a Option<graft::Donor>,
        graft_slot: &'a mut Option<graft::Graft<'a>>,
    ) -> Box<dyn WeightSource + 'a> {
        match donor {
            Some(d) => {
                let g: &'a graft::Graft<'a> = graft_slot.insert(graft::Graft { base: src, donor: d });
                self.source(g)
            }
            None => self.source(src),
        }
    }

    /// The donor of `--mtp-from`, opened and checked against `cfg`.
    pub fn mtp_donor(
        &self,
        cfg: &crate::arch::qwen_hybrid::config::HybridConfig,
        device: &Device,
    ) -> Result<Option<graft::Donor>> {
        self.mtp_from.as_deref().map(|p| graft::open_donor(p, cfg, device)).transpose()
    }

    /// `src` as the model should see it: quantising where asked, else as it is.
    pub fn source<'a>(&self, src: &'a dyn WeightSource) -> Box<dyn WeightSource + 'a> {
        match self.quantize {
            Some(q) => Box::new(quantize::Quantizing::new(src, q)),
            None => Box::new(Plain(src)),
        }
    }
}

/// A source passed through unchanged.
struct Plain<'a>(&'a dyn WeightSource);

impl WeightSource for Plain<'_> {
    fn has(&self, name: &str) -> bool {
        self.0.has(name)
    }
    fn qmatmul(&self, name: &str) -> Result<LinearWeight> {
        self.0.qmatmul(name)
    }
    fn tensor_f32(&self, name: &str) -> Result<candle_core::Tensor> {
        self.0.tensor_f32(name)
    }
    fn embedding(&self, name: &str) -> Result<Embedding> {
        self.0.embedding(name)
    }
    fn device(&self) -> &Device {
        self.0.device()
    }
    fn stacked_experts(&self, prefix: &str, proj: &str) -> Result<Option<StackedExperts>> {
        self.0.stacked_experts(prefix, proj)
    }
    fn stacked_data(&self, storage: &str) -> Result<crate::ops::moe::StackData> {
        self.0.stacked_data(storage)
    }
    fn stored_matrix(&self, name: &str) -> Result<Option<candle_core::quantized::QTensor>> {
        self.0.stored_matrix(name)
    }
    fn stored_slice(
        &self,
        name: &str,
        dim: usize,
        ranges: &weights::SliceRanges<'_>,
    ) -> Result<Option<candle_core::quantized::QTensor>> {
        self.0.stored_slice(name, dim, ranges)
    }
    fn linear(&self, name: &str) -> Result<Linear> {
        self.0.linear(name)
    }
}

/// Loads a GGUF file or a Hugging Face directory (config.json + safetensors + tokenizer.json).
pub fn load(path: &Path, device: &Device) -> Result<LoadedModel> {
    load_with(path, device, &LoadOptions::default())
}

/// [`load`] with options (load-time quantisation).
pub fn load_with(path: &Path, device: &Device, opts: &LoadOptions) -> Result<LoadedModel> {
    let free_before = crate::device::memory_info(device);
    // A file must not be able to panic the process: our code returns errors, and a panic in a
    // library underneath (tokenizers, safetensors, candle) on a hostile file becomes one too.
    let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| load_any(path, device, opts)))
        .unwrap_or_else(|p| Err(ModelError::Config(format!("{}: loading failed: {}", path.display(), panic_text(&p)))));
    loaded.map_err(|e| match free_before {
        // A GPU that runs out of memory while loading: say so, and what to change.
        Some((free, _)) if e.to_string().contains("OUT_OF_MEMORY") => ModelError::Input(format!(
            "{} does not fit in the {:.1} GiB free on the GPU ({e}); use a smaller or more quantised model, \
             free the GPU, or run it with --device cpu",
            path.display(),
            free as f64 / (1u64 << 30) as f64
        )),
        _ => e,
    })
}

fn load_any(path: &Path, device: &Device, opts: &LoadOptions) -> Result<LoadedModel> {
    let mut loaded = if path.is_dir() && crate::arch::qwen_hybrid::is_hybrid_dir(path) {
        crate::arch::qwen_hybrid::load_hf_dir(path, device, opts)?
    } else if opts.mtp_from.is_some() && !crate::arch::qwen_hybrid::gguf::is_hybrid_gguf(path) {
        return Err(ModelError::Config(format!(
            "--mtp-from: {} is not a hybrid model (Qwen3.5 / Qwen3.6 / Qwen3-Next); only those have MTP heads",
            path.display()
        )));
    } else if path.is_dir() && crate::arch::gemma3::is_gemma3_dir(path) {
        crate::arch::gemma3::load_hf_dir(path, device, opts)?
    } else if path.is_dir() {
        safetensors::load_hf_dir(path, device, opts)?
    } else if crate::arch::qwen_hybrid::gguf::is_hybrid_gguf(path) {
        crate::arch::qwen_hybrid::gguf::load_gguf(path, device, opts)?
    } else if crate::arch::gemma3::is_gemma3_gguf(path) {
        crate::arch::gemma3::load_gguf(path, device, opts)?
    } else if path.is_file() {
        gguf::load_gguf(path, device, opts)?
    } else {
        return Err(ModelError::NotFound(format!("{} is neither a GGUF file nor a model directory", path.display())));
    };
    if let Some(q) = opts.quantize {
        loaded.summary.quantized_at_load = Some(q.to_string());
    }
    if let Some(p) = &opts.mtp_from {
        let a = &mut loaded.summary.architecture;
        for was in ["MTP head: no", "MTP head: dropped", "MTP head: yes"] {
            *a = a.replace(was, &format!("MTP head: grafted from {}", p.display()));
        }
    }
    Ok(loaded)
}

thread_local! {
    static CONTAINED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs a library call that may panic on a hostile file (tokenizers, candle's GGUF reader)
/// and returns its panic as an error message. Only such calls are contained: a panic in
/// tandem's own loading code is still a bug (`load` turns it into an error too, but the fuzz
/// harness, which checks [`panic_is_contained`], reports it).
pub(crate) fn contain<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    CONTAINED.with(|c| c.set(c.get() + 1));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    CONTAINED.with(|c| c.set(c.get() - 1));
    r.map_err(|p| panic_text(&p))
}

/// Whether the current thread is inside [`contain`] (for panic hooks).
pub fn panic_is_contained() -> bool {
    CONTAINED.with(|c| c.get() > 0)
}

/// The message of a caught panic.
pub(crate) fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default()
}

/// Describes a checkpoint without loading its weights.
pub fn summarize(path: &Path) -> Result<ModelSummary> {
    std::panic::catch_unwind(|| summarize_any(path))
        .unwrap_or_else(|p| Err(ModelError::Config(format!("{}: reading failed: {}", path.display(), panic_text(&p)))))
}

fn summarize_any(path: &Path) -> Result<ModelSummary> {
    if path.is_dir() && crate::arch::qwen_hybrid::is_hybrid_dir(path) {
        crate::arch::qwen_hybrid::summarize(path)
    } else if crate::arch::gemma3::is_gemma3_dir(path) || crate::arch::gemma3::is_gemma3_gguf(path) {
        crate::arch::gemma3::summarize(path)
    } else if path.is_dir() {
        safetensors::summarize(path)
    } else if crate::arch::qwen_hybrid::gguf::is_hybrid_gguf(path) {
        crate::arch::qwen_hybrid::gguf::summarize(path)
    } else if path.is_file() {
        gguf::summarize(path)
    } else {
        Err(ModelError::NotFound(format!("{} is neither a GGUF file nor a model directory", path.display())))
    }
}

/// A spinner-style progress bar over `n` layers on stderr (hidden when stderr is not a TTY).
pub(crate) fn layer_progress(n: usize, what: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(n as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} layers") {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(what.to_string());
    pb
}
