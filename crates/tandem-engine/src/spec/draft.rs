//! Draft-model proposer: a smaller model with the same vocabulary drafts `k` tokens greedily.
//!
//! Its KV lives in a second paged store indexed by the same block ids as the target's, so a
//! sequence's block table, copy-on-write and the prefix cache serve both models at once: a
//! prefix-cache hit resumes the draft model too. The draft model mirrors the prompt as it is
//! prefilled (so published prompt blocks hold its KV); during decoding it catches up lazily,
//! in the same forward that drafts, so a sequence that stops speculating stops paying for it.

use candle_core::Tensor;
use tandem_model::arch::CausalLm;
use tandem_model::batch::{LogitsWanted, SeqChunk};

use super::{argmax, Proposer, ProposerView};

pub struct DraftProposer {
    pub model: Box<dyn CausalLm>,
    /// Seconds and positions of catch-up on idle positions since
    /// [`Proposer::take_idle_catch_up`].
    pub idle_catch_up: (f64, usize),
    /// Running mean of round 0's time per sequence when nobody catches up on idle positions.
    pub steady_round0_s: Option<f64>,
}

/// Tokens a sequence that drafts every step feeds in round 0: its last draft and the target's
/// own next token.
const STEADY_ROUND0_TOKENS: usize = 2;

fn rows(logits: Option<Tensor>) -> Result<Vec<f32>, String> {
    let t = logits.ok_or("the draft model returned no logits")?;
    t.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|e| e.to_string())
}

impl Proposer for DraftProposer {
    fn propose(&mut self, _model: &dyn CausalLm, seqs: &mut [(ProposerView<'_>, usize)]) -> Result<(), String> {
        for (seq, _) in seqs.iter_mut() {
            seq.spec.drafts.clear();
        }
        // Round 0: everything the draft model has not seen, up to the pending token; then one
        // token per round for the sequences that want more drafts.
        let mut round = 0;
        loop {
            let mut chunks = Vec::new();
            let mut who = Vec::new();
            for (i, (seq, k)) in seqs.iter_mut().enumerate() {
                if seq.spec.drafts.len() >= *k || seq.spec.draft_cache.is_none() {
                    continue;
                }
                if round > 0 && seq.spec.drafts.len() < round {
                    continue;
                }
                let Some((tokens, cache)) =
                    (if round == 0 { seq.draft_catch_up_input(usize::MAX) } else { seq.spec.last_draft_input() })
                else {
                    continue;
                };
                chunks.push(SeqChunk { tokens, cache, logits: LogitsWanted::Last });
                who.push(i);
            }
            if chunks.is_empty() {
                return Ok(());
            }
            // Round 0's tokens beyond a steady drafter's are catch-up on idle positions.
            let fed: usize = chunks.iter().map(|c| c.tokens.len()).sum();
            let idle: usize = chunks.iter().map(|c| c.tokens.len().saturating_sub(STEADY_ROUND0_TOKENS)).sum();
            let started = std::time::Instant::now();
            let logits = self.model.forward(&mut chunks).map_err(|e| format!("draft model: {e}"))?;
            if round == 0 {
                let t0 = started.elapsed().as_secs_f64();
                let seqs = who.len() as f64;
                match (idle, self.steady_round0_s) {
                    (0, Some(m)) => self.steady_round0_s = Some(m + 0.25 * (t0 / seqs - m)),
                    (0, None) => self.steady_round0_s = Some(t0 / seqs),
                    // What a steady round 0 would have cost is drafting; the rest is catch-up.
                    (_, Some(m)) => self.idle_catch_up.0 += (t0 - m * seqs).max(0.0),
                    (_, None) => self.idle_catch_up.0 += t0 * idle as f64 / fed as f64,
                }
                self.idle_catch_up.1 += idle;
            }
            drop(chunks);
            for (i, l) in who.into_iter().zip(logits) {
                let row = rows(l)?;
                seqs[i].0.spec.drafts.push(argmax(&row));
            }
            round += 1;
        }
    }

    fn take_idle_catch_up(&mut self) -> (f64, usize) {
        std::mem::take(&mut self.idle_catch_up)
    }

    fn catch_up(
        &mut self,
        _model: &dyn CausalLm,
        seqs: &mut [(ProposerView<'_>, Option<Tensor>)],
    ) -> Result<(), String> {
        let mut chunks = Vec::new();
        for (seq, _) in seqs.iter_mut() {
            let main_pos = seq.cache.position();
            let prompt_len = seq.prompt_len();
            let Some(dc) = &mut seq.spec.draft_cache else { continue };
            // Drafts past the committed positions are void.
            if dc.position() > main_pos {
                dc.truncate(main_pos).map_err(|e| e.to_string())?;
            }
            // Mirror prefill eagerly; decode catches up when it next drafts.
            if dc.position() < main_pos && dc.position() < prompt_len {
                if let Some((tokens, cache)) = seq.draft_catch_up_input(main_pos) {
                    chunks.push(SeqChunk { tokens, cache, logits: LogitsWanted::None });
                }
            }
        }
        if chunks.is_empty() {
            return Ok(());
        }
        self.model.forward(&mut chunks).map(|_| ()).map_err(|e| format!("draft model: {e}"))
    }
}
