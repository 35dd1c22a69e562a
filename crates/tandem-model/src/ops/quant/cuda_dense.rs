//! Row-invariant dense matmul on CUDA for every call size: weights whose rows are whole 32-value
//! units go to the tiled kernel of `cuda/qmatmul.cu` ([`super::cuda_quant`]); others to
//! `tandem-kernels/cuda/matmul.cu`, below, in pieces of up to [`MAX_ROWS`] rows. cuBLAS picks
//! its algorithm (and so its summation order) by shape, so one row decoded alone and the same
//! row inside a verify chunk can differ in the last bits; this kernel gives every row one fixed
//! order (a warp per output column, lanes strided over k, a butterfly sum), whatever the
//! number of rows.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::cuda_quant::WeightFormat;
use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, cuda_device, device_address, i32_of, run, tensor, Inputs};

/// Most rows the kernel takes in one launch (more are cut into pieces of this many).
pub const MAX_ROWS: usize = 32;

/// Whether `w` `[n, k]` and `x` fit the kernel.
pub fn supports(w: &Tensor, x: &Tensor) -> bool {
    w.device().is_cuda()
        && x.device().is_cuda()
        && w.rank() == 2
        && x.rank() >= 2
        && matches!(w.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16)
}

/// `x · Wᵀ` for `x` `[..., k]`, f32 out; rows beyond [`MAX_ROWS`] go in pieces, which changes
/// nothing (each row is computed alone).
pub fn forward(w: &Tensor, x: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("dense matmul: not a CUDA tensor".into()))?;
    let (n, k) = w.dims2()?;
    let mut out_shape = x.dims().to_vec();
    let last = out_shape.len() - 1;
    if out_shape[last] != k {
        return Err(ModelError::Input(format!("dense matmul: x {:?} against W [{n}, {k}]", x.dims())));
    }
    out_shape[last] = n;
    let m = x.elem_count() / k.max(1);
    let w = w.contiguous()?;
    // Rows of whole 32-value units: the tiled kernel (qmatmul.cu), same guarantees, faster.
    if let Some(fmt) = WeightFormat::of_dtype(w.dtype()).filter(|f| f.fits(k)) {
        return super::cuda_quant::matmul_raw(fmt, device_address(&w)?, n, k, x);
    }
    let x = x.reshape((m, k))?.to_dtype(DType::F32)?.contiguous()?;
    let name = match w.dtype() {
        DType::F32 => "rowinv_matmul_f32",
        DType::F16 => "rowinv_matmul_f16",
        _ => "rowinv_matmul_bf16",
    };
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::MATMUL))?;
    let mut pieces = Vec::with_capacity(m.div_ceil(MAX_ROWS));
    let mut r0 = 0;
    while r0 < m {
        let rows = (m - r0).min(MAX_ROWS);
        let xp = x.narrow(0, r0, rows)?;
        let inputs = Inputs::new(&[&xp, &w])?;
        let y = alloc_f32(&dev, rows * n)?;
        let xv = inputs.view::<f32>(0)?;
        let (mi, ni, ki) = (i32_of(rows)?, i32_of(n)?, i32_of(k)?);
        let cfg = LaunchConfig { grid_dim: (n.div_ceil(4) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
        macro_rules! go {
            ($T:ty) => {{
                let wv = inputs.view::<$T>(1)?;
                let mut b = f.builder();
                b.arg(&y).arg(&xv).arg(&wv).arg(&mi).arg(&ni).arg(&ki);
                // SAFETY: arguments in the kernel's order; y holds rows*n, x rows*k, W n*k.
                unsafe { run(&mut b, cfg, name)? };
            }};
        }
        match w.dtype() {
            DType::F32 => go!(f32),
            DType::F16 => go!(half::f16),
            _ => go!(half::bf16),
        }
        drop(xv);
        drop(inputs);
        pieces.push(tensor(y, &dev, (rows, n)));
        r0 += rows;
    }
    let y = if pieces.len() == 1 { pieces.pop().expect("one piece") } else { Tensor::cat(&pieces, 0)? };
    Ok(y.reshape(out_shape)?)
}
