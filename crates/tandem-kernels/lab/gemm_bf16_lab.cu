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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../cuda/tmma.cu"
#include "lab_common.cuh"

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

typedef void (*Kern)(float*, const uint4*, const uint4*, const uint4*, int, int, int);
struct Variant {
    const char* name;
    Kern f;
    int br, bc, smem;
};
#define V2(ST, WA, WJ, WM, WN, MB)                                                               \
    {"tmmg2_st" #ST "_" #WA "x" #WJ "_" #WM "x" #WN "_b" #MB, tmmg2<ST, WA, WJ, WM, WN, MB>, WM * WJ * 8, \
     WN * WA * 16, ST * (WN * WA * 16 + 2 * WM * WJ * 8) * 64}
static Variant VARIANTS[] = {
    {"tmmg_bf16", tmmg_bf16, TG_BM, TG_BN, 0},
    V2(2, 2, 4, 4, 2, 2),  // tmmg_bf16's tiles, one barrier a step, two blocks an SM
    V2(3, 2, 4, 4, 2, 2),  // ... three stages
    V2(4, 2, 4, 4, 2, 2),  // ... four stages
    V2(3, 4, 4, 4, 2, 1),  // 128 x 128: warps of 32 rows x 64 columns, one block an SM
    V2(4, 4, 4, 4, 2, 1),
    V2(3, 2, 8, 2, 4, 1),  // 128 x 128: warps of 64 rows x 32 columns
    V2(3, 4, 4, 2, 4, 1),  // 64 x 256
};
static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

static void launch(const Variant& v, float* y, const uint16_t* xh, const uint16_t* xl, const uint16_t* w, int m,
                   int n, int k) {
    dim3 grid((m + v.br - 1) / v.br, (n + v.bc - 1) / v.bc);
    v.f<<<grid, 256, v.smem>>>(y, (const uint4*)xh, (const uint4*)xl, (const uint4*)w, m, n, k);
}

struct Shape {
    const char* what;
    int m, n, k;
};

int main() {
    CK(cudaSetDevice(0));
    for (int i = 1; i < NV; i++)
        CK(cudaFuncSetAttribute(VARIANTS[i].f, cudaFuncAttributeMaxDynamicSharedMemorySize, VARIANTS[i].smem));
    const size_t MAXE = (size_t)4096 * 24576;
    uint16_t *w, *xh, *xl;
    float *x, *y0, *y1;
    CK(cudaMalloc(&w, MAXE * 2));
    CK(cudaMalloc(&x, (size_t)4096 * 12288 * 4));
    CK(cudaMalloc(&xh, (size_t)4096 * 12288 * 2));
    CK(cudaMalloc(&xl, (size_t)4096 * 12288 * 2));
    CK(cudaMalloc(&y0, (size_t)4096 * 24576 * 4));
    CK(cudaMalloc(&y1, (size_t)4096 * 24576 * 4));
    fill_bf16<<<4096, 256>>>(w, MAXE, 7);
    fill_f32<<<4096, 256>>>(x, (size_t)4096 * 12288, 99);
    auto split = [&](int m, int k) {
        const long long tot = (long long)m * k;
        bf16_split_rows<<<(unsigned)((tot + 255) / 256), 256>>>(xh, xl, x, tot);
    };
    // LAB_PROFILE=1: one launch of each variant on the gate+up shape only (for Nsight Compute).
    if (getenv("LAB_PROFILE")) {
        split(4096, 4096);
        for (int i = 0; i < NV; i++) launch(VARIANTS[i], y1, xh, xl, w, 4096, 24576, 4096);
        CK(cudaDeviceSynchronize());
        return 0;
    }
    // Bits: every variant against tmmg_bf16 on odd and real shapes.
    const Shape checks[] = {{"odd", 77, 200, 96},       {"odd", 300, 1000, 2080}, {"one", 1, 64, 32},
                            {"small", 17, 4096, 4096},  {"real", 512, 12352, 4096}, {"down", 333, 4096, 12288},
                            {"wide", 129, 24576, 4096}};
    int fails = 0;
    for (const Shape& s : checks) {
        split(s.m, s.k);
        launch(VARIANTS[0], y0, xh, xl, w, s.m, s.n, s.k);
        std::vector<float> a((size_t)s.m * s.n), b(a.size());
        CK(cudaMemcpy(a.data(), y0, a.size() * 4, cudaMemcpyDeviceToHost));
        for (int i = 1; i < NV; i++) {
            CK(cudaMemset(y1, 0xff, a.size() * 4));
            launch(VARIANTS[i], y1, xh, xl, w, s.m, s.n, s.k);
            CK(cudaGetLastError());
            CK(cudaMemcpy(b.data(), y1, b.size() * 4, cudaMemcpyDeviceToHost));
            size_t bad = 0;
            for (size_t e = 0; e < a.size(); e++) bad += memcmp(&a[e], &b[e], 4) != 0;
            if (bad) {
                fails++;
                printf("FAIL %s %s m%d n%d k%d: %zu of %zu differ\n", VARIANTS[i].name, s.what, s.m, s.n, s.k, bad,
                       a.size());
            }
        }
    }
    printf("bits: %d failures over %d variants x %d shapes\n", fails, NV - 1, (int)(sizeof(checks) / sizeof(checks[0])));

    // Time: the 9B shape's matrices at 4,096 rows (and 512).
    const Shape shapes[] = {{"gdn in_proj", 4096, 12352, 4096}, {"ffn gate+up", 4096, 24576, 4096},
                            {"ffn down", 4096, 4096, 12288},   {"out_proj", 4096, 4096, 4096},
                            {"gate+up pp512", 512, 24576, 4096}};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("| shape | m x n x k |");
    for (int i = 0; i < NV; i++) printf(" %s |", VARIANTS[i].name);
    printf("\n|---|---|");
    for (int i = 0; i < NV; i++) printf("---|");
    printf("\n");
    for (const Shape& s : shapes) {
        split(s.m, s.k);
        printf("| %s | %d x %d x %d |", s.what, s.m, s.n, s.k);
        for (int i = 0; i < NV; i++) {
            const int reps = 10;
            launch(VARIANTS[i], y1, xh, xl, w, s.m, s.n, s.k);
            CK(cudaEventRecord(e0));
            for (int r = 0; r < reps; r++) launch(VARIANTS[i], y1, xh, xl, w, s.m, s.n, s.k);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            const double us = ms * 1e3 / reps;
            printf(" %.0f us %.0f TF |", us, 2.0 * s.m * s.n * s.k / (us * 1e-6) / 1e12);
        }
        printf("\n");
    }
    return fails ? 1 : 0;
}
