//! Grafting an MTP head (`--mtp-from PATH`): a hybrid checkpoint whose multi-token-prediction
//! head was dropped on conversion (mlx-lm's `sanitize` removes `mtp.*`; llama.cpp drops
//! Qwen3-Next's) takes the head of another checkpoint of the same model, an HF directory or a
//! GGUF that kept it. [`Graft`] serves every `mtp.*` tensor from the donor and everything else
//! from the checkpoint; [`open_donor`] first checks that the two are the same model where the
//! head touches it (hidden size, vocabulary, attention shape, the head's input projection).
//! The grafted head then loads like a native one, quantised like the rest under `--quantize`.

use std::path::Path;

use candle_core::{Device, Tensor};

use super::{Embedding, LinearWeight, StackedExperts, WeightSource};
use crate::arch::qwen_hybrid::config::HybridConfig;
use crate::arch::qwen_hybrid::gguf::{is_hybrid_gguf, HybridGgufSource};
use crate::arch::qwen_hybrid::{is_hybrid_dir, read_config};
use crate::error::{ModelError, Result};
use crate::loader::safetensors::SafetensorsSource;

/// A donor checkpoint, open.
pub enum Donor {
    Hf(Box<SafetensorsSource>),
    Gguf(Box<HybridGgufSource>),
}

impl Donor {
    fn source(&self) -> &dyn WeightSource {
        match self {
            Donor::Hf(s) => &**s,
            Donor::Gguf(s) => &**s,
        }
    }
}

/// Opens `path` as the donor of an MTP head for a model of config `cfg`, checking that it has
/// a head and that the head fits.
pub fn open_donor(path: &Path, cfg: &HybridConfig, device: &Device) -> Result<Donor> {
    let what = |e: String| ModelError::Config(format!("--mtp-from {}: {e}", path.display()));
    let (donor, dcfg) = if path.is_dir() && is_hybrid_dir(path) {
        (Donor::Hf(Box::new(SafetensorsSource::open(path, device)?)), read_config(path)?)
    } else if path.is_file() && is_hybrid_gguf(path) {
        let s = HybridGgufSource::open(path, device)?;
        let c = s.config.clone();
        (Donor::Gguf(Box::new(s)), c)
    } else {
        return Err(what("not a hybrid (Qwen3.5 / Qwen3.6 / Qwen3-Next) HF directory or GGUF file".into()));
    };
    let src = donor.source();
    if !src.has("mtp.fc.weight") {
        return Err(what("it has no MTP head either".into()));
    }
    for (field, mine, theirs) in [
        ("hidden size", cfg.hidden_size, dcfg.hidden_size),
        ("vocabulary", cfg.vocab_size, dcfg.vocab_size),
        ("attention heads", cfg.num_heads, dcfg.num_heads),
        ("KV heads", cfg.num_kv_heads, dcfg.num_kv_heads),
        ("head dim", cfg.head_dim, dcfg.head_dim),
    ] {
        if mine != theirs {
            return Err(what(format!("its {field} is {theirs}, the model's {mine}: not the same model")));
        }
    }
    let moe_head = src.has("mtp.layers.0.mlp.gate.weight");
    if moe_head != cfg.moe.is_some() {
        let (head, model) = if moe_head { ("MoE", "dense") } else { ("dense", "MoE") };
        return Err(what(format!("its head's FFN is {head}, the model's is {model}: not the same model")));
    }
    let fc = src.tensor_f32("mtp.fc.weight")?;
    if fc.dims() != [cfg.hidden_size, 2 * cfg.hidden_size] {
        let h = cfg.hidden_size;
        return Err(what(format!("its head's input projection is {:?}, the model needs [{h}, {}]", fc.dims(), 2 * h)));
    }
    Ok(donor)
}

/// `base` with every `mtp.*` tensor taken from `donor` instead.
pub struct Graft<'a> {
    pub base: &'a dyn WeightSource,
    pub donor: &'a Donor,
}

impl Graft<'_> {
    fn pick(&self, name: &str) -> &dyn WeightSource {
        if name.starts_with("mtp.") {
            self.donor.source()
        } else {
            self.base
        }
    }
}

impl WeightSource for Graft<'_> {
    fn has(&self, name: &str) -> bool {
        self.pick(name).has(name)
    }
    fn qmatmul(&self, name: &str) -> Result<LinearWeight> {
        self.pick(name).qmatmul(name)
    }
    fn tensor_f32(&self, name: &str) -> Result<Tensor> {
        self.pick(name).tensor_f32(name)
    }
    fn embedding(&self, name: &str) -> Result<Embedding> {
        self.pick(name).embedding(name)
    }
    fn device(&self) -> &Device {
        self.base.device()
    }
    fn stacked_experts(&self, prefix: &str, proj: &str) -> Result<Option<StackedExperts>> {
        self.pick(prefix).stacked_experts(prefix, proj)
    }
    fn stored_matrix(&self, name: &str) -> Result<Option<candle_core::quantized::QTensor>> {
        self.pick(name).stored_matrix(name)
    }
    fn stored_slice(
        &self,
        name: &str,
        dim: usize,
        ranges: &crate::loader::SliceRanges<'_>,
    ) -> Result<Option<candle_core::quantized::QTensor>> {
        self.pick(name).stored_slice(name, dim, ranges)
    }
    fn stacked_data(&self, storage: &str) -> Result<crate::ops::moe::StackData> {
        // A stacked storage name is the file's own: ask the base first, then the donor.
        self.base.stacked_data(storage).or_else(|_| self.donor.source().stacked_data(storage))
    }
}
