//! MTP proposer: the model's own multi-token-prediction head drafts by feeding its output and
//! its draft back (spec §8 of the hybrid architecture notes).
//!
//! The head's KV is one more attention layer in the target's paged blocks, indexed by target
//! positions, so it is shared and prefix-cached with them. The head consumes the hidden states
//! of committed positions together with the token that followed each (catch-up) and keeps its
//! last output row; drafting runs the LM head on that row for the first draft, and drafts
//! 2..k cost one head step each and write speculative head KV that the next catch-up
//! overwrites.
//!
//! Catch-up is eager while a sequence drafts (after each verification, the head consumes the
//! committed positions) and lazy while it does not: the hidden rows are kept and consumed in
//! one chunk when [`MTP_LAZY_ROWS`] have gathered or when the sequence next drafts. A sequence
//! on which the head does not pay thus runs it over a chunk of positions now and then instead
//! of one head step per token. The blocks of positions the head has not consumed yet are not
//! published to the prefix cache until it has (see `SeqSpec::written_up_to`).

use candle_core::{IndexOp, Tensor};
use tandem_model::arch::{CausalLm, MtpDraft};

use super::{argmax, Proposer, ProposerView};

/// Hidden rows a sequence that is not drafting gathers before the head consumes them (one KV
/// block of the default size, so its blocks reach the prefix cache without much delay).
pub const MTP_LAZY_ROWS: usize = 16;

#[derive(Default)]
pub struct MtpProposer {
    /// Seconds and positions of catch-up on idle positions since
    /// [`Proposer::take_idle_catch_up`].
    idle_catch_up: (f64, usize),
}

fn last_row(t: &Tensor) -> Result<Vec<f32>, String> {
    let n = t.dim(0).map_err(|e| e.to_string())?;
    t.i(n - 1).and_then(|r| r.to_vec1::<f32>()).map_err(|e| e.to_string())
}

/// Lets the head consume the kept rows whose next token is known; returns how many it
/// consumed.
fn consume(mtp: &dyn MtpDraft, seq: &mut ProposerView<'_>) -> Result<usize, String> {
    let Some(rows) = seq.spec.mtp_rows.take() else { return Ok(0) };
    let err = |e: candle_core::Error| e.to_string();
    let from = seq.spec.mtp_pos;
    let n = rows.dim(0).map_err(err)?;
    // The token after each position must be known (not so for the last one when finished).
    let known = seq.tokens().len().saturating_sub(from + 1).min(n);
    if known < n {
        seq.spec.mtp_rows = Some(rows.narrow(0, known, n - known).map_err(err)?);
    }
    if known == 0 {
        return Ok(0);
    }
    let rows = rows.narrow(0, 0, known).map_err(err)?;
    let next: Vec<u32> = seq.tokens()[from + 1..=from + known].to_vec();
    let y = mtp.mtp_forward(&rows, &next, seq.cache, from).map_err(|e| e.to_string())?;
    let m = y.dim(0).map_err(err)?;
    seq.spec.mtp_last = Some(y.narrow(0, m - 1, 1).map_err(err)?);
    seq.spec.mtp_pos = from + known;
    Ok(known)
}

impl Proposer for MtpProposer {
    fn propose(&mut self, model: &dyn CausalLm, seqs: &mut [(ProposerView<'_>, usize)]) -> Result<(), String> {
        let mtp = model.mtp().ok_or("the model has no MTP head")?;
        let err = |e: tandem_model::ModelError| e.to_string();
        for (seq, k) in seqs.iter_mut() {
            seq.spec.drafts.clear();
            // Positions decoded while the sequence was not drafting: consume them first.
            let started = std::time::Instant::now();
            let caught_up = consume(mtp, seq)?;
            if caught_up > 0 {
                self.idle_catch_up.0 += started.elapsed().as_secs_f64();
                self.idle_catch_up.1 += caught_up;
            }
            let Some(mut y) = seq.spec.mtp_last.clone() else { continue };
            let main_pos = seq.cache.position();
            if seq.spec.mtp_pos != main_pos {
                continue; // the head is not level with the target (a lost row): no drafts
            }
            loop {
                let d = argmax(&last_row(&mtp.mtp_logits(&y).map_err(err)?)?);
                seq.spec.drafts.push(d);
                let j = seq.spec.drafts.len();
                if j >= *k {
                    break;
                }
                // The draft after `d` sits at target position main_pos + j - 1.
                y = mtp.mtp_forward(&y, &[d], seq.cache, main_pos + j - 1).map_err(err)?;
            }
        }
        Ok(())
    }

    fn catch_up(
        &mut self,
        model: &dyn CausalLm,
        seqs: &mut [(ProposerView<'_>, Option<Tensor>)],
    ) -> Result<(), String> {
        let mtp = model.mtp().ok_or("the model has no MTP head")?;
        let err = |e: candle_core::Error| e.to_string();
        for (seq, hidden) in seqs.iter_mut() {
            let Some(hidden) = hidden.take() else { continue };
            let main_pos = seq.cache.position();
            let n = hidden.dim(0).map_err(err)?;
            let start = main_pos.checked_sub(n).ok_or("MTP: more hidden rows than positions")?;
            // The head has read or kept every position before `head_end`.
            let kept = seq.spec.mtp_rows.as_ref().map_or(Ok(0), |r| r.dim(0)).map_err(err)?;
            let mut head_end = seq.spec.mtp_pos + kept;
            if n == 0 || head_end >= main_pos {
                continue;
            }
            if head_end < start {
                // A gap (cannot happen today): the head's KV there would be stale, which costs
                // acceptance, never correctness; start over from these rows.
                seq.spec.mtp_rows = None;
                seq.spec.mtp_pos = start;
                head_end = start;
            }
            // Rows before `head_end` are not needed again.
            let skip = head_end - start;
            let new = hidden.narrow(0, skip, n - skip).map_err(err)?;
            seq.spec.mtp_rows = Some(match seq.spec.mtp_rows.take() {
                Some(old) => Tensor::cat(&[&old, &new], 0).map_err(err)?,
                None => new,
            });
            if seq.spec.drafting() || main_pos - seq.spec.mtp_pos >= MTP_LAZY_ROWS {
                consume(mtp, seq)?;
            }
        }
        Ok(())
    }

    fn needs_hidden(&self) -> bool {
        true
    }

    fn take_idle_catch_up(&mut self) -> (f64, usize) {
        std::mem::take(&mut self.idle_catch_up)
    }
}
