//! Load-time quantisation (`--quantize`): a [`WeightSource`] wrapper that hands out every
//! matmul weight and the token embedding in a chosen GGML type, whatever the file holds (bf16
//! or f32 safetensors, a GGUF of another type). Each tensor is read as f32, quantised on the
//! host in parallel pieces ([`quantise_onto`]) and placed on the model's device, one tensor at
//! a time, so the peak memory above the result is one tensor's f32 copy. Norms, biases, GDN
//! parameters and everything else read with [`WeightSource::tensor_f32`] stay f32, and MoE
//! experts a GGUF stacks in one tensor keep the file's type.
//!
//! Per tensor: the LM head (and a tied embedding, which is the head) takes Q6_K where the
//! target has fewer than six bits, as llama.cpp's `Q4_K_M` does; K-quant types need rows that
//! are multiples of 256 values and fall back to Q8_0 elsewhere; 32-value block types need
//! multiples of 32 and leave other rows f32. `f16` / `bf16` keep matmul weights 16-bit dense on
//! a GPU; on the CPU (f32 kernels) they round the values to 16 bits and hold them as f32.

use std::str::FromStr;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul};
use candle_core::{DType, Device, Tensor};

use super::gguf::prefers_own_kernel;
use super::{Embedding, LinearWeight, StackedExperts, WeightSource};
use crate::arch::qwen_hybrid::to_gguf::quantise_onto;
use crate::error::{ModelError, Result};
use crate::ops::quant::{GgmlMatrix, KQuantMatrix, Kernel, QuantType};

/// Rows quantised per parallel piece (values).
const PIECE: usize = 1 << 22;

/// What `--quantize` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightQuant(pub GgmlDType);

impl FromStr for WeightQuant {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self> {
        Ok(Self(match s.to_ascii_lowercase().as_str() {
            "f16" => GgmlDType::F16,
            "bf16" => GgmlDType::BF16,
            "q8_0" => GgmlDType::Q8_0,
            "q6_k" => GgmlDType::Q6K,
            "q5_k" => GgmlDType::Q5K,
            "q5_1" => GgmlDType::Q5_1,
            "q5_0" => GgmlDType::Q5_0,
            "q4_k" => GgmlDType::Q4K,
            "q4_1" => GgmlDType::Q4_1,
            "q4_0" => GgmlDType::Q4_0,
            "q3_k" => GgmlDType::Q3K,
            "q2_k" => GgmlDType::Q2K,
            other => {
                return Err(ModelError::Config(format!(
                    "unknown --quantize type `{other}` (f16, bf16, q8_0, q6_k, q5_k, q5_1, q5_0, q4_k, q4_1, q4_0, \
                     q3_k, q2_k)"
                )))
            }
        }))
    }
}

impl std::fmt::Display for WeightQuant {
    /// The name `--quantize` takes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            GgmlDType::Q2K => "q2_k",
            GgmlDType::Q3K => "q3_k",
            GgmlDType::Q4K => "q4_k",
            GgmlDType::Q5K => "q5_k",
            GgmlDType::Q6K => "q6_k",
            GgmlDType::Q8K => "q8_k",
            other => return write!(f, "{}", format!("{other:?}").to_ascii_lowercase()),
        };
        f.write_str(name)
    }
}

fn bits(t: GgmlDType) -> f32 {
    match t {
        GgmlDType::Q2K => 2.6,
        GgmlDType::Q3K => 3.4,
        GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q4K => 4.5,
        GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q5K => 5.5,
        GgmlDType::Q6K => 6.6,
        GgmlDType::Q8_0 => 8.5,
        _ => 16.0,
    }
}

fn is_k_quant(t: GgmlDType) -> bool {
    matches!(t, GgmlDType::Q2K | GgmlDType::Q3K | GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K)
}

impl WeightQuant {
    /// The type a matrix with rows of `k` values gets (`head`: the LM head or a tied
    /// embedding); `None` keeps it as the file has it (rows that fit no block).
    pub fn type_for(&self, k: usize, head: bool) -> Option<GgmlDType> {
        let mut t = self.0;
        if matches!(t, GgmlDType::F16 | GgmlDType::BF16) {
            return Some(t);
        }
        if head && bits(t) < 6.0 {
            t = GgmlDType::Q6K;
        }
        if is_k_quant(t) && !k.is_multiple_of(256) {
            t = GgmlDType::Q8_0;
        }
        k.is_multiple_of(32).then_some(t)
    }
}

/// A source whose matmul weights and embedding come out as `quant` asks.
pub struct Quantizing<'a> {
    inner: &'a dyn WeightSource,
    quant: WeightQuant,
}

impl<'a> Quantizing<'a> {
    pub fn new(inner: &'a dyn WeightSource, quant: WeightQuant) -> Self {
        Self { inner, quant }
    }

    /// `name`'s weights on the host as f32 `[n, k]`, and the type they get.
    fn plan(&self, name: &str, head: bool) -> Result<(Tensor, Option<GgmlDType>)> {
        let t = self.inner.tensor_f32(name)?.to_device(&Device::Cpu)?;
        let k = t.dims().last().copied().unwrap_or(0);
        let ty = if t.rank() == 2 { self.quant.type_for(k, head) } else { None };
        Ok((t, ty))
    }

    fn is_head(&self, name: &str) -> bool {
        name == "output.weight" || (name == "token_embd.weight" && !self.inner.has("output.weight"))
    }
}

/// The CPU kernel of our own that a matrix `q` quantised to `ty` (`dims` `[n, k]`) runs on,
/// as a GGUF of this type would get it: the block kernels, else the K-quant tiles where
/// `kquant_head` is given (whether the matrix is an LM head); `None`: candle's `QMatMul`.
fn own_kernel(
    q: &candle_core::quantized::QTensor,
    ty: GgmlDType,
    dims: &[usize],
    dev: &Device,
    kquant_head: Option<bool>,
) -> Result<Option<LinearWeight>> {
    let (true, [n, k]) = (dev.is_cpu(), dims) else { return Ok(None) };
    if let Some(qt) = QuantType::from_ggml(ty) {
        if !Kernel::candle_only() && prefers_own_kernel(qt, *n, *k) {
            return Ok(Some(LinearWeight::Ggml(Arc::new(GgmlMatrix::from_bytes(qt, *n, *k, &q.data()?)?))));
        }
    }
    let takes = kquant_head.is_some_and(|head| crate::ops::quant::kquant::takes(ty, head));
    if takes && crate::ops::quant::kquant::available() {
        return Ok(Some(LinearWeight::KQuant(Arc::new(KQuantMatrix::from_bytes(ty, *n, *k, &q.data()?)?))));
    }
    Ok(None)
}

impl WeightSource for Quantizing<'_> {
    fn has(&self, name: &str) -> bool {
        self.inner.has(name)
    }

    fn qmatmul(&self, name: &str) -> Result<LinearWeight> {
        let (t, ty) = self.plan(name, self.is_head(name))?;
        let dev = self.inner.device();
        Ok(LinearWeight::Candle(match ty {
            None => QMatMul::Tensor(t.to_device(dev)?),
            // 16-bit dense: kept 16-bit on every device (the dense kernels read bf16 / f16 rows).
            Some(ty @ (GgmlDType::F16 | GgmlDType::BF16)) => {
                let t16 = t.to_dtype(if ty == GgmlDType::F16 { DType::F16 } else { DType::BF16 })?;
                QMatMul::Tensor(t16.to_device(dev)?)
            }
            Some(ty) => {
                let q = quantise_onto(&t, ty, PIECE, dev)?;
                if let Some(w) = own_kernel(&q, ty, t.dims(), dev, Some(self.is_head(name)))? {
                    return Ok(w);
                }
                QMatMul::from_arc(Arc::new(q))?
            }
        }))
    }

    fn tensor_f32(&self, name: &str) -> Result<Tensor> {
        self.inner.tensor_f32(name)
    }

    fn embedding(&self, name: &str) -> Result<Embedding> {
        let (t, ty) = self.plan(name, self.is_head(name))?;
        let dev = self.inner.device();
        Ok(match ty {
            Some(ty) if !matches!(ty, GgmlDType::F16 | GgmlDType::BF16) => {
                let q = quantise_onto(&t, ty, PIECE, dev)?;
                // K-quant tiles only for a tied table (packed once for both uses).
                match own_kernel(&q, ty, t.dims(), dev, self.is_head(name).then_some(true))? {
                    Some(LinearWeight::Ggml(m)) => Embedding::Ggml(m),
                    Some(LinearWeight::KQuant(m)) => Embedding::KQuant(m),
                    _ => Embedding::Quantized(Arc::new(q)),
                }
            }
            Some(GgmlDType::F16) => Embedding::Dense(t.to_dtype(DType::F16)?.to_dtype(DType::F32)?.to_device(dev)?),
            Some(GgmlDType::BF16) => Embedding::Dense(t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?.to_device(dev)?),
            _ => Embedding::Dense(t.to_device(dev)?),
        })
    }

    fn device(&self) -> &Device {
        self.inner.device()
    }

    // Experts a file stacks in one tensor (GGUF MoE) keep the file's type; experts served one
    // by one (safetensors) go through `qmatmul` like every other matrix.
    fn stacked_experts(&self, prefix: &str, proj: &str) -> Result<Option<StackedExperts>> {
        self.inner.stacked_experts(prefix, proj)
    }

    fn stacked_data(&self, storage: &str) -> Result<crate::ops::moe::StackData> {
        self.inner.stacked_data(storage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One 2-D weight, its name and an f32 norm, served as a file would.
    struct One {
        w: Tensor,
        device: Device,
    }

    impl WeightSource for One {
        fn has(&self, name: &str) -> bool {
            name == "blk.0.attn_q.weight" || name == "output.weight"
        }
        fn qmatmul(&self, _: &str) -> Result<LinearWeight> {
            Ok(LinearWeight::Candle(QMatMul::Tensor(self.w.clone())))
        }
        fn tensor_f32(&self, _: &str) -> Result<Tensor> {
            Ok(self.w.clone())
        }
        fn embedding(&self, _: &str) -> Result<Embedding> {
            Ok(Embedding::Dense(self.w.clone()))
        }
        fn device(&self) -> &Device {
            &self.device
        }
    }

    #[test]
    fn types_per_tensor() {
        let q = |s: &str| s.parse::<WeightQuant>().unwrap();
        assert_eq!(q("q4_k").type_for(4096, false), Some(GgmlDType::Q4K));
        assert_eq!(q("q4_k").type_for(4096, true), Some(GgmlDType::Q6K), "LM head below 6 bits");
        assert_eq!(q("q8_0").type_for(4096, true), Some(GgmlDType::Q8_0));
        assert_eq!(q("q4_k").type_for(896, false), Some(GgmlDType::Q8_0), "rows that fit no K-quant");
        assert_eq!(q("q4_0").type_for(100, false), None, "rows that fit no block stay as they are");
        assert_eq!(q("bf16").type_for(100, false), Some(GgmlDType::BF16));
        assert!("q9_9".parse::<WeightQuant>().is_err());
        for name in ["f16", "bf16", "q8_0", "q6_k", "q5_k", "q5_1", "q5_0", "q4_k", "q4_1", "q4_0", "q3_k", "q2_k"] {
            assert_eq!(q(name).to_string(), name);
        }
    }

    /// A quantised-at-load matrix computes exactly what the same blocks quantised by hand
    /// compute, in every type; the LM head becomes Q6_K under a 4-bit target.
    #[test]
    fn quantised_weights_are_the_blocks_of_the_f32_weights() {
        let (n, k) = (48, 512);
        let vals: Vec<f32> = (0..n * k).map(|i| ((i as f32) * 0.37).sin() * (1.0 + (i % 7) as f32)).collect();
        let w = Tensor::from_vec(vals, (n, k), &Device::Cpu).unwrap();
        let src = One { w: w.clone(), device: Device::Cpu };
        let x =
            Tensor::from_vec((0..3 * k).map(|i| ((i as f32) * 0.11).cos()).collect::<Vec<_>>(), (3, k), &Device::Cpu)
                .unwrap();
        for (target, name, want) in [
            ("q8_0", "blk.0.attn_q.weight", GgmlDType::Q8_0),
            ("q4_k", "blk.0.attn_q.weight", GgmlDType::Q4K),
            ("q4_k", "output.weight", GgmlDType::Q6K),
            ("q5_0", "blk.0.attn_q.weight", GgmlDType::Q5_0),
            ("q4_0", "blk.0.attn_q.weight", GgmlDType::Q4_0),
            ("q2_k", "blk.0.attn_q.weight", GgmlDType::Q2K),
        ] {
            let quant = Quantizing::new(&src, target.parse().unwrap());
            let got = quant.qmatmul(name).unwrap().forward(&x).unwrap();
            if target == "q4_0" && crate::ops::quant::kquant::available() {
                let on_tiles = matches!(quant.qmatmul(name).unwrap(), LinearWeight::KQuant(_));
                assert!(on_tiles, "q4_0 at load runs on the Q4_0 tiles");
            }
            let by_hand = candle_core::quantized::QTensor::quantize(&w, want).unwrap();
            let direct = GgmlMatrix::from_bytes(
                QuantType::from_ggml(want).unwrap_or(QuantType::Q8_0),
                n,
                k,
                &by_hand.data().unwrap(),
            );
            let reference = match (QuantType::from_ggml(want), direct) {
                (Some(_), Ok(m)) if prefers_own_kernel(QuantType::from_ggml(want).unwrap(), n, k) => {
                    LinearWeight::Ggml(Arc::new(m))
                }
                _ if crate::ops::quant::kquant::takes(want, name == "output.weight")
                    && crate::ops::quant::kquant::available() =>
                {
                    LinearWeight::KQuant(Arc::new(
                        KQuantMatrix::from_bytes(want, n, k, &by_hand.data().unwrap()).unwrap(),
                    ))
                }
                _ => LinearWeight::Candle(QMatMul::from_arc(Arc::new(by_hand)).unwrap()),
            };
            let want_out = reference.forward(&x).unwrap();
            let (a, b) = (
                got.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                want_out.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            assert_eq!(a, b, "{target} {name}");
        }
    }
}
