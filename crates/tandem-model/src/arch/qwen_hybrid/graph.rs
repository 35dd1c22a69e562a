//! The hybrid model's decode and verify steps as CUDA graphs ([`crate::arch::decode_graph`]):
//! the launches of a batched eager forward ([`QwenHybrid::forward_hidden`] with the batched
//! attention and GDN kernels). Per GDN layer the graph reads `[B + 1 token offsets | B
//! conv-state addresses | B delta-state addresses | B next-conv addresses | B next-delta
//! addresses]`, and in a verify step then `[B conv-lane addresses | B delta-lane addresses]`:
//! the inputs are the sequences' current states, the outputs one buffer per sequence and step
//! made before the launch, holding every GDN layer's next state (and in a verify step every
//! token's states, which become the cache's verify lanes; device states are never written in
//! place, so snapshots and checkpoints keep sharing them).

use candle_core::{DType, Device, Tensor};

use super::{Mixer, QwenHybrid};
use crate::arch::decode_graph::{plan, Inputs, Shape};
use crate::batch::SeqChunk;
use crate::error::Result;
use crate::kv::{PagedKvStore, RecurrentState};
use crate::ops::cuda_util::{alloc_f32, device_address, tensor};

impl QwenHybrid {
    /// Runs `chunks` as a CUDA graph's decode or verify step when they fit one: the logits per
    /// chunk and, for a model with an MTP head, the final-normed hidden states of every token;
    /// caches advanced (in verify mode with every token's recurrent state recorded). `None`:
    /// nothing done, run the eager forward.
    #[allow(clippy::type_complexity)]
    pub(super) fn decode_graph(
        &self,
        chunks: &mut [SeqChunk<'_>],
    ) -> Result<Option<(Vec<Option<Tensor>>, Option<Tensor>)>> {
        let Device::Cuda(dev) = &self.device else { return Ok(None) };
        let n = self.cfg.num_layers();
        let attention: Vec<usize> = (0..n).filter(|&li| matches!(self.layers[li].mixer, Mixer::Attn(_))).collect();
        let gdn: Vec<usize> = (0..n).filter(|&li| matches!(self.layers[li].mixer, Mixer::Gdn(_))).collect();
        let Some(Mixer::Gdn(g0)) = gdn.first().map(|&li| &self.layers[li].mixer) else { return Ok(None) };
        if !gdn.iter().all(|&li| matches!(&self.layers[li].mixer, Mixer::Gdn(g) if g.batches_on(&self.device))) {
            return Ok(None);
        }
        if chunks.iter().any(|c| c.cache.recurrent.len() < n) {
            return Ok(None);
        }
        let Some(step) = plan(chunks, self.cfg.vocab_size, &attention)? else { return Ok(None) };
        if self.graphs.stays_eager(&step) {
            return Ok(None);
        }
        let (bsz, t, verify) = (step.bsz, step.t, step.verify);
        if verify && chunks.iter().any(|c| c.cache.verify.as_ref().is_none_or(|l| l.len() < n)) {
            return Ok(None);
        }
        let (kernel, ch) = g0.conv_shape();
        let (conv_len, ssm_len) = (kernel.saturating_sub(1) * ch, g0.dims().state_len());
        let layer_len = conv_len + ssm_len;

        // The input states' addresses, (conv, ssm) per GDN layer and sequence.
        let mut ins = Vec::with_capacity(gdn.len() * bsz);
        for &li in &gdn {
            for c in chunks.iter() {
                match &c.cache.recurrent[li] {
                    Some(RecurrentState::Device { conv, ssm })
                        if [conv, ssm].iter().all(|t| t.dtype() == DType::F32 && t.is_contiguous())
                            && conv.elem_count() == conv_len
                            && ssm.elem_count() == ssm_len =>
                    {
                        ins.push((device_address(conv)?, device_address(ssm)?));
                    }
                    _ => return Ok(None),
                }
            }
        }
        // Each sequence's next states: one buffer per step, every GDN layer's (conv, ssm); in a
        // verify step another with every layer's t conv states, then its t delta states.
        let per_seq = gdn.len() * layer_len;
        let fresh = |len: usize| -> Result<Vec<Tensor>> {
            (0..bsz).map(|_| Ok(tensor(alloc_f32(dev, len)?, dev, len))).collect()
        };
        let next = fresh(per_seq)?;
        let lanes = if verify { fresh(per_seq * t)? } else { Vec::new() };
        let outs = next.iter().map(device_address).collect::<Result<Vec<_>>>()?;
        let lane_outs = lanes.iter().map(device_address).collect::<Result<Vec<_>>>()?;
        let meta_len = if verify { 7 * bsz + 1 } else { 5 * bsz + 1 };
        let mut meta = Vec::with_capacity(gdn.len() * meta_len);
        for gi in 0..gdn.len() {
            meta.extend((0..=bsz).map(|i| (i * t) as i64));
            let layer_ins = &ins[gi * bsz..(gi + 1) * bsz];
            meta.extend(layer_ins.iter().map(|&(c, _)| c as i64));
            meta.extend(layer_ins.iter().map(|&(_, s)| s as i64));
            let at = |o: u64, floats: usize| (o + 4 * floats as u64) as i64;
            meta.extend(outs.iter().map(|&o| at(o, gi * layer_len)));
            meta.extend(outs.iter().map(|&o| at(o, gi * layer_len + conv_len)));
            meta.extend(lane_outs.iter().map(|&o| at(o, gi * t * layer_len)));
            meta.extend(lane_outs.iter().map(|&o| at(o, gi * t * layer_len + t * conv_len)));
        }
        let (cos, sin) = self.rope.values(&step.positions);
        let shape = Shape {
            rope_half: self.rope.inv_freq().len(),
            state_words: meta.len(),
            columns: self.cfg.vocab_size,
            hidden: if self.mtp.is_some() { self.cfg.hidden_size } else { 0 },
        };
        let store = step.store.clone();
        let body = |inp: &Inputs| self.graph_body(inp, &store, bsz, verify, gdn.len());
        let Some(out) = self.graphs.run(dev, &step, &shape, (&cos, &sin), &meta, body)? else {
            return Ok(None);
        };
        let hist = kernel.saturating_sub(1);
        for (si, c) in chunks.iter_mut().enumerate() {
            let buf = &next[si];
            for (gi, &li) in gdn.iter().enumerate() {
                let o = gi * layer_len;
                let (state, lane) = c.cache.recurrent_layer_mut(li)?;
                *state = RecurrentState::Device {
                    conv: buf.narrow(0, o, conv_len)?.reshape((hist, ch))?,
                    ssm: buf.narrow(0, o + conv_len, ssm_len)?,
                };
                if let (Some(lane), Some(lb)) = (lane, lanes.get(si)) {
                    let o = gi * t * layer_len;
                    for j in 0..t {
                        lane.push(RecurrentState::Device {
                            conv: lb.narrow(0, o + j * conv_len, conv_len)?.reshape((hist, ch))?,
                            ssm: lb.narrow(0, o + t * conv_len + j * ssm_len, ssm_len)?,
                        });
                    }
                }
            }
            c.cache.advance(t);
        }
        Ok(Some((step.per_chunk(&out.logits)?, out.hidden)))
    }

    /// The step the graph records: [`QwenHybrid::forward_hidden`]'s layers for `bsz` sequences
    /// of the same number of tokens with the batched kernels (`verify`: recording every token's
    /// recurrent states), reading only `inp`, and the LM head into `inp.logits` (the final
    /// hidden states into `inp.hidden` where it has them). Idempotent (it writes the same KV
    /// rows and states again).
    fn graph_body(&self, inp: &Inputs, store: &PagedKvStore, bsz: usize, verify: bool, n_gdn: usize) -> Result<()> {
        let tables = (inp.cos.clone(), inp.sin.clone());
        let meta_len = if verify { 7 * bsz + 1 } else { 5 * bsz + 1 };
        if inp.states.elem_count() != n_gdn * meta_len {
            return Err(crate::error::ModelError::Input("decode graph: state words do not fit the layers".into()));
        }
        let mut x = self.embed_tokens(&inp.ids)?;
        let mut gi = 0;
        // As in the eager forward: each residual add fused with the norm after it.
        let mut h = self.rms(&x, self.norm_before(0))?;
        for (li, layer) in self.layers.iter().enumerate() {
            let mixed = match &layer.mixer {
                Mixer::Gdn(g) => {
                    let meta = inp.states.narrow(0, gi * meta_len, meta_len)?;
                    gi += 1;
                    g.forward_graph(&h, &meta, bsz, verify)?
                }
                Mixer::Attn(a) => a.forward_with(&h, &self.rope, &tables, |q, k, v, scale| {
                    store.attend_tables(li, &inp.tables, &q.contiguous()?, k, v, scale)
                })?,
            };
            let (x1, h1) = self.add_rms(&x, &mixed, &layer.post_norm)?;
            (x, h) = self.add_rms(&x1, &layer.ffn.forward(&h1)?, self.norm_before(li + 1))?;
        }
        if let Some(hidden) = &inp.hidden {
            hidden.slice_set(&h.to_dtype(DType::F32)?.contiguous()?, 0, 0)?;
        }
        let logits = self.lm_head.forward(&h)?;
        inp.logits.slice_set(&logits.to_dtype(DType::F32)?.contiguous()?, 0, 0)?;
        Ok(())
    }
}
