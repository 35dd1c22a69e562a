//! Greedy rows on a GPU: the argmax of every row read back in one transfer.

/// The index of the largest logit of each `[1, vocab]` row, computed where the rows live, with
/// one read back for all of them. Ties go to the lowest index, like the host sampler's argmax.
pub(super) fn device_argmax_rows<'a>(
    rows: impl Iterator<Item = &'a candle_core::Tensor>,
) -> candle_core::Result<Vec<u32>> {
    let rows: Vec<candle_core::Tensor> = rows.map(|l| l.flatten_all()).collect::<candle_core::Result<_>>()?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let m = candle_core::Tensor::stack(&rows, 0)?;
    let n = m.dim(1)?;
    let max = m.max_keepdim(1)?;
    // First index whose logit equals the maximum (candle's argmax does not promise which one).
    let hits = m.broadcast_eq(&max)?.to_dtype(candle_core::DType::F32)?;
    let idx = candle_core::Tensor::arange(0f32, n as f32, m.device())?;
    let big = ((hits.ones_like()? - &hits)? * (n as f64))?;
    let first = big.broadcast_add(&idx)?.min(1)?;
    Ok(first.to_vec1::<f32>()?.into_iter().map(|x| x as u32).collect())
}
