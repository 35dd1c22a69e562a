//! The Llama family in one implementation: pre-norm decoder layers of grouped-query attention
//! (optional qkv bias, optional per-head q/k RMSNorm, RoPE with scaling) and a SwiGLU MLP.

use candle_core::{Device, Tensor};

use crate::arch::CausalLm;
use crate::batch::SeqChunk;
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::kv::LayerCacheSpec;
use crate::loader::{layer_progress, Embedding, Linear, LinearSet, WeightSource};
use crate::ops::Rope;

pub mod tp;

struct Layer {
    attn_norm: Tensor,
    /// attn_q, attn_k, attn_v (one matmul on CUDA).
    qkv: LinearSet,
    o: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    ffn_norm: Tensor,
    /// ffn_gate, ffn_up (one matmul on CUDA).
    gate_up: LinearSet,
    down: Linear,
}

/// A loaded Llama-family model.
pub struct Llama {
    cfg: LlamaConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Linear,
    rope: Rope,
    device: Device,
    /// Decode steps captured as CUDA graphs ([`crate::arch::decode_graph`]).
    #[cfg(feature = "cuda")]
    graphs: crate::arch::decode_graph::DecodeGraphs,
}

impl Llama {
    pub fn load(cfg: &LlamaConfig, ws: &dyn WeightSource) -> Result<Self> {
        cfg.validate()?;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (qd, kvd, ff) = (cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.intermediate_size);
        let embed = ws.embedding("token_embd.weight")?.expect("token_embd.weight", cfg.vocab_size, h)?;
        let pb = layer_progress(cfg.num_layers, "loading");
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let opt = |s: &str| -> Result<Option<Tensor>> {
                let name = n(s);
                if ws.has(&name) {
                    Ok(Some(ws.tensor_f32(&name)?))
                } else {
                    Ok(None)
                }
            };
            let q_norm = if cfg.qk_norm { opt("attn_q_norm.weight")? } else { None };
            let k_norm = if cfg.qk_norm { opt("attn_k_norm.weight")? } else { None };
            if cfg.qk_norm && (q_norm.is_none() || k_norm.is_none()) {
                return Err(ModelError::MissingTensor(n("attn_q_norm.weight / attn_k_norm.weight")));
            }
            layers.push(Layer {
                attn_norm: ws.tensor_f32(&n("attn_norm.weight"))?,
                qkv: LinearSet::new(vec![
                    ws.linear(&n("attn_q.weight"))?.expect(&n("attn_q.weight"), &[qd], h)?,
                    ws.linear(&n("attn_k.weight"))?.expect(&n("attn_k.weight"), &[kvd], h)?,
                    ws.linear(&n("attn_v.weight"))?.expect(&n("attn_v.weight"), &[kvd], h)?,
                ])?,
                o: ws.linear(&n("attn_output.weight"))?.expect(&n("attn_output.weight"), &[h], qd)?,
                q_norm,
                k_norm,
                ffn_norm: ws.tensor_f32(&n("ffn_norm.weight"))?,
                gate_up: LinearSet::new(vec![
                    ws.linear(&n("ffn_gate.weight"))?.expect(&n("ffn_gate.weight"), &[ff], h)?,
                    ws.linear(&n("ffn_up.weight"))?.expect(&n("ffn_up.weight"), &[ff], h)?,
                ])?,
                down: ws.linear(&n("ffn_down.weight"))?.expect(&n("ffn_down.weight"), &[h], ff)?,
            });
            pb.inc(1);
        }
        pb.finish_and_clear();
        let norm = ws.tensor_f32("output_norm.weight")?;
        let lm_head = if ws.has("output.weight") {
            ws.linear("output.weight")?.expect("output.weight", &[cfg.vocab_size], h)?
        } else {
            embed.as_linear()?
        };
        let freq_factors = if ws.has("rope_freqs.weight") {
            Some(ws.tensor_f32("rope_freqs.weight")?.flatten_all()?.to_vec1::<f32>()?)
        } else {
            None
        };
        let rope = Rope::new(cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling, cfg.rope_style, freq_factors.as_deref());
        Ok(Self {
            cfg: cfg.clone(),
            embed,
            layers,
            norm,
            lm_head,
            rope,
            device: ws.device().clone(),
            #[cfg(feature = "cuda")]
            graphs: Default::default(),
        })
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    fn rms(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        crate::ops::norm::rms_norm(x, w, self.cfg.rms_norm_eps as f32)
    }
}

impl crate::arch::RankLayers for Llama {
    type Tables = (Tensor, Tensor);

    fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Layer `li`'s attention on the normed `h`, through o_proj (under tensor parallelism, this
    /// rank's partial sum); attention itself left to `attend(q, k, v, scale)`.
    fn attn_out(
        &self,
        li: usize,
        h: &Tensor,
        tables: &Self::Tables,
        attend: impl FnOnce(&Tensor, &Tensor, &Tensor, f64) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let layer = &self.layers[li];
        let (nh, hd) = (self.cfg.num_heads, self.cfg.head_dim);
        // Norms and RoPE are per token: once over the batch; attention per sequence.
        let (q, k, v) = self.heads(layer, layer.qkv.forward_array(h)?, tables)?;
        let att = attend(&q, &k, &v, 1.0 / (hd as f64).sqrt())?;
        let att = att.transpose(0, 1)?.reshape((h.dim(0)?, nh * hd))?;
        layer.o.forward(&att)
    }

    /// `(x1, h1)`: the residual add after layer `li`'s attention and the FFN norm.
    fn post_attn(&self, li: usize, x: &Tensor, att: &Tensor) -> Result<(Tensor, Tensor)> {
        crate::ops::norm::add_rms_norm(x, att, &self.layers[li].ffn_norm, self.cfg.rms_norm_eps as f32)
    }

    /// Layer `li`'s SwiGLU MLP on the normed `h1`, through down_proj (a partial sum under
    /// tensor parallelism).
    fn ffn_out(&self, li: usize, h1: &Tensor) -> Result<Tensor> {
        let layer = &self.layers[li];
        let [g, u] = layer.gate_up.forward_array(h1)?;
        layer.down.forward_silu_mul(&g, &u)
    }

    /// `(x, h)` after layer `li`: the residual add and the next layer's norm (the last layer:
    /// the add alone, `h` = `x`; the final norm runs on the rows whose logits are asked for).
    fn layer_end(&self, li: usize, x1: &Tensor, down: &Tensor) -> Result<(Tensor, Tensor)> {
        match self.layers.get(li + 1) {
            Some(next) => crate::ops::norm::add_rms_norm(x1, down, &next.attn_norm, self.cfg.rms_norm_eps as f32),
            None => {
                let x = (x1 + down)?;
                Ok((x.clone(), x))
            }
        }
    }
}

impl CausalLm for Llama {
    fn cache_spec(&self) -> Vec<LayerCacheSpec> {
        (0..self.cfg.num_layers)
            .map(|_| LayerCacheSpec::Attention { kv_heads: self.cfg.num_kv_heads, head_dim: self.cfg.head_dim })
            .collect()
    }
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
    fn context_length(&self) -> usize {
        self.cfg.max_position_embeddings
    }
    fn device(&self) -> &Device {
        &self.device
    }

    fn limit_logits(&mut self, n: usize) -> Result<bool> {
        if n == 0 || n >= self.cfg.vocab_size {
            return Ok(false);
        }
        self.lm_head = self.lm_head.first_rows(n)?;
        #[cfg(feature = "cuda")]
        {
            // Graphs captured so far hold the whole head.
            self.graphs = Default::default();
        }
        Ok(true)
    }

    fn forward(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        #[cfg(feature = "cuda")]
        if let Some(logits) = self.decode_graph(chunks)? {
            return Ok(logits);
        }
        self.eager_forward(chunks)
    }

    fn forward_eager(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        self.eager_forward(chunks)
    }

    #[cfg(feature = "cuda")]
    fn graph_launches(&self) -> usize {
        self.graphs.launches()
    }
}

impl Llama {
    /// [`CausalLm::forward`] without CUDA graphs: every launch queued from the host (the
    /// reference the decode graphs are checked against).
    fn eager_forward(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Vec<Option<Tensor>>> {
        let cfg = &self.cfg;
        let (ids, positions) = crate::arch::batch_tokens(chunks, cfg.vocab_size)?;
        // One RoPE table for every token of the batch (one upload, not one per sequence).
        let tables = self.rope.tables(&positions, &self.device)?;
        let total = ids.len();
        let ids = Tensor::from_vec(ids, total, &self.device)?;
        let x = self.layers_forward(&ids, &tables, |li, q, k, v, scale| {
            crate::arch::attend_chunks(chunks, li, q, k, v, scale)
        })?;
        for c in chunks.iter_mut() {
            c.cache.advance(c.tokens.len());
        }
        // Only the rows someone asked for go through the final norm and the LM head.
        crate::batch::logits_for_chunks(&x, chunks, |sel| self.lm_head.forward(&self.rms(sel, &self.norm)?))
    }

    /// The decoder layers over the tokens `ids` with RoPE `tables` of their positions, attention
    /// left to `attend(layer, q [nh, total, hd], k, v [nkv, total, hd], scale)`, which writes
    /// the new keys and values and returns `[nh, total, hd]`. Returns the last layer's output.
    fn layers_forward(
        &self,
        ids: &Tensor,
        tables: &(Tensor, Tensor),
        attend: impl FnMut(usize, &Tensor, &Tensor, &Tensor, f64) -> Result<Tensor>,
    ) -> Result<Tensor> {
        crate::arch::rank_layers(std::slice::from_ref(self), self.embed_normed(ids)?, tables, attend)
    }

    /// `(x, h)`: the embeddings of `ids` and their norm before layer 0.
    fn embed_normed(&self, ids: &Tensor) -> Result<(Tensor, Tensor)> {
        self.input_normed(self.embed.forward(ids)?)
    }

    /// `(x, h)`: embeddings `x` and their norm before layer 0.
    fn input_normed(&self, x: Tensor) -> Result<(Tensor, Tensor)> {
        // Each residual add is fused with the norm after it (one launch on CUDA): `h` is the
        // normed `x` the next projection reads.
        let h = match self.layers.first() {
            Some(l) => self.rms(&x, &l.attn_norm)?,
            None => x.clone(),
        };
        Ok((x, h))
    }

    /// Layer `layer`'s projections `[q, k, v]` (`[total, heads hd]` rows) as head-major `[heads,
    /// total, hd]` after its per-head q / k norms (where it has them) and RoPE with `tables`: on
    /// CUDA one `attn_glue` launch where it fits (`TANDEM_ATTN_GLUE=0`: candle's ops), else
    /// candle's ops.
    fn heads(
        &self,
        layer: &Layer,
        [q, k, v]: [Tensor; 3],
        (cos, sin): &(Tensor, Tensor),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let cfg = &self.cfg;
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        #[cfg(feature = "cuda")]
        if q.device().is_cuda()
            && crate::ops::attn_glue::enabled()
            && crate::ops::attn_glue::fits(hd, self.rope.rot_dim(), self.rope.style())
            && layer.q_norm.is_some() == layer.k_norm.is_some()
        {
            let norms = layer.q_norm.as_ref().zip(layer.k_norm.as_ref());
            let eps = cfg.rms_norm_eps as f32;
            return crate::ops::attn_glue::cuda::prep_plain(&q, &k, &v, norms, eps, cos, sin, (nh, nkv, hd));
        }
        let total = q.dim(0)?;
        let mut q = q.reshape((total, nh, hd))?;
        let mut k = k.reshape((total, nkv, hd))?;
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            q = self.rms(&q.contiguous()?, qn)?;
            k = self.rms(&k.contiguous()?, kn)?;
        }
        let q = self.rope.apply(&q.transpose(0, 1)?.unsqueeze(0)?, cos, sin)?.squeeze(0)?;
        let k = self.rope.apply(&k.transpose(0, 1)?.unsqueeze(0)?, cos, sin)?.squeeze(0)?;
        let v = v.reshape((total, nkv, hd))?.transpose(0, 1)?;
        Ok((q, k, v))
    }

    /// Runs `chunks` as a CUDA graph's decode or verify step when they fit one
    /// ([`crate::arch::decode_graph`]): the logits per chunk, caches advanced. `None`: nothing
    /// done, run the eager forward.
    #[cfg(feature = "cuda")]
    fn decode_graph(&self, chunks: &mut [SeqChunk<'_>]) -> Result<Option<Vec<Option<Tensor>>>> {
        use crate::arch::decode_graph::{plan, Inputs, Shape};
        let Device::Cuda(dev) = &self.device else { return Ok(None) };
        let attention: Vec<usize> = (0..self.layers.len()).collect();
        let Some(step) = plan(chunks, self.cfg.vocab_size, &attention)? else { return Ok(None) };
        let (cos, sin) = self.rope.values(&step.positions);
        let columns = self.lm_head.weight.dims()?.0;
        let shape = Shape { rope_half: self.rope.inv_freq().len(), state_words: 0, columns, hidden: 0 };
        let store = step.store.clone();
        let body = |inp: &Inputs| {
            let tables = (inp.cos.clone(), inp.sin.clone());
            let x = self.layers_forward(&inp.ids, &tables, |li, q, k, v, scale| {
                store.attend_tables(li, &inp.tables, &q.contiguous()?, &k.contiguous()?, &v.contiguous()?, scale)
            })?;
            let logits = self.lm_head.forward(&self.rms(&x, &self.norm)?)?;
            Ok(inp.logits.slice_set(&logits.to_dtype(candle_core::DType::F32)?.contiguous()?, 0, 0)?)
        };
        let Some(out) = self.graphs.run(dev, &step, &shape, (&cos, &sin), &[], body)? else { return Ok(None) };
        for c in chunks.iter_mut() {
            c.cache.advance(step.t);
        }
        Ok(Some(step.per_chunk(&out.logits)?))
    }
}
