// 8-bit activations for the integer matmul kernels (qmma.cu: Q8_0, kqmma.cu: K-quants): a
// row's 32-value blocks quantised alone, so a row's codes depend only on that row.
#pragma once
#include "common.cuh"

// A 32-value block's quantisation, one value per lane (the whole warp calls it): this lane's
// int8 value, and the block's scale in *d on every lane. The one definition every kernel uses.
__device__ __forceinline__ int8_t quant_block(float v, float* d) {
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    int q = __float2int_rn(v * id);
    q = max(-127, min(127, q));
    *d = amax / 127.f;
    return (int8_t)q;
}


// The one step of the Q8_0 chain (qmma.cu's header; q8gemm.cu walks the same one): acc + isum
// * (dw * dx), rounded as written (the scale product first, then one fused multiply-add).
__device__ __forceinline__ float chain_scale(float dw, float dxv) { return __fmul_rn(dw, dxv); }
__device__ __forceinline__ float chain_fma(float acc, int isum, float scale) {
    return fmaf(__int2float_rn(isum), scale, acc);
}
__device__ __forceinline__ float chain_step(float acc, int isum, float dw, float dxv) {
    return chain_fma(acc, isum, chain_scale(dw, dxv));
}
