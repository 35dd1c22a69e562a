//! Greedy rows on a GPU: the argmax of every row read back in one transfer.

/// The index of the largest logit of each row of each `[rows, vocab]` (or `[vocab]`) tensor,
/// computed where the rows live (`tandem_model::ops::sampling::argmax_rows`: many blocks over
/// the vocabulary, one read back for all rows): one list per tensor, decode steps one id,
/// verify chunks one per position. Ties go to the lowest index and NaN counts as `-inf`, like
/// the host sampler's argmax.
pub(super) fn device_argmax_rows<'a>(
    logits: impl Iterator<Item = &'a candle_core::Tensor>,
) -> tandem_model::error::Result<Vec<Vec<u32>>> {
    let mut mats = Vec::new();
    let mut counts = Vec::new();
    for l in logits {
        let vocab = l.dims().last().copied().unwrap_or(0).max(1);
        let rows = l.elem_count() / vocab;
        mats.push(l.reshape((rows, vocab))?);
        counts.push(rows);
    }
    if mats.is_empty() {
        return Ok(Vec::new());
    }
    let m = if mats.len() == 1 { mats.pop().expect("one") } else { candle_core::Tensor::cat(&mats, 0)? };
    let ids = tandem_model::ops::sampling::argmax_rows(&m)?;
    let mut it = ids.into_iter();
    Ok(counts.into_iter().map(|c| it.by_ref().take(c).collect()).collect())
}

/// [`device_argmax_rows`] of the tensors whose `greedy` flag is set, one result per such tensor
/// in order (every one the error, if the read failed).
pub(super) fn device_argmax_each<'a>(
    logits: impl Iterator<Item = (&'a Option<candle_core::Tensor>, bool)>,
) -> std::vec::IntoIter<Result<Vec<u32>, String>> {
    let rows: Vec<&candle_core::Tensor> = logits.filter(|(_, g)| *g).filter_map(|(l, _)| l.as_ref()).collect();
    let n = rows.len();
    match device_argmax_rows(rows.into_iter()) {
        Ok(ids) => ids.into_iter().map(Ok).collect::<Vec<_>>().into_iter(),
        Err(err) => vec![Err(err.to_string()); n].into_iter(),
    }
}
