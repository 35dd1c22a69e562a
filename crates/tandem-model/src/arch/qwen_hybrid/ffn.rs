//! Feed-forward blocks of the hybrid family: dense SwiGLU, and the sparse MoE block (softmax
//! over all experts, top-k, renormalised, plus a sigmoid-gated shared expert). Expert weights
//! load from per-expert tensors (`experts.{e}.gate_proj.weight`, ...; kept as the source stores
//! them, so GGUF experts stay quantised) or from the fused
//! Qwen3.5 layout (`experts.gate_up_proj` `[E, 2I, H]`, gate rows first; `experts.down_proj`
//! `[E, H, I]`).
//!
//! On a device with MoE kernels (CUDA) the routed experts are kept stacked as the file stores
//! them ([`RoutedExperts`]: a GGUF's `ffn_*_exps` tensors, the fused HF tensors, or per-expert
//! tensors stacked at load) and routed on the device, with no host round trip; elsewhere the
//! router logits come to the host and each chosen expert runs its own matmuls.

use candle_core::quantized::QMatMul;
use candle_core::{DType, Tensor};

use crate::error::{ModelError, Result};
use crate::loader::{Linear, LinearSet, LinearWeight, WeightSource};
use crate::ops::moe::{ExpertStack, RoutedExperts, StackData};

use super::config::HybridConfig;

/// A dense f32 weight `[out, in]` for `x · Wᵀ` through [`crate::ops::quant::row_stable`]: on
/// the CPU the row-invariant dense kernel (candle's own matmul sums one row differently from
/// several on aarch64, which broke verify rows of the MoE experts there).
#[derive(Debug, Clone)]
pub struct Dense {
    w: QMatMul,
}

impl Dense {
    /// From a PyTorch-layout weight `[out, in]`.
    pub fn from_weight(w: &Tensor) -> Result<Self> {
        Ok(Self { w: QMatMul::Tensor(w.to_dtype(DType::F32)?.contiguous()?) })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(crate::ops::quant::row_stable::forward(&self.w, x)?)
    }
}

/// `down(silu(gate(x)) ⊙ up(x))`.
pub struct Mlp {
    /// gate_proj, up_proj (one matmul on CUDA).
    gate_up: LinearSet,
    down: Linear,
}

impl Mlp {
    pub fn load(ws: &dyn WeightSource, p: &str) -> Result<Self> {
        Ok(Self {
            gate_up: LinearSet::new(vec![
                ws.linear(&format!("{p}gate_proj.weight"))?,
                ws.linear(&format!("{p}up_proj.weight"))?,
            ])?,
            down: ws.linear(&format!("{p}down_proj.weight"))?,
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [g, u] = self.gate_up.forward_array(x)?;
        self.down.forward_silu_mul(&g, &u)
    }
}

/// An expert's projection: dense f32 (fused HF layout) or a [`Linear`] as the source stores it
/// (per-expert tensors, possibly quantised slices of a GGUF's stacked experts).
enum ExpertW {
    Dense(Dense),
    Linear(Linear),
}

impl ExpertW {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            ExpertW::Dense(d) => d.forward(x),
            ExpertW::Linear(l) => l.forward(x),
        }
    }
}

/// Rows up to which a MoE block of packed Q4K experts takes [`Moe::grouped`] (decode steps,
/// verify chunks); longer prefill chunks batch each expert's rows in one call instead.
const GROUPED_ROWS: usize = 16;

struct Expert {
    gate: ExpertW,
    up: ExpertW,
    down: ExpertW,
}

pub struct Moe {
    router: Linear,
    /// The per-expert path (CPU, and devices without MoE kernels).
    experts: Vec<Expert>,
    /// The device path: every expert stacked, routed on the device.
    routed: Option<RoutedExperts>,
    shared: Option<(Mlp, Linear)>,
    top_k: usize,
    norm_topk: bool,
}

impl Moe {
    /// `p` is the block's prefix, e.g. `blk.3.mlp.`.
    pub fn load(cfg: &HybridConfig, ws: &dyn WeightSource, p: &str) -> Result<Self> {
        let m = cfg.moe.as_ref().ok_or_else(|| ModelError::Config("MoE layer without MoE config".into()))?;
        let i = m.intermediate_size;
        let mut experts = Vec::with_capacity(m.num_experts);
        let fused = format!("{p}experts.gate_up_proj");
        let routed = if ws.device().is_cuda() { routed_experts(cfg, ws, p)? } else { None };
        if routed.is_some() {
            // the stacks hold every expert; nothing per expert
        } else if ws.has(&fused) {
            let gu = ws.tensor_f32(&fused)?;
            let dn = ws.tensor_f32(&format!("{p}experts.down_proj"))?;
            if gu.dims() != [m.num_experts, 2 * i, cfg.hidden_size] || dn.dims() != [m.num_experts, cfg.hidden_size, i]
            {
                return Err(ModelError::Config(format!(
                    "{fused}: shapes {:?} / {:?} do not fit the config",
                    gu.dims(),
                    dn.dims()
                )));
            }
            for e in 0..m.num_experts {
                let g = gu.get(e)?;
                let d = |w: &Tensor| -> Result<ExpertW> { Ok(ExpertW::Dense(Dense::from_weight(w)?)) };
                experts.push(Expert {
                    gate: d(&g.narrow(0, 0, i)?)?,
                    up: d(&g.narrow(0, i, i)?)?,
                    down: d(&dn.get(e)?)?,
                });
            }
        } else {
            for e in 0..m.num_experts {
                // Each expert's shape is checked against the config at load, like every layer's.
                let w = |s: &str, rows: usize, cols: usize| -> Result<ExpertW> {
                    let name = format!("{p}experts.{e}.{s}.weight");
                    Ok(ExpertW::Linear(ws.linear(&name)?.expect(&name, &[rows], cols)?))
                };
                let h = cfg.hidden_size;
                experts.push(Expert {
                    gate: w("gate_proj", i, h)?,
                    up: w("up_proj", i, h)?,
                    down: w("down_proj", h, i)?,
                });
            }
        }
        let shared = if ws.has(&format!("{p}shared_expert.gate_proj.weight")) {
            Some((Mlp::load(ws, &format!("{p}shared_expert."))?, ws.linear(&format!("{p}shared_expert_gate.weight"))?))
        } else {
            None
        };
        Ok(Self {
            router: ws.linear(&format!("{p}gate.weight"))?,
            experts,
            routed,
            shared,
            top_k: m.top_k,
            norm_topk: m.norm_topk_prob,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(r) = &self.routed {
            let out = r.forward(x, &self.router.forward(x)?)?;
            return self.add_shared(x, out);
        }
        let n = x.dim(0)?;
        let logits = self.router.forward(x)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        let mut per_expert: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); self.experts.len()];
        for (row, l) in logits.iter().enumerate() {
            let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let p: Vec<f32> = l.iter().map(|v| (v - m).exp()).collect();
            let z: f32 = p.iter().sum();
            let mut idx: Vec<usize> = (0..p.len()).collect();
            idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            idx.truncate(self.top_k);
            let sel: f32 = idx.iter().map(|&e| p[e] / z).sum();
            for &e in &idx {
                let w = if self.norm_topk { p[e] / z / sel } else { p[e] / z };
                per_expert[e].0.push(row as u32);
                per_expert[e].1.push(w);
            }
        }
        if n <= GROUPED_ROWS {
            if let Some(out) = self.grouped(x, &per_expert)? {
                return self.add_shared(x, out);
            }
        }
        let mut out = x.zeros_like()?;
        for (e, (rows, ws)) in per_expert.into_iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let ex = &self.experts[e];
            let m = rows.len();
            let ids = Tensor::from_vec(rows, m, x.device())?;
            let xs = x.index_select(&ids, 0)?;
            let h = (candle_nn::ops::silu(&ex.gate.forward(&xs)?)? * ex.up.forward(&xs)?)?;
            let y = ex.down.forward(&h)?.broadcast_mul(&Tensor::from_vec(ws, (m, 1), x.device())?)?;
            out = out.index_add(&ids, &y, 0)?;
        }
        debug_assert_eq!(out.dim(0).ok(), Some(n));
        self.add_shared(x, out)
    }

    /// The routed experts of a few rows as two grouped calls when every expert is a packed
    /// Q4K matrix ([`crate::ops::quant::kquant::matmul_grouped`]: gate and up of every (row,
    /// expert) pair at once, then every down), `None` otherwise. Each row gets the bits of the
    /// per-expert loop: the same products, SiLU and product on the same values, the weighted
    /// outputs added to zero in expert order as `index_add` adds them.
    fn grouped(&self, x: &Tensor, per_expert: &[(Vec<u32>, Vec<f32>)]) -> Result<Option<Tensor>> {
        use crate::ops::quant::kquant::{matmul_grouped, Job};
        fn packed(w: &ExpertW) -> Option<&crate::ops::quant::KQuantMatrix> {
            match w {
                ExpertW::Linear(Linear { weight: LinearWeight::KQuant(m), bias: None }) => Some(m.as_ref()),
                _ => None,
            }
        }
        let mut pairs = Vec::new(); // (row, weight, gate, up, down)
        for (e, (rows, ws)) in per_expert.iter().enumerate() {
            let ex = &self.experts[e];
            for (&r, &w) in rows.iter().zip(ws) {
                let (Some(g), Some(u), Some(d)) = (packed(&ex.gate), packed(&ex.up), packed(&ex.down)) else {
                    return Ok(None);
                };
                pairs.push((r as usize, w, g, u, d));
            }
        }
        let (n, h) = x.dims2()?;
        let xs = x.to_dtype(DType::F32)?.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        let jobs: Vec<Job<'_>> =
            pairs.iter().flat_map(|(r, _, g, u, _)| [Job { w: g, row: *r }, Job { w: u, row: *r }]).collect();
        let gu = matmul_grouped(&jobs, &xs, n);
        let i = gu.first().map_or(0, |v| v.len());
        let p = pairs.len();
        let (gate, up): (Vec<f32>, Vec<f32>) = (
            gu.iter().step_by(2).flatten().copied().collect(),
            gu.iter().skip(1).step_by(2).flatten().copied().collect(),
        );
        let dev = x.device();
        let hidden = (candle_nn::ops::silu(&Tensor::from_vec(gate, (p, i), dev)?)?
            * Tensor::from_vec(up, (p, i), dev)?)?
        .flatten_all()?
        .to_vec1::<f32>()?;
        let jobs: Vec<Job<'_>> = pairs.iter().enumerate().map(|(q, (_, _, _, _, d))| Job { w: d, row: q }).collect();
        let down = matmul_grouped(&jobs, &hidden, p);
        let mut out = vec![0f32; n * h];
        for ((r, w, ..), y) in pairs.iter().zip(&down) {
            for (o, v) in out[r * h..(r + 1) * h].iter_mut().zip(y) {
                *o += v * w;
            }
        }
        Ok(Some(Tensor::from_vec(out, (n, h), dev)?.to_dtype(x.dtype())?))
    }

    /// `out` plus the sigmoid-gated shared expert, if the block has one.
    fn add_shared(&self, x: &Tensor, out: Tensor) -> Result<Tensor> {
        Ok(match &self.shared {
            Some((mlp, gate)) => {
                (out + mlp.forward(x)?.broadcast_mul(&candle_nn::ops::sigmoid(&gate.forward(x)?)?)?)?
            }
            None => out,
        })
    }
}

/// The routed experts stacked for the device kernels, or `None` where they cannot be (a format
/// without kernels, per-expert quantised tensors): the per-expert path then serves the layer.
fn routed_experts(cfg: &HybridConfig, ws: &dyn WeightSource, p: &str) -> Result<Option<RoutedExperts>> {
    let Some(m) = cfg.moe.as_ref() else { return Ok(None) };
    let (e, i, h) = (m.num_experts, m.intermediate_size, cfg.hidden_size);
    let fused = format!("{p}experts.gate_up_proj");
    let (gate, up, down) = if ws.has(&fused) {
        // HF fused layout: [E, 2I, H] (gate rows first) and [E, H, I].
        let gu = StackData::Dense(ws.tensor_f32(&fused)?.contiguous()?);
        let dn = StackData::Dense(ws.tensor_f32(&format!("{p}experts.down_proj"))?.contiguous()?);
        (
            ExpertStack::new(gu.clone(), e, 2 * i, 0, i, h)?,
            ExpertStack::new(gu, e, 2 * i, i, i, h)?,
            ExpertStack::new(dn, e, h, 0, h, i)?,
        )
    } else if let (Some(g), Some(u), Some(d)) =
        (ws.stacked_experts(p, "gate_proj")?, ws.stacked_experts(p, "up_proj")?, ws.stacked_experts(p, "down_proj")?)
    {
        // A GGUF's stacked expert tensors, kept quantised.
        let gd = ws.stacked_data(&g.storage)?;
        let ud = if u.storage == g.storage { gd.clone() } else { ws.stacked_data(&u.storage)? };
        let dd = ws.stacked_data(&d.storage)?;
        let n = |s: &crate::loader::StackedExperts| s.experts;
        if n(&g) != e || n(&u) != e || n(&d) != e {
            return Err(ModelError::Config(format!("{p}: stacked experts do not hold the config's {e} experts")));
        }
        (
            ExpertStack::new(gd, e, g.rows_per_expert, g.row0, i, h)?,
            ExpertStack::new(ud, e, u.rows_per_expert, u.row0, i, h)?,
            ExpertStack::new(dd, e, d.rows_per_expert, d.row0, h, i)?,
        )
    } else {
        // Per-expert tensors: stacked here when they are dense.
        let stack = |proj: &str| -> Result<Option<Tensor>> {
            let mut ts = Vec::with_capacity(e);
            for x in 0..e {
                match ws.qmatmul(&format!("{p}experts.{x}.{proj}.weight"))? {
                    LinearWeight::Candle(candle_core::quantized::QMatMul::Tensor(t)) => ts.push(t),
                    _ => return Ok(None),
                }
            }
            Ok(Some(Tensor::stack(&ts, 0)?.to_dtype(DType::F32)?.contiguous()?))
        };
        let (Some(g), Some(u), Some(d)) = (stack("gate_proj")?, stack("up_proj")?, stack("down_proj")?) else {
            return Ok(None);
        };
        (
            ExpertStack::new(StackData::Dense(g), e, i, 0, i, h)?,
            ExpertStack::new(StackData::Dense(u), e, i, 0, i, h)?,
            ExpertStack::new(StackData::Dense(d), e, h, 0, h, i)?,
        )
    };
    let r = RoutedExperts::new(gate, up, down, m.top_k, m.norm_topk_prob)?;
    Ok(r.supported().then_some(r))
}

pub enum Ffn {
    Dense(Mlp),
    Moe(Box<Moe>),
}

impl Ffn {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Moe(m) => m.forward(x),
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::QMatMul;
    use candle_core::Device;

    use super::*;
    use crate::conformance::Rng;
    use crate::ops::moe::reference;

    /// The per-expert path (CPU) computes the routed-experts maths the device kernels are
    /// checked against (`ops::moe::reference`, `tandem check-device`'s `moe` rows).
    #[test]
    fn per_expert_path_matches_the_reference() {
        let (e, top_k, h, i, m) = (8, 3, 64, 32, 5);
        let mut rng = Rng(11);
        let mut mats = |rows: usize, cols: usize| -> Vec<Vec<f32>> { (0..e).map(|_| rng.vec(rows * cols)).collect() };
        let (gate, up, down) = (mats(i, h), mats(i, h), mats(h, i));
        let dense = |w: &[f32], rows, cols| {
            ExpertW::Dense(
                Dense::from_weight(&Tensor::from_vec(w.to_vec(), (rows, cols), &Device::Cpu).unwrap()).unwrap(),
            )
        };
        let experts = (0..e)
            .map(|x| Expert { gate: dense(&gate[x], i, h), up: dense(&up[x], i, h), down: dense(&down[x], h, i) })
            .collect();
        let router_w: Vec<f32> = rng.vec(e * h).into_iter().map(|v| v * 2.0).collect();
        let router_t = Tensor::from_vec(router_w.clone(), (e, h), &Device::Cpu).unwrap();
        let router = Linear { weight: LinearWeight::Candle(QMatMul::Tensor(router_t.clone())), bias: None };
        let moe = Moe { router, experts, routed: None, shared: None, top_k, norm_topk: true };
        let x: Vec<f32> = rng.vec(m * h);
        let xt = Tensor::from_vec(x.clone(), (m, h), &Device::Cpu).unwrap();
        let got = moe.forward(&xt).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let logits = xt.matmul(&router_t.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let ex = reference::Experts { gate: &gate, up: &up, down: &down, hidden: h, inter: i };
        let want = reference::forward(&ex, &x, &logits, m, top_k, true);
        let err = crate::conformance::rel_err_slices(&got, &want);
        assert!(err < 1e-5, "per-expert MoE vs reference: relative error {err}");
        // And the routing itself: ties go to the lower index, weights renormalised.
        let r = reference::route(&[1.0, 3.0, 3.0, 0.5], 2, true);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((r[0].1 - 0.5).abs() < 1e-12 && (r[1].1 - 0.5).abs() < 1e-12);
    }

    /// Packed Q4K experts: a few rows take the grouped path, a long chunk the per-expert loop;
    /// each row has the same bits both ways (decode = verify = prefill), near the f32 maths.
    #[test]
    fn grouped_q4k_experts_equal_the_per_expert_loop() {
        use candle_core::quantized::{GgmlDType, QTensor};
        use std::sync::Arc;
        let (e, top_k, h, i, m) = (6, 2, 256, 256, GROUPED_ROWS + 4);
        let mut rng = Rng(5);
        // Q4K gate / up and Q5K down, as in a Q4_K_M / Q5_K_M mix.
        let mut mat = |rows: usize, cols: usize, dt: GgmlDType| -> (Vec<f32>, ExpertW) {
            let w = rng.vec(rows * cols);
            let q = QTensor::quantize(&Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap(), dt).unwrap();
            let m = crate::ops::quant::KQuantMatrix::from_bytes(dt, rows, cols, &q.data().unwrap()).unwrap();
            let deq = m.dequantize();
            (deq, ExpertW::Linear(Linear { weight: LinearWeight::KQuant(Arc::new(m)), bias: None }))
        };
        let (mut gate, mut up, mut down, mut experts) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..e {
            let (g, gw) = mat(i, h, GgmlDType::Q4K);
            let (u, uw) = mat(i, h, GgmlDType::Q4K);
            let (d, dw) = mat(h, i, GgmlDType::Q5K);
            gate.push(g);
            up.push(u);
            down.push(d);
            experts.push(Expert { gate: gw, up: uw, down: dw });
        }
        let router_t = Tensor::from_vec(rng.vec(e * h), (e, h), &Device::Cpu).unwrap();
        let router = Linear { weight: LinearWeight::Candle(QMatMul::Tensor(router_t.clone())), bias: None };
        let moe = Moe { router, experts, routed: None, shared: None, top_k, norm_topk: true };
        let x: Vec<f32> = rng.vec(m * h);
        let xt = Tensor::from_vec(x.clone(), (m, h), &Device::Cpu).unwrap();
        let bits = |t: Tensor| {
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let all = bits(moe.forward(&xt).unwrap());
        for (start, len) in [(0, 1), (7, 1), (3, 5), (0, GROUPED_ROWS)] {
            let part = bits(moe.forward(&xt.narrow(0, start, len).unwrap()).unwrap());
            assert_eq!(part, all[start * h..(start + len) * h].to_vec(), "rows {start}..{}", start + len);
        }
        let got: Vec<f32> = all.iter().map(|&b| f32::from_bits(b)).collect();
        let logits = xt.matmul(&router_t.t().unwrap()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let ex = reference::Experts { gate: &gate, up: &up, down: &down, hidden: h, inter: i };
        let want = reference::forward(&ex, &x, &logits, m, top_k, true);
        let err = crate::conformance::rel_err_slices(&got, &want);
        assert!(err < 2e-2, "Q4K experts vs the f32 reference on their weights: relative error {err}");
    }
}
