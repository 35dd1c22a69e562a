// Decoding GGML weight rows into f32 for the row-invariant quantised matmuls (qmatmul.cu). A
// row of k values is k / 32 units; unit u holds values u*32 .. u*32+31, decoded eight at a
// time: decode8(row, u, l0, w) gives values u*32 + l0 .. u*32 + l0 + 7 (l0 = 0, 8, 16, 24).
// Each decoder reproduces ggml's / candle's `dequantize_row_*` arithmetic (scale products
// first, no fused multiply-adds), so a decoded weight has the bits the CPU's dequantisation
// gives it. Bytes come in as whole aligned 32-bit words (`bytes8`, `u16_at`), not one load per
// byte: in qmatmul.cu's chain the lanes of a warp read neighbouring pieces of neighbouring
// blocks, so each load instruction covers one contiguous stretch of the row.
//
// Layouts (bytes per block): q4_0 (18: f16 d, 16 nibble bytes), q4_1 (20: d, m, 16), q5_0
// (22: d, 4 high-bit bytes, 16), q5_1 (24: d, m, 4, 16), q8_0 (34: d, 32 int8); the K-quants
// work on superblocks of 256 values = 8 units: q4_k (144: d, dmin, 12 packed 6-bit scales and
// mins, 128 nibble bytes), q5_k (176: d, dmin, 12, 32 high-bit bytes, 128), q6_k (210: 128 low
// nibbles, 64 bytes of 2-bit highs, 16 int8 scales, f16 d), q2_k (84: 16 bytes of 4-bit scale
// and min pairs, 64 bytes of 2-bit values, d, dmin), q3_k (110: 32 high-bit mask bytes, 64
// bytes of 2-bit values, 12 packed 6-bit scales, d). Every block size is even and rows start
// on even addresses, so 16-bit fields are 2-byte aligned.
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
#define WT_Q2_K 11
#define WT_Q3_K 12

// Sixteen bytes at an 8-byte aligned address as four words: one 16-byte load where the address
// allows (rows of a multiple of 8 values), else two 8-byte loads.
__device__ __forceinline__ void load16(const uint8_t* p, unsigned int* v) {
    if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
        const uint2 a = __ldg(reinterpret_cast<const uint2*>(p)), b = __ldg(reinterpret_cast<const uint2*>(p) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
    }
}

// A 16-bit field at an even address.
__device__ __forceinline__ unsigned int u16_at(const uint8_t* p) {
    return __ldg(reinterpret_cast<const unsigned short*>(p));
}

__device__ __forceinline__ float f16_at(const uint8_t* p) {
    return __half2float(__ushort_as_half((unsigned short)u16_at(p)));
}

// A 32-bit little-endian field at an even address.
__device__ __forceinline__ unsigned int u32_at(const uint8_t* p) { return u16_at(p) | (u16_at(p + 2) << 16); }

// Eight bytes at p (any alignment) as two little-endian words, from the aligned words that
// cover them (the third only when p is not 4-byte aligned; it never leaves p's last word).
__device__ __forceinline__ uint2 bytes8(const uint8_t* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const unsigned int* q = reinterpret_cast<const unsigned int*>(a & ~(uintptr_t)3);
    const unsigned int sh = (unsigned int)(a & 3) * 8;
    const unsigned int w0 = __ldg(q), w1 = __ldg(q + 1);
    const unsigned int w2 = sh ? __ldg(q + 2) : 0u;
    return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}

// The eight bytes of v minus `off`, as exact floats, without integer-to-float conversions
// (a quarter-rate instruction that would bound the Q8_0 kernel): byte i is moved into the low
// mantissa bits of 2^23 (one byte permute), and 2^23 + off subtracted. The same values
// (float)(byte - off) gives, bit for bit, for every byte and the small offsets used here.
__device__ __forceinline__ void bytes_minus(uint2 v, float off, float* q) {
    const float base = 8388608.f + off;
    for (int i = 0; i < 4; i++) {
        q[i] = __fsub_rn(__int_as_float(__byte_perm(v.x, 0x4B000000u, 0x7440u | i)), base);
        q[i + 4] = __fsub_rn(__int_as_float(__byte_perm(v.y, 0x4B000000u, 0x7440u | i)), base);
    }
}

// Bits 0..7 of b as bytes 0..7 (0 or 1 each): four bits times 0x00204081 land at bits 0, 8,
// 16 and 24.
__device__ __forceinline__ uint2 spread_bits(unsigned int b) {
    return make_uint2(((b & 15u) * 0x00204081u) & 0x01010101u, (((b >> 4) & 15u) * 0x00204081u) & 0x01010101u);
}

// Each byte of v shifted right by `shift` and masked with `mask` (per-byte fields).
__device__ __forceinline__ uint2 fields(uint2 v, int shift, unsigned int mask) {
    return make_uint2((v.x >> shift) & mask, (v.y >> shift) & mask);
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
__device__ __forceinline__ void decode8(const uint8_t* __restrict__ row, int u, int l0, float* w);

template <>
__device__ __forceinline__ void decode8<WT_F32>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const float4* p = reinterpret_cast<const float4*>(row) + (u * 32 + l0) / 4;
    const float4 a = __ldg(p), b = __ldg(p + 1);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}

template <>
__device__ __forceinline__ void decode8<WT_F16>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    unsigned int v[4];
    load16(row + (size_t)(u * 32 + l0) * 2, v);
    for (int i = 0; i < 4; i++) {
        w[2 * i] = __half2float(__ushort_as_half((unsigned short)(v[i] & 0xFFFFu)));
        w[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(v[i] >> 16)));
    }
}

template <>
__device__ __forceinline__ void decode8<WT_BF16>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    unsigned int v[4];
    load16(row + (size_t)(u * 32 + l0) * 2, v);
    for (int i = 0; i < 4; i++) {
        w[2 * i] = __uint_as_float(v[i] << 16);  // a bf16 is the top half of its f32
        w[2 * i + 1] = __uint_as_float(v[i] & 0xFFFF0000u);
    }
}

// Values j < 16 are the low nibbles of bytes j, values j >= 16 the high nibbles of bytes j - 16.
template <>
__device__ __forceinline__ void decode8<WT_Q4_0>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)u * 18;
    const float d = f16_at(b);
    const uint2 q = bytes8(b + 2 + (l0 & 15));
    const int shift = l0 >= 16 ? 4 : 0;
    float f[8];
    bytes_minus(fields(q, shift, 0x0F0F0F0Fu), 8.f, f);
    for (int i = 0; i < 8; i++) w[i] = __fmul_rn(f[i], d);
}

template <>
__device__ __forceinline__ void decode8<WT_Q4_1>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)u * 20;
    const float d = f16_at(b), m = f16_at(b + 2);
    const uint2 q = bytes8(b + 4 + (l0 & 15));
    const int shift = l0 >= 16 ? 4 : 0;
    float f[8];
    bytes_minus(fields(q, shift, 0x0F0F0F0Fu), 0.f, f);
    for (int i = 0; i < 8; i++) w[i] = __fadd_rn(__fmul_rn(f[i], d), m);
}

// q5: the fifth bit of value j is bit j of the 32-bit qh.
template <>
__device__ __forceinline__ void decode8<WT_Q5_0>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)u * 22;
    const float d = f16_at(b);
    const unsigned int qh = u32_at(b + 2);
    const uint2 q = bytes8(b + 6 + (l0 & 15));
    const int shift = l0 >= 16 ? 4 : 0;
    const uint2 lo = fields(q, shift, 0x0F0F0F0Fu), hi = spread_bits(qh >> l0);
    float f[8];
    bytes_minus(make_uint2(lo.x | (hi.x << 4), lo.y | (hi.y << 4)), 16.f, f);
    for (int i = 0; i < 8; i++) w[i] = __fmul_rn(f[i], d);
}

template <>
__device__ __forceinline__ void decode8<WT_Q5_1>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)u * 24;
    const float d = f16_at(b), m = f16_at(b + 2);
    const unsigned int qh = u32_at(b + 4);
    const uint2 q = bytes8(b + 8 + (l0 & 15));
    const int shift = l0 >= 16 ? 4 : 0;
    const uint2 lo = fields(q, shift, 0x0F0F0F0Fu), hi = spread_bits(qh >> l0);
    float f[8];
    bytes_minus(make_uint2(lo.x | (hi.x << 4), lo.y | (hi.y << 4)), 0.f, f);
    for (int i = 0; i < 8; i++) w[i] = __fadd_rn(__fmul_rn(f[i], d), m);
}

template <>
__device__ __forceinline__ void decode8<WT_Q8_0>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)u * 34;
    const float d = f16_at(b);
    const uint2 q = bytes8(b + 2 + l0);
    float f[8];
    bytes_minus(make_uint2(q.x ^ 0x80808080u, q.y ^ 0x80808080u), 128.f, f);  // int8 + 128, unsigned
    for (int i = 0; i < 8; i++) w[i] = __fmul_rn(f[i], d);
}

// K-quants: unit u is sub-block j = u % 8 of superblock u / 8.
template <>
__device__ __forceinline__ void decode8<WT_Q4_K>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)(u >> 3) * 144;
    const int j = u & 7;
    const float d = f16_at(b), dmin = f16_at(b + 2);
    int sc, m;
    scale_min_k4(j, b + 4, &sc, &m);
    const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
    const uint2 q = bytes8(b + 16 + (j >> 1) * 32 + l0);
    const int shift = (j & 1) * 4;
    float f[8];
    bytes_minus(fields(q, shift, 0x0F0F0F0Fu), 0.f, f);
    for (int i = 0; i < 8; i++) w[i] = __fsub_rn(__fmul_rn(d1, f[i]), m1);
}

template <>
__device__ __forceinline__ void decode8<WT_Q5_K>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)(u >> 3) * 176;
    const int j = u & 7;
    const float d = f16_at(b), dmin = f16_at(b + 2);
    int sc, m;
    scale_min_k4(j, b + 4, &sc, &m);
    const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
    const uint2 qh = bytes8(b + 16 + l0);
    const uint2 ql = bytes8(b + 48 + (j >> 1) * 32 + l0);
    const int shift = (j & 1) * 4;
    const uint2 lo = fields(ql, shift, 0x0F0F0F0Fu), hi = fields(qh, j, 0x01010101u);
    float f[8];
    bytes_minus(make_uint2(lo.x | (hi.x << 4), lo.y | (hi.y << 4)), 0.f, f);
    for (int i = 0; i < 8; i++) w[i] = __fsub_rn(__fmul_rn(d1, f[i]), m1);
}

// q6_k: a superblock is two halves of 128 values; sub-block j is part j % 4 of half j / 4.
template <>
__device__ __forceinline__ void decode8<WT_Q6_K>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)(u >> 3) * 210;
    const int j = u & 7;
    const int half = j >> 2, part = j & 3;
    const uint2 ql = bytes8(b + half * 64 + (part & 1) * 32 + l0);
    const uint2 qh = bytes8(b + 128 + half * 32 + l0);
    const float dsc = __fmul_rn(f16_at(b + 208), (float)reinterpret_cast<const int8_t*>(b + 192)[half * 8 + part * 2 + (l0 >> 4)]);
    const int lshift = (part >> 1) * 4, hshift = part * 2;
    const uint2 lo = fields(ql, lshift, 0x0F0F0F0Fu), hi = fields(qh, hshift, 0x03030303u);
    float f[8];
    bytes_minus(make_uint2(lo.x | (hi.x << 4), lo.y | (hi.y << 4)), 32.f, f);
    for (int i = 0; i < 8; i++) w[i] = __fmul_rn(dsc, f[i]);
}

// q2_k: sub-block j (32 values) takes 2-bit field j % 4 of the 32 bytes of half j / 4; each
// 16 values have their own 4-bit scale (low nibble) and min (high nibble).
template <>
__device__ __forceinline__ void decode8<WT_Q2_K>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)(u >> 3) * 84;
    const int j = u & 7;
    const float d = f16_at(b + 80), dmin = f16_at(b + 82);
    const int sc = b[j * 2 + (l0 >> 4)];
    const float dl = __fmul_rn(d, (float)(sc & 15)), ml = __fmul_rn(dmin, (float)(sc >> 4));
    const uint2 q = bytes8(b + 16 + (j >> 2) * 32 + l0);
    const int shift = (j & 3) * 2;
    float f[8];
    bytes_minus(fields(q, shift, 0x03030303u), 0.f, f);
    for (int i = 0; i < 8; i++) w[i] = __fsub_rn(__fmul_rn(dl, f[i]), ml);
}

// q3_k: as q2_k for the low two bits, the third from bit j of mask byte (value % 32); a
// value whose mask bit is clear is 4 lower. Scale s (0..15, one per 16 values) has its low
// nibble in byte s % 8 (high nibble when s >= 8) and its top two bits in byte 8 + s % 4 at
// bit 2 * (s / 4); it is stored offset by 32.
template <>
__device__ __forceinline__ void decode8<WT_Q3_K>(const uint8_t* __restrict__ row, int u, int l0, float* w) {
    const uint8_t* b = row + (size_t)(u >> 3) * 110;
    const int j = u & 7;
    const uint8_t* sb = b + 96;
    const int s = j * 2 + (l0 >> 4);
    const int slo = s < 8 ? (sb[s] & 15) : (sb[s - 8] >> 4);
    const int shi = (sb[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    const float dl = __fmul_rn(f16_at(b + 108), __fsub_rn((float)(slo | (shi << 4)), 32.f));
    const uint2 q = bytes8(b + 32 + (j >> 2) * 32 + l0);
    const uint2 hm = bytes8(b + l0);
    const int shift = (j & 3) * 2;
    // (low two bits | mask bit << 2) - 4: the mask bit set is +0, clear is -4.
    const uint2 lo = fields(q, shift, 0x03030303u), hi = fields(hm, j, 0x01010101u);
    float f[8];
    bytes_minus(make_uint2(lo.x | (hi.x << 2), lo.y | (hi.y << 2)), 4.f, f);
    for (int i = 0; i < 8; i++) w[i] = __fmul_rn(dl, f[i]);
}

// Value i of a dense row (the tail of a row whose length is not a multiple of 32); never
// called for quantised rows, whose length always is.
template <int WT>
__device__ __forceinline__ float decode_at(const uint8_t* __restrict__ row, int i) {
    if (WT == WT_F32) return reinterpret_cast<const float*>(row)[i];
    if (WT == WT_F16) return __half2float(reinterpret_cast<const __half*>(row)[i]);
    if (WT == WT_BF16) return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[i]);
    return 0.f;
}
