//! The multi-token-prediction (MTP) head of the hybrid family (spec §8). For main position p it
//! takes the main model's final-normed hidden state h_p and the token at p + 1:
//! `x = fc([norm_e(E[t_{p+1}]) ; norm_h(h_p)])`, one full-attention decoder layer (its own KV,
//! indexed by main positions), `y = norm(x)`, logits = lm_head(y) (shared with the main model),
//! a draft for token p + 2. Drafting k > 1 feeds `y` and the drafted token back at p + 1, ...

use candle_core::Tensor;

use crate::error::{ModelError, Result};
use crate::kv::{KvBuffer, LayerKv};
use crate::loader::{Linear, WeightSource};

use super::attention::{norm_1p, AttnPart, GatedAttention};
use super::ffn::{Ffn, Mlp, Moe};
use super::{HybridConfig, QwenHybrid};

pub struct MtpHead {
    enorm: Tensor,
    hnorm: Tensor,
    fc: Linear,
    in_norm: Tensor,
    attn: GatedAttention,
    post_norm: Tensor,
    ffn: Ffn,
    norm: Tensor,
    eps: f32,
}

/// What [`MtpHead::draft`] returns.
pub struct Drafts {
    pub tokens: Vec<u32>,
    /// `[k, vocab]`, the logits each draft was taken from.
    pub logits: Tensor,
}

impl MtpHead {
    pub fn load(cfg: &HybridConfig, ws: &dyn WeightSource) -> Result<Self> {
        let p = "mtp.layers.0.";
        let ffn = if ws.has(&format!("{p}mlp.gate.weight")) {
            Ffn::Moe(Box::new(Moe::load(cfg, ws, &format!("{p}mlp."))?))
        } else {
            Ffn::Dense(Mlp::load(ws, &format!("{p}mlp."))?)
        };
        Ok(Self {
            enorm: norm_1p(ws, "mtp.pre_fc_norm_embedding.weight")?,
            hnorm: norm_1p(ws, "mtp.pre_fc_norm_hidden.weight")?,
            fc: ws.linear("mtp.fc.weight")?,
            in_norm: norm_1p(ws, &format!("{p}input_layernorm.weight"))?,
            attn: GatedAttention::load(ws, p, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps)?,
            post_norm: norm_1p(ws, &format!("{p}post_attention_layernorm.weight"))?,
            ffn,
            norm: norm_1p(ws, "mtp.norm.weight")?,
            eps: cfg.rms_norm_eps as f32,
        })
    }

    fn rms(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        crate::ops::norm::rms_norm(x, w, self.eps)
    }

    /// Runs the head over main positions `kv.len() ..` with `hidden: [n, H]` (final-normed main
    /// states at those positions) and `next_tokens` (the token after each). Appends to `kv`.
    /// Returns `(logits [n, vocab], y [n, H])`.
    pub fn forward(
        &self,
        model: &QwenHybrid,
        hidden: &Tensor,
        next_tokens: &[u32],
        kv: &mut KvBuffer,
    ) -> Result<(Tensor, Tensor)> {
        let start = kv.len();
        let y = self.forward_kv(model, hidden, next_tokens, LayerKv::Contiguous(kv), start)?;
        Ok((model.logits(&y)?, y))
    }

    /// [`Self::forward_kv`] with the head's KV in layer `layer` of a sequence's cache.
    pub fn forward_in(
        &self,
        model: &QwenHybrid,
        hidden: &Tensor,
        next_tokens: &[u32],
        cache: &mut crate::kv::SequenceCache,
        layer: usize,
        past: usize,
    ) -> Result<Tensor> {
        self.forward_kv(model, hidden, next_tokens, cache.layer_kv_at(layer, past)?, past)
    }

    /// The head's output `y: [n, H]` (before the LM head) over any KV store: `kv` continues at
    /// main position `start` (its `past`), e.g. the head's layer in the engine's paged blocks.
    pub fn forward_kv(
        &self,
        model: &QwenHybrid,
        hidden: &Tensor,
        next_tokens: &[u32],
        kv: LayerKv<'_>,
        start: usize,
    ) -> Result<Tensor> {
        let n = next_tokens.len();
        if hidden.dim(0)? != n || n == 0 {
            return Err(ModelError::Input(format!("MTP: {} hidden rows for {n} tokens", hidden.dim(0)?)));
        }
        if let Some(&bad) = next_tokens.iter().find(|&&t| t as usize >= model.config().vocab_size) {
            return Err(ModelError::Input(format!("token id {bad} is outside the vocabulary")));
        }
        let e = model.embed_tokens(&Tensor::from_vec(next_tokens.to_vec(), n, hidden.device())?)?;
        self.forward_embedded(model, &e, hidden, kv, start)
    }

    /// [`Self::forward_kv`] with the next tokens already embedded (`e: [n, H]`; a model whose
    /// table is cut among tensor-parallel ranks embeds them itself); `model` gives the rotary
    /// tables.
    pub fn forward_embedded(
        &self,
        model: &QwenHybrid,
        e: &Tensor,
        hidden: &Tensor,
        kv: LayerKv<'_>,
        start: usize,
    ) -> Result<Tensor> {
        let n = hidden.dim(0)?;
        if e.dim(0)? != n || n == 0 {
            return Err(ModelError::Input(format!("MTP: {} hidden rows for {} tokens", n, e.dim(0)?)));
        }
        let dev = hidden.device();
        let x = Tensor::cat(&[self.rms(e, &self.enorm)?, self.rms(hidden, &self.hnorm)?], 1)?;
        let x = self.fc.forward(&x)?;
        let positions: Vec<usize> = (start..start + n).collect();
        let tables = model.rope.tables(&positions, dev)?;
        let h = self.rms(&x, &self.in_norm)?;
        let mut parts = [AttnPart { len: n, kv }];
        let x = (x + self.attn.forward(&h, &model.rope, &tables, &mut parts)?)?;
        let x = (&x + self.ffn.forward(&self.rms(&x, &self.post_norm)?)?)?;
        self.rms(&x, &self.norm)
    }

    /// Feeds the real rows (as in [`Self::forward`]) and then drafts `k >= 1` tokens greedily,
    /// feeding each draft and the head's own output back. The KV keeps only the real rows.
    pub fn draft(
        &self,
        model: &QwenHybrid,
        hidden: &Tensor,
        next_tokens: &[u32],
        kv: &mut KvBuffer,
        k: usize,
    ) -> Result<Drafts> {
        let real_len = kv.len() + next_tokens.len();
        let (logits, y) = self.forward(model, hidden, next_tokens, kv)?;
        let n = next_tokens.len();
        let mut last_logits = logits.narrow(0, n - 1, 1)?;
        let mut last_y = y.narrow(0, n - 1, 1)?;
        let mut tokens = Vec::with_capacity(k);
        let mut all = Vec::with_capacity(k);
        for step in 0..k.max(1) {
            let tok = crate::ops::sampling::argmax_rows(&last_logits.flatten_all()?.unsqueeze(0)?)?[0];
            tokens.push(tok);
            all.push(last_logits.clone());
            if step + 1 < k {
                let (l, yy) = self.forward(model, &last_y, &[tok], kv)?;
                last_logits = l;
                last_y = yy;
            }
        }
        kv.truncate(real_len);
        Ok(Drafts { tokens, logits: Tensor::cat(&all, 0)? })
    }
}
