// A lab for the bf16 prefill GEMM (issue 16, target 4): variants of tmmg_bf16 (cuda/tmma.cu)
// with other block and warp tiles and deeper cp.async pipelines of one barrier a step, each
// checked bit for bit against tmmg_bf16 on odd and real shapes, then timed on the Qwen3.5-9B
// shape's matrices at 4,096 rows (useful TFLOP/s: 2 m n k a call). Not part of the build:
// `scripts/gpu-gemm-lab.sh` compiles and runs it on the device machine.
//
// tmmg2<ST, WA, WJ, WM, WN, MB>: tmma.cu's tmm_tile (tmmg_bf16's chain on other tiles) with
// MB blocks an SM.
#include "../cuda/tmma.cu"
#include "gemm_lab_harness.cuh"

template <int ST, int WA, int WJ, int WM, int WN, int MB>
__global__ void __launch_bounds__(256, MB)
    tmmg2(float* __restrict__ y, const uint4* __restrict__ xh, const uint4* __restrict__ xl,
          const uint4* __restrict__ w, int m, int n, int k) {
    tmm_tile<ST, WA, WJ, WM, WN, false>(y, xh, xl, w, m, n, k);
}

#define V2(ST, WA, WJ, WM, WN, MB)                                                                        \
    {"tmmg2_st" #ST "_" #WA "x" #WJ "_" #WM "x" #WN "_b" #MB, tmmg2<ST, WA, WJ, WM, WN, MB>, WM * WJ * 8, \
     WN * WA * 16, ST * (WN * WA * 16 + 2 * WM * WJ * 8) * 64}
static const Variant VARIANTS[] = {
    {"tmmg_bf16", tmmg_bf16, TG_BM, TG_BN, 0},
    V2(2, 2, 4, 4, 2, 2),  // tmmg_bf16's tiles, one barrier a step, two blocks an SM
    V2(3, 2, 4, 4, 2, 2),  // ... three stages
    V2(4, 2, 4, 4, 2, 2),  // ... four stages
    V2(3, 4, 4, 4, 2, 1),  // 128 x 128: warps of 32 rows x 64 columns, one block an SM
    V2(4, 4, 4, 4, 2, 1),
    V2(3, 2, 8, 2, 4, 1),  // 128 x 128: warps of 64 rows x 32 columns
    V2(3, 4, 4, 2, 4, 1),  // 64 x 256
    // Batched decode's calls (32-64 rows): smaller row tiles, eight warps.
    V2(3, 2, 2, 4, 2, 2),  // 64 x 64: warps of 16 rows x 32 columns
    V2(3, 1, 2, 4, 2, 2),  // 64 x 32
    V2(3, 2, 1, 4, 2, 2),  // 32 x 64: warps of 8 rows x 32 columns
    V2(4, 2, 1, 4, 2, 3),  // ... four stages, three blocks an SM
    V2(3, 4, 2, 4, 2, 2),  // 64 x 128
};
static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

int main() { return gemm_lab_main(VARIANTS, NV); }
