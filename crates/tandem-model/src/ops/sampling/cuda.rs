//! Launcher of `top_candidates` (`tandem-kernels/cuda/sampling.cu`); same contract as
//! [`super::top_candidates_ref`], which `tandem check-device` compares it with.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::TopCandidates;
use crate::error::{ModelError, Result};
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
    let f = dev.get_or_load_custom_func("top_candidates", "tandem_sampling", tandem_kernels::SAMPLING)?;
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
