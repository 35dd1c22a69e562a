//! The vector primitives of the kernel ([`VecOps`]), their portable form ([`Plain`]) and the
//! element-wise helpers (exponential, maximum, sum) written so that LLVM vectorises them in
//! whichever instruction set the caller is compiled for.

/// What a kernel build needs from its instruction set.
pub(super) trait VecOps {
    /// `out[i] = sum_c q[c] * keys[i][c]` for eight key rows of `q.len()` values each.
    fn dot8(q: &[f32], keys: &[&[f32]; 8]) -> [f32; 8];
    /// `acc[c] += sum_j p[j] * rows[j][c]`, the keys added in the order `j = 0, 1, ..`;
    /// `rows.len() <= p.len()`, every row at least `acc.len()` long.
    fn accumulate(acc: &mut [f32], p: &[f32], rows: &[&[f32]]);
    /// `dst[i] = src[i]` as f32, `src.len() == dst.len()`.
    fn f16_to_f32(src: &[half::f16], dst: &mut [f32]);
}

/// Plain loops, for any CPU (and the reference order of the SIMD builds' arithmetic).
pub(super) struct Plain;

impl VecOps for Plain {
    #[inline(always)]
    fn dot8(q: &[f32], keys: &[&[f32]; 8]) -> [f32; 8] {
        std::array::from_fn(|i| dot(q, keys[i]))
    }

    #[inline(always)]
    fn accumulate(acc: &mut [f32], p: &[f32], rows: &[&[f32]]) {
        for (&pj, row) in p.iter().zip(rows) {
            for (a, &x) in acc.iter_mut().zip(*row) {
                *a += pj * x;
            }
        }
    }

    #[inline(always)]
    fn f16_to_f32(src: &[half::f16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

/// A dot product with eight accumulators, so that SSE can still vectorise it.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    sum_lanes(&acc) + tail
}

/// The fixed reduction order of eight lanes.
#[inline(always)]
fn sum_lanes(acc: &[f32; 8]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// `sum(x)` over a slice whose length is a multiple of 8, in eight lanes keyed by index mod 8:
/// trailing zeros never change the result, so rows padded to different lengths agree.
#[inline(always)]
pub(super) fn sum8(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for c in x.chunks_exact(8) {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    sum_lanes(&acc)
}

/// `max(x)` (`-inf` for an empty slice).
#[inline(always)]
pub(super) fn max(x: &[f32]) -> f32 {
    x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// `x[j] = exp(x[j] - m)` for `x[j] <= m`.
#[inline(always)]
pub(super) fn exp_sub(x: &mut [f32], m: f32) {
    for v in x {
        *v = exp_neg(*v - m);
    }
}

/// `exp(x)` for `x <= 0` from Cephes' `expf` (about one ulp, flushes below `e^-87` to
/// ~1e-38): pure arithmetic, so loops over it vectorise.
#[inline(always)]
pub(super) fn exp_neg(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding and subtracting rounds to an integer
    let x = x.max(-87.0);
    let k = (x * std::f32::consts::LOG2_E + MAGIC) - MAGIC;
    let r = x - k * 0.693_359_4 + k * 2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 0.166_666_65) * r
        + 0.5;
    let y = p * r * r + r + 1.0;
    // Wrapping add: no overflow check in the loop body, so it vectorises in every profile.
    y * f32::from_bits(((k as i32).wrapping_add(127) as u32) << 23)
}
