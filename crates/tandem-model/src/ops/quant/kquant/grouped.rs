//! Several Q4K / Q5K products of one row each in one parallel call: the few rows of a MoE decode or
//! verify step meet 8 experts x 3 matrices, and as separate calls each one quantises its input
//! again and wakes the thread pool for a few microseconds of work. Here the rows are quantised
//! once and the column tiles of every product are split over the threads together. Every
//! result has the bits of the same product done alone ([`KQuantMatrix::matmul`]): the same
//! quantised row, the same per-lane arithmetic.

use super::KQuantMatrix;
#[cfg(target_arch = "x86_64")]
use super::{quantize, COLS, QK_K};

/// One product: `w · x[row]ᵀ`.
pub struct Job<'a> {
    pub w: &'a KQuantMatrix,
    pub row: usize,
}

/// `out[j] = jobs[j].w · x[jobs[j].row]ᵀ` for `x` `m` rows of `k` (every job's `k`).
pub fn matmul_grouped(jobs: &[Job<'_>], x: &[f32], m: usize) -> Vec<Vec<f32>> {
    let Some(first) = jobs.first() else { return Vec::new() };
    let k = first.w.k;
    assert!(jobs.iter().all(|j| j.w.k == k && j.row < m), "grouped Q4K matmul: jobs of other k or rows");
    assert_eq!(x.len(), m * k, "grouped Q4K matmul: x has {} values, want {m} × {k}", x.len());
    let mut outs: Vec<Vec<f32>> = jobs.iter().map(|j| vec![0f32; j.w.n]).collect();
    // Q5_0 tiles read activations of their own (per-block scales): product by product.
    #[cfg(target_arch = "x86_64")]
    if super::available() && jobs.iter().all(|j| !j.w.per_block_acts()) {
        let nb = k / QK_K;
        let (q8, bsum) = quantize(x, m, nb);
        // SAFETY: the CPU check is `available`; every job's tiles hold `nb` superblocks per
        // column tile and its row is in `q8` (asserted); tasks write disjoint tiles.
        unsafe { run(jobs, &q8, &bsum, nb, &mut outs) };
        return outs;
    }
    for (j, o) in jobs.iter().zip(outs.iter_mut()) {
        j.w.matmul(&x[j.row * k..(j.row + 1) * k], 1, o);
    }
    outs
}

#[cfg(target_arch = "x86_64")]
unsafe fn run(
    jobs: &[Job<'_>],
    q8: &[candle_core::quantized::k_quants::BlockQ8K],
    bsum: &[[u32; 4]],
    nb: usize,
    outs: &mut [Vec<f32>],
) {
    use super::super::matrix::{for_column_chunks, OutPtr};
    use super::x86::RowPtr;
    let Some(simd) = super::simd() else { return };
    // Tile g of the flat list is column tile g - starts[j] of job j.
    let mut starts = Vec::with_capacity(jobs.len() + 1);
    starts.push(0usize);
    for j in jobs {
        starts.push(starts.last().copied().unwrap_or(0) + j.w.n.div_ceil(COLS));
    }
    let total = starts[jobs.len()];
    let ptrs: Vec<OutPtr> = outs.iter_mut().map(|o| OutPtr(o.as_mut_ptr())).collect();
    let work: usize = jobs.iter().map(|j| j.w.n * j.w.k).sum();
    let threads = crate::ops::cpu_threads::threads();
    for_column_chunks(total, threads, work, 1, 1, |tiles| {
        for g in tiles {
            let j = starts.partition_point(|&s| s <= g) - 1;
            let (job, ct) = (&jobs[j], g - starts[j]);
            let row = [RowPtr { q8: q8[job.row * nb..].as_ptr() as *const u8, bsum: bsum[job.row * nb..].as_ptr() }];
            let cols = COLS.min(job.w.n - ct * COLS);
            job.w.tile_rows::<1>(simd, ct, &row, ptrs[j].get().add(ct * COLS), job.w.n, cols);
        }
    });
}
