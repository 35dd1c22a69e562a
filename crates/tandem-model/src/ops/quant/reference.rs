//! The plain Rust dot products: one weight row against one quantised activation row, block by
//! block, as ggml's generic `ggml_vec_dot_q4_1_q8_1` / `q5_0_q8_0` / `q5_1_q8_1`:
//!
//! `Σ_blocks (d_w · d_a) · Σ_j q_w[j] · q_a[j]  (+ m_w · s_a for the types with a minimum)`
//!
//! The integer sums are exact, so a SIMD kernel may only differ from this in the order of
//! the f32 additions. Used on CPUs without AVX2, and as the reference in tests.

use super::activation::Q8Block;
use super::blocks::WeightBlock;

/// Dot product of one weight row with one quantised activation row (same number of blocks).
pub fn vec_dot<B: WeightBlock>(w: &[B], a: &[Q8Block]) -> f32 {
    debug_assert_eq!(w.len(), a.len());
    let mut sumf = 0f32;
    for (wb, ab) in w.iter().zip(a) {
        let q = wb.ints();
        let sumi: i32 = q.iter().zip(&ab.qs).map(|(&x, &y)| x * y as i32).sum();
        sumf += (wb.d() * ab.d) * sumi as f32;
        if B::HAS_MIN {
            sumf += wb.m() * ab.s;
        }
    }
    sumf
}

/// `y[r, c] = vec_dot(w[c], a[r])` for all rows `r < m` and columns `c` in `cols`; `w` holds
/// `n` rows of `nb` blocks, `a` holds `m` rows of `nb` blocks, `y` is `m × n`.
///
/// # Safety
/// `y` must be valid for writes at `r * n + c` for every `r < m`, `c` in `cols`, and no other
/// thread may access those elements meanwhile.
pub(super) unsafe fn matmul_cols<B: WeightBlock>(
    w: &[B],
    nb: usize,
    a: &[Q8Block],
    m: usize,
    cols: std::ops::Range<usize>,
    y: *mut f32,
    n: usize,
) {
    for r in 0..m {
        let ar = &a[r * nb..(r + 1) * nb];
        for c in cols.clone() {
            let v = vec_dot(&w[c * nb..(c + 1) * nb], ar);
            // SAFETY: in bounds and exclusive by the caller's contract.
            unsafe { *y.add(r * n + c) = v };
        }
    }
}
