// Helpers shared by the kernel labs (compiled on the device machine with nvcc, not part of
// the build): a CUDA error check and deterministic fills of bf16 / f32 buffers.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(((h & 0xffff) / 32768.f - 1.f) * 0.05f));
    }
}
__global__ void fill_f32(float* p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2246822519u ^ seed;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        p[i] = ((h & 0xffffff) / 8388608.f - 1.f) * 3.f;
    }
}

// The permuted step order of the wgmma labs: each 32-value step's eight 4-value runs stored
// 0, 2, 4, 6, 1, 3, 5, 7 (the values of the chain's first mma of a step, then the second's).
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
