//! Launcher of the chunked (WY) GDN step for prefill chunks (`tandem-kernels/cuda/gdn_chunked.cu`):
//! the same contract as [`super::cuda::delta_fused`] without verify lanes, in three launches
//! (per-chunk WY factors for all chunks in parallel, the state pass over the chunks in order,
//! the gated output norm). Reference: [`super::step::step_reference_chunked`], which runs the
//! CPU's chunked kernel ([`super::gated_delta_chunked`]).

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::GdnDims;
use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, allow_dynamic_shared, cuda_device, f32_rows, i32_of, run, tensor, Inputs};

/// The kernels' chunk length (`WY_C`), the same as the CPU's [`super::CHUNK`].
const WY_C: usize = 64;
/// Value columns per block of the state pass (`WY_COLS`).
const WY_COLS: usize = 32;
/// Warps per block of the state pass (`WY_WARPS`).
const WY_WARPS: u32 = 16;

/// Shared memory the state pass asks for: the state slice and V', plus the chunk's W, Q and K
/// rows when staged (`gdn_chunked.cu`).
fn wy_state_smem(dk: usize, staged: bool) -> u32 {
    let rows = if staged { 3 * WY_C * dk } else { 0 };
    ((dk + WY_C) * WY_COLS * 4 + rows * 4) as u32
}

/// Whether the state pass stages each chunk's W, Q and K rows in shared memory
/// (`gdn_wy_state_staged`: the same bits as `gdn_wy_state`): by default, where they fit (220
/// KB, under the 227 KB a block may have: key dims up to 128) and dk is a multiple of 4;
/// `TANDEM_GDN_WY=plain` keeps every call on `gdn_wy_state` (16 warps, rows from global
/// memory), for comparisons. Measured on the H100 (9B Q8_0 pp512, 2026-12-05): 7,163-7,172
/// tok/s staged against 6,798-6,820 plain; check-device passes every `gdn_step wy` shape with it.
fn wy_staged(dk: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| std::env::var("TANDEM_GDN_WY").as_deref() != Ok("plain"));
    on && dk.is_multiple_of(4) && wy_state_smem(dk, true) <= 220 * 1024
}

/// See [`super::step::step_reference_chunked`]: from the conv output `u` `[t, 2 nk dk + nv dv]`,
/// the gate `z` `[t, nv dv]` and the raw `b`, `a` `[t, nv]`, the normed output `[t, nv dv]` and
/// the next state `[nv, dk, dv]`.
pub fn step_chunked(
    u: &Tensor,
    z: &Tensor,
    b: &Tensor,
    a: &Tensor,
    state: &Tensor,
    p: &super::device::StepTensors<'_>,
    d: GdnDims,
) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(u).ok_or_else(|| ModelError::Input("gdn chunked step: not a CUDA tensor".into()))?;
    let t = u.dim(0)?;
    if t == 0 || d.nk == 0 || d.nv % d.nk != 0 || d.dk == 0 || d.dk > 256 || d.dv == 0 {
        return Err(ModelError::Input(format!(
            "gdn chunked step: {t} tokens, {} v-heads over {} k-heads, key dim {} (up to 256), value dim {}",
            d.nv, d.nk, d.dk, d.dv
        )));
    }
    let f32c = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F32)?.contiguous()?) };
    let ts = [u, b, a, p.dt_bias, p.neg_a, p.norm_w, state].map(f32c);
    let ts = ts.into_iter().collect::<Result<Vec<_>>>()?;
    let inputs = Inputs::new(&ts.iter().collect::<Vec<_>>())?;
    let v = |i: usize| inputs.view::<f32>(i);
    let (uv, bv, av, dtb, nga, nw, sv) = (v(0)?, v(1)?, v(2)?, v(3)?, v(4)?, v(5)?, v(6)?);
    // z is read in place where it is a column view of the fused projection (gdn_gated_norm
    // takes its row stride): a copy of [t, nv dv] f32 a layer otherwise.
    if z.dims2()? != (t, d.nv * d.dv) {
        return Err(ModelError::Input(format!("gdn chunked step: z {:?}, want [{t}, {}]", z.dims(), d.nv * d.dv)));
    }
    let (zt, ldz) = f32_rows(z)?;
    let z_in = Inputs::new_rows(&[&zt])?;
    let zv = z_in.view::<f32>(0)?;
    let chunks = t.div_ceil(WY_C);
    let (nv, dk, dv) = (d.nv, d.dk, d.dv);
    // Scratch: normalised q, k, the WY factors W and U, the cumulative decays, the causal scores.
    let qn = alloc_f32(&dev, nv * t * dk)?;
    let kn = alloc_f32(&dev, nv * t * dk)?;
    let w = alloc_f32(&dev, nv * t * dk)?;
    let uu = alloc_f32(&dev, nv * t * dv)?;
    let gam = alloc_f32(&dev, nv * t)?;
    let pm = alloc_f32(&dev, nv * chunks * WY_C * WY_C)?;
    let o_raw = alloc_f32(&dev, t * nv * dv)?;
    let next = alloc_f32(&dev, d.state_len())?;
    let y = alloc_f32(&dev, t * nv * dv)?;
    let (ti, nki, nvi, dki, dvi) = (i32_of(t)?, i32_of(d.nk)?, i32_of(nv)?, i32_of(dk)?, i32_of(dv)?);
    let chunks_u32 = u32::try_from(chunks).map_err(|_| ModelError::Input(format!("gdn chunked step: {t} tokens")))?;

    let f = dev.kernel("gdn_wy_prep", tandem_kernels::ptx(tandem_kernels::GDN_CHUNKED))?;
    let mut bl = f.builder();
    bl.arg(&qn).arg(&kn).arg(&w).arg(&uu).arg(&gam).arg(&pm);
    bl.arg(&uv).arg(&bv).arg(&av).arg(&dtb).arg(&nga);
    bl.arg(&ti).arg(&nki).arg(&nvi).arg(&dki).arg(&dvi).arg(&p.scale);
    let cfg = LaunchConfig { grid_dim: (nv as u32, chunks_u32, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in gdn_wy_prep's order; qn, kn, w hold nv*t*dk, uu nv*t*dv, gam nv*t,
    // pm nv*chunks*64*64; the grid has one block per (v-head, chunk).
    unsafe { run(&mut bl, cfg, "gdn_wy_prep")? };
    drop(bl);

    let staged = wy_staged(dk);
    let name = if staged { "gdn_wy_state_staged" } else { "gdn_wy_state" };
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::GDN_CHUNKED))?;
    let smem = wy_state_smem(dk, staged);
    if staged {
        allow_dynamic_shared(&f, format!("{:?}/{name}", dev.id()), name, smem)?;
    }
    let mut bl = f.builder();
    bl.arg(&o_raw).arg(&next).arg(&qn).arg(&kn).arg(&w).arg(&uu).arg(&gam).arg(&pm).arg(&sv);
    bl.arg(&ti).arg(&nvi).arg(&dki).arg(&dvi);
    let cfg = LaunchConfig {
        grid_dim: (nv as u32, dv.div_ceil(WY_COLS) as u32, 1),
        block_dim: (WY_WARPS * 32, 1, 1),
        shared_mem_bytes: smem,
    };
    // SAFETY: arguments in gdn_wy_state's order (the staged kernel's are the same); o_raw
    // holds t*nv*dv, next nv*dk*dv; shared memory holds the state slice (dk x 32) and V'
    // (64 x 32), and for the staged kernel the chunk's W, Q and K rows (3 x 64 x dk, dk a
    // multiple of 4: wy_staged checks), as wy_state_smem computes.
    unsafe { run(&mut bl, cfg, name)? };
    drop(bl);

    let rows = t * nv;
    let (rowsi, eps) = (i32_of(rows)?, p.eps);
    let f = dev.kernel("gdn_gated_norm", tandem_kernels::ptx(tandem_kernels::GDN_CHUNKED))?;
    let mut bl = f.builder();
    let ldz = i32_of(ldz)?;
    bl.arg(&y).arg(&o_raw).arg(&zv).arg(&nw).arg(&rowsi).arg(&dvi).arg(&eps).arg(&nvi).arg(&ldz);
    let cfg = LaunchConfig { grid_dim: (rows.div_ceil(8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in gdn_gated_norm's order; y and o_raw hold rows*dv, z rows*dv, one
    // warp per row.
    unsafe { run(&mut bl, cfg, "gdn_gated_norm")? };
    drop(bl);
    drop((uv, zv, bv, av, dtb, nga, nw, sv));
    drop(inputs);
    drop(z_in);
    Ok((tensor(y, &dev, (t, nv * dv)), tensor(next, &dev, (nv, dk, dv))))
}
