//! The Gated DeltaNet token mixer: projections to the pre-conv `[Q | K | V]` channels, z, b
//! and a; the causal conv + SiLU with the sequence's conv state; L2-normalised q/k (q scaled by
//! dk^-1/2); gates β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias); the gated delta
//! rule (chunked for prefill, recurrent for single tokens and verify mode); the gated RMSNorm
//! with z; out_proj. Qwen3-Next's grouped `in_proj_qkvz` / `in_proj_ba` rows are permuted at
//! load time into the split Qwen3.5 layout, so one code path serves both.
//!
//! GGUF layouts are recognised by the tensors present: a grouped `in_proj_ba` beside split
//! `in_proj_qkv` / `in_proj_z` (`qwen3next` GGUFs) has its b and a columns picked after the
//! matmul; V heads in llama.cpp's tiled order ([`HybridConfig::v_heads_tiled`], `qwen35*`
//! GGUFs) are put back in grouped order by gathering the projection outputs (and scattering
//! the `out_proj` input), so quantised weights are used exactly as stored, while the small
//! per-head tensors (conv, A, dt_bias) are reordered at load time.

use std::sync::Arc;

use candle_core::Tensor;

use crate::error::{ModelError, Result};
use crate::kv::RecurrentState;
use crate::loader::{Linear, WeightSource};
use crate::ops::gdn::{
    causal_conv_silu_taps, device as gdn_dev, gated_delta_chunked, gated_delta_recurrent, gated_delta_recurrent_states,
    gated_rms_norm, l2_normalize, step::gates as gdn_gates, GdnDims,
};

use super::config::HybridConfig;
use super::ffn::Dense;

/// A projection either as stored or re-laid out at load time.
enum Proj {
    Stored(Linear),
    Permuted(Dense),
    /// A stored projection whose output columns are picked and reordered by the `u32` indices
    /// (on the device, and on the host for folding them into a fused weight).
    Gathered(Arc<Linear>, Tensor, #[cfg_attr(not(feature = "cuda"), allow(dead_code))] Vec<u32>),
}

impl Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Proj::Stored(l) => l.forward(x),
            Proj::Permuted(d) => d.forward(x),
            Proj::Gathered(l, cols, _) => Ok(l.forward(x)?.contiguous()?.index_select(cols, 1)?),
        }
    }
    fn gathered(l: Arc<Linear>, cols: Vec<u32>, dev: &candle_core::Device) -> Result<Self> {
        let n = cols.len();
        Ok(Proj::Gathered(l, Tensor::from_slice(&cols, n, dev)?, cols))
    }
    fn rows(w: &Tensor, rows: Vec<u32>) -> Result<Self> {
        let n = rows.len();
        let idx = Tensor::from_vec(rows, n, w.device())?;
        Ok(Proj::Permuted(Dense::from_weight(&w.index_select(&idx, 0)?)?))
    }
}

/// The four input projections: each on its own, or (CUDA) one fused matmul whose weight rows
/// are the projections' output columns in the order the layer reads them (llama.cpp's tiled V
/// heads folded in at load: no gather per step).
enum Projections {
    Each(Box<[Proj; 4]>),
    #[cfg(feature = "cuda")]
    Fused(crate::ops::quant::cuda_fused::FusedLinear),
}

impl Projections {
    /// One fused matmul where the stored weights allow (CUDA, one format; not the re-laid out
    /// HF `in_proj_qkvz`), else the projections as they are.
    fn new(projs: [Proj; 4]) -> Result<Self> {
        #[cfg(feature = "cuda")]
        {
            let mut parts: Vec<&Linear> = Vec::new();
            let mut outputs = Vec::new();
            for p in &projs {
                let (l, rows) = match p {
                    Proj::Stored(l) => (l, None),
                    Proj::Gathered(l, _, cols) => (&**l, Some(cols.clone())),
                    Proj::Permuted(_) => return Ok(Projections::Each(Box::new(projs))),
                };
                let i = match parts.iter().position(|q| std::ptr::eq(*q, l)) {
                    Some(i) => i,
                    None => {
                        parts.push(l);
                        parts.len() - 1
                    }
                };
                let rows = match rows {
                    Some(r) => r,
                    None => (0..l.weight.dims()?.0 as u32).collect(),
                };
                outputs.push((i, rows));
            }
            if crate::loader::LinearSet::fusing_enabled() {
                if let Some(set) = crate::ops::quant::cuda_fused::FusedLinear::from_rows(&parts, &outputs)? {
                    return Ok(Projections::Fused(set));
                }
            }
        }
        Ok(Projections::Each(Box::new(projs)))
    }

    /// qkv, z, b, a for `h`.
    fn forward(&self, h: &Tensor) -> Result<[Tensor; 4]> {
        let outs: Vec<Tensor> = match self {
            Projections::Each(ps) => ps.iter().map(|p| p.forward(h)).collect::<Result<_>>()?,
            #[cfg(feature = "cuda")]
            Projections::Fused(set) => set.forward(h)?,
        };
        outs.try_into().map_err(|_| ModelError::Input("GDN: projections missing".into()))
    }
}

/// One sequence's share of a batch for a GDN layer.
pub struct GdnPart<'a> {
    pub len: usize,
    pub state: &'a mut RecurrentState,
    /// Verify mode: the state after each position is appended here.
    pub lane: Option<&'a mut Vec<RecurrentState>>,
}

pub struct GdnLayer {
    /// qkv, z, b, a.
    proj: Projections,
    out: Linear,
    /// Tiled V-head order: the `out_proj` input columns, gathered from grouped order.
    out_cols: Option<Tensor>,
    /// The conv weights as taps `[K, channels]` (`gdn::conv_taps`).
    conv_taps: Vec<f32>,
    neg_a: Vec<f32>,
    dt_bias: Vec<f32>,
    norm_w: Vec<f32>,
    dims: GdnDims,
    channels: usize,
    kernel: usize,
    eps: f32,
    /// The small per-layer tensors on the model's device (GPU models).
    dev: Option<DeviceParams>,
}

/// `conv_w [ch, K]`, `neg_a`, `dt_bias [nv]`, `norm_w [dv]` as f32 device tensors.
struct DeviceParams {
    conv_w: Tensor,
    neg_a: Tensor,
    dt_bias: Tensor,
    norm_w: Tensor,
}

fn vec_of(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

impl GdnLayer {
    /// `p` is the layer prefix (`blk.N.`).
    pub fn load(cfg: &HybridConfig, ws: &dyn WeightSource, p: &str) -> Result<Self> {
        let n = |s: &str| format!("{p}linear_attn.{s}");
        let (nk, nv, dk, dv) =
            (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim);
        let dims = GdnDims { nk, nv, dk, dv };
        let r = dims.ratio();
        let channels = cfg.conv_channels();
        let dev = ws.device();
        // Tiled V-head order (llama.cpp `qwen35*`): tiled head j·nk + g is grouped head g·r + j.
        let tiled = cfg.v_heads_tiled && nk != nv;
        let tiled_of = |h: usize| if tiled { (h % r) * nk + h / r } else { h };
        let mut out_cols = None;
        let (qkv, z, b, a) = if ws.has(&n("in_proj_qkvz.weight")) {
            let w = ws.tensor_f32(&n("in_proj_qkvz.weight"))?;
            let ba = ws.tensor_f32(&n("in_proj_ba.weight"))?;
            let group = 2 * dk + 2 * r * dv;
            let (mut qkv_rows, mut z_rows, mut b_rows, mut a_rows) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for part in 0..2 {
                for g in 0..nk {
                    qkv_rows.extend((0..dk).map(|d| (g * group + part * dk + d) as u32));
                }
            }
            for h in 0..nv {
                let (g, j) = (h / r, h % r);
                qkv_rows.extend((0..dv).map(|d| (g * group + 2 * dk + j * dv + d) as u32));
                z_rows.extend((0..dv).map(|d| (g * group + 2 * dk + r * dv + j * dv + d) as u32));
                b_rows.push((g * 2 * r + j) as u32);
                a_rows.push((g * 2 * r + r + j) as u32);
            }
            if w.dim(0)? != nk * group || ba.dim(0)? != 2 * nv {
                return Err(ModelError::Config(format!(
                    "{}: shape {:?} does not fit the config",
                    n("in_proj_qkvz"),
                    w.dims()
                )));
            }
            (Proj::rows(&w, qkv_rows)?, Proj::rows(&w, z_rows)?, Proj::rows(&ba, b_rows)?, Proj::rows(&ba, a_rows)?)
        } else {
            let kd = nk * dk;
            // Output columns of the V-indexed projections, in grouped order.
            let v_cols = |width: usize| -> Vec<u32> {
                (0..nv).flat_map(|h| (0..width).map(move |d| (tiled_of(h) * width + d) as u32)).collect()
            };
            let stored = |s: &str, cols: Option<Vec<u32>>| -> Result<Proj> {
                let l = ws.linear(&n(s))?;
                match cols {
                    Some(c) => Proj::gathered(Arc::new(l), c, dev),
                    None => Ok(Proj::Stored(l)),
                }
            };
            let qkv_cols =
                tiled.then(|| (0..2 * kd as u32).chain(v_cols(dv).into_iter().map(|c| c + 2 * kd as u32)).collect());
            let qkv = stored("in_proj_qkv.weight", qkv_cols)?;
            let z = stored("in_proj_z.weight", tiled.then(|| v_cols(dv)))?;
            let (b, a) = if ws.has(&n("in_proj_ba.weight")) {
                // Grouped per k-head: [b_g (r) | a_g (r)] for each k-head g.
                let ba = Arc::new(ws.linear(&n("in_proj_ba.weight"))?);
                let b_cols = (0..nv).map(|h| ((h / r) * 2 * r + h % r) as u32).collect();
                let a_cols = (0..nv).map(|h| ((h / r) * 2 * r + r + h % r) as u32).collect();
                (Proj::gathered(ba.clone(), b_cols, dev)?, Proj::gathered(ba, a_cols, dev)?)
            } else {
                (
                    stored("in_proj_b.weight", tiled.then(|| v_cols(1)))?,
                    stored("in_proj_a.weight", tiled.then(|| v_cols(1)))?,
                )
            };
            if tiled {
                // out_proj reads its input in tiled order: column t·dv + d is grouped head g·r + j.
                let cols: Vec<u32> =
                    (0..nv).flat_map(|t| (0..dv).map(move |d| (((t % nk) * r + t / nk) * dv + d) as u32)).collect();
                out_cols = Some(Tensor::from_vec(cols, nv * dv, dev)?);
            }
            (qkv, z, b, a)
        };
        let mut conv_w = vec_of(&ws.tensor_f32(&n("conv1d.weight"))?)?;
        if conv_w.len() != channels * cfg.conv_kernel {
            return Err(ModelError::Config(format!(
                "{}: {} values, expected {channels} x {}",
                n("conv1d.weight"),
                conv_w.len(),
                cfg.conv_kernel
            )));
        }
        let mut neg_a: Vec<f32> = vec_of(&ws.tensor_f32(&n("A_log"))?)?.iter().map(|x| -x.exp()).collect();
        let mut dt_bias = vec_of(&ws.tensor_f32(&n("dt_bias"))?)?;
        let norm_w = vec_of(&ws.tensor_f32(&n("norm.weight"))?)?;
        if neg_a.len() != nv || dt_bias.len() != nv || norm_w.len() != dv {
            return Err(ModelError::Config(format!(
                "{p}linear_attn: A_log / dt_bias / norm sizes do not fit the config"
            )));
        }
        if tiled {
            let kc = cfg.conv_kernel;
            let v0 = 2 * nk * dk * kc;
            let (stored_a, stored_dt, stored_conv) = (neg_a.clone(), dt_bias.clone(), conv_w.clone());
            for h in 0..nv {
                let t = tiled_of(h);
                neg_a[h] = stored_a[t];
                dt_bias[h] = stored_dt[t];
                conv_w[v0 + h * dv * kc..v0 + (h + 1) * dv * kc]
                    .copy_from_slice(&stored_conv[v0 + t * dv * kc..v0 + (t + 1) * dv * kc]);
            }
        }
        let dev_params = if dev.is_cpu() {
            None
        } else {
            Some(DeviceParams {
                conv_w: Tensor::from_slice(&conv_w, (channels, cfg.conv_kernel), dev)?,
                neg_a: Tensor::from_slice(&neg_a, nv, dev)?,
                dt_bias: Tensor::from_slice(&dt_bias, nv, dev)?,
                norm_w: Tensor::from_slice(&norm_w, dv, dev)?,
            })
        };
        Ok(Self {
            dev: dev_params,
            proj: if dev.is_cpu() {
                Projections::Each(Box::new([qkv, z, b, a]))
            } else {
                Projections::new([qkv, z, b, a])?
            },
            out: ws.linear(&n("out_proj.weight"))?,
            out_cols,
            conv_taps: crate::ops::gdn::conv_taps(&conv_w, channels, cfg.conv_kernel),
            neg_a,
            dt_bias,
            norm_w,
            dims,
            channels,
            kernel: cfg.conv_kernel,
            eps: cfg.rms_norm_eps as f32,
        })
    }

    pub fn dims(&self) -> GdnDims {
        self.dims
    }

    /// out_proj of the normed output `y` `[tokens, nv dv]` (in grouped V-head order; tiled
    /// checkpoints gather its columns first).
    fn output(&self, y: &Tensor) -> Result<Tensor> {
        match &self.out_cols {
            Some(cols) => self.out.forward(&y.index_select(cols, 1)?),
            None => self.out.forward(y),
        }
    }

    /// The device step's parameters.
    fn step_tensors<'a>(&'a self, p: &'a DeviceParams) -> gdn_dev::StepTensors<'a> {
        gdn_dev::StepTensors {
            dt_bias: &p.dt_bias,
            neg_a: &p.neg_a,
            norm_w: &p.norm_w,
            scale: (self.dims.dk as f64).powf(-0.5) as f32,
            eps: self.eps,
        }
    }

    /// `h: [tokens, hidden]` (normed), the parts in order. Returns `[tokens, hidden]`.
    pub fn forward(&self, h: &Tensor, parts: &mut [GdnPart<'_>]) -> Result<Tensor> {
        if let Some(p) = &self.dev {
            if !h.device().is_cpu() {
                return self.forward_device(h, parts, p);
            }
        }
        let GdnDims { nk, nv, dk, dv } = self.dims;
        let (ch, kd) = (self.channels, nk * dk);
        let [qkv, z, b, a] = self.proj.forward(h)?;
        let (qkv, z, b, a) = (vec_of(&qkv)?, vec_of(&z)?, vec_of(&b)?, vec_of(&a)?);
        let total = h.dim(0)?;
        let mut y = vec![0f32; total * nv * dv];
        let scale = (dk as f32).powf(-0.5);
        let mut off = 0;
        for part in parts.iter_mut() {
            let t = part.len;
            let x = &qkv[off * ch..(off + t) * ch];
            let mut conv_states = Vec::new();
            if let RecurrentState::Device { .. } = part.state {
                *part.state = RecurrentState::Host { conv: part.state.conv_values()?, ssm: part.state.ssm_values()? };
            }
            let RecurrentState::Host { conv: conv_state, .. } = &mut *part.state else {
                return Err(ModelError::Input("GDN state is not on the host".into()));
            };
            let u = if part.lane.is_some() {
                // Verify mode: one token at a time so every position's conv state is kept.
                let mut u = Vec::with_capacity(t * ch);
                for i in 0..t {
                    u.extend(causal_conv_silu_taps(
                        &x[i * ch..(i + 1) * ch],
                        conv_state,
                        &self.conv_taps,
                        ch,
                        self.kernel,
                    ));
                    conv_states.push(conv_state.clone());
                }
                u
            } else {
                causal_conv_silu_taps(x, conv_state, &self.conv_taps, ch, self.kernel)
            };
            let (mut q, mut k, mut v) =
                (Vec::with_capacity(t * kd), Vec::with_capacity(t * kd), Vec::with_capacity(t * nv * dv));
            for row in u.chunks(ch) {
                q.extend_from_slice(&row[..kd]);
                k.extend_from_slice(&row[kd..2 * kd]);
                v.extend_from_slice(&row[2 * kd..]);
            }
            l2_normalize(&mut q, dk, 1e-6);
            l2_normalize(&mut k, dk, 1e-6);
            q.iter_mut().for_each(|x| *x *= scale);
            let mut beta = Vec::with_capacity(t * nv);
            let mut g = Vec::with_capacity(t * nv);
            for i in 0..t {
                for hh in 0..nv {
                    let idx = (off + i) * nv + hh;
                    let (bt, gt) = gdn_gates(b[idx], a[idx], self.dt_bias[hh], self.neg_a[hh]);
                    beta.push(bt);
                    g.push(gt);
                }
            }
            let RecurrentState::Host { ssm, .. } = &mut *part.state else {
                return Err(ModelError::Input("a CPU GDN layer got device state".into()));
            };
            let mut o = match &mut part.lane {
                Some(lane) => {
                    let (o, states) = gated_delta_recurrent_states(&q, &k, &v, &beta, &g, ssm, self.dims);
                    for (conv, ssm) in conv_states.into_iter().zip(states) {
                        lane.push(RecurrentState::Host { conv, ssm });
                    }
                    o
                }
                None if t == 1 => gated_delta_recurrent(&q, &k, &v, &beta, &g, ssm, self.dims),
                None => gated_delta_chunked(&q, &k, &v, &beta, &g, ssm, self.dims),
            };
            gated_rms_norm(&mut o, &z[off * nv * dv..(off + t) * nv * dv], &self.norm_w, self.eps);
            y[off * nv * dv..(off + t) * nv * dv].copy_from_slice(&o);
            off += t;
        }
        self.output(&Tensor::from_vec(y, (total, nv * dv), h.device())?)
    }

    /// The same layer with state and arithmetic on the model's device, no host round trip:
    /// prefill chunks one sequence at a time ([`gdn_dev`]: the conv, then the chunked or fused
    /// step), the token-by-token parts (decode, verify) of a CUDA batch together
    /// ([`Self::forward_batched`]), one set of launches for all of them.
    fn forward_device(&self, h: &Tensor, parts: &mut [GdnPart<'_>], p: &DeviceParams) -> Result<Tensor> {
        let d = self.dims;
        let dev = h.device();
        let [qkv, z, b, a] = self.proj.forward(h)?.map(|t| t.to_dtype(candle_core::DType::F32));
        let (qkv, z, b, a) = (qkv?, z?, b?, a?);
        let sp = self.step_tensors(p);
        let starts: Vec<usize> = parts.iter().scan(0, |o, part| Some(std::mem::replace(o, *o + part.len))).collect();
        let batched: Vec<bool> = parts
            .iter()
            .map(|part| gdn_dev::batches(dev, d) && !gdn_dev::takes_chunked(dev, part.len, part.lane.is_some(), d))
            .collect();
        // The outputs in the order computed, and each part's rows in them.
        let mut pieces = Vec::new();
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); parts.len()];
        let mut done = 0usize;
        if batched.iter().filter(|&&x| x).count() >= 2 {
            // Verify parts keep every position's state; decode parts do not: one batch each.
            for verify in [false, true] {
                let group: Vec<usize> =
                    (0..parts.len()).filter(|&i| batched[i] && parts[i].lane.is_some() == verify).collect();
                if group.is_empty() {
                    continue;
                }
                let o = self.forward_batched([&qkv, &z, &b, &a], parts, &starts, &group, p, &sp)?;
                for &i in &group {
                    rows[i] = (done..done + parts[i].len).map(|r| r as u32).collect();
                    done += parts[i].len;
                }
                pieces.push(o);
            }
        }
        for (i, part) in parts.iter_mut().enumerate() {
            if !rows[i].is_empty() || part.len == 0 {
                continue;
            }
            let (off, t) = (starts[i], part.len);
            let (conv, ssm) = match &*part.state {
                RecurrentState::Device { conv, ssm } => (conv.clone(), ssm.clone()),
                RecurrentState::Host { conv, ssm } => (
                    Tensor::from_slice(conv, (self.kernel - 1, self.channels), dev)?,
                    Tensor::from_slice(ssm, ssm.len(), dev)?,
                ),
            };
            let lanes = part.lane.is_some();
            let x = qkv.narrow(0, off, t)?;
            let (u, conv_next, conv_lanes) = gdn_dev::conv_silu(&x, &conv, &p.conv_w, lanes)?;
            let (o, ssm_next, ssm_lanes) = gdn_dev::step(
                &u,
                &z.narrow(0, off, t)?,
                &b.narrow(0, off, t)?,
                &a.narrow(0, off, t)?,
                &ssm,
                &sp,
                d,
                lanes,
            )?;
            pieces.push(o);
            rows[i] = (done..done + t).map(|r| r as u32).collect();
            done += t;
            *part.state = RecurrentState::Device { conv: conv_next, ssm: ssm_next.flatten_all()? };
            if let (Some(lane), Some(cl), Some(sl)) = (&mut part.lane, conv_lanes, ssm_lanes) {
                for i in 0..t {
                    lane.push(RecurrentState::Device { conv: cl.get(i)?, ssm: sl.get(i)?.flatten_all()? });
                }
            }
        }
        let y =
            if pieces.len() == 1 { pieces.pop().unwrap_or_else(|| unreachable!()) } else { Tensor::cat(&pieces, 0)? };
        self.output(&rows_of(&y, &rows.concat())?)
    }

    /// The parts `group` (token-by-token, all verify or none) in one batched step
    /// ([`crate::ops::gdn::cuda_batch::step_batch`]); each part takes its row of the batch's next
    /// state (and its lanes). Returns the group's output rows, part after part. Only CUDA
    /// batches: elsewhere [`gdn_dev::batches`] is false and this is not called.
    fn forward_batched(
        &self,
        [qkv, z, b, a]: [&Tensor; 4],
        parts: &mut [GdnPart<'_>],
        starts: &[usize],
        group: &[usize],
        p: &DeviceParams,
        sp: &gdn_dev::StepTensors<'_>,
    ) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        {
            use crate::ops::gdn::cuda_batch::{step_batch, BatchSeq};
            let dev = qkv.device();
            let token_rows: Vec<u32> =
                group.iter().flat_map(|&i| (starts[i]..starts[i] + parts[i].len).map(|r| r as u32)).collect();
            let states = group
                .iter()
                .map(|&i| match &*parts[i].state {
                    RecurrentState::Device { conv, ssm } => Ok((conv.clone(), ssm.clone())),
                    RecurrentState::Host { conv, ssm } => Ok((
                        Tensor::from_slice(conv, (self.kernel - 1, self.channels), dev)?,
                        Tensor::from_slice(ssm, ssm.len(), dev)?,
                    )),
                })
                .collect::<Result<Vec<_>>>()?;
            let seqs: Vec<BatchSeq<'_>> =
                group.iter().zip(&states).map(|(&i, (conv, ssm))| BatchSeq { len: parts[i].len, conv, ssm }).collect();
            let lanes = parts[group[0]].lane.is_some();
            let r = step_batch(
                &rows_of(qkv, &token_rows)?,
                &rows_of(z, &token_rows)?,
                &rows_of(b, &token_rows)?,
                &rows_of(a, &token_rows)?,
                &seqs,
                &p.conv_w,
                sp,
                self.dims,
                lanes,
            )?;
            drop(seqs);
            let mut tok = 0;
            for (k, &i) in group.iter().enumerate() {
                let part = &mut parts[i];
                *part.state = RecurrentState::Device { conv: r.conv.get(k)?, ssm: r.ssm.get(k)?.flatten_all()? };
                if let (Some(lane), Some(cl), Some(sl)) = (&mut part.lane, &r.conv_lanes, &r.ssm_lanes) {
                    for j in tok..tok + part.len {
                        lane.push(RecurrentState::Device { conv: cl.get(j)?, ssm: sl.get(j)?.flatten_all()? });
                    }
                }
                tok += part.len;
            }
            Ok(r.o)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (qkv, z, b, a, parts, starts, group, p, sp);
            Err(ModelError::Input("batched GDN steps need a CUDA build".into()))
        }
    }
}

#[cfg(feature = "cuda")]
impl GdnLayer {
    /// The layer's decode or verify step inside a CUDA graph: `bsz` sequences of the same
    /// number of tokens, whose input and output state addresses (and with `lanes`, the
    /// addresses of their per-token states) are in `meta` (see
    /// [`crate::ops::gdn::cuda_batch::step_batch_at`]); no sequence cache is touched. The same
    /// arithmetic as an eager decode or verify ([`Self::forward_batched`]), so the same bits.
    pub fn forward_graph(&self, h: &Tensor, meta: &Tensor, bsz: usize, lanes: bool) -> Result<Tensor> {
        let p =
            self.dev.as_ref().ok_or_else(|| ModelError::Input("GDN graph step: layer has no device params".into()))?;
        let d = self.dims;
        let [qkv, z, b, a] = self.proj.forward(h)?.map(|t| t.to_dtype(candle_core::DType::F32));
        let sp = self.step_tensors(p);
        self.output(&crate::ops::gdn::cuda_batch::step_batch_at(
            &qkv?,
            [&z?, &b?, &a?],
            meta,
            bsz,
            lanes,
            &p.conv_w,
            &sp,
            d,
        )?)
    }

    /// Whether the decode step batches on this device (CUDA, supported dims).
    pub fn batches_on(&self, dev: &candle_core::Device) -> bool {
        self.dev.is_some() && gdn_dev::batches(dev, self.dims)
    }

    /// Conv kernel width and channels (the conv state is `[kernel - 1, channels]`).
    pub fn conv_shape(&self) -> (usize, usize) {
        (self.kernel, self.channels)
    }
}

/// The rows `rows` of `t`, in that order: a view when they are consecutive (every row: `t`
/// itself), else a gather. `t` may be a column view of the fused projection's output (not
/// contiguous): CUDA's gather needs a contiguous source, so such a `t` is copied first. (A
/// mixed step, a prefill chunk beside decodes, gathers the decodes' rows: before 2026-12-07
/// that failed on CUDA and the engine fell back to one sequence at a time.)
fn rows_of(t: &Tensor, rows: &[u32]) -> Result<Tensor> {
    if let Some(&first) = rows.first() {
        if rows.iter().enumerate().all(|(i, &r)| r as usize == first as usize + i) {
            return if first == 0 && rows.len() == t.dim(0)? {
                Ok(t.clone())
            } else {
                Ok(t.narrow(0, first as usize, rows.len())?)
            };
        }
    }
    let idx = Tensor::from_slice(rows, rows.len(), t.device())?;
    Ok(t.contiguous()?.index_select(&idx, 0)?)
}
