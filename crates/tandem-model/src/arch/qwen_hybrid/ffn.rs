//! Feed-forward blocks of the hybrid family: dense SwiGLU, and the sparse MoE block (softmax
//! over all experts, top-k, renormalised, plus a sigmoid-gated shared expert). Expert weights
//! load from per-expert tensors (`experts.{e}.gate_proj.weight`, ...; kept as the source stores
//! them, so GGUF experts stay quantised) or from the fused
//! Qwen3.5 layout (`experts.gate_up_proj` `[E, 2I, H]`, gate rows first; `experts.down_proj`
//! `[E, H, I]`).

use candle_core::{DType, Tensor};

use crate::error::{ModelError, Result};
use crate::loader::{Linear, WeightSource};

use super::config::HybridConfig;

/// A dense weight kept transposed (`[in, out]`) for `x · Wᵀ` as one matmul.
#[derive(Debug, Clone)]
pub struct Dense {
    wt: Tensor,
}

impl Dense {
    /// From a PyTorch-layout weight `[out, in]`.
    pub fn from_weight(w: &Tensor) -> Result<Self> {
        Ok(Self { wt: w.to_dtype(DType::F32)?.t()?.contiguous()? })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.matmul(&self.wt)?)
    }
}

/// `down(silu(gate(x)) ⊙ up(x))`.
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    pub fn load(ws: &dyn WeightSource, p: &str) -> Result<Self> {
        Ok(Self {
            gate: ws.linear(&format!("{p}gate_proj.weight"))?,
            up: ws.linear(&format!("{p}up_proj.weight"))?,
            down: ws.linear(&format!("{p}down_proj.weight"))?,
        })
    }
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = candle_nn::ops::silu(&self.gate.forward(x)?)?;
        self.down.forward(&(g * self.up.forward(x)?)?)
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

struct Expert {
    gate: ExpertW,
    up: ExpertW,
    down: ExpertW,
}

pub struct Moe {
    router: Linear,
    experts: Vec<Expert>,
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
        if ws.has(&fused) {
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
                let w = |s: &str| -> Result<ExpertW> {
                    Ok(ExpertW::Linear(ws.linear(&format!("{p}experts.{e}.{s}.weight"))?))
                };
                experts.push(Expert { gate: w("gate_proj")?, up: w("up_proj")?, down: w("down_proj")? });
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
            shared,
            top_k: m.top_k,
            norm_topk: m.norm_topk_prob,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
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
        if let Some((mlp, gate)) = &self.shared {
            let s = mlp.forward(x)?.broadcast_mul(&candle_nn::ops::sigmoid(&gate.forward(x)?)?)?;
            out = (out + s)?;
        }
        debug_assert_eq!(out.dim(0).ok(), Some(n));
        Ok(out)
    }
}

pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

impl Ffn {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Moe(m) => m.forward(x),
        }
    }
}
