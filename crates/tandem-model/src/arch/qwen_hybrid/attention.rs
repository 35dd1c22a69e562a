//! Gated full attention of the hybrid family: q_proj rows interleaved per head as
//! `[query_h | gate_h]`, zero-centred RMSNorm of q and k per head (weights stored as 1 + w),
//! partial NeoX RoPE, causal GQA over the sequence's KV, and a sigmoid output gate before o_proj.
//! The glue on each side of attention is [`crate::ops::attn_glue`] (one launch each on CUDA).

use candle_core::Tensor;

use crate::error::Result;
use crate::kv::LayerKv;
use crate::loader::{Linear, LinearSet, WeightSource};
use crate::ops::{attn_glue, Rope};

/// One sequence's share of a batch for an attention layer.
pub struct AttnPart<'a> {
    pub len: usize,
    pub kv: LayerKv<'a>,
}

pub struct GatedAttention {
    /// q_proj, k_proj, v_proj (one matmul on CUDA).
    qkv: LinearSet,
    o: Linear,
    q_norm: Tensor,
    k_norm: Tensor,
    nh: usize,
    nkv: usize,
    hd: usize,
    eps: f32,
}

/// Loads a zero-centred norm weight as `1 + w`.
pub fn norm_1p(ws: &dyn WeightSource, name: &str) -> Result<Tensor> {
    Ok(ws.tensor_f32(name)?.affine(1.0, 1.0)?)
}

impl GatedAttention {
    /// `p` is the layer prefix (`blk.3.` or `mtp.layers.0.`).
    pub fn load(ws: &dyn WeightSource, p: &str, nh: usize, nkv: usize, hd: usize, eps: f64) -> Result<Self> {
        let n = |s: &str| format!("{p}self_attn.{s}");
        // q_proj holds the queries and their output gates: 2 x heads x head_dim rows.
        let o = ws.linear(&n("o_proj.weight"))?;
        let h = o.weight.dims()?.0;
        Ok(Self {
            qkv: LinearSet::new(vec![
                ws.linear(&n("q_proj.weight"))?.expect(&n("q_proj.weight"), &[2 * nh * hd], h)?,
                ws.linear(&n("k_proj.weight"))?.expect(&n("k_proj.weight"), &[nkv * hd], h)?,
                ws.linear(&n("v_proj.weight"))?.expect(&n("v_proj.weight"), &[nkv * hd], h)?,
            ])?,
            o: o.expect(&n("o_proj.weight"), &[h], nh * hd)?,
            q_norm: norm_1p(ws, &n("q_norm.weight"))?,
            k_norm: norm_1p(ws, &n("k_norm.weight"))?,
            nh,
            nkv,
            hd,
            eps: eps as f32,
        })
    }

    /// `h: [tokens, hidden]` (normed), the parts in order; `tables`: RoPE cos/sin of every
    /// token's position, in the same order. Returns `[tokens, hidden]`.
    ///
    /// What is per token (the q/k norms, RoPE, the output gate) runs once over the whole
    /// batch; attention over each sequence's own KV too where the device batches it
    /// ([`crate::kv::attend_batch`]), else part by part on each part's rows.
    /// Every op here is row by row, so a sequence gets the same bits alone or in a batch.
    pub fn forward(
        &self,
        h: &Tensor,
        rope: &Rope,
        tables: &(Tensor, Tensor),
        parts: &mut [AttnPart<'_>],
    ) -> Result<Tensor> {
        self.forward_with(h, rope, tables, |q, kc, vc, scale| {
            let lens: Vec<usize> = parts.iter().map(|p| p.len).collect();
            let kvs: Vec<&LayerKv<'_>> = parts.iter().map(|p| &p.kv).collect();
            let batched = crate::kv::attend_batch(&kvs, &lens, &q.contiguous()?, kc, vc, scale)?;
            drop(kvs);
            if let Some(att) = batched {
                Ok(att)
            } else if let [part] = parts {
                part.kv.attend(&q.contiguous()?, kc, vc, scale)
            } else {
                let mut outs = Vec::with_capacity(parts.len());
                let mut off = 0;
                for part in parts.iter_mut() {
                    let t = part.len;
                    let rows = |x: &Tensor| x.narrow(1, off, t).and_then(|x| x.contiguous());
                    outs.push(part.kv.attend(&rows(q)?, &rows(kc)?, &rows(vc)?, scale)?);
                    off += t;
                }
                Ok(Tensor::cat(&outs, 1)?)
            }
        })
    }

    /// The layer with attention itself left to `attend(q [nh, total, hd], k, v [nkv, total,
    /// hd], scale)`, which writes the new keys and values and returns `[nh, total, hd]` (a CUDA
    /// graph's decode step attends through tables already on the device).
    pub fn forward_with(
        &self,
        h: &Tensor,
        rope: &Rope,
        tables: &(Tensor, Tensor),
        attend: impl FnOnce(&Tensor, &Tensor, &Tensor, f64) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let (nh, nkv, hd) = (self.nh, self.nkv, self.hd);
        let [qg, k, v] = self.qkv.forward_array(h)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let (q, kc, vc) =
            attn_glue::prep(&qg, &k, &v, &self.q_norm, &self.k_norm, self.eps, rope, tables, (nh, nkv, hd))?;
        let att = attend(&q, &kc, &vc, scale)?;
        self.o.forward(&attn_glue::gate(&att, &qg, nh, hd)?)
    }
}
