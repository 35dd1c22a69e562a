//! GGUF files: memory-mapped, tensors read by name in whatever type the file stores.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::gguf_file::{self, Content};
use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Tensor};
use memmap2::Mmap;

use super::{Embedding, LinearWeight, LoadedModel, ModelSummary, WeightSource};
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::ops::quant::{GgmlMatrix, KQuantMatrix, QuantType};
use crate::tokenizer::Tokenizer;

/// An open GGUF file.
pub struct GgufSource {
    mmap: Mmap,
    pub content: Content,
    device: Device,
}

impl GgufSource {
    pub fn open(path: &Path, device: &Device) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: the file is opened read-only; tandem never writes model files while serving.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        // Every size, offset and count in the header is checked against the file first
        // (hostile or truncated files are errors, never panics or huge allocations).
        super::gguf_check::check(&mmap[..]).map_err(|e| ModelError::Config(format!("{}: {e}", path.display())))?;
        let content = crate::loader::contain(|| Content::read(&mut Cursor::new(&mmap[..])))
            .map_err(|_| {
                ModelError::Config(format!("{} is not a valid GGUF file (the reader gave up)", path.display()))
            })?
            .map_err(|e| ModelError::Config(format!("{} is not a valid GGUF file: {e}", path.display())))?;
        Ok(Self { mmap, content, device: device.clone() })
    }

    pub(crate) fn qtensor(&self, name: &str) -> Result<candle_core::quantized::QTensor> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        Ok(info.read(&mut Cursor::new(&self.mmap[..]), self.content.tensor_data_offset, &self.device)?)
    }

    /// A 2-D Q4_1 / Q5_0 / Q5_1 / Q8_0 tensor as a [`GgmlMatrix`] (blocks copied straight from the
    /// mapped file) when the model runs on the CPU; `None` for other types, shapes or devices,
    /// or when `TANDEM_QUANT_KERNEL=candle` asks for candle's own kernels (for comparisons).
    fn ggml_matrix(&self, name: &str) -> Result<Option<GgmlMatrix>> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let [n, k] = info.shape.dims() else { return Ok(None) };
        let Some(ty) = ggml_type(info.ggml_dtype, *n, *k, &self.device) else { return Ok(None) };
        // `TensorInfo::shape` is already in PyTorch order ([out, in]); GGUF stores it reversed.
        Ok(Some(GgmlMatrix::from_bytes(ty, *n, *k, self.tensor_bytes(name, info)?)?))
    }

    /// The mapped bytes of a tensor (`name` for the error).
    fn tensor_bytes(&self, name: &str, info: &gguf_file::TensorInfo) -> Result<&[u8]> {
        let start = (self.content.tensor_data_offset + info.offset) as usize;
        let len = info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
        self.mmap.get(start..start + len).ok_or_else(|| {
            ModelError::Config(format!("{name}: its {len} bytes at {start} run past the end of the file"))
        })
    }

    /// A 2-D Q4_K / Q5_K (Q6_K: see [`crate::ops::quant::kquant::takes`]) tensor as a [`KQuantMatrix`] (packed straight from the mapped file)
    /// when the model runs on a CPU that has our kernel; `None` otherwise (candle's `QMatMul`).
    fn kquant_matrix(&self, name: &str, head: bool) -> Result<Option<KQuantMatrix>> {
        let info = self.content.tensor_infos.get(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let ([n, k], true) = (info.shape.dims(), takes_kquant(info.ggml_dtype, info.shape.dims(), head, &self.device))
        else {
            return Ok(None);
        };
        Ok(Some(KQuantMatrix::from_bytes(info.ggml_dtype, *n, *k, self.tensor_bytes(name, info)?)?))
    }

    pub fn metadata(&self) -> &std::collections::HashMap<String, gguf_file::Value> {
        &self.content.metadata
    }

    pub fn tensor_types(&self) -> (BTreeMap<String, usize>, u64) {
        let mut types = BTreeMap::new();
        let mut params = 0u64;
        for info in self.content.tensor_infos.values() {
            *types.entry(format!("{:?}", info.ggml_dtype)).or_insert(0) += 1;
            params += info.shape.elem_count() as u64;
        }
        (types, params)
    }
}

impl WeightSource for GgufSource {
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }
    fn qmatmul(&self, name: &str) -> Result<LinearWeight> {
        if let Some(w) = self.ggml_matrix(name)? {
            return Ok(LinearWeight::Ggml(Arc::new(w)));
        }
        if let Some(w) = self.kquant_matrix(name, name == "output.weight")? {
            return Ok(LinearWeight::KQuant(Arc::new(w)));
        }
        candle_linear(self.qtensor(name)?, &self.device)
    }
    fn stored_matrix(&self, name: &str) -> Result<Option<candle_core::quantized::QTensor>> {
        match self.content.tensor_infos.get(name) {
            Some(info) if info.shape.rank() == 2 => Ok(Some(self.qtensor(name)?)),
            _ => Ok(None),
        }
    }
    fn stored_slice(
        &self,
        name: &str,
        dim: usize,
        ranges: &super::weights::SliceRanges<'_>,
    ) -> Result<Option<candle_core::quantized::QTensor>> {
        // The slice's blocks straight from the mapped file: no copy of the whole matrix first
        // (nor, on a GPU, an upload and a read back of it).
        let Some(info) = self.content.tensor_infos.get(name).filter(|i| i.shape.rank() == 2) else { return Ok(None) };
        let (rows, cols) = info.shape.dims2()?;
        let dtype = info.ggml_dtype;
        let (bytes, shape) =
            super::shard::slice_bytes(self.tensor_bytes(name, info)?, (rows, cols), dtype, dim, &ranges(dtype)?)?;
        let storage = candle_core::quantized::QStorage::from_data(std::borrow::Cow::Owned(bytes), &self.device, dtype)?;
        Ok(Some(candle_core::quantized::QTensor::new(storage, shape)?))
    }
    fn tensor_f32(&self, name: &str) -> Result<Tensor> {
        Ok(self.qtensor(name)?.dequantize(&self.device)?.to_dtype(DType::F32)?)
    }
    fn embedding(&self, name: &str) -> Result<Embedding> {
        // Packed from the mapped bytes where our kernels take the table (no copy first).
        let tied = !self.has("output.weight");
        if let Some(w) = self.ggml_matrix(name)? {
            return Ok(Embedding::Ggml(Arc::new(w)));
        }
        if tied {
            if let Some(w) = self.kquant_matrix(name, true)? {
                return Ok(Embedding::KQuant(Arc::new(w)));
            }
        }
        embedding_of_stored(self.qtensor(name)?, tied)
    }
    fn device(&self) -> &Device {
        &self.device
    }
}

/// Whether a CPU model runs a `ty` matrix `[n, k]` on our [`GgmlMatrix`] kernels rather than
/// candle's (GGUF weights, and weights quantised at load alike).
/// The block type of a `[n, k]` matrix of `dtype` on `device` where it runs on our 32-value
/// block kernels ([`GgmlMatrix`]); `None` where it does not.
fn ggml_type(dtype: candle_core::quantized::GgmlDType, n: usize, k: usize, device: &Device) -> Option<QuantType> {
    let ty = QuantType::from_ggml(dtype)?;
    (device.is_cpu() && !crate::ops::quant::Kernel::candle_only() && prefers_own_kernel(ty, n, k)).then_some(ty)
}

/// Whether a matrix of `dtype` and `dims` on `device` runs on our K-quant tiles
/// ([`KQuantMatrix`]); `head`: it is the LM head.
fn takes_kquant(dtype: candle_core::quantized::GgmlDType, dims: &[usize], head: bool, device: &Device) -> bool {
    // Q6K layer matrices come here where `kquant::q6k_layers` says (by default on Zen 5 and
    // later: faster prefill, the same decode; elsewhere the Q6K pair kernel, `row_stable`,
    // decodes faster), and an LM head, which only ever multiplies one row per sequence, always
    // stays on the pair kernel.
    let takes = crate::ops::quant::kquant::takes(dtype, head) && device.is_cpu();
    match dims {
        [_, k] => {
            takes
                && crate::ops::quant::kquant::available()
                && crate::ops::quant::kquant::fits(dtype, *k)
                && (dtype != candle_core::quantized::GgmlDType::Q8_0 || crate::ops::quant::kquant::q8_tiles_for(*k))
        }
        _ => false,
    }
}

/// A stored matrix on candle's side: 16-bit matrices stay 16-bit (the dense kernels read them
/// and widen exactly; candle would widen them to f32), the rest as a `QMatMul`.
fn candle_linear(q: candle_core::quantized::QTensor, device: &Device) -> Result<LinearWeight> {
    let keep = match q.dtype() {
        candle_core::quantized::GgmlDType::F16 => Some(DType::F16),
        candle_core::quantized::GgmlDType::BF16 => Some(DType::BF16),
        _ => None,
    };
    if let (Some(dt), 2) = (keep, q.rank()) {
        return Ok(LinearWeight::Candle(QMatMul::Tensor(q.dequantize(device)?.to_dtype(dt)?)));
    }
    Ok(LinearWeight::Candle(QMatMul::from_qtensor(q)?))
}

/// The token embedding table for a stored matrix (a GGUF tensor, or a tensor-parallel slice
/// of one's rows) as the GGUF loader makes it: on our block kernels where they take it; a
/// `tied` table (no `output.weight`: it is the LM head too) on our K-quant tiles where they
/// take it as a head, packed once for both uses (lookups dequantise the tiles); 16- and 32-bit
/// tables dense f32; the rest as stored.
pub(crate) fn embedding_of_stored(q: candle_core::quantized::QTensor, tied: bool) -> Result<Embedding> {
    let device = q.device();
    let dims = q.shape().dims().to_vec();
    if let [n, k] = dims[..] {
        if let Some(ty) = ggml_type(q.dtype(), n, k, &device) {
            return Ok(Embedding::Ggml(Arc::new(GgmlMatrix::from_bytes(ty, n, k, &q.data()?)?)));
        }
        if tied && takes_kquant(q.dtype(), &dims, true, &device) {
            return Ok(Embedding::KQuant(Arc::new(KQuantMatrix::from_bytes(q.dtype(), n, k, &q.data()?)?)));
        }
    }
    Ok(match q.dtype() {
        candle_core::quantized::GgmlDType::F32
        | candle_core::quantized::GgmlDType::F16
        | candle_core::quantized::GgmlDType::BF16 => Embedding::Dense(q.dequantize(&device)?.to_dtype(DType::F32)?),
        _ => Embedding::Quantized(Arc::new(q)),
    })
}

/// The layer weight for a stored matrix (a GGUF tensor, or a tensor-parallel slice of one) as
/// the GGUF loader makes it: on our block or K-quant kernels where they take it, else candle's.
pub(crate) fn linear_of_stored(q: candle_core::quantized::QTensor, head: bool) -> Result<LinearWeight> {
    let device = q.device();
    let dims = q.shape().dims().to_vec();
    if let [n, k] = dims[..] {
        if let Some(ty) = ggml_type(q.dtype(), n, k, &device) {
            return Ok(LinearWeight::Ggml(Arc::new(GgmlMatrix::from_bytes(ty, n, k, &q.data()?)?)));
        }
        if takes_kquant(q.dtype(), &dims, head, &device) {
            return Ok(LinearWeight::KQuant(Arc::new(KQuantMatrix::from_bytes(q.dtype(), n, k, &q.data()?)?)));
        }
    }
    candle_linear(q, &device)
}

pub(crate) fn prefers_own_kernel(ty: QuantType, n: usize, k: usize) -> bool {
    // Q8_0 has SIMD kernels in candle on every CPU (NEON included): ours only where ours
    // are SIMD too (x86 with AVX2), never the scalar reference in their place.
    if ty == QuantType::Q8_0 && crate::ops::quant::Kernel::best() == crate::ops::quant::Kernel::Reference {
        return false;
    }
    // Q8_0: where candle repacks the matrix into VNNI tiles (k a multiple of 256, n of 16,
    // a CPU with VNNI) those beat our row-major blocks (random 0.8B hybrid, 2 threads:
    // pp512 180 vs 123 tok/s, decode 25.2 vs 15.4); elsewhere candle runs its compact
    // blocks and ours win (SmolLM2, k = 576: decode 112 vs 103; qwen2.5-coder-0.5b's tied
    // 151,936 x 896 head: 27.3 vs 22.7). `TANDEM_Q8_KERNEL=ours|candle` forces one side.
    // Where `kquant::q8_tiles_for` holds (`kquant::q8_tiles`: the AVX-512 K-quant kernel, or
    // its AVX2 build on Zen 3, or `TANDEM_Q8_KERNEL=tiles`; rows of whole superblocks, or any
    // multiple of 32 on the AVX2 build), Q8_0 matrices go to its Q8_0 tiles (`kquant::tile8`;
    // the loaders' K-quant path) instead: one
    // float operation per block and column where our block kernels spend eight (Zen 4, random
    // 0.8B hybrid, 2 threads: pp512 256 tok/s against 203 on candle's tiles and 140 on ours,
    // tg64 31.8 against 25.6 and 33.5; 1 thread tg32 27.1 against 23.1 on ours).
    // Q5_0 goes to the kernel's Q5_0 tiles (`kquant::tile50`, rows of any multiple of 32
    // values) on the same CPUs, for the same reason.
    if ty == QuantType::Q5_0 && crate::ops::quant::kquant::q50_tiles() {
        return false;
    }
    if ty == QuantType::Q8_0 {
        if crate::ops::quant::kquant::q8_tiles_for(k) {
            return false;
        }
        let candle_repacks =
            k.is_multiple_of(256) && n.is_multiple_of(16) && crate::ops::quant::Kernel::best().is_vnni();
        let ours = match std::env::var("TANDEM_Q8_KERNEL").as_deref() {
            Ok("ours") => true,
            Ok("candle") => false,
            _ => !candle_repacks,
        };
        if !ours {
            return false;
        }
    }
    true
}

/// Reads only the metadata and builds the config (no weights): for `inspect` and estimates.
pub fn read_config(src: &GgufSource) -> Result<LlamaConfig> {
    LlamaConfig::from_gguf(
        src.metadata(),
        src.has("output.weight"),
        src.has("blk.0.attn_q.bias"),
        src.has("blk.0.attn_q_norm.weight"),
    )
}

pub fn load_gguf(path: &Path, device: &Device, opts: &super::LoadOptions) -> Result<LoadedModel> {
    let src = GgufSource::open(path, device)?;
    let cfg = read_config(&src)?;
    let tokenizer = Tokenizer::from_gguf(&src.content)?;
    let model = crate::arch::llama::tp::load(&cfg, &src, opts)?;
    let summary = summary_of(&src, &cfg, path);
    Ok(LoadedModel { model, tokenizer, chat_template: summary.chat_template.clone(), summary })
}

/// Describes a GGUF file from its metadata alone (no weights are read).
pub fn summarize(path: &Path) -> Result<ModelSummary> {
    let src = GgufSource::open(path, &Device::Cpu)?;
    let cfg = read_config(&src)?;
    Ok(summary_of(&src, &cfg, path))
}

pub(crate) fn summary_of(src: &GgufSource, cfg: &LlamaConfig, path: &Path) -> ModelSummary {
    let chat_template = src.metadata().get("tokenizer.chat_template").and_then(|v| v.to_string().ok()).cloned();
    let (tensor_types, parameters) = src.tensor_types();
    ModelSummary {
        path: path.display().to_string(),
        format: "gguf".into(),
        parameters,
        file_bytes: src.mmap.len() as u64,
        tensor_types,
        chat_template,
        ..ModelSummary::from_config(cfg)
    }
}
