//! A decoder layer's glue on every backend: RMSNorm, the residual add fused with the RMSNorm
//! that follows it, and SiLU(gate) x up. On CUDA each is one launch of our own kernels
//! (`tandem-kernels/cuda/norm.cu`; a decode step of a 9B model spent 0.4 ms of ~4.3 in
//! candle's norms and adds, at 5 us a launch); elsewhere they are candle's ops, unchanged.
//! Each CUDA row is computed in an order fixed by its length alone (row-invariant, like the
//! matmuls); `check-device` compares the kernels with the candle ops they replace.

use candle_core::Tensor;

use crate::error::Result;

/// `rms_norm(x) * w` over the last dimension.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && enabled() {
        return Ok(cuda::rms_norm(x, None, w, eps)?.1);
    }
    Ok(candle_nn::ops::rms_norm(x, w, eps)?)
}

/// `(x + d, rms_norm(x + d) * w)`: a residual add and the norm after it.
pub fn add_rms_norm(x: &Tensor, d: &Tensor, w: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && enabled() {
        return cuda::rms_norm(x, Some(d), w, eps);
    }
    let s = (x + d)?;
    let h = candle_nn::ops::rms_norm(&s, w, eps)?;
    Ok((s, h))
}

/// `silu(g) * u`, elementwise (same shapes).
pub fn silu_mul(g: &Tensor, u: &Tensor) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if g.device().is_cuda() && enabled() {
        return cuda::silu_mul(g, u);
    }
    if let Some(t) = crate::ops::act::silu_mul_cpu(g, u)? {
        return Ok(t);
    }
    Ok((candle_nn::ops::silu(g)? * u)?)
}

/// Whether the CUDA kernels run (`TANDEM_FUSED_NORM=0`: candle's ops, for comparisons).
#[cfg(feature = "cuda")]
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TANDEM_FUSED_NORM").as_deref() != Ok("0"))
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::{DType, Tensor};

    use crate::error::{ModelError, Result};
    use crate::ops::cuda_module::LoadKernel as _;
    use crate::ops::cuda_util::{alloc_f32, cuda_device, device_address, i32_of, run, tensor, Inputs};

    fn f32c(t: &Tensor) -> Result<Tensor> {
        Ok(t.to_dtype(DType::F32)?.contiguous()?)
    }

    /// `(s, h)` with `s = x (+ d)` and `h = rms_norm(s) * w`; `s` is `x` itself without `d`.
    pub fn rms_norm(x: &Tensor, d: Option<&Tensor>, w: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
        let dev = cuda_device(x).ok_or_else(|| ModelError::Input("rms_norm: not a CUDA tensor".into()))?;
        let n = x.dims().last().copied().unwrap_or(0);
        if w.elem_count() != n || d.is_some_and(|d| d.dims() != x.dims()) {
            return Err(ModelError::Input(format!("rms_norm: x {:?}, w {:?}", x.dims(), w.dims())));
        }
        let rows = x.elem_count() / n.max(1);
        let (xc, wc) = (f32c(x)?, f32c(w)?);
        let dc = d.map(f32c).transpose()?;
        let h = alloc_f32(&dev, rows * n)?;
        let s = if dc.is_some() { Some(alloc_f32(&dev, rows * n)?) } else { None };
        if rows > 0 && n > 0 {
            let mut ts = vec![&xc, &wc];
            if let Some(dc) = &dc {
                ts.push(dc);
            }
            let inputs = Inputs::new(&ts)?;
            let (xv, wv) = (inputs.view::<f32>(0)?, inputs.view::<f32>(1)?);
            let dv = if dc.is_some() { Some(inputs.view::<f32>(2)?) } else { None };
            let ni = i32_of(n)?;
            let grid = u32::try_from(rows).map_err(|_| ModelError::Input("rms_norm: too many rows".into()))?;
            let f = dev.kernel("rmsnorm_rows", tandem_kernels::ptx(tandem_kernels::NORM))?;
            let mut b = f.builder();
            let null = 0u64;
            b.arg(&xv);
            match &dv {
                Some(dv) => b.arg(dv),
                None => b.arg(&null),
            };
            b.arg(&wv).arg(&eps).arg(&ni);
            match &s {
                Some(s) => b.arg(s),
                None => b.arg(&null),
            };
            b.arg(&h);
            let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: arguments in rmsnorm_rows' order; x, d (or null), s (or null with d) and h
            // hold rows * n f32, w n; one block (RN_THREADS = 256) per row.
            unsafe { run(&mut b, cfg, "rmsnorm_rows")? };
        }
        let h = tensor(h, &dev, x.dims());
        let s = match s {
            Some(s) => tensor(s, &dev, x.dims()),
            None => xc,
        };
        Ok((s, h))
    }

    /// `silu(g) * u` for `[..., n]` tensors whose rows may be views with a row stride (the
    /// halves of a fused projection's output); other layouts are made contiguous first.
    pub fn silu_mul(g: &Tensor, u: &Tensor) -> Result<Tensor> {
        let dev = cuda_device(g).ok_or_else(|| ModelError::Input("silu_mul: not a CUDA tensor".into()))?;
        if g.dims() != u.dims() || g.rank() == 0 {
            return Err(ModelError::Input(format!("silu_mul: {:?} against {:?}", g.dims(), u.dims())));
        }
        let n = *g.dims().last().unwrap_or(&0);
        let rows = g.elem_count() / n.max(1);
        // A view of rows [rows, n] with unit column stride: its row stride.
        let row_view = |t: &Tensor| -> Result<(Tensor, i64)> {
            let t = t.to_dtype(DType::F32)?;
            let t = match (t.rank(), t.is_contiguous()) {
                (2, _) => t,
                (_, true) => t.reshape((rows, n))?,
                _ => t.contiguous()?.reshape((rows, n))?,
            };
            let st = t.stride().to_vec();
            if st[1] == 1 && (rows <= 1 || st[0] >= n) {
                Ok((t, if rows <= 1 { n as i64 } else { st[0] as i64 }))
            } else {
                Ok((t.contiguous()?, n as i64))
            }
        };
        let (gv, gs) = row_view(g)?;
        let (uv, us) = row_view(u)?;
        let out = alloc_f32(&dev, rows * n)?;
        if rows * n > 0 {
            let (ga, ua) = (device_address(&gv)?, device_address(&uv)?);
            let (ri, ni) = (i32_of(rows)?, i32_of(n)?);
            let blocks = (rows * n).div_ceil(256).min(4096) as u32;
            let f = dev.kernel("silu_mul_rows", tandem_kernels::ptx(tandem_kernels::NORM))?;
            let mut b = f.builder();
            b.arg(&ga).arg(&gs).arg(&ua).arg(&us).arg(&out).arg(&ri).arg(&ni);
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: arguments in silu_mul_rows' order; g and u are live f32 tensors (held
            // here) whose rows lie `gs` / `us` values apart with unit column stride, out rows *
            // n; all on the device's one stream.
            unsafe { run(&mut b, cfg, "silu_mul_rows")? };
        }
        drop((gv, uv));
        Ok(tensor(out, &dev, g.dims()))
    }
}
