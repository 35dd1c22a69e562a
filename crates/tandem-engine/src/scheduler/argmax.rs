//! Greedy rows on a GPU: the argmax of every row read back in one transfer.

/// The index of the largest logit of each `[1, vocab]` row, computed where the rows live
/// (`tandem_model::ops::sampling::argmax_rows`: many blocks over the vocabulary, one read
/// back for all rows). Ties go to the lowest index and NaN counts as `-inf`, like the host
/// sampler's argmax.
pub(super) fn device_argmax_rows<'a>(
    rows: impl Iterator<Item = &'a candle_core::Tensor>,
) -> tandem_model::error::Result<Vec<u32>> {
    let rows: Vec<candle_core::Tensor> = rows.map(|l| l.flatten_all()).collect::<candle_core::Result<_>>()?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let m = candle_core::Tensor::stack(&rows, 0)?;
    tandem_model::ops::sampling::argmax_rows(&m)
}
