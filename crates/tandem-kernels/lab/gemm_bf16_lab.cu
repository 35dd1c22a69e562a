// A lab for the bf16 prefill GEMM (issue 16, target 4): variants of tmmg_bf16 (cuda/tmma.cu)
// with other block and warp tiles and deeper cp.async pipelines of one barrier a step, each
// checked bit for bit against tmmg_bf16 on odd and real shapes, then timed on the Qwen3.5-9B
// shape's matrices at 4,096 rows (useful TFLOP/s: 2 m n k a call). Not part of the build:
// `scripts/gpu-gemm-lab.sh` compiles and runs it on the device machine.
//
// tmmg2<ST, WA, WJ, WM, WN>: tmmg_bf16's chain (partition by partition, each segment's steps in
// order, one accumulator from zero per partition added in order into the total), a block of
// WM x WN warps, warp (wm, wn) taking WJ groups of 8 rows and WA groups of 16 columns (block
// tile WM WJ 8 rows x WN WA 16 columns); ST stages of one 32-value step (weights, hi, lo) in
// flight, one barrier a step: wait for step i, barrier, refill the stage step i - 1 used, run
// step i. Every output sees the same mma sequence with the same operands as in tmmg_bf16.
#include "../cuda/tmma.cu"
#include "gemm_lab_harness.cuh"

template <int ST, int WA, int WJ, int WM, int WN, int MB>
__global__ void __launch_bounds__(256, MB)
    tmmg2(float* __restrict__ y, const uint4* __restrict__ xh, const uint4* __restrict__ xl,
          const uint4* __restrict__ w, int m, int n, int k) {
    constexpr int BR = WM * WJ * 8, BC = WN * WA * 16;
    constexpr int SW = BC * TG_PIECES, SX = BR * TG_PIECES, STAGE = SW + 2 * SX;  // uint4 a stage
    extern __shared__ __align__(16) uint4 smem2[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int wn = warp % WN, wm = warp / WN;
    const int row0 = blockIdx.x * BR, col0 = blockIdx.y * BC;
    const bool live = row0 + wm * WJ * 8 < m;
    const int steps = k >> 5, k8 = k >> 3;
    const int L = min(TM_MAXL, max(1, steps / TM_WARPS));
    const int nseg = (steps + L - 1) / L;

    auto load = [&](int s, int st) {
        uint4* ws = smem2 + st * STAGE;
        uint4* hs = ws + SW;
        uint4* ls = hs + SX;
        for (int idx = tid; idx < SW; idx += 256) {
            const int c = idx >> 2, pc = idx & 3, col = col0 + c;
            const bool ok = col < n;
            cp_async16_zfill(&ws[idx], w + (size_t)(ok ? col : 0) * k8 + (size_t)s * 4 + pc, ok);
        }
        for (int idx = tid; idx < SX; idx += 256) {
            const int r = idx >> 2, pc = idx & 3, row = row0 + r;
            const bool ok = row < m;
            const size_t off = (size_t)(ok ? row : 0) * k8 + (size_t)s * 4 + pc;
            cp_async16_zfill(&hs[idx], xh + off, ok);
            cp_async16_zfill(&ls[idx], xl + off, ok);
        }
    };

    float acc[WA][WJ][4], tot[WA][WJ][4];
#pragma unroll
    for (int a = 0; a < WA; a++)
#pragma unroll
        for (int j = 0; j < WJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[a][j][e] = 0.f, tot[a][j][e] = 0.f;

    TgSteps li;
    li.start(L, nseg, steps);
#pragma unroll
    for (int d = 0; d < ST - 1; d++) {
        if (!li.done()) {
            load(li.step(), d);
            li.next();
        }
        cp_async_commit();
    }
    int st = 0;
    for (int p = 0; p < TM_WARPS; p++) {
        for (int seg = p; seg < nseg; seg += TM_WARPS) {
            const int ns = min(L, steps - seg * L);
            for (int i = 0; i < ns; i++) {
                cp_async_wait<ST - 2>();
                __syncthreads();
                if (!li.done()) {
                    load(li.step(), (st + ST - 1) % ST);
                    li.next();
                }
                cp_async_commit();
                if (live) {
                    const uint4* ws = smem2 + st * STAGE;
                    const uint4* hs = ws + SW;
                    const uint4* ls = hs + SX;
                    uint4 wa[WA], wb[WA];
#pragma unroll
                    for (int a = 0; a < WA; a++) {
                        const int c = wn * WA * 16 + a * 16 + g;
                        wa[a] = ws[c * TG_PIECES + t];
                        wb[a] = ws[(c + 8) * TG_PIECES + t];
                    }
#pragma unroll
                    for (int j = 0; j < WJ; j++) {
                        const int r = wm * WJ * 8 + j * 8 + g;
                        const uint4 bh = hs[r * TG_PIECES + t], bl = ls[r * TG_PIECES + t];
#pragma unroll
                        for (int a = 0; a < WA; a++) tm_step(acc[a][j], wa[a], wb[a], bh, bl);
                    }
                }
                st = (st + 1) % ST;
            }
        }
#pragma unroll
        for (int a = 0; a < WA; a++)
#pragma unroll
            for (int j = 0; j < WJ; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tot[a][j][e] = p == 0 ? acc[a][j][e] : tot[a][j][e] + acc[a][j][e];
                    acc[a][j][e] = 0.f;
                }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int a = 0; a < WA; a++) {
#pragma unroll
        for (int j = 0; j < WJ; j++) {
            const int c = col0 + wn * WA * 16 + a * 16 + g;
            const int r = row0 + wm * WJ * 8 + j * 8 + 2 * t;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = c + (e >> 1) * 8, row = r + (e & 1);
                if (row < m && col < n) y[(size_t)row * n + col] = tot[a][j][e];
            }
        }
    }
}

#define V2(ST, WA, WJ, WM, WN, MB)                                                                        \
    {"tmmg2_st" #ST "_" #WA "x" #WJ "_" #WM "x" #WN "_b" #MB, tmmg2<ST, WA, WJ, WM, WN, MB>, WM * WJ * 8, \
     WN * WA * 16, ST * (WN * WA * 16 + 2 * WM * WJ * 8) * 64, false}
static const Variant VARIANTS[] = {
    {"tmmg_bf16", tmmg_bf16, TG_BM, TG_BN, 0, false},
    V2(2, 2, 4, 4, 2, 2),  // tmmg_bf16's tiles, one barrier a step, two blocks an SM
    V2(3, 2, 4, 4, 2, 2),  // ... three stages
    V2(4, 2, 4, 4, 2, 2),  // ... four stages
    V2(3, 4, 4, 4, 2, 1),  // 128 x 128: warps of 32 rows x 64 columns, one block an SM
    V2(4, 4, 4, 4, 2, 1),
    V2(3, 2, 8, 2, 4, 1),  // 128 x 128: warps of 64 rows x 32 columns
    V2(3, 4, 4, 2, 4, 1),  // 64 x 256
};
static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

int main() { return gemm_lab_main(VARIANTS, NV); }
