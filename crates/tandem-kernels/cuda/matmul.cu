// Row-invariant dense matmul for the small-row path (decode, verify chunks, small batches):
// y [m, n] f32 = x [m, k] f32 . W [n, k]^T (W in T). One warp per output column: lane l sums
// x[r, c] W[n, c] over c = l, l + 32, ... in order, then a fixed butterfly sum. A row's result
// depends only on its own x row and W, never on m, so a row in a verify chunk or a ragged
// batch has the bits of the same row computed alone.
#include "common.cuh"

#define MAXM 32
#define WARPS 4

template <typename T>
__device__ void rowinv(float* __restrict__ y, const float* __restrict__ x, const T* __restrict__ w, int m, int n,
                       int k) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int col = blockIdx.x * WARPS + warp;
    if (col >= n) return;
    const T* wr = w + (size_t)col * k;
    float acc[MAXM];
#pragma unroll
    for (int r = 0; r < MAXM; r++) acc[r] = 0.f;
    for (int c = lane; c < k; c += 32) {
        float wv = to_f32(wr[c]);
#pragma unroll
        for (int r = 0; r < MAXM; r++) {
            if (r < m) acc[r] += x[(size_t)r * k + c] * wv;
        }
    }
#pragma unroll
    for (int r = 0; r < MAXM; r++) {
        if (r < m) {
            float s = warp_sum(acc[r]);
            if (lane == 0) y[(size_t)r * n + col] = s;
        }
    }
}

#define ROWINV(name, T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) name(float* y, const float* x, const T* w, int m, \
                                                                    int n, int k) {                       \
        rowinv<T>(y, x, w, m, n, k);                                                                      \
    }

ROWINV(rowinv_matmul_f32, float)
ROWINV(rowinv_matmul_f16, __half)
ROWINV(rowinv_matmul_bf16, __nv_bfloat16)
