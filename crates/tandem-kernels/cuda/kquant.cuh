// K-quant matmul helpers shared by kqmma.cu (activation quantiser, GEMV, small-tile GEMM)
// and kqgemm.cu (the prefill GEMM): the superblock layouts (qunits.cuh), shared-memory word
// reads, the codes and scales of a staged superblock, the int8 mma instructions, and the
// chain's superblock term (kqmma.cu's header defines the chain).
#pragma once
#include "common.cuh"
#include "qunits.cuh"

#define KT_Q4_K 0
#define KT_Q5_K 1
#define KT_Q6_K 2

template <int KT>
__host__ __device__ constexpr int kq_bytes() {
    return KT == KT_Q4_K ? 144 : KT == KT_Q5_K ? 176 : 210;
}

// Shared-memory words: at a 4-byte aligned address, and at an even one (two halves).
__device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t lds32_2(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}
// N consecutive words from an even shared address: N + 1 aligned reads and funnel shifts
// (reads the aligned word after the last byte: stages carry 16 bytes of padding).
template <int N>
__device__ __forceinline__ void lds_run(const uint8_t* p, uint32_t (&out)[N]) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    const uint32_t* q = reinterpret_cast<const uint32_t*>(a & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(a & 3) * 8;
    uint32_t cur = q[0];
#pragma unroll
    for (int i = 0; i < N; i++) {
        const uint32_t nx = q[i + 1];
        out[i] = __funnelshift_r(cur, nx, sh);
        cur = nx;
    }
}
__device__ __forceinline__ float f16_bits(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)h)); }

// The chain's superblock term (kqmma.cu's header): T = (float(I) d - float(M) dmin) dx,
// rounded as written (the min product first, one fused multiply-add, then the activation
// scale). q6_k passes M = 0 and dmin = 0: fma(I, d, -0) is the product I d itself.
__device__ __forceinline__ float kq_term(int isum, int msum, float d, float dmin, float dxv) {
    const float t = __fmaf_rn(__int2float_rn(isum), d, -__fmul_rn(__int2float_rn(msum), dmin));
    return __fmul_rn(t, dxv);
}
// M = sum_j m_j xs_j over a superblock's eight sub-blocks: xs the activation row's code sums
// (int16 pairs: word i holds sub-blocks 2i, 2i + 1), mw the weight column's 6-bit mins as
// bytes (word 0: m_0..m_3, word 1: m_4..m_7). Exact.
__device__ __forceinline__ int kq_msum(uint4 xs, uint2 mw) {
    int s = __dp2a_lo((int)xs.x, (int)mw.x, 0);
    s = __dp2a_hi((int)xs.y, (int)mw.x, s);
    s = __dp2a_lo((int)xs.z, (int)mw.y, s);
    return __dp2a_hi((int)xs.w, (int)mw.y, s);
}
// The eight 6-bit mins of a q4_k / q5_k superblock's scales (its bytes 4..15) as bytes.
__device__ __forceinline__ uint2 kq_mins(const uint8_t* sb) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int sc, mn;
        scale_min_k4(j, sb + 4, &sc, &mn);
        w[j >> 2] |= (uint32_t)mn << (8 * (j & 3));
    }
    return make_uint2(w[0], w[1]);
}

// Word i (values 4i .. 4i + 3) of sub-block j's codes, from a staged superblock: int8 values
// (q4_k 0..15, q5_k 0..31, q6_k -32..31).
template <int KT>
__device__ __forceinline__ uint32_t kword(const uint8_t* sb, int j, int i) {
    if constexpr (KT == KT_Q4_K) {
        return (lds32(sb + 16 + (j >> 1) * 32 + 4 * i) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
    } else if constexpr (KT == KT_Q5_K) {
        const uint32_t lo = (lds32(sb + 48 + (j >> 1) * 32 + 4 * i) >> (4 * (j & 1))) & 0x0F0F0F0Fu;
        const uint32_t hi = ((lds32(sb + 16 + 4 * i) >> j) & 0x01010101u) << 4;
        return lo | hi;
    } else {
        const int half = j >> 2, part = j & 3;
        const uint32_t lo = (lds32_2(sb + half * 64 + (part & 1) * 32 + 4 * i) >> ((part >> 1) * 4)) & 0x0F0F0F0Fu;
        const uint32_t hi = ((lds32_2(sb + 128 + half * 32 + 4 * i) >> (part * 2)) & 0x03030303u) << 4;
        return __vsub4(lo | hi, 0x20202020u);
    }
}

// A superblock's scales for sub-block j: q4_k / q5_k the 6-bit scale and min, q6_k the two
// int8 scales of its 16-value halves.
template <int KT>
__device__ __forceinline__ void kscale(const uint8_t* sb, int j, int* a, int* b) {
    if constexpr (KT == KT_Q6_K) {
        const int8_t* sc = reinterpret_cast<const int8_t*>(sb + 192);
        *a = sc[(j >> 2) * 8 + (j & 3) * 2];
        *b = sc[(j >> 2) * 8 + (j & 3) * 2 + 1];
    } else {
        scale_min_k4(j, sb + 4, a, b);
    }
}
// The superblock's d (and dmin for q4_k / q5_k).
template <int KT>
__device__ __forceinline__ void kd(const uint8_t* sb, float* d, float* dmin) {
    if constexpr (KT == KT_Q6_K) {
        *d = f16_bits(lds32_2(sb + 208) & 0xFFFFu);
        *dmin = 0.f;
    } else {
        const uint32_t v = lds32(sb);
        *d = f16_bits(v & 0xFFFFu);
        *dmin = f16_bits(v >> 16);
    }
}

// Bytes a staged superblock row takes: q6_k superblocks start on even addresses, so a row's
// copy is the 16-byte aligned window around it (at most 14 bytes before it; q4_k / q5_k
// superblocks are 16-byte aligned).
template <int KT>
__host__ __device__ constexpr int kq_stride() {
    return KT == KT_Q6_K ? 224 : kq_bytes<KT>();
}

__device__ __forceinline__ void mma_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
__device__ __forceinline__ void mma_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}
