// Mixture-of-experts routing on the device, so an MoE layer never sends its router logits to
// the host (the CPU path in arch/qwen_hybrid/ffn.rs is the reference).
//
// moe_route: per token (one block per row), softmax over the E router logits, the top_k
//   experts by probability (ties to the lower index, like the CPU's stable sort), their
//   weights p / z, renormalised over the chosen ones when `norm` is set. ids, wts [m, top_k],
//   in rank order.
// moe_sort: the m * top_k slots grouped by expert (a counting sort in one block), so that the
//   expert matmuls (qmatmul.cu) read each expert's weights from cache for all its tokens.
//   The order inside a group is not fixed, and need not be: each slot is computed alone.
// moe_combine: out [m, h] = sum over j of wts[r, j] * y[r * top_k + j] in rank order.
#include "common.cuh"

#define ROUTE_THREADS 256

extern "C" __global__ void __launch_bounds__(ROUTE_THREADS)
    moe_route(int* __restrict__ ids, float* __restrict__ wts, const float* __restrict__ logits, int E, int top_k,
              int norm) {
    extern __shared__ float p[];  // E probabilities (unnormalised), then reduction scratch
    __shared__ float red_v[ROUTE_THREADS];
    __shared__ int red_i[ROUTE_THREADS];
    __shared__ float zs;
    const int row = blockIdx.x, t = threadIdx.x;
    const float* l = logits + (size_t)row * E;
    float mx = -INFINITY;
    for (int e = t; e < E; e += ROUTE_THREADS) mx = fmaxf(mx, l[e]);
    red_v[t] = mx;
    __syncthreads();
    for (int o = ROUTE_THREADS / 2; o > 0; o >>= 1) {
        if (t < o) red_v[t] = fmaxf(red_v[t], red_v[t + o]);
        __syncthreads();
    }
    mx = red_v[0];
    __syncthreads();
    float z = 0.f;
    for (int e = t; e < E; e += ROUTE_THREADS) {
        const float v = expf(l[e] - mx);
        p[e] = v;
        z += v;
    }
    red_v[t] = z;
    __syncthreads();
    for (int o = ROUTE_THREADS / 2; o > 0; o >>= 1) {
        if (t < o) red_v[t] += red_v[t + o];
        __syncthreads();
    }
    if (t == 0) zs = red_v[0];
    __syncthreads();
    // top_k rounds of argmax; a chosen expert's p is set to -1 (probabilities are >= 0)
    for (int j = 0; j < top_k; j++) {
        float bv = -2.f;
        int bi = E;
        for (int e = t; e < E; e += ROUTE_THREADS) {
            const float v = p[e];
            if (v > bv) {
                bv = v;
                bi = e;
            }
        }
        red_v[t] = bv;
        red_i[t] = bi;
        __syncthreads();
        for (int o = ROUTE_THREADS / 2; o > 0; o >>= 1) {
            if (t < o) {
                const float v2 = red_v[t + o];
                const int i2 = red_i[t + o];
                if (v2 > red_v[t] || (v2 == red_v[t] && i2 < red_i[t])) {
                    red_v[t] = v2;
                    red_i[t] = i2;
                }
            }
            __syncthreads();
        }
        if (t == 0) {
            const int e = red_i[0];
            ids[(size_t)row * top_k + j] = e;
            wts[(size_t)row * top_k + j] = red_v[0] / zs;
            p[e] = -1.f;
        }
        __syncthreads();
    }
    if (t == 0 && norm) {
        float sel = 0.f;
        for (int j = 0; j < top_k; j++) sel += wts[(size_t)row * top_k + j];
        for (int j = 0; j < top_k; j++) wts[(size_t)row * top_k + j] = wts[(size_t)row * top_k + j] / sel;
    }
}

// One block of 1024 threads; counts in dynamic shared memory (E ints).
extern "C" __global__ void __launch_bounds__(1024)
    moe_sort(int* __restrict__ order, const int* __restrict__ ids, int S, int E) {
    extern __shared__ int cnt[];
    const int t = threadIdx.x;
    for (int e = t; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int s = t; s < S; s += blockDim.x) atomicAdd(&cnt[ids[s]], 1);
    __syncthreads();
    if (t == 0) {
        int run = 0;
        for (int e = 0; e < E; e++) {
            const int c = cnt[e];
            cnt[e] = run;
            run += c;
        }
    }
    __syncthreads();
    for (int s = t; s < S; s += blockDim.x) order[atomicAdd(&cnt[ids[s]], 1)] = s;
}

extern "C" __global__ void moe_combine(float* __restrict__ out, const float* __restrict__ y,
                                       const float* __restrict__ wts, int h, int top_k) {
    const int row = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= h) return;
    float acc = 0.f;
    for (int j = 0; j < top_k; j++) {
        const size_t s = (size_t)row * top_k + j;
        acc = fmaf(wts[s], y[s * h + c], acc);
    }
    out[(size_t)row * h + c] = acc;
}
