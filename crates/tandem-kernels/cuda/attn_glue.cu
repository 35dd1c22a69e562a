// The gated attention layer's glue around paged attention (qwen_hybrid::attention on CUDA): one
// launch on each side, where candle's ops took per layer two q / k norms, two partial rotations
// (a copy, the rotation and a concatenation each), the head-major copies of q, k and v, the
// gate's copy, a sigmoid, a product and the output's copy back to token-major rows.
//
// attn_prep: per token and head, from the fused q / k / v projection's rows read in place (row
//   strides given; q_proj's rows hold [query_h | gate_h] per head): q = rope(rmsnorm(q_h) * wq),
//   k = rope(rmsnorm(k_h) * wk), v as it is, written head-major [heads, tokens, hd] as the
//   attention kernels read them. A block of hd threads per (token, head); thread d holds value
//   d. RMSNorm as norm.cu's rmsnorm_rows sums a row of up to 256 values (one square per
//   thread, a fixed butterfly in each warp, the warps' sums in warp order, then x * inv * w):
//   the same bits, and per token, whatever else shares the launch. RoPE: NeoX pairs (i, i +
//   rot / 2) of the first rot dims with the token's cos / sin row, written as candle's rope
//   kernel writes them; the dims past rot pass through. The same kernel serves the plain
//   (Llama-family) layer: qhead = hd (q rows hold only the queries, not [query | gate] pairs:
//   qhead = 2 hd) and, without per-head norms (wq = wk = null), x rotated as it is.
// attn_gate: out [tokens, nh hd] = att [nh, tokens, hd] * sigmoid(gate), the gate read in place
//   from q_proj's rows.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(1024)
    attn_prep(float* __restrict__ q_out, float* __restrict__ k_out, float* __restrict__ v_out,
              const float* __restrict__ qg, long long ldq, const float* __restrict__ kx, long long ldk,
              const float* __restrict__ vx, long long ldv, const float* __restrict__ wq, const float* __restrict__ wk,
              const float* __restrict__ cosv, const float* __restrict__ sinv, float eps, int total, int nh, int hd,
              int rot, int qhead) {
    __shared__ float part[32];
    __shared__ float inv;
    __shared__ float y[1024];
    const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
    const bool is_q = h < nh;
    const int kh = h - nh;
    const float* src = is_q ? qg + (long long)t * ldq + (long long)h * qhead : kx + (long long)t * ldk + (long long)kh * hd;
    const float x = src[d];
    float yv = x;
    if (wq) {
        const float ss = warp_sum(fmaf(x, x, 0.f));
        if ((d & 31) == 0) part[d >> 5] = ss;
        __syncthreads();
        if (d == 0) {
            float s = part[0];
            for (int i = 1; i < (hd >> 5); i++) s += part[i];
            inv = rsqrtf(s / (float)hd + eps);
        }
        __syncthreads();
        yv = x * inv * (is_q ? wq : wk)[d];
    }
    y[d] = yv;
    __syncthreads();
    float o = yv;
    const int half = rot >> 1;
    if (d < rot) {
        const int i = d < half ? d : d - half;
        const float c = cosv[(long long)t * half + i], s = sinv[(long long)t * half + i];
        if (d < half) {
            o = yv * c - y[d + half] * s;
        } else {
            o = y[d - half] * s + yv * c;
        }
    }
    if (is_q) {
        q_out[((long long)h * total + t) * hd + d] = o;
    } else {
        const long long at = ((long long)kh * total + t) * hd + d;
        k_out[at] = o;
        v_out[at] = vx[(long long)t * ldv + (long long)kh * hd + d];
    }
}

extern "C" __global__ void attn_gate(float* __restrict__ out, const float* __restrict__ att,
                                     const float* __restrict__ qg, long long ldq, int total, int nh, int hd) {
    const long long width = (long long)nh * hd, n = (long long)total * width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / width, r = i - t * width;
        const int h = (int)(r / hd), d = (int)(r - (long long)h * hd);
        const float g = qg[t * ldq + (long long)h * 2 * hd + hd + d];
        out[i] = att[((long long)h * total + t) * hd + d] * (1.f / (1.f + expf(-g)));
    }
}
