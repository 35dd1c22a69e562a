//! Launchers of `top_candidates` and `argmax_rows` (`tandem-kernels/cuda/sampling.cu`); same
//! contracts as [`super::top_candidates_ref`] and [`super::argmax_ref`], which `tandem
//! check-device` compares them with.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::TopCandidates;
use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{cuda_device, err, i32_of, run, tensor, Inputs};

pub fn top_candidates(logits: &Tensor, k: usize, inv_t: f32) -> Result<TopCandidates> {
    let dev = cuda_device(logits).ok_or_else(|| ModelError::Input("top candidates: not a CUDA tensor".into()))?;
    let row = logits.flatten_all()?.to_dtype(DType::F32)?.contiguous()?;
    let vocab = row.dim(0)?;
    if vocab == 0 || k == 0 {
        return Err(ModelError::Input("top candidates of an empty row".into()));
    }
    let inputs = Inputs::new(&[&row])?;
    let view = inputs.view::<f32>(0)?;
    // One buffer [ids k | logit bits k | mass as two words], read back in one copy.
    // SAFETY: the kernel writes the first min(k, vocab) ids and values and the mass.
    let out = unsafe { dev.alloc::<u32>(2 * k + 2) }.map_err(err("top candidates"))?;
    let (v, ki) = (i32_of(vocab)?, i32_of(k)?);
    let f = dev.kernel("top_candidates", tandem_kernels::ptx(tandem_kernels::SAMPLING))?;
    {
        let (ids, vals, mass) = (out.slice(0..k), out.slice(k..2 * k), out.slice(2 * k..2 * k + 2));
        let mut b = f.builder();
        b.arg(&view).arg(&v).arg(&ki).arg(&inv_t).arg(&ids).arg(&vals).arg(&mass);
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: arguments in top_candidates' order; ids and vals hold k words, mass two
        // (8-byte aligned: the buffer's start plus 8k bytes), for one row.
        unsafe { run(&mut b, cfg, "top_candidates")? };
    }
    drop(view);
    drop(inputs);
    let words = tensor(out, &dev, 2 * k + 2).to_vec1::<u32>()?;
    let n = k.min(vocab);
    let ids = words[..n].to_vec();
    let logits = words[k..k + n].iter().map(|&w| f32::from_bits(w)).collect();
    let mass = f64::from_bits(words[2 * k] as u64 | ((words[2 * k + 1] as u64) << 32));
    Ok(TopCandidates { ids, logits, vocab, mass })
}

/// Values a block of `argmax_rows` covers (AM_THREADS x AM_PER).
const ARGMAX_CHUNK: usize = 256 * 16;

/// The argmax of every row of `x` `[rows, n]`, read back in one copy.
pub fn argmax_rows(x: &Tensor) -> Result<Vec<u32>> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("argmax: not a CUDA tensor".into()))?;
    let (rows, n) = x.dims2()?;
    if rows == 0 {
        return Ok(Vec::new());
    }
    if n == 0 {
        return Ok(vec![0; rows]);
    }
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let chunks =
        u32::try_from(n.div_ceil(ARGMAX_CHUNK)).map_err(|_| ModelError::Input("argmax: row too long".into()))?;
    let grid_y = u32::try_from(rows).ok().filter(|&r| r <= 65_535);
    let grid_y = grid_y.ok_or_else(|| ModelError::Input(format!("argmax: {rows} rows")))?;
    let inputs = Inputs::new(&[&x])?;
    let view = inputs.view::<f32>(0)?;
    // One 64-bit word per row (two u32 here), zeroed: below every packed value.
    let out = dev.alloc_zeros::<u32>(2 * rows).map_err(err("argmax"))?;
    let ni = i32_of(n)?;
    let f = dev.kernel("argmax_rows", tandem_kernels::ptx(tandem_kernels::SAMPLING))?;
    {
        let mut b = f.builder();
        b.arg(&view).arg(&ni).arg(&out);
        let cfg = LaunchConfig { grid_dim: (chunks, grid_y, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: arguments in argmax_rows' order; x holds rows*n f32, out rows 64-bit words
        // (the allocation is 8-byte aligned), zeroed above.
        unsafe { run(&mut b, cfg, "argmax_rows")? };
    }
    drop(view);
    drop(inputs);
    let words = tensor(out, &dev, 2 * rows).to_vec1::<u32>()?;
    Ok(words.chunks_exact(2).map(|w| super::unpack_argmax(w[0], w[1])).collect())
}
