//! The sampling-candidates check: the device's top candidates of a logits row
//! ([`crate::ops::sampling::top_candidates`]) against the reference's, over vocabularies below
//! and above the candidate count, with ties across the boundary and planted NaN / inf. The
//! candidate set and its logits must match bit for bit, the softmax mass to 1e-6 (the device's `expf` is within 2
//! ulp of the host's). Devices
//! without the kernel (the CPU, Metal) read rows whole; they get no rows here. Beside it, greedy
//! rows: [`argmax_rows`] on a batch of such rows (one of only NaN and `-inf`) against
//! [`argmax_ref`], exact.

use candle_core::{Device, Tensor};

use super::{timed, Check, Judge, Rng};
use crate::error::Result;
use crate::ops::sampling::{
    argmax_ref, argmax_rows, top_candidates, top_candidates_ref, TopCandidates, DEVICE_CANDIDATES,
};

pub fn run(dev: &Device) -> Vec<Check> {
    let mut out = Vec::new();
    for (vocab, ties, inv_t) in [(100, false, 1.0), (384, true, 1.25), (151_936, false, 1.0), (248_320, true, 0.7)] {
        let shape = format!("vocab {vocab}{}", if ties { " ties" } else { "" });
        if !dev.is_cpu() {
            match argmax_case(dev, vocab, ties) {
                Ok(c) => out.push(c),
                Err(e) => out.push(Check::error("argmax_rows", shape.clone(), "f32", e)),
            }
        }
        match case(dev, vocab, ties, inv_t) {
            Ok(Some(c)) => out.extend(c),
            Ok(None) => return out,
            Err(e) => out.push(Check::error("top_candidates", shape, "f32", e)),
        }
    }
    out
}

/// A row as [`case`] makes it (ties, a NaN, an -inf, +inf where `vocab` is 384).
fn test_row(vocab: usize, ties: bool) -> Vec<f32> {
    let mut rng = Rng(vocab as u64 + ties as u64);
    let mut row: Vec<f32> = rng.vec(vocab).into_iter().map(|v| v * 8.0).collect();
    if ties {
        // Coarse values: hundreds of logits share the value at the 256th place.
        row.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0);
    }
    row[3] = f32::NAN;
    if vocab == 384 {
        // +inf counts as f32::MAX: the mass is then that one token's.
        row[vocab / 2] = f32::INFINITY;
    }
    row[vocab - 1] = f32::NEG_INFINITY;
    row
}

/// Four rows: the test row, the same with its maximum repeated later (the first one wins),
/// one of NaN and -inf only (0), and the row reversed.
fn argmax_case(dev: &Device, vocab: usize, ties: bool) -> Result<Check> {
    let row = test_row(vocab, ties);
    let mut twice = row.clone();
    let first = argmax_ref(&row) as usize;
    twice[vocab - 2] = twice[first];
    let empty: Vec<f32> = (0..vocab).map(|i| if i % 2 == 0 { f32::NAN } else { f32::NEG_INFINITY }).collect();
    let rev: Vec<f32> = row.iter().rev().copied().collect();
    let rows = [row, twice, empty, rev];
    let want: Vec<u32> = rows.iter().map(|r| argmax_ref(r)).collect();
    let t = Tensor::from_slice(&rows.concat(), (4, vocab), dev)?;
    let (got, ms) = timed(dev, || argmax_rows(&t))?;
    let shape = format!("4 x vocab {vocab}{}", if ties { " ties" } else { "" });
    Ok(Check::new("argmax_rows", shape, "f32", if got == want { 0.0 } else { 1.0 }, Judge::Exact, ms))
}

/// The candidates sorted by id, so two sets compare entry by entry.
fn by_id(c: &TopCandidates) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = c.ids.iter().zip(&c.logits).map(|(&i, l)| (i, l.to_bits())).collect();
    v.sort_unstable();
    v
}

fn case(dev: &Device, vocab: usize, ties: bool, inv_t: f32) -> Result<Option<Vec<Check>>> {
    let row = test_row(vocab, ties);
    let want = top_candidates_ref(&row, DEVICE_CANDIDATES, inv_t);
    let t = Tensor::from_slice(&row, (1, vocab), dev)?;
    let (got, ms) = timed(dev, || top_candidates(&t, DEVICE_CANDIDATES, inv_t))?;
    let Some(got) = got else { return Ok(None) };
    let shape = format!("vocab {vocab}{}", if ties { " ties" } else { "" });
    let same = by_id(&got) == by_id(&want) && got.vocab == want.vocab;
    let mass_err = ((got.mass - want.mass).abs() / want.mass.abs().max(1e-300)) as f32;
    Ok(Some(vec![
        Check::new("top_candidates", shape.clone(), "f32", if same { 0.0 } else { 1.0 }, Judge::Exact, ms),
        Check::new("top_candidates mass", shape, "f32", mass_err, Judge::Tolerance(1e-6), 0.0),
    ]))
}
