//! MTP proposer: the model's own multi-token-prediction head drafts by feeding its output and
//! its draft back (spec §8 of the hybrid architecture notes).
//!
//! The head's KV is one more attention layer in the target's paged blocks, indexed by target
//! positions, so it is shared and prefix-cached with them. After every target forward the head
//! consumes the hidden states of the newly committed positions together with the token that
//! followed each (catch-up) and keeps its last output row; drafting runs the LM head on that
//! row for the first draft (so steps that do not draft skip the LM head), and drafts 2..k cost
//! one head step each and write speculative head KV that the next catch-up overwrites.

use candle_core::{IndexOp, Tensor};
use tandem_model::arch::CausalLm;

use super::{argmax, Proposer};
use crate::sequence::Sequence;

pub struct MtpProposer;

fn last_row(t: &Tensor) -> Result<Vec<f32>, String> {
    let n = t.dim(0).map_err(|e| e.to_string())?;
    t.i(n - 1).and_then(|r| r.to_vec1::<f32>()).map_err(|e| e.to_string())
}

impl Proposer for MtpProposer {
    fn propose(&mut self, model: &dyn CausalLm, seqs: &mut [(&mut Sequence, usize)]) -> Result<(), String> {
        let mtp = model.mtp().ok_or("the model has no MTP head")?;
        let err = |e: tandem_model::ModelError| e.to_string();
        for (seq, k) in seqs.iter_mut() {
            seq.spec.drafts.clear();
            let Some(mut y) = seq.spec.mtp_last.clone() else { continue };
            let main_pos = seq.cache.position();
            loop {
                let d = argmax(&last_row(&mtp.mtp_logits(&y).map_err(err)?)?);
                seq.spec.drafts.push(d);
                let j = seq.spec.drafts.len();
                if j >= *k {
                    break;
                }
                // The draft after `d` sits at target position main_pos + j - 1.
                y = mtp.mtp_forward(&y, &[d], &mut seq.cache, main_pos + j - 1).map_err(err)?;
            }
        }
        Ok(())
    }

    fn catch_up(&mut self, model: &dyn CausalLm, seqs: &mut [(&mut Sequence, Option<Tensor>)]) -> Result<(), String> {
        let mtp = model.mtp().ok_or("the model has no MTP head")?;
        for (seq, hidden) in seqs.iter_mut() {
            let Some(hidden) = hidden.take() else { continue };
            let main_pos = seq.cache.position();
            let n = hidden.dim(0).map_err(|e| e.to_string())?;
            let start = main_pos.checked_sub(n).ok_or("MTP: more hidden rows than positions")?;
            // The token after each of these positions must be known (not so when finished).
            if seq.tokens().len() <= main_pos || n == 0 {
                seq.spec.mtp_last = None;
                continue;
            }
            // Rows before the head's own position were consumed already (cannot happen today;
            // a gap would leave stale head KV, which costs acceptance, never correctness).
            let skip = seq.spec.mtp_pos.saturating_sub(start).min(n);
            if skip == n {
                continue;
            }
            let from = start + skip;
            let rows = hidden.narrow(0, skip, n - skip).map_err(|e| e.to_string())?;
            let next: Vec<u32> = seq.tokens()[from + 1..=main_pos].to_vec();
            let y = mtp.mtp_forward(&rows, &next, &mut seq.cache, from).map_err(|e| e.to_string())?;
            let m = y.dim(0).map_err(|e| e.to_string())?;
            seq.spec.mtp_last = Some(y.narrow(0, m - 1, 1).map_err(|e| e.to_string())?);
            seq.spec.mtp_pos = main_pos;
        }
        Ok(())
    }

    fn needs_hidden(&self) -> bool {
        true
    }
}
