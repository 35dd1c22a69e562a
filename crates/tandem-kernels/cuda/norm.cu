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

// Rows of up to RN_THREADS * RN_KEEP values are read once, every load of a thread issued
// together (the row's values and its weights in flight at once, not one dependent round trip
// per 256 values), and kept in registers for the output; longer rows stream twice. Either way
// thread t sums the squares of values t, t + 256, ... in that order: the same bits.
#define RN_KEEP 32

__device__ __forceinline__ float rn_inv(float ss, int n, float eps) {
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
    return inv;
}

extern "C" __global__ void __launch_bounds__(RN_THREADS)
    rmsnorm_rows(const float* __restrict__ x, const float* __restrict__ d, const float* __restrict__ w, float eps,
                 int n, float* __restrict__ x_out, float* __restrict__ h_out) {
    const size_t off = (size_t)blockIdx.x * n;
    const float* xr = x + off;
    const float* dr = d ? d + off : nullptr;
    float ss = 0.f;
    if (n <= RN_THREADS * RN_KEEP) {
        float v[RN_KEEP], wv[RN_KEEP];
#pragma unroll
        for (int j = 0; j < RN_KEEP; j++) {
            const int i = threadIdx.x + j * RN_THREADS;
            v[j] = 0.f;
            wv[j] = 0.f;
            if (i < n) {
                v[j] = xr[i];
                wv[j] = w[i];
            }
        }
        if (dr) {
#pragma unroll
            for (int j = 0; j < RN_KEEP; j++) {
                const int i = threadIdx.x + j * RN_THREADS;
                if (i < n) v[j] = v[j] + dr[i];
            }
        }
#pragma unroll
        for (int j = 0; j < RN_KEEP; j++) {
            const int i = threadIdx.x + j * RN_THREADS;
            if (i < n) {
                if (dr) x_out[off + i] = v[j];
                ss = fmaf(v[j], v[j], ss);
            }
        }
        const float inv = rn_inv(ss, n, eps);
#pragma unroll
        for (int j = 0; j < RN_KEEP; j++) {
            const int i = threadIdx.x + j * RN_THREADS;
            if (i < n) h_out[off + i] = v[j] * inv * wv[j];
        }
        return;
    }
    for (int i = threadIdx.x; i < n; i += RN_THREADS) {
        float s = xr[i];
        if (dr) {
            s = s + dr[i];
            x_out[off + i] = s;
        }
        ss = fmaf(s, s, ss);
    }
    const float inv = rn_inv(ss, n, eps);
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
        out[i] = __fmul_rn(silu_f(gv), u[r * u_stride + c]);  // as gated_act (common.cuh)
    }
}
