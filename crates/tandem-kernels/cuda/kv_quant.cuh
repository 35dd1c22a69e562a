// ggml's q8_0 / q4_0 blocks of 32 values as the KV cache stores them (kv/dtype.rs):
// q8_0: f16 scale d, 32 int8 q, value = q * d (34 bytes);
// q4_0: f16 scale d, 16 bytes of nibbles (value j < 16 in the low nibble of byte j, value
//       j >= 16 in the high nibble of byte j - 16), value = (nibble - 8) * d (18 bytes).
#pragma once
#include "common.cuh"

#define Q8_BYTES 34
#define Q4_BYTES 18

__device__ __forceinline__ float block_scale(const uint8_t* b) {
    __half h = __ushort_as_half((unsigned short)(b[0] | (b[1] << 8)));
    return __half2float(h);
}

__device__ __forceinline__ float q8_0_at(const uint8_t* row, int d) {
    const uint8_t* b = row + (d >> 5) * Q8_BYTES;
    return (float)(int8_t)b[2 + (d & 31)] * block_scale(b);
}

__device__ __forceinline__ float q4_0_at(const uint8_t* row, int d) {
    const uint8_t* b = row + (d >> 5) * Q4_BYTES;
    int j = d & 31;
    uint8_t byte = b[2 + (j & 15)];
    int nib = j < 16 ? (byte & 15) : (byte >> 4);
    return (float)(nib - 8) * block_scale(b);
}
