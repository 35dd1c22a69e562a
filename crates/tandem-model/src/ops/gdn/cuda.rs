//! Launchers of the GDN CUDA kernels (`tandem-kernels/cuda/gdn.cu`): the causal conv + SiLU
//! and the gated delta rule, each with explicit input and output state and optional verify
//! lanes. Same contracts as [`super::portable`], which the tests compare them with.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::GdnDims;
use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, cuda_device, i32_of, run, tensor, Inputs};

/// The kernel `{family}_{32|64|128|256}` instantiated for key dim `dk` (the smallest that holds
/// it), or an error naming `what` for key dims over 256.
fn by_key_dim(family: &str, dk: usize, what: &str) -> Result<String> {
    let max = match dk {
        0..=32 => 32,
        33..=64 => 64,
        65..=128 => 128,
        129..=256 => 256,
        _ => return Err(ModelError::Input(format!("{what}: key dim {dk} (the CUDA kernels take up to 256)"))),
    };
    Ok(format!("{family}_{max}"))
}

fn f32c(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?.contiguous()?)
}

/// Tokens per block of `gdn_conv_silu` (`CONV_TILE` in gdn.cu).
const CONV_TILE: usize = 16;

/// See [`super::portable::conv_silu`].
pub fn conv_silu(x: &Tensor, state: &Tensor, w: &Tensor, lanes: bool) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("gdn conv: not a CUDA tensor".into()))?;
    let (t, ch) = x.dims2()?;
    let (_, kernel) = w.dims2()?;
    if !(1..=8).contains(&kernel) {
        return Err(ModelError::Input(format!("gdn conv: kernel size {kernel} (the CUDA kernel takes 1..=8)")));
    }
    let hist = kernel - 1;
    let (x, state, w) = (f32c(x)?, f32c(state)?, f32c(w)?);
    let inputs = Inputs::new(&[&x, &state, &w])?;
    let y = alloc_f32(&dev, t * ch)?;
    let next = alloc_f32(&dev, hist * ch)?;
    let lane_buf = if lanes { Some(alloc_f32(&dev, t * hist * ch)?) } else { None };
    let (xv, sv, wv) = (inputs.view::<f32>(0)?, inputs.view::<f32>(1)?, inputs.view::<f32>(2)?);
    let (ti, chi, ki) = (i32_of(t)?, i32_of(ch)?, i32_of(kernel)?);
    let null = 0u64;
    let f = dev.kernel("gdn_conv_silu", tandem_kernels::ptx(tandem_kernels::GDN))?;
    let mut b = f.builder();
    b.arg(&y);
    b.arg(&next);
    match &lane_buf {
        Some(l) => b.arg(l),
        None => b.arg(&null),
    };
    b.arg(&xv).arg(&sv).arg(&wv).arg(&ti).arg(&chi).arg(&ki);
    // A block per 128 channels and tile of CONV_TILE tokens (gdn.cu), at least one.
    let tiles =
        u32::try_from(t.div_ceil(CONV_TILE).max(1)).map_err(|_| ModelError::Input(format!("gdn conv: {t} tokens")))?;
    let cfg =
        LaunchConfig { grid_dim: (ch.div_ceil(128) as u32, tiles, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in gdn_conv_silu's order; y holds t*ch, next hist*ch (a fresh buffer,
    // not the state read), lanes t*hist*ch.
    unsafe { run(&mut b, cfg, "gdn_conv_silu")? };
    drop(b);
    drop(inputs);
    Ok((tensor(y, &dev, (t, ch)), tensor(next, &dev, (hist, ch)), lane_buf.map(|l| tensor(l, &dev, (t, hist, ch)))))
}

/// See [`super::portable::delta_rule`].
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    beta: &Tensor,
    g: &Tensor,
    state: &Tensor,
    d: GdnDims,
    lanes: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let dev = cuda_device(q).ok_or_else(|| ModelError::Input("gdn delta rule: not a CUDA tensor".into()))?;
    let t = v.dim(0)?;
    let name = &by_key_dim("gdn_delta", d.dk, "gdn delta rule")?;
    if d.nk == 0 || !d.nv.is_multiple_of(d.nk) {
        return Err(ModelError::Input(format!("gdn delta rule: {} v-heads over {} k-heads", d.nv, d.nk)));
    }
    let (q, k, v, beta, g, state) = (f32c(q)?, f32c(k)?, f32c(v)?, f32c(beta)?, f32c(g)?, f32c(state)?);
    let inputs = Inputs::new(&[&q, &k, &v, &beta, &g, &state])?;
    let o = alloc_f32(&dev, t * d.nv * d.dv)?;
    let next = alloc_f32(&dev, d.state_len())?;
    let lane_buf = if lanes { Some(alloc_f32(&dev, t * d.state_len())?) } else { None };
    let views = (0..6).map(|i| inputs.view::<f32>(i)).collect::<Result<Vec<_>>>()?;
    let (ti, nk, nv, dk, dv) = (i32_of(t)?, i32_of(d.nk)?, i32_of(d.nv)?, i32_of(d.dk)?, i32_of(d.dv)?);
    let null = 0u64;
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::GDN))?;
    let mut b = f.builder();
    b.arg(&o);
    b.arg(&next);
    match &lane_buf {
        Some(l) => b.arg(l),
        None => b.arg(&null),
    };
    for view in &views {
        b.arg(view);
    }
    b.arg(&ti).arg(&nk).arg(&nv).arg(&dk).arg(&dv);
    let threads = d.dv.min(128);
    let cfg = LaunchConfig {
        grid_dim: (d.nv as u32, d.dv.div_ceil(threads) as u32, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: (2 * d.dk * 4) as u32,
    };
    // SAFETY: arguments in gdn_delta_*'s order; o holds t*nv*dv, next nv*dk*dv, lanes t times that.
    unsafe { run(&mut b, cfg, name)? };
    drop(b);
    drop(views);
    drop(inputs);
    Ok((
        tensor(o, &dev, (t, d.nv, d.dv)),
        tensor(next, &dev, (d.nv, d.dk, d.dv)),
        lane_buf.map(|l| tensor(l, &dev, (t, d.nv, d.dk, d.dv))),
    ))
}

/// See [`super::step::step_reference`]: from the conv output `u` `[t, 2 nk dk + nv dv]`,
/// the gate `z` `[t, nv dv]` and the raw `b`, `a` `[t, nv]`, the normed output `[t, nv dv]`,
/// the next state and (with `lanes`) the state after every token.
#[allow(clippy::too_many_arguments)]
pub fn delta_fused(
    u: &Tensor,
    z: &Tensor,
    b: &Tensor,
    a: &Tensor,
    state: &Tensor,
    p: &super::device::StepTensors<'_>,
    d: GdnDims,
    lanes: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    if split_columns() {
        return delta_cols(u, z, b, a, state, p, d, lanes);
    }
    let dev = cuda_device(u).ok_or_else(|| ModelError::Input("gdn fused step: not a CUDA tensor".into()))?;
    let t = u.dim(0)?;
    let name = &by_key_dim("gdn_delta_fused", d.dk, "gdn fused step")?;
    if d.nk == 0 || !d.nv.is_multiple_of(d.nk) || d.dv == 0 || d.dv > 256 {
        return Err(ModelError::Input(format!(
            "gdn fused step: {} v-heads over {} k-heads, value dim {} (up to 256)",
            d.nv, d.nk, d.dv
        )));
    }
    let ts = [u, z, b, a, p.dt_bias, p.neg_a, p.norm_w, state].map(f32c);
    let ts = ts.into_iter().collect::<Result<Vec<_>>>()?;
    let inputs = Inputs::new(&ts.iter().collect::<Vec<_>>())?;
    let o = alloc_f32(&dev, t * d.nv * d.dv)?;
    let next = alloc_f32(&dev, d.state_len())?;
    let lane_buf = if lanes { Some(alloc_f32(&dev, t * d.state_len())?) } else { None };
    let views = (0..ts.len()).map(|i| inputs.view::<f32>(i)).collect::<Result<Vec<_>>>()?;
    let (ti, nk, nv, dk, dv) = (i32_of(t)?, i32_of(d.nk)?, i32_of(d.nv)?, i32_of(d.dk)?, i32_of(d.dv)?);
    let null = 0u64;
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::GDN))?;
    let mut bld = f.builder();
    bld.arg(&o);
    bld.arg(&next);
    match &lane_buf {
        Some(l) => bld.arg(l),
        None => bld.arg(&null),
    };
    for view in &views {
        bld.arg(view);
    }
    bld.arg(&ti).arg(&nk).arg(&nv).arg(&dk).arg(&dv).arg(&p.scale).arg(&p.eps);
    let threads = d.dv.div_ceil(32) * 32;
    let cfg = LaunchConfig {
        grid_dim: (d.nv as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: ((2 * d.dk + threads / 32) * 4) as u32,
    };
    // SAFETY: arguments in gdn_delta_fused_*'s order; o holds t*nv*dv, next nv*dk*dv, lanes t
    // times that; shared memory holds q, k and one float per warp.
    unsafe { run(&mut bld, cfg, name)? };
    drop(bld);
    drop(views);
    drop(inputs);
    Ok((
        tensor(o, &dev, (t, d.nv * d.dv)),
        tensor(next, &dev, (d.nv, d.dk, d.dv)),
        lane_buf.map(|l| tensor(l, &dev, (t, d.nv, d.dk, d.dv))),
    ))
}

/// Whether the step runs as `gdn_delta_cols_*` + `gdn_gated_norm` (32 state columns per block,
/// all SMs busy) rather than `gdn_delta_fused_*` (one block per value head):
/// `TANDEM_GDN_STEP=block` picks the latter, for comparisons.
pub(crate) fn split_columns() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("TANDEM_GDN_STEP").as_deref() != Ok("block"))
}

/// [`delta_fused`]'s contract, computed by `gdn_delta_cols_*` (the delta rule over 32-column
/// slices of each head's state, the output before its norm) and then `gdn_gated_norm`.
#[allow(clippy::too_many_arguments)]
fn delta_cols(
    u: &Tensor,
    z: &Tensor,
    b: &Tensor,
    a: &Tensor,
    state: &Tensor,
    p: &super::device::StepTensors<'_>,
    d: GdnDims,
    lanes: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let dev = cuda_device(u).ok_or_else(|| ModelError::Input("gdn step: not a CUDA tensor".into()))?;
    let t = u.dim(0)?;
    if d.dk == 0 {
        return Err(ModelError::Input("gdn step: key dim 0".into()));
    }
    let name = &by_key_dim("gdn_delta_cols", d.dk, "gdn step")?;
    if d.nk == 0 || !d.nv.is_multiple_of(d.nk) || d.dv == 0 {
        return Err(ModelError::Input(format!("gdn step: {} v-heads over {} k-heads, value dim {}", d.nv, d.nk, d.dv)));
    }
    let ts = [u, b, a, p.dt_bias, p.neg_a, state, z, p.norm_w].map(f32c);
    let ts = ts.into_iter().collect::<Result<Vec<_>>>()?;
    let inputs = Inputs::new(&ts.iter().collect::<Vec<_>>())?;
    let o_raw = alloc_f32(&dev, t * d.nv * d.dv)?;
    let o = alloc_f32(&dev, t * d.nv * d.dv)?;
    let next = alloc_f32(&dev, d.state_len())?;
    let lane_buf = if lanes { Some(alloc_f32(&dev, t * d.state_len())?) } else { None };
    let views = (0..ts.len()).map(|i| inputs.view::<f32>(i)).collect::<Result<Vec<_>>>()?;
    let (ti, nk, nv, dk, dv) = (i32_of(t)?, i32_of(d.nk)?, i32_of(d.nv)?, i32_of(d.dk)?, i32_of(d.dv)?);
    let null = 0u64;
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::GDN))?;
    let mut bld = f.builder();
    bld.arg(&o_raw).arg(&next);
    match &lane_buf {
        Some(l) => bld.arg(l),
        None => bld.arg(&null),
    };
    for view in &views[..6] {
        bld.arg(view);
    }
    bld.arg(&ti).arg(&nk).arg(&nv).arg(&dk).arg(&dv).arg(&p.scale);
    let cfg = LaunchConfig {
        grid_dim: (d.nv as u32, d.dv.div_ceil(32) as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: ((2 * d.dk + 4) * 4) as u32,
    };
    // SAFETY: arguments in gdn_delta_cols_*'s order (o_raw, next, lanes, u, b, a, dt_bias,
    // neg_a, state); o_raw holds t*nv*dv, next nv*dk*dv, lanes t times that; shared memory
    // holds q, k and one float per warp of the 128-thread block.
    unsafe { run(&mut bld, cfg, name)? };
    drop(bld);
    let rows = t * d.nv;
    let (rowsi, eps) = (i32_of(rows)?, p.eps);
    let f = dev.kernel("gdn_gated_norm", tandem_kernels::ptx(tandem_kernels::GDN_CHUNKED))?;
    let mut bl = f.builder();
    let ldz = i32_of(d.nv * d.dv)?; // z contiguous [t, nv dv]
    bl.arg(&o).arg(&o_raw).arg(&views[6]).arg(&views[7]).arg(&rowsi).arg(&dv).arg(&eps).arg(&nv).arg(&ldz);
    let cfg = LaunchConfig { grid_dim: (rows.div_ceil(8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in gdn_gated_norm's order; o and o_raw hold rows*dv, z rows*dv, one
    // warp per row.
    unsafe { run(&mut bl, cfg, "gdn_gated_norm")? };
    drop(bl);
    drop(views);
    drop(inputs);
    Ok((
        tensor(o, &dev, (t, d.nv * d.dv)),
        tensor(next, &dev, (d.nv, d.dk, d.dv)),
        lane_buf.map(|l| tensor(l, &dev, (t, d.nv, d.dk, d.dv))),
    ))
}

#[cfg(test)]
mod tests {
    use super::by_key_dim;

    /// Every name the launchers can ask for is a kernel of the module's PTX.
    #[test]
    fn kernel_names_exist() {
        for family in ["gdn_delta", "gdn_delta_fused", "gdn_delta_cols"] {
            for dk in [1, 32, 33, 64, 100, 128, 200, 256] {
                let name = by_key_dim(family, dk, "test").unwrap();
                assert!(
                    tandem_kernels::ptx(tandem_kernels::GDN).contains(&format!(".entry {name}(")),
                    "{name} is not in gdn.ptx"
                );
            }
        }
        assert!(by_key_dim("gdn_delta", 257, "test").is_err());
    }
}
