// The permuted step order of the wgmma labs (not part of the build; include after
// ../cuda/tmma.cu, whose split1 it uses): each 32-value step's eight 4-value runs stored
// 0, 2, 4, 6, 1, 3, 5, 7 (the values of the chain's first mma of a step, then the second's).
#pragma once
#include <cstdint>
// Where value i of a row lands.
__host__ __device__ inline long long perm_index(long long i) {
    const int v = (int)(i & 31), run = v >> 2;
    return (i & ~31LL) + ((run & 1) * 16 + (run >> 1) * 4 + (v & 3));
}

// The weights reordered like the activations (a load-time repack would do this once).
__global__ void perm_bf16(uint16_t* __restrict__ out, const uint16_t* __restrict__ in, long long total) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
        out[perm_index(i)] = in[i];
}

// bf16_split_rows' bits with each 32-value step's eight 4-value runs stored in the order
// 0, 2, 4, 6, 1, 3, 5, 7: the values the chain's first mma of a step takes (8t .. 8t + 3 for
// t = 0..3), then the second's, each half a whole 32-byte stretch. xl null: the hi halves
// alone (bf16_hi_rows' bits: split1's hi is bf16's round to nearest even).
__global__ void split_perm(uint16_t* __restrict__ xh, uint16_t* __restrict__ xl, const float* __restrict__ x,
                           long long total) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long o = perm_index(i);
    const uint32_t s = split1(x[i]);
    xh[o] = (uint16_t)(s & 0xffffu);
    if (xl) xl[o] = (uint16_t)(s >> 16);
}
