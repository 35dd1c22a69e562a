// Shared helpers for tandem's kernels: element loads as f32 and a fixed-order warp sum.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

// Butterfly sum over the 32 lanes: every lane ends with the same value, summed in an order
// that depends only on the lane values (never on which rows or how many share the launch).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

// Activation (r, c) of a gated MLP's down projection, silu(g) * u from row views g and u (row
// strides ldg, ldu): silu_mul_rows' expression, so its bits, for kernels that form the
// activations as they read them.
__device__ __forceinline__ float gated_act(const float* __restrict__ g, long long ldg, const float* __restrict__ u,
                                           long long ldu, long long r, long long c) {
    return __fmul_rn(silu_f(__ldg(g + r * ldg + c)), __ldg(u + r * ldu + c));
}

// Asynchronous 16-byte global -> shared copies (sm_80+), committed in groups; a warp waits for
// all but the newest N groups, then __syncwarp()s before reading what its lanes copied.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// The same copy reading only the first `n` (0..16) source bytes and zero-filling the rest (a
// window that would run past the end of a buffer).
__device__ __forceinline__ void cp_async16_n(void* smem, const void* gmem, int n) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
// A 16-byte piece at `src` of a buffer ending at `end`: whole, or cut at the end.
__device__ __forceinline__ void cp_async16_upto(void* smem, const uint8_t* src, const uint8_t* end) {
    const long long left = end - src;
    if (left >= 16) {
        cp_async16(smem, src);
    } else {
        cp_async16_n(smem, src, left > 0 ? (int)left : 0);
    }
}
// A 4-byte asynchronous copy (through L1; both addresses 4-byte aligned).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// A warp's copy of `bytes` (a multiple of 16) contiguous bytes into shared memory, lane l taking
// the 16-byte pieces l, l + 32, ... (one coalesced stretch per instruction).
__device__ __forceinline__ void warp_cp_async(uint8_t* dst, const uint8_t* src, int bytes, int lane) {
    for (int i = lane; i < bytes / 16; i += 32) cp_async16(dst + i * 16, src + i * 16);
}

// ldmatrix .x4: four 8 x 8 matrices of 16-bit elements (here 8 rows of 16 bytes each) from
// shared memory (a shared-window address: smem_addr); lane l gives the address of row l % 8
// of matrix l / 8 and receives, of each matrix i, word l % 4 of row l / 4 in r[i]: the int8
// mma fragments' layout.
// A hint: the cache line holding p into L2 (no register written, no fault on a bad address).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// Programmatic dependent launch (sm_90): a kernel launched with programmatic stream
// serialisation may start while the kernel before it finishes; it must wait (pdl_wait) before
// it reads anything that kernel wrote, and lets the kernel after it start early (pdl_trigger).
// Both are no-ops in a kernel launched the ordinary way, as the engine launches every kernel:
// tmv_bf16 carries them for the GEMV lab (lab/gemv_bf16_lab.cu), where PDL took 6.5% off a
// graph of matmuls alone, while PDL launches of the engine's GEMVs moved a 9B decode step by
// nothing measurable (docs/PERFORMANCE.md, 2026-12-04).
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
