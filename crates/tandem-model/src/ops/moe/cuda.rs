//! Launchers of the MoE kernels: route (`moe_route`), group slots by expert (`moe_sort`), the
//! chosen experts' gate/up and down projections (`moe_gate_up_*`, `moe_matmul_*` in
//! `qmatmul.cu`, the row-invariant arithmetic of the dense/quantised matmuls) and the weighted
//! sum (`moe_combine`). Seven launches per layer whatever the number of experts, nothing read
//! back to the host.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Tensor};

use super::{ExpertStack, RoutedExperts, StackData};
use crate::error::{ModelError, Result};
use crate::ops::cuda_module::LoadKernel as _;
use crate::ops::cuda_util::{alloc_f32, cuda_device, device_address, i32_of, run, tensor, Inputs};
use crate::ops::quant::cuda_quant::WeightFormat;

/// Most experts the routing and sorting kernels take (shared memory).
const MAX_EXPERTS: usize = 8192;
/// CUDA's limit on a grid's y dimension: slots go in launches of at most this many.
const MAX_GRID_Y: usize = 65_535;

fn format(s: &ExpertStack) -> Option<WeightFormat> {
    let f = match &s.data {
        StackData::Quant(q) if q.device().is_cuda() => WeightFormat::of_ggml(q.dtype())?,
        StackData::Dense(t) if t.device().is_cuda() => WeightFormat::of_dtype(t.dtype())?,
        _ => return None,
    };
    f.fits(s.k).then_some(f)
}

pub(super) fn supported(r: &RoutedExperts) -> bool {
    let (g, u, d) = (format(&r.gate), format(&r.up), format(&r.down));
    g.is_some() && g == u && d.is_some() && r.gate.experts <= MAX_EXPERTS
}

/// The device address of expert 0's first row of `s`, and the bytes between experts.
fn base(s: &ExpertStack, f: WeightFormat) -> Result<(u64, i64)> {
    let row = f.row_bytes(s.k);
    let start = match &s.data {
        StackData::Quant(q) => q.device_ptr()? as u64,
        StackData::Dense(t) => device_address(t)?,
    };
    // The stack is owned by the layer and never written, and everything runs on one stream, so
    // the address stays valid for the launches that follow.
    Ok((start + (s.row0 * row) as u64, (s.rows_per_expert * row) as i64))
}

pub(super) fn forward(r: &RoutedExperts, x: &Tensor, logits: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(x).ok_or_else(|| ModelError::Input("MoE: not a CUDA tensor".into()))?;
    let (fg, fd) = match (format(&r.gate), format(&r.down)) {
        (Some(g), Some(d)) if supported(r) => (g, d),
        _ => return Err(ModelError::Input("MoE: these expert weights have no CUDA kernel".into())),
    };
    let (m, hidden) = x.dims2()?;
    let (m2, e) = logits.dims2()?;
    if m2 != m || e != r.gate.experts || hidden != r.gate.k {
        return Err(ModelError::Input(format!("MoE: x {:?}, logits {:?} for {e} experts", x.dims(), logits.dims())));
    }
    let (top_k, inter) = (r.top_k, r.gate.n);
    let slots = m * top_k;
    let x = x.to_dtype(DType::F32)?.contiguous()?;
    let logits = logits.to_dtype(DType::F32)?.contiguous()?;
    let inputs = Inputs::new(&[&x, &logits])?;
    let (xv, lv) = (inputs.view::<f32>(0)?, inputs.view::<f32>(1)?);
    // SAFETY (allocations): moe_route writes every id and weight, moe_sort every slot of order,
    // the expert kernels every element of h and y, moe_combine every output.
    let ids = unsafe { dev.alloc::<i32>(slots.max(1))? };
    let wts = alloc_f32(&dev, slots)?;
    let order = unsafe { dev.alloc::<i32>(slots.max(1))? };
    let h = alloc_f32(&dev, slots * inter)?;
    let y = alloc_f32(&dev, slots * hidden)?;
    let out = alloc_f32(&dev, m * hidden)?;
    if m == 0 {
        return Ok(tensor(out, &dev, (0, hidden)));
    }
    let (ei, ki, ni, hi, ii) =
        (i32_of(e)?, i32_of(top_k)?, i32_of(r.norm_topk as usize)?, i32_of(hidden)?, i32_of(inter)?);
    let si = i32_of(slots)?;

    let f = dev.kernel("moe_route", tandem_kernels::ptx(tandem_kernels::MOE))?;
    let mut b = f.builder();
    b.arg(&ids).arg(&wts).arg(&lv).arg(&ei).arg(&ki).arg(&ni);
    let cfg = LaunchConfig { grid_dim: (m as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: (e * 4) as u32 };
    // SAFETY: moe_route(ids, wts, logits, E, top_k, norm): ids/wts m*top_k, logits m*E.
    unsafe { run(&mut b, cfg, "moe_route")? };
    drop(b);

    let f = dev.kernel("moe_sort", tandem_kernels::ptx(tandem_kernels::MOE))?;
    let mut b = f.builder();
    b.arg(&order).arg(&ids).arg(&si).arg(&ei);
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: (e * 4) as u32 };
    // SAFETY: moe_sort(order, ids, S, E): both S ints, ids < E (written by moe_route).
    unsafe { run(&mut b, cfg, "moe_sort")? };
    drop(b);

    let (g0, gstride) = base(&r.gate, fg)?;
    let (u0, ustride) = base(&r.up, fg)?;
    let (d0, dstride) = base(&r.down, fd)?;
    if ustride != gstride {
        return Err(ModelError::Input("MoE: gate and up stacks have different expert strides".into()));
    }
    let name = format!("moe_gate_up_{}", fg.suffix);
    let f = dev.kernel(&name, tandem_kernels::ptx(tandem_kernels::QMATMUL))?;
    let (grow, drow) = (fg.row_bytes(hidden) as i64, fd.row_bytes(inter) as i64);
    let xdiv = i32_of(top_k)?;
    let one = 1i32;
    for s0 in (0..slots).step_by(MAX_GRID_Y) {
        let n_s = (slots - s0).min(MAX_GRID_Y);
        let ord = order.slice(s0..s0 + n_s);
        let mut b = f.builder();
        b.arg(&h).arg(&xv).arg(&g0).arg(&u0).arg(&ord).arg(&ids).arg(&ii).arg(&hi).arg(&grow).arg(&gstride).arg(&xdiv);
        let cfg = LaunchConfig {
            grid_dim: (inter.div_ceil(4) as u32, n_s as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: moe_gate_up(h, x, wg, wu, order, ids, n, k, row_bytes, expert_bytes, x_div):
        // h S*inter, x m*hidden, experts E*stride bytes from each base, order a slice of S.
        unsafe { run(&mut b, cfg, &name)? };
    }
    let name = format!("moe_matmul_{}", fd.suffix);
    let f = dev.kernel(&name, tandem_kernels::ptx(tandem_kernels::QMATMUL))?;
    for s0 in (0..slots).step_by(MAX_GRID_Y) {
        let n_s = (slots - s0).min(MAX_GRID_Y);
        let ord = order.slice(s0..s0 + n_s);
        let mut b = f.builder();
        b.arg(&y).arg(&h).arg(&d0).arg(&ord).arg(&ids).arg(&hi).arg(&ii).arg(&drow).arg(&dstride).arg(&one);
        let cfg = LaunchConfig {
            grid_dim: (hidden.div_ceil(4) as u32, n_s as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: moe_matmul(y, x, w, order, ids, n, k, row_bytes, expert_bytes, x_div): y S*hidden,
        // h S*inter (one row per slot).
        unsafe { run(&mut b, cfg, &name)? };
    }

    let f = dev.kernel("moe_combine", tandem_kernels::ptx(tandem_kernels::MOE))?;
    let mut b = f.builder();
    b.arg(&out).arg(&y).arg(&wts).arg(&hi).arg(&ki);
    let cfg = LaunchConfig {
        grid_dim: (m as u32, hidden.div_ceil(256) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: moe_combine(out, y, wts, h, top_k): out m*hidden, y S*hidden, wts S.
    unsafe { run(&mut b, cfg, "moe_combine")? };
    drop(b);
    drop((xv, lv));
    drop(inputs);
    Ok(tensor(out, &dev, (m, hidden)))
}
