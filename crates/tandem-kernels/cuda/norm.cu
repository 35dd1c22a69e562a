// Row-wise kernels of a decoder layer's glue, one launch where candle needs two or three:
//
// rmsnorm_rows: h [rows, n] = s * rsqrt(mean(s^2) + eps) * w with s = x (+ d, when d is given;
//   s is then also written to x_out: the residual add fused with the norm that follows it).
//   One block of RN_THREADS threads per row; thread t sums the squares of values t, t + 256, ...
//   in order, then a fixed butterfly within each warp and the warps' sums in warp order: the
//   order depends on n alone, so a row has the same bits in every call (decode, verify, batch,
//   prefill chunk), as the matmuls do.
// silu_mul_rows: out [rows, n] = silu(g) * u for row views g, u (row strides given: the two
//   halves of a fused [gate | up] projection's output without copies).
#include "common.cuh"

#define RN_THREADS 256

extern "C" __global__ void __launch_bounds__(RN_THREADS)
    rmsnorm_rows(const float* __restrict__ x, const float* __restrict__ d, const float* __restrict__ w, float eps,
                 int n, float* __restrict__ x_out, float* __restrict__ h_out) {
    const size_t off = (size_t)blockIdx.x * n;
    const float* xr = x + off;
    const float* dr = d ? d + off : nullptr;
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += RN_THREADS) {
        float s = xr[i];
        if (dr) {
            s = s + dr[i];
            x_out[off + i] = s;
        }
        ss = fmaf(s, s, ss);
    }
    ss = warp_sum(ss);
    __shared__ float part[RN_THREADS / 32];
    __shared__ float inv;
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = part[0];
#pragma unroll
        for (int i = 1; i < RN_THREADS / 32; i++) t += part[i];
        inv = rsqrtf(t / (float)n + eps);
    }
    __syncthreads();
    const float* sr = dr ? x_out + off : xr;
    for (int i = threadIdx.x; i < n; i += RN_THREADS) h_out[off + i] = sr[i] * inv * w[i];
}

extern "C" __global__ void silu_mul_rows(const float* __restrict__ g, long long g_stride, const float* __restrict__ u,
                                         long long u_stride, float* __restrict__ out, int rows, int n) {
    const long long total = (long long)rows * n;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / n, c = i - r * n;
        const float gv = g[r * g_stride + c];
        out[i] = silu_f(gv) * u[r * u_stride + c];
    }
}
