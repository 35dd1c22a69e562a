// Sampling candidates on the device: for each row of logits [rows, vocab], the K largest
// logits (ties to the lower id) and the row's softmax mass at the request's temperature, so
// that a sampled (non-greedy) request reads back K ids and logits instead of the whole
// vocabulary. The host sampler (tandem-engine's sampler/candidates.rs) filters them exactly as
// it would filter the full row, and reads the row after all where the candidates cannot decide.
//
// Logits are sanitised as the host sampler does (NaN -> -inf, +inf -> FLT_MAX) and ordered by
// an order-preserving map of their bits to unsigned keys. One block of TB threads per row:
// the maximum key, the mass sum_i exp((l_i - max) * inv_t) over z > -88 (each term an f32 exp,
// summed in f64 in a fixed order), a four-pass 8-bit radix select of the K-th largest key T,
// then every key > T (in any order: the host sorts) and the lowest-id keys == T to make K.
#include "common.cuh"
#include <float.h>

#define TB 1024

__device__ __forceinline__ float sanitize_logit(float x) {
    if (isnan(x)) return -INFINITY;
    if (isinf(x) && x > 0.f) return FLT_MAX;
    return x;
}

__device__ __forceinline__ unsigned int key_of(float x) {
    const unsigned int u = __float_as_uint(sanitize_logit(x));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float float_of_key(unsigned int k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// ids / vals: rows x K (the first min(K, vocab) of each row written); mass: rows.
extern "C" __global__ void __launch_bounds__(TB) top_candidates(const float* __restrict__ logits, int vocab, int K,
                                                                 float inv_t, unsigned int* __restrict__ ids,
                                                                 float* __restrict__ vals, double* __restrict__ mass) {
    const float* row = logits + (size_t)blockIdx.x * vocab;
    ids += (size_t)blockIdx.x * K;
    vals += (size_t)blockIdx.x * K;
    const int tid = threadIdx.x;
    __shared__ unsigned int part[TB];
    __shared__ double red[TB];
    __shared__ unsigned int hist[256];
    __shared__ unsigned int s_prefix, s_remaining, s_pos;

    unsigned int mk = 0;
    for (int i = tid; i < vocab; i += TB) mk = max(mk, key_of(row[i]));
    part[tid] = mk;
    __syncthreads();
    for (int s = TB / 2; s > 0; s >>= 1) {
        if (tid < s) part[tid] = max(part[tid], part[tid + s]);
        __syncthreads();
    }
    const float maxv = float_of_key(part[0]);

    double acc = 0.0;
    for (int i = tid; i < vocab; i += TB) {
        const float z = __fmul_rn(__fsub_rn(sanitize_logit(row[i]), maxv), inv_t);
        if (z > -88.f) acc += (double)expf(z);
    }
    red[tid] = acc;
    __syncthreads();
    for (int s = TB / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        __syncthreads();
    }
    if (tid == 0) mass[blockIdx.x] = red[0];

    if (vocab <= K) {
        for (int i = tid; i < vocab; i += TB) {
            ids[i] = (unsigned int)i;
            vals[i] = row[i];
        }
        return;
    }

    // Radix select: after each pass, prefix holds the top digits of T and remaining how many
    // keys with that prefix are still to be taken.
    unsigned int prefix = 0, pmask = 0, remaining = (unsigned int)K;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = tid; b < 256; b += TB) hist[b] = 0;
        __syncthreads();
        for (int i = tid; i < vocab; i += TB) {
            const unsigned int k = key_of(row[i]);
            if ((k & pmask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            unsigned int cum = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (cum + hist[b] >= remaining) break;
                cum += hist[b];
            }
            s_prefix = prefix | ((unsigned int)b << shift);
            s_remaining = remaining - cum;
        }
        __syncthreads();
        prefix = s_prefix;
        remaining = s_remaining;
        pmask |= 255u << shift;
        __syncthreads();
    }
    const unsigned int T = prefix;

    if (tid == 0) s_pos = 0;
    __syncthreads();
    for (int i = tid; i < vocab; i += TB) {
        if (key_of(row[i]) > T) {
            const unsigned int p = atomicAdd(&s_pos, 1u);
            ids[p] = (unsigned int)i;
            vals[p] = row[i];
        }
    }
    __syncthreads();
    const unsigned int above = s_pos;

    // Keys equal to T in id order: each thread owns a contiguous range, ranks come from an
    // exclusive scan of the per-thread counts.
    const int chunk = (vocab + TB - 1) / TB;
    const int lo = min(tid * chunk, vocab), hi = min(lo + chunk, vocab);
    unsigned int c = 0;
    for (int i = lo; i < hi; i++) c += key_of(row[i]) == T;
    part[tid] = c;
    __syncthreads();
    if (tid == 0) {
        unsigned int run = 0;
        for (int t = 0; t < TB; t++) {
            const unsigned int v = part[t];
            part[t] = run;
            run += v;
        }
    }
    __syncthreads();
    unsigned int rank = part[tid];
    for (int i = lo; i < hi && rank < remaining; i++) {
        if (key_of(row[i]) == T) {
            ids[above + rank] = (unsigned int)i;
            vals[above + rank] = row[i];
            rank++;
        }
    }
}

// Greedy rows: argmax_rows packs each logit as (order key << 32) | ~index and keeps the largest
// per row with a 64-bit atomicMax, so the result is the largest logit with ties to the lowest
// index, NaN counted as -inf (the host sampler's argmax). A grid of (chunks, rows) blocks of
// AM_THREADS threads, AM_PER values a thread: many blocks over a 248K vocabulary where a
// single-block reduction (candle's argmax: 159 us on the H200) serialises. out: one 64-bit
// word per row, zeroed by the caller (below every packed value: -inf's key is 0x007fffff).
#define AM_THREADS 256
#define AM_PER 16

__device__ __forceinline__ unsigned int argmax_key(float x) {
    const unsigned int u = __float_as_uint(isnan(x) ? -INFINITY : x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

extern "C" __global__ void __launch_bounds__(AM_THREADS)
    argmax_rows(const float* __restrict__ x, int n, unsigned long long* __restrict__ out) {
    const float* row = x + (size_t)blockIdx.y * n;
    const int base = blockIdx.x * AM_THREADS * AM_PER;
    unsigned long long best = 0ull;
#pragma unroll
    for (int j = 0; j < AM_PER; j++) {
        const int i = base + j * AM_THREADS + (int)threadIdx.x;
        if (i < n) {
            const unsigned long long v = ((unsigned long long)argmax_key(__ldg(row + i)) << 32) | (unsigned int)(~i);
            best = v > best ? v : best;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned long long t = __shfl_xor_sync(0xffffffffu, best, o);
        best = t > best ? t : best;
    }
    __shared__ unsigned long long warp_best[AM_THREADS / 32];
    if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < AM_THREADS / 32; w++) best = warp_best[w] > best ? warp_best[w] : best;
        atomicMax(out + blockIdx.y, best);
    }
}
