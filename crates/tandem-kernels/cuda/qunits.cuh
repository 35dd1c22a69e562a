// Decoding GGML weight rows into f32, 32 values ("a unit") at a time, for the row-invariant
// quantised matmuls (qmatmul.cu). A row of k values is k / 32 units; unit u holds values
// u*32 .. u*32+31 in order. Each decoder reproduces ggml's / candle's `dequantize_row_*`
// arithmetic (scale products first, no fused multiply-adds), so a decoded weight has the bits
// the CPU's dequantisation gives it.
//
// Layouts (bytes per block): q4_0 (18: f16 d, 16 nibble bytes), q4_1 (20: d, m, 16), q5_0
// (22: d, 4 high-bit bytes, 16), q5_1 (24: d, m, 4, 16), q8_0 (34: d, 32 int8); the K-quants
// work on superblocks of 256 values = 8 units: q4_k (144: d, dmin, 12 packed 6-bit scales and
// mins, 128 nibble bytes), q5_k (176: d, dmin, 12, 32 high-bit bytes, 128), q6_k (210: 128 low
// nibbles, 64 bytes of 2-bit highs, 16 int8 scales, f16 d).
#pragma once
#include "common.cuh"

#define WT_F32 0
#define WT_F16 1
#define WT_BF16 2
#define WT_Q4_0 3
#define WT_Q4_1 4
#define WT_Q5_0 5
#define WT_Q5_1 6
#define WT_Q8_0 7
#define WT_Q4_K 8
#define WT_Q5_K 9
#define WT_Q6_K 10

__device__ __forceinline__ float f16_at(const uint8_t* p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ unsigned int u32_at(const uint8_t* p) {
    return (unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) | ((unsigned int)p[3] << 24);
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) of a q4_k / q5_k block.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

template <int WT>
__device__ __forceinline__ void decode_unit(const uint8_t* __restrict__ row, int u, float* w);

template <>
__device__ __forceinline__ void decode_unit<WT_F32>(const uint8_t* __restrict__ row, int u, float* w) {
    const float4* p = reinterpret_cast<const float4*>(row) + u * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 v = p[i];
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
    }
}

template <>
__device__ __forceinline__ void decode_unit<WT_F16>(const uint8_t* __restrict__ row, int u, float* w) {
    const __half2* p = reinterpret_cast<const __half2*>(row) + u * 16;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        float2 v = __half22float2(p[i]);
        w[2 * i] = v.x;
        w[2 * i + 1] = v.y;
    }
}

template <>
__device__ __forceinline__ void decode_unit<WT_BF16>(const uint8_t* __restrict__ row, int u, float* w) {
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(row) + u * 16;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        float2 v = __bfloat1622float2(p[i]);
        w[2 * i] = v.x;
        w[2 * i + 1] = v.y;
    }
}

template <>
__device__ __forceinline__ void decode_unit<WT_Q4_0>(const uint8_t* __restrict__ row, int u, float* w) {
    const uint8_t* b = row + (size_t)u * 18;
    const float d = f16_at(b);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const uint8_t q = b[2 + j];
        w[j] = __fmul_rn((float)((int)(q & 15) - 8), d);
        w[j + 16] = __fmul_rn((float)((int)(q >> 4) - 8), d);
    }
}

template <>
__device__ __forceinline__ void decode_unit<WT_Q4_1>(const uint8_t* __restrict__ row, int u, float* w) {
    const uint8_t* b = row + (size_t)u * 20;
    const float d = f16_at(b), m = f16_at(b + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const uint8_t q = b[4 + j];
        w[j] = __fadd_rn(__fmul_rn((float)(q & 15), d), m);
        w[j + 16] = __fadd_rn(__fmul_rn((float)(q >> 4), d), m);
    }
}

template <>
__device__ __forceinline__ void decode_unit<WT_Q5_0>(const uint8_t* __restrict__ row, int u, float* w) {
    const uint8_t* b = row + (size_t)u * 22;
    const float d = f16_at(b);
    const unsigned int qh = u32_at(b + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const uint8_t q = b[6 + j];
        const int x0 = (int)((q & 15) | (((qh >> j) << 4) & 0x10)) - 16;
        const int x1 = (int)((q >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        w[j] = __fmul_rn((float)x0, d);
        w[j + 16] = __fmul_rn((float)x1, d);
    }
}

template <>
__device__ __forceinline__ void decode_unit<WT_Q5_1>(const uint8_t* __restrict__ row, int u, float* w) {
    const uint8_t* b = row + (size_t)u * 24;
    const float d = f16_at(b), m = f16_at(b + 2);
    const unsigned int qh = u32_at(b + 4);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const uint8_t q = b[8 + j];
        const int x0 = (int)((q & 15) | (((qh >> j) << 4) & 0x10));
        const int x1 = (int)((q >> 4) | ((qh >> (j + 12)) & 0x10));
        w[j] = __fadd_rn(__fmul_rn((float)x0, d), m);
        w[j + 16] = __fadd_rn(__fmul_rn((float)x1, d), m);
    }
}

template <>
__device__ __forceinline__ void decode_unit<WT_Q8_0>(const uint8_t* __restrict__ row, int u, float* w) {
    const uint8_t* b = row + (size_t)u * 34;
    const float d = f16_at(b);
#pragma unroll
    for (int j = 0; j < 32; j++) w[j] = __fmul_rn((float)(int8_t)b[2 + j], d);
}

template <>
__device__ __forceinline__ void decode_unit<WT_Q4_K>(const uint8_t* __restrict__ row, int u, float* w) {
    const uint8_t* b = row + (size_t)(u >> 3) * 144;
    const int j = u & 7;
    const float d = f16_at(b), dmin = f16_at(b + 2);
    int sc, m;
    scale_min_k4(j, b + 4, &sc, &m);
    const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
    const uint8_t* q = b + 16 + (j >> 1) * 32;
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++) w[l] = __fsub_rn(__fmul_rn(d1, (float)((q[l] >> shift) & 15)), m1);
}

template <>
__device__ __forceinline__ void decode_unit<WT_Q5_K>(const uint8_t* __restrict__ row, int u, float* w) {
    const uint8_t* b = row + (size_t)(u >> 3) * 176;
    const int j = u & 7;
    const float d = f16_at(b), dmin = f16_at(b + 2);
    int sc, m;
    scale_min_k4(j, b + 4, &sc, &m);
    const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
    const uint8_t* qh = b + 16;
    const uint8_t* ql = b + 48 + (j >> 1) * 32;
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int q = ((ql[l] >> shift) & 15) + ((qh[l] >> j) & 1) * 16;
        w[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}

template <>
__device__ __forceinline__ void decode_unit<WT_Q6_K>(const uint8_t* __restrict__ row, int u, float* w) {
    const uint8_t* b = row + (size_t)(u >> 3) * 210;
    const int j = u & 7;
    const int half = j >> 2, part = j & 3;
    const uint8_t* ql = b + half * 64 + (part & 1) * 32;
    const uint8_t* qh = b + 128 + half * 32;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + half * 8 + part * 2;
    const float d = f16_at(b + 208);
    const int lshift = (part >> 1) * 4, hshift = part * 2;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int q = (int)(((ql[l] >> lshift) & 15) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        w[l] = __fmul_rn(__fmul_rn(d, (float)sc[l >> 4]), (float)q);
    }
}
