//! Whole GEMM row tiles for a step: a step of prefill chunks beside decodes has rows = chunk +
//! decodes (520 for a 512-token chunk and 8 decodes), one row tile more than the chunk alone
//! on a GPU's prefill GEMMs (128 rows a tile), which for a 9B matrix of 4,096 columns is a
//! second wave of blocks. [`trim_to_tiles`] gives the step's excess over a whole number of
//! tiles back from its last prefill chunk (those tokens go in the next step), so the step runs
//! full tiles. Outputs do not depend on how a prompt is chunked (the chunk-equivalence
//! invariant), so this moves only speed. The scheduler passes no chunk when the last one ends
//! its prompt: trimming that one would delay the request's first token by a step.

/// Trims `want[last]` (the step's last prefill chunk) so the step's total rows are a multiple
/// of `align` when they exceed one `align` and the chunk can give the excess back and keep a
/// token. Returns the rows trimmed. `align` <= 1 trims nothing.
pub(crate) fn trim_to_tiles(want: &mut [usize], last: Option<usize>, align: usize) -> usize {
    let Some(last) = last.filter(|_| align > 1) else { return 0 };
    let total: usize = want.iter().sum();
    if total <= align {
        return 0;
    }
    let excess = total % align;
    if excess == 0 || want[last] <= excess {
        return 0;
    }
    want[last] -= excess;
    excess
}

/// The row tile of the CUDA prefill GEMMs (bf16 `tmmg_bf16`, the quantised `q8gemm` /
/// `kqgemm` tiles are 128 or 64 rows): the alignment a CUDA engine trims its steps to.
pub(crate) const CUDA_ROW_TILE: usize = 128;

/// `TANDEM_STEP_ALIGN` read once (1 turns trimming off, 128 is the CUDA GEMMs' row tile); 0
/// (the device decides, [`resolve`]) when unset or unparsable.
pub(crate) fn step_align() -> usize {
    static A: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *A.get_or_init(|| std::env::var("TANDEM_STEP_ALIGN").ok().and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// The alignment an engine on `device` uses for a configured `align`: a set value as it is, 0
/// (auto) [`CUDA_ROW_TILE`] on CUDA and 1 (no trimming) elsewhere. Measured on an H100
/// (2026-12-07, 9B bf16, 8 decodes beside a 4K prompt in 512-token chunks): a mixed step
/// 101 -> 78 ms, the prompt's prefill 5,079 -> 6,202 tok/s. A CPU's GEMMs have no row tile
/// worth the trimming.
pub(crate) fn resolve(align: usize, device: &candle_core::Device) -> usize {
    match align {
        0 if device.is_cuda() => CUDA_ROW_TILE,
        0 => 1,
        a => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_beside_decodes_gives_back_the_rows_past_a_whole_tile() {
        // Eight decodes and a 512-token chunk: 520 rows -> 512.
        let mut want = vec![1, 1, 1, 1, 1, 1, 1, 1, 512];
        assert_eq!(trim_to_tiles(&mut want, Some(8), 128), 8);
        assert_eq!(want[8], 504);
        assert_eq!(want.iter().sum::<usize>(), 512);
        // Two chunks: only the last gives rows back.
        let mut want = vec![3, 512, 512];
        assert_eq!(trim_to_tiles(&mut want, Some(2), 128), 3);
        assert_eq!(want, vec![3, 512, 509]);
    }

    #[test]
    fn auto_alignment_is_the_devices_and_a_set_value_stays() {
        let cpu = candle_core::Device::Cpu;
        assert_eq!(resolve(0, &cpu), 1);
        assert_eq!(resolve(1, &cpu), 1);
        assert_eq!(resolve(128, &cpu), 128);
        assert_eq!(resolve(4, &cpu), 4);
    }

    #[test]
    fn small_steps_whole_steps_and_short_chunks_stay() {
        // At most one tile: nothing to gain.
        let mut want = vec![1, 1, 100];
        assert_eq!(trim_to_tiles(&mut want, Some(2), 128), 0);
        assert_eq!(want, vec![1, 1, 100]);
        // Already whole tiles.
        let mut want = vec![256];
        assert_eq!(trim_to_tiles(&mut want, Some(0), 128), 0);
        // The chunk is the excess or less (the prompt's tail): it keeps its tokens.
        let mut want = vec![100, 30, 10];
        assert_eq!(trim_to_tiles(&mut want, Some(2), 128), 0);
        assert_eq!(want, vec![100, 30, 10]);
        // No prefill chunk (decodes and drafts only), or no alignment.
        let mut want = vec![5; 40];
        assert_eq!(trim_to_tiles(&mut want, None, 128), 0);
        let mut want = vec![1, 512];
        assert_eq!(trim_to_tiles(&mut want, Some(1), 1), 0);
        assert_eq!(want, vec![1, 512]);
    }
}
