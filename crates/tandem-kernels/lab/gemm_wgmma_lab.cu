// A lab for the bf16 prefill GEMM on Hopper's warpgroup MMA (issue 16, target 4): tmmg_bf16's
// chain (cuda/tmma.cu) with wgmma.mma_async in place of mma.sync, checked bit for bit against
// tmmg_bf16 and timed by gemm_lab_harness.cuh. Not part of the build: `scripts/gpu-gemm-lab.sh
// LAB=wgmma` compiles and runs it on the device machine (sm_90a).
//
// Why it can give tmmg_bf16's bits (scripts/gpu-wgmma-bits.sh, 2026-12-06 on an H100): one
// wgmma.m64n8k16 gives the f32 bits of one mma.sync.m16n8k16 over the same 16 products and
// accumulator, alone and in chains of 8, and mma.sync's result does not depend on which k slot
// holds which (pair of) values. So a wgmma step needs only the chain's *set* of 16 values per
// instruction: values 8t .. 8t + 3 (t = 0..3) of a 32-value step, then 8t + 4 .. 8t + 7, each
// with the hi, then the lo half of the activations, in that order (tm_step).
//
// tmmw<BR, ST, KS, MB>: a block of two warpgroups; warpgroup h takes 64 weight columns
// (wgmma's M) x BR activation rows (its N: 64 or 128); MB blocks an SM. ST stages of KS
// steps, a step being the block's 128 weight rows, BR hi rows and BR lo rows of one 32-value
// step, in wgmma's no-swizzle K-major layout (8 x 16-byte core matrices; along K 128 bytes
// apart, along rows 256), the step's two 16-value sets one after the other. The activations
// come reordered by split_perm (a set is a whole 32-byte stretch of the row: 16-byte copies);
// the weights, in the model's order, by 8-byte copies (a 4-value run to its set's place). Per
// stage: wait for its copies, make them visible to the async proxy, barrier, refill the stage
// two back (each warpgroup leaves only its latest wgmma group in flight, so every wgmma that
// read that stage has finished), then per step issue the four wgmmas of tm_step's order as
// one group. At the end of a partition all groups are waited for and its accumulator folded
// into the total (tg_fold's order, empty partitions included).
// WP: the weights reordered like the activations (as a load-time repack would leave them), so
// 16-byte copies place them too. TY: the partitions' total kept in y (read, added, written at
// each fold: eight times a tile) instead of registers, which lets N reach 256 (a 128 x 256
// tile: fewer bytes a product) within the register file.
// Measured on an H100 (2026-12-06, the 8-byte-copy variants only): the bits of tmmg_bf16 on
// every shape, 105-129 TFLOP/s against its 121-144 (docs/PERFORMANCE.md). The WP / TY
// variants are compiled here (no ptxas C7517 / C7519: the accumulators stay in place between
// wgmmas), not yet run.
#include <cuda_bf16.h>

#include "../cuda/tmma.cu"
#include "gemm_lab_harness.cuh"
#include "wgmma_ops.cuh"

template <int BR, int ST, int KS, int MB, bool WP, bool TY>
__global__ void __launch_bounds__(256, MB)
    tmmw(float* __restrict__ y, const uint4* __restrict__ xh, const uint4* __restrict__ xl,
         const uint4* __restrict__ w, int m, int n, int k) {
    constexpr int BC = 128;
    constexpr int WSET = BC * 32, XSET = BR * 32;  // bytes of one 16-value set of a step
    constexpr int SSTEP = 2 * WSET + 4 * XSET;     // a step: weights, hi, lo, two sets each
    constexpr int NR = BR / 2;                     // accumulator registers a thread
    extern __shared__ __align__(1024) uint8_t wsm[];
    const int tid = threadIdx.x, h = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * BR, col0 = blockIdx.y * BC;
    const int steps = k >> 5, k8 = k >> 3;
    const int L = min(TM_MAXL, max(1, steps / TM_WARPS));
    const int nseg = (steps + L - 1) / L;
    const uint8_t* wb = reinterpret_cast<const uint8_t*>(w);

    auto load = [&](int s, uint8_t* ws) {
        uint8_t* hs = ws + 2 * WSET;
        uint8_t* ls = hs + 2 * XSET;
        if constexpr (WP) {
            // Weights reordered like the activations: BC rows x 4 pieces of 16 bytes.
            for (int idx = tid; idx < BC * 4; idx += 256) {
                const int r = idx >> 2, q = idx & 3, col = col0 + r;
                const bool ok = col < n;
                cp_async16_zfill(ws + (q >> 1) * WSET + cm_off(r, q & 1), w + (size_t)(ok ? col : 0) * k8 + (size_t)s * 4 + q, ok);
            }
        } else {
            // Weights: BC rows x 8 runs of 8 bytes; run c goes to set c & 1, core c >> 2, half (c >> 1) & 1.
            for (int idx = tid; idx < BC * 8; idx += 256) {
                const int r = idx >> 3, c = idx & 7, col = col0 + r;
                const bool ok = col < n;
                const uint8_t* src = wb + ((size_t)(ok ? col : 0) * k + (size_t)s * 32) * 2 + c * 8;
                cp_async8_zfill(ws + (c & 1) * WSET + cm_off(r, c >> 2) + ((c >> 1) & 1) * 8, src, ok);
            }
        }
        // Activations (reordered): BR rows x 4 pieces; piece q goes to set q >> 1, core q & 1.
        for (int idx = tid; idx < BR * 4; idx += 256) {
            const int r = idx >> 2, q = idx & 3, row = row0 + r;
            const bool ok = row < m;
            const size_t off = (size_t)(ok ? row : 0) * k8 + (size_t)s * 4 + q;
            const int d = (q >> 1) * XSET + cm_off(r, q & 1);
            cp_async16_zfill(hs + d, xh + off, ok);
            cp_async16_zfill(ls + d, xl + off, ok);
        }
    };

    float acc[NR], tot[TY ? 1 : NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < (TY ? 1 : NR); i++) tot[i] = 0.f;
    // d[4 j + e]: weight column 16 warp + g + 8 (e >> 1) of this warpgroup's 64, activation
    // row 8 j + 2 t + (e & 1); TY keeps the partitions' total in y itself.
    auto yat = [&](int i) -> float* {
        const int j = i >> 2, e = i & 3;
        const int row = row0 + 8 * j + 2 * t + (e & 1);
        const int col = col0 + h * 64 + 16 * warp + g + 8 * (e >> 1);
        return row < m && col < n ? y + (size_t)row * n + col : nullptr;
    };
    // li walks the steps for the copies (KS a stage), lc for the mma; both in the chain's order.
    TgSteps li, lc;
    li.start(L, nseg, steps);
    lc.start(L, nseg, steps);
    auto fill = [&](int stage) {
        for (int u = 0; u < KS && !li.done(); u++) {
            load(li.step(), wsm + (stage * KS + u) * SSTEP);
            li.next();
        }
        cp_async_commit();
    };
#pragma unroll
    for (int d = 0; d < ST - 2; d++) fill(d);
    const int groups = (steps + KS - 1) / KS;
    for (int G = 0; G < groups; G++) {
        cp_async_wait<ST - 3>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        // Refill the stage of group G - 2: every warpgroup left at most its group G - 1's last
        // step in flight before this barrier.
        fill((G + ST - 2) % ST);
        for (int u = 0; u < KS && !lc.done(); u++) {
            const uint8_t* ws = wsm + ((G % ST) * KS + u) * SSTEP;
            const uint8_t* hs = ws + 2 * WSET;
            const uint8_t* ls = hs + 2 * XSET;
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int set = 0; set < 2; set++) {
                const uint64_t da = wg_desc(ws + set * WSET + h * 64 * 32);
                wgmma_n(acc, da, wg_desc(hs + set * XSET));
                wgmma_n(acc, da, wg_desc(ls + set * XSET));
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            const int p0 = lc.p;
            lc.next();
            const int p1 = lc.done() ? TM_WARPS : lc.p;
            if (p1 != p0) {
                // The end of partition p0 (and of any empty ones up to p1): tg_fold's order.
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
                for (int q = p0; q < p1; q++) {
#pragma unroll
                    for (int i = 0; i < NR; i++) {
                        if constexpr (TY) {
                            if (float* yp = yat(i)) *yp = q == 0 ? acc[i] : *yp + acc[i];
                        } else {
                            tot[i] = q == 0 ? acc[i] : tot[i] + acc[i];
                        }
                        acc[i] = 0.f;
                    }
                }
            }
        }
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    cp_async_wait<0>();
    if constexpr (!TY) {
#pragma unroll
        for (int i = 0; i < NR; i++)
            if (float* yp = yat(i)) *yp = tot[i];
    }
}

#define VW(BR, ST, KS, MB, WP, TY)                                                                        \
    {"tmmw_" #BR "_st" #ST "_ks" #KS "_b" #MB "_wp" #WP "_ty" #TY, tmmw<BR, ST, KS, MB, WP, TY>, BR, 128,          \
     ST * KS * (2 * 128 * 32 + 4 * BR * 32), WP ? 2 : 1}
static const Variant VARIANTS[] = {
    {"tmmg_bf16", tmmg_bf16, TG_BM, TG_BN, 0, 0},
    VW(128, 4, 2, 1, false, false),  // the best of 2026-12-06 08:20 (128 TF)
    VW(128, 4, 2, 1, true, false),   // weights reordered at load: 16-byte copies
    VW(128, 4, 1, 1, true, false),
    VW(256, 4, 1, 1, true, true),    // 128 x 256 tiles, the partitions' total kept in y
    VW(256, 5, 1, 1, true, true),
    VW(128, 4, 2, 1, true, true),    // ... the same at 128 x 128 (what keeping it in y costs)
};
static const int NV = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

int main() { return gemm_lab_main(VARIANTS, NV); }
