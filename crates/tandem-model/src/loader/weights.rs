//! The layer building blocks every format hands out: [`LinearWeight`] / [`Linear`] (a matmul
//! weight kept as the file stores it, with the row-invariant forward), [`Embedding`], and the
//! [`WeightSource`] trait the architectures load through (tensors by GGUF-style name, stacked
//! experts). Format dispatch and model assembly stay in the parent module.

use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor};
use candle_core::{Device, Tensor};

use crate::error::{ModelError, Result};

/// The ranges of a stored slice ([`WeightSource::stored_slice`]) for the matrix's block type
/// (a column cut keeps whole blocks).
pub type SliceRanges<'a> = dyn Fn(candle_core::quantized::GgmlDType) -> Result<Vec<std::ops::Range<usize>>> + 'a;
use crate::ops::quant::{GgmlMatrix, KQuantMatrix};

/// The weight of a [`Linear`]: candle's `QMatMul` (dense, GPU, or quantised types candle has
/// fast kernels for), our own CPU kernels for GGML Q4_1 / Q5_0 / Q5_1 / Q8_0 blocks and for
/// the K-quants, Q8_0, Q5_0 and Q4_0 as tiles (packed at load, [`KQuantMatrix`]), or an affine
/// weight with group biases (MLX 6/8-bit).
#[derive(Debug, Clone)]
pub enum LinearWeight {
    Candle(QMatMul),
    Ggml(Arc<GgmlMatrix>),
    /// Affine 6/8-bit weights (mlx's) as Q8_0 plus group biases (`ops::quant::affine`).
    Affine(Arc<crate::ops::quant::affine::AffineQ8>),
    /// Q2_K .. Q6_K, Q8_0, Q5_0, Q4_0 on the CPU where our kernel runs (AVX-512 VNNI or AVX2;
    /// [`crate::ops::quant::kquant::takes`]).
    KQuant(Arc<KQuantMatrix>),
}

impl LinearWeight {
    /// `x · Wᵀ` for `x` `[..., k]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            // Each row gets the same bits whatever the number of rows (decode = verify).
            LinearWeight::Candle(w) => crate::ops::quant::row_stable::forward(w, x)?,
            LinearWeight::Ggml(w) => w.forward(x)?,
            LinearWeight::Affine(w) => w.forward(x)?,
            LinearWeight::KQuant(w) => w.forward(x)?,
        })
    }
}

impl LinearWeight {
    /// `(rows, cols)` of W: outputs by inputs.
    pub fn dims(&self) -> Result<(usize, usize)> {
        Ok(match self {
            LinearWeight::Candle(QMatMul::QTensor(q)) => q.shape().dims2()?,
            LinearWeight::Candle(QMatMul::Tensor(t)) | LinearWeight::Candle(QMatMul::TensorF16(t)) => t.dims2()?,
            LinearWeight::Ggml(w) => (w.n(), w.k()),
            LinearWeight::Affine(w) => w.dims(),
            LinearWeight::KQuant(w) => (w.n(), w.k()),
        })
    }

    /// The first `n` output rows of W (`n` at most its row count): a copy in the same format.
    pub fn first_rows(&self, n: usize) -> Result<LinearWeight> {
        let too_many = |rows: usize| ModelError::Input(format!("cannot take {n} rows of a {rows}-row weight"));
        Ok(match self {
            LinearWeight::Candle(QMatMul::QTensor(q)) => {
                let (rows, k) = q.shape().dims2()?;
                if n > rows {
                    return Err(too_many(rows));
                }
                let dtype = q.dtype();
                let row_bytes = k / dtype.block_size() * dtype.type_size();
                let data = q.data()?;
                let storage = candle_core::quantized::QStorage::from_data(
                    std::borrow::Cow::Owned(data[..n * row_bytes].to_vec()),
                    &q.device(),
                    dtype,
                )?;
                LinearWeight::Candle(QMatMul::from_qtensor(QTensor::new(storage, (n, k))?)?)
            }
            LinearWeight::Candle(QMatMul::Tensor(t)) => {
                if n > t.dim(0)? {
                    return Err(too_many(t.dim(0)?));
                }
                LinearWeight::Candle(QMatMul::Tensor(t.narrow(0, 0, n)?.contiguous()?))
            }
            LinearWeight::Candle(QMatMul::TensorF16(t)) => {
                if n > t.dim(0)? {
                    return Err(too_many(t.dim(0)?));
                }
                LinearWeight::Candle(QMatMul::TensorF16(t.narrow(0, 0, n)?.contiguous()?))
            }
            LinearWeight::Ggml(w) => {
                if n > w.n() {
                    return Err(too_many(w.n()));
                }
                let bytes = w.to_bytes();
                let row_bytes = bytes.len() / w.n().max(1);
                LinearWeight::Ggml(Arc::new(GgmlMatrix::from_bytes(w.quant_type(), n, w.k(), &bytes[..n * row_bytes])?))
            }
            LinearWeight::Affine(w) => {
                if n > w.dims().0 {
                    return Err(too_many(w.dims().0));
                }
                LinearWeight::Affine(Arc::new(w.first_rows(n)?))
            }
            LinearWeight::KQuant(w) => {
                if n > w.n() {
                    return Err(too_many(w.n()));
                }
                LinearWeight::KQuant(Arc::new(w.first_rows(n)))
            }
        })
    }
}

/// A linear layer `y = x Wᵀ (+ b)`, with W quantised or dense.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: LinearWeight,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// `x` is `[rows, k]` (any strides), the result f32 `[rows, n]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.weight.forward(x)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// `silu(g) ⊙ u` through the layer (a gated MLP's down projection), `g` and `u` `[rows, k]`
    /// f32: on CUDA, where the weights' kernel forms the activations as it reads them, one
    /// launch (`row_stable::forward_gated`), else `silu_mul` and [`Self::forward`]; the same bits.
    pub fn forward_silu_mul(&self, g: &Tensor, u: &Tensor) -> Result<Tensor> {
        if let (LinearWeight::Candle(w), None) = (&self.weight, &self.bias) {
            if let Some(y) = crate::ops::quant::row_stable::forward_gated(w, g, u)? {
                return Ok(y);
            }
        }
        self.forward(&crate::ops::norm::silu_mul(g, u)?)
    }
}

impl Linear {
    /// Checks that W is `rows` (one of them) by `cols`, as the config says: a config that
    /// disagrees with the tensors the file holds is an error at load, before anything is sized
    /// from it (KV pools, recurrent state).
    pub fn expect(self, name: &str, rows: &[usize], cols: usize) -> Result<Self> {
        let (r, c) = self.weight.dims()?;
        if !rows.contains(&r) || c != cols {
            return Err(ModelError::Config(format!(
                "{name}: shape [{r}, {c}] does not fit the config (expected [{}, {cols}])",
                rows.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" or ")
            )));
        }
        Ok(self)
    }

    /// The layer restricted to its first `n` outputs.
    pub fn first_rows(&self, n: usize) -> Result<Linear> {
        let bias = match &self.bias {
            Some(b) => Some(b.narrow(0, 0, n)?),
            None => None,
        };
        Ok(Linear { weight: self.weight.first_rows(n)?, bias })
    }
}

/// Linear layers that read the same input (`[q | k | v]`, `[gate | up]`): on CUDA one fused
/// matmul where the weights allow (`ops::quant::cuda_fused`; the same bits as separate calls),
/// otherwise each on its own. `TANDEM_FUSE_PROJECTIONS=0` keeps them separate (comparisons).
pub enum LinearSet {
    Each(Vec<Linear>),
    #[cfg(feature = "cuda")]
    Fused(crate::ops::quant::cuda_fused::FusedLinear),
}

impl LinearSet {
    pub fn new(parts: Vec<Linear>) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if Self::fusing_enabled() {
            let refs: Vec<&Linear> = parts.iter().collect();
            if let Some(f) = crate::ops::quant::cuda_fused::FusedLinear::new(&refs)? {
                return Ok(LinearSet::Fused(f));
            }
        }
        Ok(LinearSet::Each(parts))
    }

    /// Each layer's output for `x` `[rows, k]`, in order.
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        match self {
            LinearSet::Each(ls) => ls.iter().map(|l| l.forward(x)).collect(),
            #[cfg(feature = "cuda")]
            LinearSet::Fused(f) => f.forward(x),
        }
    }

    /// [`Self::forward`] for a set of exactly `N` layers, as an array.
    pub fn forward_array<const N: usize>(&self, x: &Tensor) -> Result<[Tensor; N]> {
        let outs = self.forward(x)?;
        let got = outs.len();
        outs.try_into().map_err(|_| ModelError::Input(format!("{got} projections where {N} were expected")))
    }

    /// Whether the layers run as one matmul.
    pub fn is_fused(&self) -> bool {
        !matches!(self, LinearSet::Each(_))
    }

    /// Whether projections are fused where they can be (`TANDEM_FUSE_PROJECTIONS` is not `0`).
    pub fn fusing_enabled() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::env::var("TANDEM_FUSE_PROJECTIONS").as_deref() != Ok("0"))
    }
}

/// A token-embedding table.
#[derive(Debug, Clone)]
pub enum Embedding {
    Quantized(Arc<QTensor>),
    /// Q4_1 / Q5_0 / Q5_1 on the CPU: rows dequantised on lookup, and the same blocks serve
    /// as a tied LM head.
    Ggml(Arc<GgmlMatrix>),
    /// Q2K / Q4K / Q5K / Q8_0 on a CPU with our K-quant kernel: rows dequantised from the packed
    /// tiles on lookup, and the tiles serve as a tied LM head.
    KQuant(Arc<KQuantMatrix>),
    Dense(Tensor),
}

impl Embedding {
    /// `(vocabulary, hidden)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        Ok(match self {
            Embedding::Quantized(q) => q.shape().dims2()?,
            Embedding::Ggml(w) => (w.n(), w.k()),
            Embedding::KQuant(w) => (w.n(), w.k()),
            Embedding::Dense(t) => t.dims2()?,
        })
    }

    /// Checks the table is `vocab x hidden` (see [`Linear::expect`]).
    pub fn expect(self, name: &str, vocab: usize, hidden: usize) -> Result<Self> {
        let (v, h) = self.dims()?;
        if v != vocab || h != hidden {
            return Err(ModelError::Config(format!(
                "{name}: shape [{v}, {h}] does not fit the config (expected [{vocab}, {hidden}])"
            )));
        }
        Ok(self)
    }

    /// Rows for `ids` as f32, `[ids.len(), hidden]`.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Embedding::Quantized(q) => q.embedding(ids)?.to_dtype(candle_core::DType::F32)?,
            Embedding::Ggml(w) => lookup(ids, w.n(), w.k(), |id, row| w.dequantize_row(id, row))?,
            Embedding::KQuant(w) => lookup(ids, w.n(), w.k(), |id, row| w.dequantize_row(id, row))?,
            Embedding::Dense(t) => t.index_select(ids, 0)?,
        })
    }

    /// The same table as an output projection (tied embeddings).
    pub fn as_linear(&self) -> Result<Linear> {
        let weight = match self {
            Embedding::Quantized(q) => LinearWeight::Candle(QMatMul::from_arc(q.clone())?),
            Embedding::Ggml(w) => LinearWeight::Ggml(w.clone()),
            Embedding::KQuant(w) => LinearWeight::KQuant(w.clone()),
            Embedding::Dense(t) => LinearWeight::Candle(QMatMul::Tensor(t.clone())),
        };
        Ok(Linear { weight, bias: None })
    }
}

/// The rows `ids` of an `n x k` table that `row(id, out)` dequantises, as `[ids.len(), k]` f32
/// on the CPU; an id outside the table is an input error.
fn lookup(ids: &Tensor, n: usize, k: usize, row: impl Fn(usize, &mut [f32])) -> Result<Tensor> {
    let ids = ids.flatten_all()?.to_dtype(candle_core::DType::U32)?.to_vec1::<u32>()?;
    let mut out = vec![0f32; ids.len() * k];
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(k)) {
        if id as usize >= n {
            return Err(ModelError::Input(format!("token id {id} is outside the embedding table")));
        }
        row(id as usize, o);
    }
    Ok(Tensor::from_vec(out, (ids.len(), k), &Device::Cpu)?)
}

/// See [`WeightSource::stacked_experts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackedExperts {
    pub storage: String,
    pub experts: usize,
    pub rows_per_expert: usize,
    pub row0: usize,
}

/// Tensors by GGUF-style name, whatever the container format.
pub trait WeightSource {
    fn has(&self, name: &str) -> bool;
    /// A weight for a matmul, kept quantised where the file is quantised.
    fn qmatmul(&self, name: &str) -> Result<LinearWeight>;
    /// Any tensor, dequantised to f32 (norm weights, biases).
    fn tensor_f32(&self, name: &str) -> Result<Tensor>;
    fn embedding(&self, name: &str) -> Result<Embedding>;
    fn device(&self) -> &Device;

    /// Where the file stacks projection `proj` (`gate_proj`, `up_proj`, `down_proj`) of every
    /// expert of the MoE block at `prefix` in one tensor: its name, its rows per expert and the
    /// row this projection starts at (gate and up fused in one tensor share a name). `None`
    /// where the source serves experts one by one.
    fn stacked_experts(&self, prefix: &str, proj: &str) -> Result<Option<StackedExperts>> {
        let _ = (prefix, proj);
        Ok(None)
    }
    /// A matrix exactly as the file stores it, where this source would repack it for the CPU's
    /// kernels (GGUF): tensor parallelism cuts the stored blocks, then packs the slice.
    /// `None` where the source hands out matrices as stored anyway.
    fn stored_matrix(&self, name: &str) -> Result<Option<candle_core::quantized::QTensor>> {
        let _ = name;
        Ok(None)
    }
    /// [`Self::stored_matrix`]'s rows (`dim` 0) or columns (`dim` 1) `ranges(dtype)`, its stored
    /// blocks cut (`shard::quantised_slice`); a source that can read the slice alone (GGUF's
    /// mapped bytes) does so rather than copy the whole matrix first. `None` where
    /// `stored_matrix` is.
    fn stored_slice(&self, name: &str, dim: usize, ranges: &SliceRanges<'_>) -> Result<Option<QTensor>> {
        match self.stored_matrix(name)? {
            Some(q) => Ok(Some(crate::loader::shard::quantised_slice(&q, dim, &ranges(q.dtype())?)?)),
            None => Ok(None),
        }
    }
    /// The storage behind [`StackedExperts::storage`], kept as the file stores it.
    fn stacked_data(&self, storage: &str) -> Result<crate::ops::moe::StackData> {
        Err(ModelError::MissingTensor(storage.to_string()))
    }

    fn linear(&self, name: &str) -> Result<Linear> {
        let bias_name = name.strip_suffix(".weight").map(|p| format!("{p}.bias"));
        let bias = match bias_name {
            Some(b) if self.has(&b) => Some(self.tensor_f32(&b)?),
            _ => None,
        };
        Ok(Linear { weight: self.qmatmul(name)?, bias })
    }
}
