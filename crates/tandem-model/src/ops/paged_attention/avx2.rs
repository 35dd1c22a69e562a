//! AVX2 + FMA forms of the kernel's vector primitives: eight dot products at once, reduced
//! with a horizontal-add transpose (no per-key horizontal sum), and the weighted sum of value
//! rows with the accumulator held in registers across keys (up to 64 floats at a time).
//!
//! [`Fma`] must only be used inside a function compiled with `avx2,fma,f16c` that runs after
//! [`super::kernel`] checked the CPU at run time; the kernel's `segment_avx2` is that function.

use std::arch::x86_64::*;

use super::vec_ops::VecOps;

pub(super) struct Fma;

impl VecOps for Fma {
    #[inline(always)]
    fn dot8(q: &[f32], keys: &[&[f32]; 8]) -> [f32; 8] {
        assert!(keys.iter().all(|k| k.len() >= q.len()), "key rows shorter than the query");
        // SAFETY: every key row holds at least `q.len()` values (checked above), the only
        // extent `dot8` reads; `Fma` is only used where the CPU has AVX2 and FMA (module doc).
        unsafe { dot8(q, keys) }
    }

    #[inline(always)]
    fn accumulate(acc: &mut [f32], p: &[f32], rows: &[&[f32]]) {
        assert!(p.len() >= rows.len() && rows.iter().all(|r| r.len() >= acc.len()), "value rows do not fit");
        // SAFETY: `accumulate` reads `rows[j][..acc.len()]` and `p[j]` for `j < rows.len()`,
        // all in bounds (checked above); the CPU has AVX2 and FMA (module doc).
        unsafe { accumulate(acc, p, rows) }
    }

    #[inline(always)]
    fn f16_to_f32(src: &[half::f16], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len(), "f16 row and f32 buffer differ in length");
        // SAFETY: both slices hold `dst.len()` elements (checked above); the CPU has F16C
        // (the kernel checks it with AVX2 and FMA before using `Fma`).
        unsafe { f16_to_f32(src, dst) }
    }
}

/// SAFETY (caller): F16C present; `src.len() == dst.len()`.
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn f16_to_f32(src: &[half::f16], dst: &mut [f32]) {
    let n = dst.len();
    let (s, d) = (src.as_ptr() as *const u16, dst.as_mut_ptr());
    let mut c = 0;
    while c + 8 <= n {
        let h = _mm_loadu_si128(s.add(c) as *const __m128i);
        _mm256_storeu_ps(d.add(c), _mm256_cvtph_ps(h));
        c += 8;
    }
    for (i, h) in src.iter().enumerate().skip(c) {
        *d.add(i) = h.to_f32();
    }
}

/// SAFETY (caller): AVX2 + FMA present; every key row at least `q.len()` long.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn dot8(q: &[f32], keys: &[&[f32]; 8]) -> [f32; 8] {
    let hd = q.len();
    let mut a = [_mm256_setzero_ps(); 8];
    let mut c = 0;
    while c + 8 <= hd {
        let qv = _mm256_loadu_ps(q.as_ptr().add(c));
        for i in 0..8 {
            a[i] = _mm256_fmadd_ps(_mm256_loadu_ps(keys[i].as_ptr().add(c)), qv, a[i]);
        }
        c += 8;
    }
    // Transpose-reduce: lane i of the result is ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)) of a[i],
    // the same order whatever the other seven keys are.
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    let lo = _mm256_permute2f128_ps(u0, u1, 0x20);
    let hi = _mm256_permute2f128_ps(u0, u1, 0x31);
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(lo, hi));
    if c < hd {
        for (o, k) in out.iter_mut().zip(keys) {
            for (x, y) in q[c..].iter().zip(&k[c..hd]) {
                *o = x.mul_add(*y, *o);
            }
        }
    }
    out
}

/// SAFETY (caller): AVX2 + FMA present; `p.len() >= rows.len()`, every row at least
/// `acc.len()` long.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn accumulate(acc: &mut [f32], p: &[f32], rows: &[&[f32]]) {
    let hd = acc.len();
    let mut c = 0;
    while c + 64 <= hd {
        columns::<8>(acc, p, rows, c);
        c += 64;
    }
    if c + 32 <= hd {
        columns::<4>(acc, p, rows, c);
        c += 32;
    }
    while c + 8 <= hd {
        columns::<1>(acc, p, rows, c);
        c += 8;
    }
    for (&pj, row) in p.iter().zip(rows) {
        for (a, x) in acc[c..].iter_mut().zip(&row[c..hd]) {
            *a = pj.mul_add(*x, *a);
        }
    }
}

/// `acc[c0..c0 + 8N] += sum_j p[j] * rows[j][c0..c0 + 8N]` with the `N` accumulators in
/// registers. SAFETY (caller): as [`accumulate`], and `c0 + 8N <= acc.len()`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn columns<const N: usize>(acc: &mut [f32], p: &[f32], rows: &[&[f32]], c0: usize) {
    let dst = acc.as_mut_ptr().add(c0);
    let mut a = [_mm256_setzero_ps(); N];
    for (i, ai) in a.iter_mut().enumerate() {
        *ai = _mm256_loadu_ps(dst.add(8 * i));
    }
    for (j, row) in rows.iter().enumerate() {
        let pj = _mm256_set1_ps(*p.get_unchecked(j));
        let src = row.as_ptr().add(c0);
        for (i, ai) in a.iter_mut().enumerate() {
            *ai = _mm256_fmadd_ps(pj, _mm256_loadu_ps(src.add(8 * i)), *ai);
        }
    }
    for (i, ai) in a.iter().enumerate() {
        _mm256_storeu_ps(dst.add(8 * i), *ai);
    }
}
