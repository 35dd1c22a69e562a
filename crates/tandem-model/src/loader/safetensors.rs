//! Hugging Face directories: `config.json`, one or many `*.safetensors` (memory-mapped, with
//! `model.safetensors.index.json` for sharded checkpoints), `tokenizer.json`, and the chat
//! template from `chat_template.jinja` or `tokenizer_config.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::QMatMul;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::{Embedding, LinearWeight, LoadedModel, ModelSummary, WeightSource};
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;

/// Safetensors shards of one checkpoint.
pub struct SafetensorsSource {
    st: MmapedSafetensors,
    names: std::collections::HashSet<String>,
    device: Device,
    /// Prefix of the text model's weights (`model.` or `model.language_model.`).
    prefix: String,
    /// MLX affine quantisation (`config.json`'s `quantization` block), if the checkpoint has it.
    mlx: Option<super::mlx::MlxQuant>,
    /// mlx-lm's hybrid converters store the zero-centred norms as 1 + w (and the GDN conv as
    /// `[C, K, 1]`): those norms are read back as w.
    norms_plus_one: bool,
}

/// An MLX-quantised weight as loaded: `[n, k]` GGML blocks (Q4_1, Q5_1, Q5_0), Q8_0 + group
/// biases, or dense values.
enum MlxWeight {
    Ggml {
        ty: crate::ops::quant::QuantType,
        n: usize,
        k: usize,
        bytes: Vec<u8>,
    },
    /// 6 / 8 bits: Q8_0 blocks of `q - o` and group biases (`ops::quant::affine`).
    Affine {
        n: usize,
        k: usize,
        group: usize,
        blocks: Vec<u8>,
        bias: Vec<f32>,
    },
    /// Dense values: f32, or bf16 where that is exact (the fp modes).
    F32(Tensor),
}

/// A Llama-family layer's tensors: (GGUF stem, Hugging Face stem), both directions of the
/// name maps (`hf_name`, `arch::llama_to_gguf`).
pub(crate) const LLAMA_LAYER_NAMES: [(&str, &str); 11] = [
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// Maps a GGUF-style tensor name to the Hugging Face name.
pub fn hf_name(gguf: &str, prefix: &str) -> String {
    let map_tail = |tail: &str| -> String {
        let (stem, suffix) = match tail.rsplit_once('.') {
            Some((s, suf)) => (s, suf),
            None => (tail, ""),
        };
        let hf = LLAMA_LAYER_NAMES.iter().find(|(g, _)| *g == stem).map_or(stem, |(_, h)| h);
        format!("{hf}.{suffix}")
    };
    match gguf {
        "token_embd.weight" => format!("{prefix}embed_tokens.weight"),
        "output_norm.weight" => format!("{prefix}norm.weight"),
        "output.weight" => "lm_head.weight".to_string(),
        _ => match gguf.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((layer, tail)) => format!("{prefix}layers.{layer}.{}", map_tail(tail)),
            None => gguf.to_string(),
        },
    }
}

impl SafetensorsSource {
    pub fn open(dir: &Path, device: &Device) -> Result<Self> {
        let files = shard_files(dir)?;
        // SAFETY: read-only mapping of files tandem does not modify.
        let st = unsafe { MmapedSafetensors::multi(&files) }
            .map_err(|e| ModelError::Config(format!("cannot read safetensors in {}: {e}", dir.display())))?;
        let names: std::collections::HashSet<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
        let prefix = if names.iter().any(|n| n.starts_with("model.language_model.")) {
            "model.language_model."
        } else if names.iter().any(|n| n.starts_with("language_model.model.")) {
            // mlx-lm's layout of multimodal checkpoints (Qwen3.5).
            "language_model.model."
        } else {
            "model."
        };
        let mlx = match std::fs::read_to_string(dir.join("config.json")) {
            Ok(text) => {
                let v: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| ModelError::Config(format!("{}: {e}", dir.join("config.json").display())))?;
                super::mlx::MlxQuant::from_config(&v)?
            }
            Err(_) => None,
        };
        // mlx-lm's sanitised hybrid layout: the GDN conv as [C, K, 1] and norms as 1 + w.
        let norms_plus_one = st
            .tensors()
            .iter()
            .any(|(n, v)| n.ends_with("linear_attn.conv1d.weight") && matches!(v.shape(), [_, k, 1] if *k > 1));
        Ok(Self { st, names, device: device.clone(), prefix: prefix.into(), mlx, norms_plus_one })
    }

    /// The HF name of GGUF-style `gguf` in this checkpoint.
    fn hf(&self, gguf: &str) -> String {
        if gguf == "output.weight" && self.prefix == "language_model.model." {
            return "language_model.lm_head.weight".into();
        }
        hf_name(gguf, &self.prefix)
    }

    /// Whether `hf` is a zero-centred norm stored as 1 + w (mlx-lm's hybrid converters).
    fn baked_norm(&self, hf: &str) -> bool {
        self.norms_plus_one && super::mlx::is_baked_norm(hf)
    }

    /// mlx-lm's stacked experts: `{base}.experts.{e}.{proj}.weight`, which the checkpoint does
    /// not hold, read as expert `e` of `{base}.switch_mlp.{proj}.weight` (`[E, n, k]`, with
    /// `[E, n, groups]` scales and biases when quantised). The stacked name and `e`.
    fn switch_expert(&self, hf: &str) -> Option<(String, usize)> {
        let (base, rest) = hf.split_once(".experts.")?;
        let (e, tail) = rest.split_once('.')?;
        let e: usize = e.parse().ok()?;
        let stacked = format!("{base}.switch_mlp.{tail}");
        self.names.contains(&stacked).then_some((stacked, e))
    }

    /// Tensor `hf` from the files, or the expert slice [`Self::switch_expert`] names.
    fn load_raw(&self, hf: &str, device: &Device) -> Result<Tensor> {
        if self.names.contains(hf) {
            return Ok(self.st.load(hf, device)?);
        }
        match self.switch_expert(hf) {
            Some((stacked, e)) => {
                let t = self.st.load(&stacked, device)?;
                let experts = t.dims().first().copied().unwrap_or(0);
                if e >= experts {
                    return Err(ModelError::Config(format!("{stacked}: no expert {e} (it holds {experts})")));
                }
                Ok(t.get(e)?)
            }
            None => Err(ModelError::MissingTensor(hf.to_string())),
        }
    }

    /// The HF name of `gguf`'s weight when it is MLX-quantised (its `scales` tensor exists,
    /// beside it or beside its stacked experts).
    fn mlx_quantised(&self, gguf: &str) -> Option<String> {
        self.mlx.as_ref()?;
        let hf = self.hf(gguf);
        let stem = match self.switch_expert(&hf) {
            Some((stacked, _)) if !self.names.contains(&hf) => stacked,
            _ => hf.clone(),
        };
        let scales = format!("{}.scales", stem.strip_suffix(".weight")?);
        self.names.contains(&scales).then_some(hf)
    }

    /// An MLX-quantised weight: repacked as GGML blocks where that is exact, else f32 values.
    fn mlx_weight(&self, hf: &str) -> Result<MlxWeight> {
        let cfg = self.mlx.as_ref().ok_or_else(|| ModelError::Config("not an MLX checkpoint".into()))?;
        // An expert of stacked experts takes the stack's module settings.
        let module = match self.switch_expert(hf) {
            Some((stacked, _)) if !self.names.contains(hf) => stacked,
            _ => hf.to_string(),
        };
        let (bits, group) = cfg.params(&module)?;
        let stem = hf.strip_suffix(".weight").unwrap_or(hf);
        let cpu = Device::Cpu;
        let words = self.load_raw(hf, &cpu)?;
        let (n, wpr) = words.dims2()?;
        let words = words.flatten_all()?.to_vec1::<u32>()?;
        if let Some(fp) = cfg.fp_mode() {
            return self.mlx_fp_weight(stem, &words, (n, wpr * 32 / bits), fp);
        }
        let f32s = |name: String| -> Result<Vec<f32>> {
            Ok(self.load_raw(&name, &cpu)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
        };
        let (scales, biases) = (f32s(format!("{stem}.scales"))?, f32s(format!("{stem}.biases"))?);
        let k = wpr * 32 / bits;
        if scales.len() != n * (k / group) || biases.len() != scales.len() {
            return Err(ModelError::Config(format!(
                "{stem}: scales / biases do not fit [{n}, {k}] in groups of {group}"
            )));
        }
        let q = super::mlx::unpack(&words, n, k, bits)?;
        if let Some((ty, bytes)) = super::mlx::repack(&q, &scales, &biases, (n, k, group, bits)) {
            return Ok(MlxWeight::Ggml { ty, n, k, bytes });
        }
        if let Some((blocks, bias)) = crate::ops::quant::affine::split(&q, &scales, &biases, (n, k, group, bits)) {
            return Ok(MlxWeight::Affine { n, k, group, blocks, bias });
        }
        tracing::warn!("{stem}: MLX {bits}-bit weights dequantised to f32 (scales not exact in f16)");
        let vals = super::mlx::dequantize(&q, &scales, &biases, n, k, group);
        Ok(MlxWeight::F32(Tensor::from_vec(vals, (n, k), &cpu)?))
    }

    /// An MLX weight in a floating-point mode (`loader/mlx_fp.rs`): mxfp4 as Q5_0 blocks, the
    /// others (and mxfp4 scales f16 cannot hold) as bf16, both exact.
    fn mlx_fp_weight(
        &self,
        stem: &str,
        words: &[u32],
        (n, k): (usize, usize),
        fp: super::mlx_fp::FpMode,
    ) -> Result<MlxWeight> {
        let (bits, group) = fp.shape();
        let scales = self.load_raw(&format!("{stem}.scales"), &Device::Cpu)?;
        let scales = scales.flatten_all()?.to_vec1::<u8>()?;
        if !k.is_multiple_of(group) || scales.len() != n * (k / group) {
            return Err(ModelError::Config(format!(
                "{stem}: {} scales do not fit [{n}, {k}] in groups of {group} ({})",
                scales.len(),
                fp.name()
            )));
        }
        let codes = super::mlx::unpack(words, n, k, bits)?;
        if fp == super::mlx_fp::FpMode::Mxfp4 {
            if let Some(bytes) = super::mlx_fp::mxfp4_to_q5_0(&codes, &scales, n, k) {
                return Ok(MlxWeight::Ggml { ty: crate::ops::quant::QuantType::Q5_0, n, k, bytes });
            }
        }
        let vals = super::mlx_fp::dequantize(&codes, &scales, n, k, fp);
        if let Some(b) = super::mlx_fp::exact_bf16(&vals) {
            return Ok(MlxWeight::F32(Tensor::from_vec(b, (n, k), &Device::Cpu)?));
        }
        tracing::warn!("{stem}: MLX {} weights outside bf16's range, kept as f32", fp.name());
        Ok(MlxWeight::F32(Tensor::from_vec(vals, (n, k), &Device::Cpu)?))
    }

    /// An MLX-quantised weight as a matmul weight on the source's device.
    fn mlx_linear(&self, hf: &str) -> Result<LinearWeight> {
        Ok(match self.mlx_weight(hf)? {
            MlxWeight::Ggml { ty, n, k, bytes } if self.device.is_cpu() => {
                LinearWeight::Ggml(std::sync::Arc::new(crate::ops::quant::GgmlMatrix::from_bytes(ty, n, k, &bytes)?))
            }
            MlxWeight::Ggml { ty, n, k, bytes } => LinearWeight::Candle(QMatMul::from_arc(std::sync::Arc::new(
                candle_core::quantized::ggml_file::qtensor_from_ggml(ty.to_ggml(), &bytes, vec![n, k], &self.device)?,
            ))?),
            MlxWeight::Affine { n, k, group, blocks, bias } => LinearWeight::Affine(std::sync::Arc::new(
                crate::ops::quant::affine::AffineQ8::new(&blocks, bias, (n, k, group), &self.device)?,
            )),
            MlxWeight::F32(t) => LinearWeight::Candle(QMatMul::Tensor(t.to_device(&self.device)?)),
        })
    }

    fn load(&self, gguf: &str) -> Result<Tensor> {
        let name = self.hf(gguf);
        let t = self.load_raw(&name, &self.device)?.to_dtype(DType::F32)?;
        Ok(if self.baked_norm(&name) { t.affine(1.0, -1.0)? } else { t })
    }

    /// A matmul weight: bf16 and f16 matrices as stored (the CPU's dense kernels and the CUDA
    /// ones read them directly, with the bits of the same values widened to f32, in half the
    /// memory), anything else as f32.
    fn load_matrix(&self, gguf: &str) -> Result<Tensor> {
        let name = self.hf(gguf);
        let t = self.load_raw(&name, &self.device)?;
        let keep = matches!(t.dtype(), DType::BF16 | DType::F16) && t.rank() == 2 && !self.baked_norm(&name);
        Ok(if keep { t } else { t.to_dtype(DType::F32)? })
    }

    /// `safetensors`, or `safetensors (MLX affine 4-bit, groups of 64)`.
    pub fn format(&self) -> String {
        match &self.mlx {
            Some(q) => {
                let (bits, group) = q.params("").unwrap_or((0, 0));
                match q.fp_mode() {
                    Some(fp) => format!("safetensors (MLX {}, groups of {group})", fp.name()),
                    None => format!("safetensors (MLX affine {bits}-bit, groups of {group})"),
                }
            }
            None => "safetensors".into(),
        }
    }

    /// Tensors by type, and the parameter count. An MLX-quantised weight counts its unpacked
    /// values and shows its width and what it runs as (`MLX 4-bit affine -> Q4_1`); its scales
    /// and biases are metadata (`MLX scales / biases`), not parameters.
    pub fn tensor_types(&self) -> (BTreeMap<String, usize>, u64) {
        let mut types = BTreeMap::new();
        let mut params = 0u64;
        for (name, view) in self.st.tensors() {
            let elems = view.shape().iter().product::<usize>() as u64;
            let stem = name
                .strip_suffix(".weight")
                .or_else(|| name.strip_suffix(".scales"))
                .or_else(|| name.strip_suffix(".biases"));
            // The MLX config, for a weight or its scales / biases when the weight is quantised.
            let mlx = self.mlx.as_ref().filter(|_| stem.is_some_and(|s| self.names.contains(&format!("{s}.scales"))));
            let (label, count) = match mlx {
                Some(q) if name.ends_with(".weight") => {
                    let (bits, _) = q.params(&name).unwrap_or((32, 0));
                    let unpacked = elems * 32 / bits.max(1) as u64;
                    (mlx_label(q, bits), unpacked)
                }
                Some(_) => ("MLX scales / biases".to_string(), 0),
                None => (format!("{:?}", view.dtype()), elems),
            };
            *types.entry(label).or_insert(0) += 1;
            params += count;
        }
        (types, params)
    }
}

/// How an MLX-quantised weight of `bits` is read (see `loader/mlx.rs`, `loader/mlx_fp.rs`; a
/// tensor whose scales are not exact in f16 falls back to dense values).
fn mlx_label(q: &super::mlx::MlxQuant, bits: usize) -> String {
    use super::mlx_fp::FpMode;
    match q.fp_mode() {
        Some(FpMode::Mxfp4) => "MLX mxfp4 -> Q5_0".into(),
        Some(fp) => format!("MLX {} -> BF16", fp.name()),
        None => match bits {
            1..=4 => format!("MLX {bits}-bit affine -> Q4_1"),
            5 => "MLX 5-bit affine -> Q5_1".into(),
            _ => format!("MLX {bits}-bit affine -> Q8_0 + group biases"),
        },
    }
}

impl WeightSource for SafetensorsSource {
    fn has(&self, name: &str) -> bool {
        let hf = self.hf(name);
        self.names.contains(&hf) || self.switch_expert(&hf).is_some()
    }
    fn qmatmul(&self, name: &str) -> Result<LinearWeight> {
        if let Some(hf) = self.mlx_quantised(name) {
            return self.mlx_linear(&hf);
        }
        Ok(LinearWeight::Candle(QMatMul::Tensor(self.load_matrix(name)?)))
    }
    fn tensor_f32(&self, name: &str) -> Result<Tensor> {
        if let Some(hf) = self.mlx_quantised(name) {
            return Ok(match self.mlx_weight(&hf)? {
                MlxWeight::Ggml { ty, n, k, bytes } => Tensor::from_vec(
                    crate::ops::quant::GgmlMatrix::from_bytes(ty, n, k, &bytes)?.dequantize(),
                    (n, k),
                    &self.device,
                )?,
                MlxWeight::Affine { n, k, group, blocks, bias } => {
                    crate::ops::quant::affine::AffineQ8::new(&blocks, bias, (n, k, group), &Device::Cpu)?
                        .dequantize()?
                        .to_device(&self.device)?
                }
                MlxWeight::F32(t) => t.to_dtype(DType::F32)?.to_device(&self.device)?,
            });
        }
        self.load(name)
    }
    fn embedding(&self, name: &str) -> Result<Embedding> {
        if let Some(hf) = self.mlx_quantised(name) {
            return Ok(match self.mlx_linear(&hf)? {
                LinearWeight::Ggml(m) => Embedding::Ggml(m),
                LinearWeight::Candle(QMatMul::QTensor(q)) => Embedding::Quantized(q),
                LinearWeight::Candle(QMatMul::Tensor(t)) => Embedding::Dense(t.to_dtype(DType::F32)?),
                LinearWeight::Candle(QMatMul::TensorF16(t)) => Embedding::Dense(t.to_dtype(DType::F32)?),
                // Lookups need rows: the effective weights, dense (the tied head then runs dense).
                LinearWeight::Affine(a) => Embedding::Dense(a.dequantize()?.to_device(&self.device)?),
                LinearWeight::KQuant(m) => Embedding::KQuant(m),
            });
        }
        Ok(Embedding::Dense(self.load(name)?))
    }
    fn device(&self) -> &Device {
        &self.device
    }
}

pub(crate) fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|e| ModelError::io(&index, e))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", index.display())))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::Config(format!("{}: no weight_map", index.display())))?;
        let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
        files.sort();
        files.dedup();
        return Ok(files.into_iter().map(|f| dir.join(f)).collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::NotFound(format!("no *.safetensors in {}", dir.display())));
    }
    Ok(files)
}

pub fn read_config(dir: &Path) -> Result<LlamaConfig> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
    LlamaConfig::from_hf_json(&v)
}

pub fn load_hf_dir(dir: &Path, device: &Device, opts: &super::LoadOptions) -> Result<LoadedModel> {
    let cfg = read_config(dir)?;
    let src = SafetensorsSource::open(dir, device)?;
    let tokenizer = Tokenizer::from_hf_dir(dir)?;
    let model = crate::arch::llama::tp::load(&cfg, &src, opts)?;
    let summary = summary_of(&src, &cfg, dir)?;
    Ok(LoadedModel { model, tokenizer, chat_template: summary.chat_template.clone(), summary })
}

/// Describes a Hugging Face directory from its config and safetensors headers.
pub fn summarize(dir: &Path) -> Result<ModelSummary> {
    let cfg = read_config(dir)?;
    let src = SafetensorsSource::open(dir, &Device::Cpu)?;
    summary_of(&src, &cfg, dir)
}

pub(crate) fn summary_of(src: &SafetensorsSource, cfg: &LlamaConfig, dir: &Path) -> Result<ModelSummary> {
    let (tensor_types, parameters) = src.tensor_types();
    let file_bytes = shard_files(dir)?.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    Ok(ModelSummary {
        path: dir.display().to_string(),
        format: src.format(),
        parameters,
        file_bytes,
        tensor_types,
        chat_template: crate::chat_template::hf_chat_template(dir)?,
        ..ModelSummary::from_config(cfg)
    })
}

#[cfg(test)]
mod tests {
    use super::hf_name;

    #[test]
    fn maps_names() {
        assert_eq!(hf_name("blk.3.attn_q.bias", "model."), "model.layers.3.self_attn.q_proj.bias");
        assert_eq!(hf_name("blk.0.ffn_norm.weight", "model."), "model.layers.0.post_attention_layernorm.weight");
        assert_eq!(hf_name("token_embd.weight", "model.language_model."), "model.language_model.embed_tokens.weight");
        assert_eq!(hf_name("output.weight", "model."), "lm_head.weight");
    }
}
