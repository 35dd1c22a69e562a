//! `dst ← lhs · rhs` on one thread with the `gemm` crate's f32 kernels (candle's): the small
//! strided products the CPU kernels of the chunked GDN rule and of prefill attention are made of.

/// `dst ← lhs · rhs` (`acc = None`) or `dst ← dst + acc · lhs · rhs`, for `lhs` `[m, k]` and
/// `rhs` `[k, n]` given as (slice, row stride, column stride) and `dst` `[m, n]` with row
/// stride `ldd`, on the `gemm` crate's kernels (the ones candle's f32 matmul uses; FMA, packed
/// panels, one thread): deterministic for a given shape and CPU.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_into(
    dst: &mut [f32],
    ldd: usize,
    acc: Option<f32>,
    lhs: (&[f32], usize, usize),
    rhs: (&[f32], usize, usize),
    m: usize,
    k: usize,
    n: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let ((l, l_rs, l_cs), (r, r_rs, r_cs)) = (lhs, rhs);
    let last = |rows: usize, rs: usize, cols: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(
        last(m, ldd, n, 1) < dst.len()
            && (k == 0 || (last(m, l_rs, k, l_cs) < l.len() && last(k, r_rs, n, r_cs) < r.len())),
        "gemm_into: operands too short"
    );
    if k == 0 {
        if acc.is_none() {
            (0..m).for_each(|i| dst[i * ldd..i * ldd + n].iter_mut().for_each(|x| *x = 0.0));
        }
        return;
    }
    // SAFETY: the asserted extents cover every element gemm reads or writes; `dst` is borrowed
    // mutably, so it overlaps neither operand.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ldd as isize,
            acc.is_some(),
            l.as_ptr(),
            l_cs as isize,
            l_rs as isize,
            r.as_ptr(),
            r_cs as isize,
            r_rs as isize,
            1.0,
            acc.unwrap_or(1.0),
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}
