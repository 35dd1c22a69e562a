//! One GDN layer's decode / verify work for a whole batch of sequences in three launches
//! (`gdn_conv_silu_batch`, `gdn_delta_cols_batch_*`, `gdn_gated_norm` in
//! `tandem-kernels/cuda/gdn.cu`), instead of three per sequence. Each sequence keeps its own
//! input state tensors: the kernels read them through a table of device addresses uploaded
//! with the token offsets (one small copy per layer), and write every sequence's next state
//! into one `[B, ...]` buffer whose rows become the sequences' new states (views; device states
//! are never written in place, so sharing a buffer is safe). Each sequence's arithmetic is the
//! one-sequence kernels' exactly ([`super::cuda::delta_fused`] with the column split): a batch
//! gives the bits of its parts, which `conformance` checks.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Device, Tensor};

use super::device::StepTensors;
use super::GdnDims;
use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, cuda_device, device_address, f32_rows, i32_of, run, tensor, Inputs};

/// One sequence of a batch: its token count and input states (`conv` `[K-1, ch]`, `ssm`
/// `[nv dk dv]`, f32 on the device).
pub struct BatchSeq<'a> {
    pub len: usize,
    pub conv: &'a Tensor,
    pub ssm: &'a Tensor,
}

/// What [`step_batch`] returns: the normed output `[total, nv dv]` (the sequences' tokens one
/// after another), the next states (`conv` `[B, K-1, ch]`, `ssm` `[B, nv, dk, dv]`) and, with
/// lanes, the states after every token (`[total, K-1, ch]`, `[total, nv, dk, dv]`).
pub struct BatchStep {
    pub o: Tensor,
    pub conv: Tensor,
    pub ssm: Tensor,
    pub conv_lanes: Option<Tensor>,
    pub ssm_lanes: Option<Tensor>,
}

fn f32c(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::F32)?.contiguous()?)
}

/// The conv (with the weights `conv_w` `[ch, K]`) and the fused step of
/// [`super::device::step`] for every sequence of `seqs`, whose pre-conv channels `x`
/// `[total, ch]`, gate `z` `[total, nv dv]` and raw `b`, `a` `[total, nv]` lie one after another.
#[allow(clippy::too_many_arguments)]
pub fn step_batch(
    x: &Tensor,
    z: &Tensor,
    b: &Tensor,
    a: &Tensor,
    seqs: &[BatchSeq<'_>],
    conv_w: &Tensor,
    p: &StepTensors<'_>,
    d: GdnDims,
    lanes: bool,
) -> Result<BatchStep> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("gdn batch step: not a CUDA tensor".into()))?;
    let bsz = seqs.len();
    check(x, bsz, seqs.iter().map(|s| s.len).sum(), conv_w, d)?;
    let (ch, hist) = (x.dim(1)?, conv_w.dim(1)?.saturating_sub(1));
    // The input states as contiguous f32 (already so, unless made elsewhere) and their addresses.
    let mut states = Vec::with_capacity(2 * bsz);
    for s in seqs {
        if s.conv.elem_count() != hist * ch || s.ssm.elem_count() != d.state_len() {
            return Err(ModelError::Input("gdn batch step: a sequence's state does not fit the layer".into()));
        }
        states.push(f32c(s.conv)?);
        states.push(f32c(s.ssm)?);
    }
    let mut meta = Vec::with_capacity(3 * bsz + 1);
    let mut off = 0i64;
    meta.push(0);
    for s in seqs {
        off += s.len as i64;
        meta.push(off);
    }
    for which in 0..2 {
        for i in 0..bsz {
            meta.push(device_address(&states[2 * i + which])? as i64);
        }
    }
    let meta = Tensor::from_vec(meta, 3 * bsz + 1, &Device::Cuda(dev.clone()))?;
    let lanes = if lanes { LaneMode::Fresh } else { LaneMode::Off };
    let (o, next, lanes) = launch([x, z, b, a], &meta, bsz, conv_w, p, d, lanes, true)?;
    drop(states);
    let (conv, ssm) = next.ok_or_else(|| ModelError::Input("gdn batch step: no next state".into()))?;
    Ok(BatchStep { o, conv, ssm, conv_lanes: lanes.0, ssm_lanes: lanes.1 })
}

/// Checks a batched step's shapes; returns the delta kernel's name.
fn check(x: &Tensor, bsz: usize, total_of_seqs: usize, conv_w: &Tensor, d: GdnDims) -> Result<&'static str> {
    let (total, ch) = x.dims2()?;
    let (wch, kernel) = conv_w.dims2()?;
    if total != total_of_seqs || bsz == 0 || wch != ch {
        return Err(ModelError::Input(format!("gdn batch step: {total} tokens over {bsz} sequences, {ch} channels")));
    }
    if !(1..=8).contains(&kernel) || d.nk == 0 || !d.nv.is_multiple_of(d.nk) || d.dk == 0 || d.dv == 0 {
        return Err(ModelError::Input(format!(
            "gdn batch step: conv kernel {kernel}, {} v-heads over {} k-heads, dims {} x {}",
            d.nv, d.nk, d.dk, d.dv
        )));
    }
    Ok(match d.dk {
        0..=32 => "gdn_delta_cols_batch_32",
        33..=64 => "gdn_delta_cols_batch_64",
        65..=128 => "gdn_delta_cols_batch_128",
        129..=256 => "gdn_delta_cols_batch_256",
        _ => return Err(ModelError::Input(format!("gdn batch step: key dim {} (up to 256)", d.dk))),
    })
}

/// A CUDA graph's step: `bsz` sequences of `x.dim(0) / bsz` tokens each (one: a decode step;
/// more: a verify step), whose input and output state addresses are in `meta` (i64 on the
/// device, `[B + 1 offsets | B conv in | B ssm in | B conv out | B ssm out]`, written before
/// every launch of the graph; with `lanes`, then `[B conv lanes | B ssm lanes]`, the addresses
/// the states after each token go to, one after another); the kernels write the next states
/// there. Returns the normed output `[total, nv dv]`.
#[allow(clippy::too_many_arguments)]
pub fn step_batch_at(
    x: &Tensor,
    [z, b, a]: [&Tensor; 3],
    meta: &Tensor,
    bsz: usize,
    lanes: bool,
    conv_w: &Tensor,
    p: &StepTensors<'_>,
    d: GdnDims,
) -> Result<Tensor> {
    check(x, bsz, x.dim(0)?, conv_w, d)?;
    let words = if lanes { 7 * bsz + 1 } else { 5 * bsz + 1 };
    if meta.dtype() != DType::I64 || meta.elem_count() != words {
        return Err(ModelError::Input(format!("gdn graph step: meta {:?} for {bsz} sequences", meta.dims())));
    }
    let lanes = if lanes { LaneMode::InMeta } else { LaneMode::Off };
    Ok(launch([x, z, b, a], meta, bsz, conv_w, p, d, lanes, false)?.0)
}

/// Where a batched step's per-token states go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LaneMode {
    /// Nowhere (a decode step).
    Off,
    /// New `[total, ...]` buffers, returned.
    Fresh,
    /// The addresses in meta (a graph's verify step).
    InMeta,
}

type Lanes = (Option<Tensor>, Option<Tensor>);
/// A batched step's output, its next states (when fresh) and its lanes.
type Launched = (Tensor, Option<(Tensor, Tensor)>, Lanes);

/// The three launches of a batched step with `meta` on the device; `fresh`: the next states go
/// to new `[B, ...]` buffers (returned), else to meta's output addresses.
#[allow(clippy::too_many_arguments)]
fn launch(
    [x, z, b, a]: [&Tensor; 4],
    meta: &Tensor,
    bsz: usize,
    conv_w: &Tensor,
    p: &StepTensors<'_>,
    d: GdnDims,
    lane_mode: LaneMode,
    fresh: bool,
) -> Result<Launched> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("gdn batch step: not a CUDA tensor".into()))?;
    let (total, ch) = x.dims2()?;
    let kernel = conv_w.dim(1)?;
    let hist = kernel.saturating_sub(1);
    let name = check(x, bsz, total, conv_w, d)?;
    // x, z, b and a are read in place when they are column views of the fused input
    // projection (a call of several rows): each kernel takes their row strides.
    let (rows, lds): (Vec<Tensor>, Vec<usize>) =
        [x, z, b, a].into_iter().map(f32_rows).collect::<Result<Vec<_>>>()?.into_iter().unzip();
    let ts = [conv_w, p.dt_bias, p.neg_a, p.norm_w].map(f32c);
    let ts = rows.into_iter().map(Ok).chain(ts).collect::<Result<Vec<_>>>()?;
    let [ldx, ldz, ldb, lda] = [lds[0], lds[1], lds[2], lds[3]].map(i32_of);
    let (ldx, ldz, ldb, lda) = (ldx?, ldz?, ldb?, lda?);
    let meta = meta.contiguous()?;
    let inputs = Inputs::new_rows(&ts.iter().chain([&meta]).collect::<Vec<_>>())?;
    let v = |i: usize| inputs.view::<f32>(i);
    let (xv, zv, bv, av, wv, dtb, nga, nw) = (v(0)?, v(1)?, v(2)?, v(3)?, v(4)?, v(5)?, v(6)?, v(7)?);
    let mv = inputs.view::<i64>(8)?;
    let null = 0u64;
    let (bi, chi, ki) = (i32_of(bsz)?, i32_of(ch)?, i32_of(kernel)?);
    let lanes = lane_mode == LaneMode::Fresh;
    let meta_lanes = i32::from(lane_mode == LaneMode::InMeta);
    let bz = u32::try_from(bsz).map_err(|_| ModelError::Input(format!("gdn batch step: {bsz} sequences")))?;

    let u = alloc_f32(&dev, total * ch)?;
    let conv_next = if fresh { Some(alloc_f32(&dev, bsz * hist * ch)?) } else { None };
    let conv_lanes = if lanes { Some(alloc_f32(&dev, total * hist * ch)?) } else { None };
    let f = dev.kernel("gdn_conv_silu_batch", tandem_kernels::ptx(tandem_kernels::GDN))?;
    let mut bl = f.builder();
    bl.arg(&u);
    match &conv_next {
        Some(c) => bl.arg(c),
        None => bl.arg(&null),
    };
    match &conv_lanes {
        Some(l) => bl.arg(l),
        None => bl.arg(&null),
    };
    bl.arg(&xv).arg(&mv).arg(&wv).arg(&bi).arg(&chi).arg(&ki).arg(&meta_lanes).arg(&ldx);
    let cfg = LaunchConfig { grid_dim: (ch.div_ceil(128) as u32, bz, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in gdn_conv_silu_batch's order; x holds total rows ldx apart (ldx >= ch,
    // f32_rows); u holds total*ch, conv_next B*hist*ch,
    // lanes total*hist*ch; meta holds B+1 offsets (the last = total) and B live state addresses
    // (and with meta_lanes, B lane addresses of t*hist*ch each at 5B+1).
    unsafe { run(&mut bl, cfg, "gdn_conv_silu_batch")? };
    drop(bl);

    let o_raw = alloc_f32(&dev, total * d.nv * d.dv)?;
    let ssm_next = if fresh { Some(alloc_f32(&dev, bsz * d.state_len())?) } else { None };
    let ssm_lanes = if lanes { Some(alloc_f32(&dev, total * d.state_len())?) } else { None };
    let (nk, nv, dk, dv) = (i32_of(d.nk)?, i32_of(d.nv)?, i32_of(d.dk)?, i32_of(d.dv)?);
    let f = dev.kernel(name, tandem_kernels::ptx(tandem_kernels::GDN))?;
    let mut bl = f.builder();
    bl.arg(&o_raw);
    match &ssm_next {
        Some(c) => bl.arg(c),
        None => bl.arg(&null),
    };
    match &ssm_lanes {
        Some(l) => bl.arg(l),
        None => bl.arg(&null),
    };
    bl.arg(&u).arg(&bv).arg(&av).arg(&dtb).arg(&nga).arg(&mv).arg(&bi);
    bl.arg(&nk).arg(&nv).arg(&dk).arg(&dv).arg(&p.scale).arg(&meta_lanes).arg(&ldb).arg(&lda);
    let cfg = LaunchConfig {
        grid_dim: (d.nv as u32, d.dv.div_ceil(32) as u32, bz),
        block_dim: (128, 1, 1),
        shared_mem_bytes: ((2 * d.dk + 4) * 4) as u32,
    };
    // SAFETY: arguments in gdn_delta_cols_batch_*'s order; b and a hold total rows ldb / lda
    // apart (each at least nv); o_raw holds total*nv*dv, ssm_next
    // B*nv*dk*dv, lanes total times that; u is the conv output [total, ch]; shared memory holds
    // q, k and one float per warp of the 128-thread block.
    unsafe { run(&mut bl, cfg, name)? };
    drop(bl);

    let rows = total * d.nv;
    let (rowsi, eps) = (i32_of(rows)?, p.eps);
    let o = alloc_f32(&dev, rows * d.dv)?;
    let f = dev.kernel("gdn_gated_norm", tandem_kernels::ptx(tandem_kernels::GDN_CHUNKED))?;
    let mut bl = f.builder();
    bl.arg(&o).arg(&o_raw).arg(&zv).arg(&nw).arg(&rowsi).arg(&dv).arg(&eps).arg(&nv).arg(&ldz);
    let cfg = LaunchConfig { grid_dim: (rows.div_ceil(8) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    // SAFETY: arguments in gdn_gated_norm's order; o and o_raw hold rows*dv, z total rows of
    // nv*dv ldz apart, one
    // warp per row.
    unsafe { run(&mut bl, cfg, "gdn_gated_norm")? };
    drop(bl);
    drop(inputs);
    let next = match (conv_next, ssm_next) {
        (Some(c), Some(s)) => Some((tensor(c, &dev, (bsz, hist, ch)), tensor(s, &dev, (bsz, d.nv, d.dk, d.dv)))),
        _ => None,
    };
    let lanes = (
        conv_lanes.map(|l| tensor(l, &dev, (total, hist, ch))),
        ssm_lanes.map(|l| tensor(l, &dev, (total, d.nv, d.dk, d.dv))),
    );
    Ok((tensor(o, &dev, (total, d.nv * d.dv)), next, lanes))
}
