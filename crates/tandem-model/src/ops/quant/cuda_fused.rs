//! Several projections of the same input as one matmul on CUDA: their weight rows copied, at
//! load time, into one device buffer (`[q | k | v]`, `[gate | up]`, a GDN layer's `[qkv | z |
//! b | a]`), one launch of `cuda/qmatmul.cu` per call instead of one per projection, and the
//! output split by columns.
//!
//! A decode step launches fewer kernels (the host queues each launch in about 11 us, a large
//! share of a step on a fast GPU), and the small projections (a GDN layer's b and a: 32 rows
//! each on the 9B shape) stop being launches of a handful of warps that read a whole row each
//! while the rest of the GPU idles. Every output column is the same chain of operations as in
//! the projection's own matmul (`qmatmul.cu`: a column's result depends only on its weight row
//! and the input row), so fusing changes no bit; `tests/fused_projections` on the device checks
//! it against the separate matmuls.

use candle_core::cuda_backend::cudarc::driver::{result as cu, CudaSlice, DevicePtr};
use candle_core::quantized::QMatMul;
use candle_core::{Device, Tensor};

use super::cuda_quant::{matmul_raw, WeightFormat};
use crate::error::Result;
use crate::loader::{Linear, LinearWeight};
use crate::ops::cuda_util::{device_address, err};

/// The weights of several projections in one buffer: rows of part 0, then part 1, ...
pub struct FusedLinear {
    buf: CudaSlice<u8>,
    address: u64,
    fmt: WeightFormat,
    k: usize,
    /// Output columns of each part.
    widths: Vec<usize>,
    biases: Vec<Option<Tensor>>,
}

/// A part's rows on the device.
struct Rows {
    address: u64,
    fmt: WeightFormat,
    n: usize,
    k: usize,
    dev: Device,
    /// A contiguous copy the address points into, when the weight was not contiguous.
    _hold: Option<Tensor>,
}

fn rows_of(l: &Linear) -> Result<Option<Rows>> {
    let LinearWeight::Candle(w) = &l.weight else { return Ok(None) };
    Ok(match w {
        QMatMul::QTensor(q) if q.device().is_cuda() && !super::Kernel::candle_only() => {
            let Some(fmt) = WeightFormat::of_ggml(q.dtype()) else { return Ok(None) };
            let (n, k) = q.shape().dims2()?;
            Some(Rows { address: q.device_ptr()? as u64, fmt, n, k, dev: q.device(), _hold: None })
        }
        QMatMul::Tensor(t) if t.device().is_cuda() && t.rank() == 2 && super::row_stable::dense_enabled() => {
            let Some(fmt) = WeightFormat::of_dtype(t.dtype()) else { return Ok(None) };
            let (n, k) = t.dims2()?;
            let t = t.contiguous()?;
            Some(Rows { address: device_address(&t)?, fmt, n, k, dev: t.device().clone(), _hold: Some(t) })
        }
        _ => None,
    })
}

impl FusedLinear {
    /// The parts' weights copied into one buffer, or `None` when they cannot share a launch:
    /// fewer than two, not all CUDA weights the kernels decode, different formats or input
    /// lengths. The parts stay valid (the caller drops them to free their memory).
    pub fn new(parts: &[&Linear]) -> Result<Option<Self>> {
        if parts.len() < 2 {
            return Ok(None);
        }
        let outputs = parts
            .iter()
            .enumerate()
            .map(|(i, p)| Ok((i, (0..p.weight.dims()?.0 as u32).collect())))
            .collect::<Result<Vec<_>>>()?;
        Self::from_rows(parts, &outputs)
    }

    /// One buffer whose outputs are rows of the parts: output j is the rows `outputs[j].1` of
    /// part `outputs[j].0`, in that order (a projection whose output columns a model reorders,
    /// such as llama.cpp's tiled V heads, gets them in its order from the matmul itself; each
    /// column is the chain of its own weight row, so no bit changes). `None` as for
    /// [`Self::new`], and when a reordered part has a bias.
    pub fn from_rows(parts: &[&Linear], outputs: &[(usize, Vec<u32>)]) -> Result<Option<Self>> {
        if outputs.is_empty() {
            return Ok(None);
        }
        let mut found = Vec::with_capacity(parts.len());
        for p in parts {
            match rows_of(p)? {
                Some(r) => found.push(r),
                None => return Ok(None),
            }
        }
        let (fmt, k) = (found[0].fmt, found[0].k);
        if !fmt.fits(k) || found.iter().any(|r| r.fmt != fmt || r.k != k || !r.dev.same_device(&found[0].dev)) {
            return Ok(None);
        }
        for (p, rows) in outputs {
            let Some(r) = found.get(*p) else { return Ok(None) };
            let identity = rows.len() == r.n && rows.iter().enumerate().all(|(i, &x)| x as usize == i);
            if rows.iter().any(|&x| x as usize >= r.n) || (!identity && parts[*p].bias.is_some()) {
                return Ok(None);
            }
        }
        let Device::Cuda(dev) = found[0].dev.clone() else { return Ok(None) };
        let row_bytes = fmt.row_bytes(k);
        let total: usize = outputs.iter().map(|(_, rows)| rows.len() * row_bytes).sum();
        // SAFETY: every byte is written by the copies below before any launch reads it.
        let buf = unsafe { dev.alloc::<u8>(total) }?;
        let stream = dev.cuda_stream();
        let address = buf.device_ptr(&stream).0;
        let mut at = address;
        for (p, rows) in outputs {
            let src = found[*p].address;
            // Runs of consecutive rows go in one copy.
            let mut i = 0;
            while i < rows.len() {
                let mut j = i + 1;
                while j < rows.len() && rows[j] == rows[j - 1] + 1 {
                    j += 1;
                }
                let bytes = (j - i) * row_bytes;
                let from = src + rows[i] as u64 * row_bytes as u64;
                // SAFETY: rows i..j of the part lie inside its n rows of row_bytes (checked
                // above; a live weight, or its contiguous copy held in `found`), the
                // destination range inside `buf`; both on the device's stream.
                unsafe { cu::memcpy_dtod_async(at, from, bytes, stream.cu_stream()) }.map_err(err("fused weights"))?;
                at += bytes as u64;
                i = j;
            }
        }
        // The sources may be freed once the copies are done.
        stream.synchronize().map_err(err("fused weights"))?;
        drop(found);
        Ok(Some(Self {
            buf,
            address,
            fmt,
            k,
            widths: outputs.iter().map(|(_, rows)| rows.len()).collect(),
            biases: outputs.iter().map(|(p, _)| parts[*p].bias.clone()).collect(),
        }))
    }

    /// Each part's `x · Wᵀ (+ bias)` for `x` `[..., k]`, f32, in the parts' order (column views
    /// of one result: contiguous for a single row).
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let n: usize = self.widths.iter().sum();
        let y = matmul_raw(self.fmt, self.address, n, self.k, x)?;
        let last = y.rank() - 1;
        let mut outs = Vec::with_capacity(self.widths.len());
        let mut off = 0;
        for (w, b) in self.widths.iter().zip(&self.biases) {
            let part = y.narrow(last, off, *w)?;
            outs.push(match b {
                Some(b) => part.broadcast_add(b)?,
                None => part,
            });
            off += w;
        }
        Ok(outs)
    }

    /// Bytes of weights held.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }
}

impl std::fmt::Debug for FusedLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FusedLinear({} x {} {}, parts {:?})",
            self.widths.iter().sum::<usize>(),
            self.k,
            self.fmt.suffix,
            self.widths
        )
    }
}
