// tmmw_bf16 / tmmw_bf16_h: tmma.cu's chain on Hopper's wgmma (sm_90a only: build.rs compiles
// this module for compute_90a when CUDA_COMPUTE_CAP is 90, and to an empty module otherwise),
// for the calls tmmg_bf16 takes (prefill, wide batches). The same bits as tmmg_bf16 /
// tmmg_bf16_h for every row (the lab, lab/gemm_tma_lab.cu, checks them bit for bit; k is
// a positive multiple of 32, cuda_tmma.rs' `fits`: with no step the total would stay unwritten).
//
// - Operands: W [n, k] bf16 as loaded, and the activations' hi (and lo) halves [m, k] as
//   bf16_split_rows / bf16_hi_rows write them, both read by TMA tensor maps (encoded by the
//   host) in boxes of 32 values (one step of the chain) x BC weight rows / BR activation rows,
//   in the 64-byte swizzle; rows past the matrix arrive as zeros.
// - A block: one producer thread (warpgroup 0) issues a step's boxes into a ring of ST stages,
//   each with a "full" mbarrier (the copies' bytes) and an "empty" one (the consumers' 256
//   threads); two consumer warpgroups (64 weight columns each: wgmma's M) take the BR
//   activation rows as wgmma's N. A step is two sets of 16 values (0 .. 15, 16 .. 31, the
//   chain's order), each one wgmma with the hi halves and (split mode) one with the lo halves.
// - Partitions: the steps come in TgSteps' order; at a partition's end the accumulators are
//   added into a total in shared memory (tg_fold's order: the total is partition 0's, then
//   each next one added; empty partitions add +0), which keeps the registers free for
//   N = 256. The total leaves as whole rows of y.
// - Tiles: block b walks tiles b, b + gridDim.x, ... (row tile fastest, so neighbours share a
//   weight tile); with a grid of every tile a block runs one, with fewer (a block an SM) the
//   ring runs on across tiles so the next tile's first loads overlap the last one's folds.
#include "common.cuh"
#include "tmma_chain.cuh"

// Only sm_90a has wgmma: built for any other GPU, the module stays empty (the host pass of a
// lab build sees the declarations).
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "wgmma.cuh"

#define TW_BC 128  // weight columns a block (two consumer warpgroups of 64)

// A stage: one step's boxes, weights (BC rows) then hi (BR rows) then lo (split mode), each a
// box of rows x 64 bytes in the 64-byte swizzle; then the total and the mbarriers.
template <int BR, int ST, bool LO>
struct TwShape {
    static constexpr int W = TW_BC * 64, X = BR * 64;
    static constexpr int STAGE = W + (LO ? 2 : 1) * X;
    static constexpr int TOT = BR * TW_BC * 4;
    static constexpr int SMEM = ST * STAGE + TOT + 2 * ST * 8;
};

// The total's place in shared memory: row r (activation row), column c (weight column),
// columns' bits 3-4 XORed with the row's bits 1-2 so that a fold's 32 lanes hit 32 banks;
// four consecutive columns stay together (float4 reads for the stores).
__device__ __forceinline__ int tw_tot_at(int r, int c) { return r * TW_BC + (c ^ (((r >> 1) & 3) << 3)); }

// The consumers (warpgroups 1 and 2; h = 0 / 1 their 64 weight columns): every step of the
// chain from its stage, partitions folded into the total, the total into y. G0 counts the
// ring's steps before this tile; returns the count after it.
template <int BR, int ST, bool LO>
__device__ __forceinline__ int tw_consume(float* __restrict__ y, uint8_t* smem, float* tot, uint64_t* full,
                                          uint64_t* empty, int h, int ctid, int row0, int col0, int m, int n,
                                          int steps, int L, int nseg, int G0) {
    using S = TwShape<BR, ST, LO>;
    constexpr int NR = BR / 2;  // accumulator registers a consumer thread
    const int warp = (ctid >> 5) & 3, lane = ctid & 31;
    const int g = lane >> 2, t = lane & 3;
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.f;
    TgSteps gc;
    gc.start(L, nseg, steps);
    int G = G0;
    for (; !gc.done(); G++) {
        const int st = G % ST;
        mbar_wait(&full[st], (G / ST) & 1);
        const uint8_t* ws = smem + st * S::STAGE;
        const uint8_t* hs = ws + S::W;
        const uint8_t* ls = hs + S::X;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int set = 0; set < 2; set++) {
            const uint64_t da = wg_desc_sw64(ws + h * 64 * 64 + set * 32);
            wgmma_n(acc, da, wg_desc_sw64(hs + set * 32));
            if constexpr (LO) wgmma_n(acc, da, wg_desc_sw64(ls + set * 32));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        // The step before this one has finished: its stage may be refilled.
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (G > G0) mbar_arrive(&empty[(G - 1) % ST]);
        const int p0 = gc.p;
        gc.next();
        const int p1 = gc.done() ? TM_WARPS : gc.p;
        if (p1 != p0) {
            // The end of partition p0 (and of the empty ones up to p1): into the total.
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
            for (int i = 0; i < NR; i++) {
                // acc[4 j + e]: weight column 16 warp + g + 8 (e >> 1) of this warpgroup's
                // 64, activation row 8 j + 2 t + (e & 1).
                const int j = i >> 2, e = i & 3;
                float* p = &tot[tw_tot_at(8 * j + 2 * t + (e & 1), h * 64 + 16 * warp + g + 8 * (e >> 1))];
                float v = p0 == 0 ? acc[i] : *p + acc[i];
                for (int q = p0 + 1; q < p1; q++) v = v + 0.f;
                *p = v;
                acc[i] = 0.f;
            }
        }
    }
    // The last partition's fold waited for every wgmma: the tile's last stage is free.
    if (G > G0) mbar_arrive(&empty[(G - 1) % ST]);
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    const bool vec = (n & 3) == 0;
    for (int idx = ctid; idx < BR * TW_BC / 4; idx += 256) {
        const int r = idx / (TW_BC / 4), c = (idx % (TW_BC / 4)) * 4;
        const int row = row0 + r, col = col0 + c;
        if (row >= m || col >= n) continue;
        const float4 v = *reinterpret_cast<const float4*>(&tot[tw_tot_at(r, c)]);
        float* yp = y + (size_t)row * n + col;
        if (vec && col + 3 < n) {
            *reinterpret_cast<float4*>(yp) = v;
        } else {
            const float a[4] = {v.x, v.y, v.z, v.w};
            for (int e = 0; e < 4; e++)
                if (col + e < n) yp[e] = a[e];
        }
    }
    // Every consumer has read the total before a next tile's first fold writes it.
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    return G;
}

// The thread's warpgroup from a value the compiler sees as warp-uniform (otherwise it
// serialises the wgmmas behind the divergent branch: ptxas's C7520).
__device__ __forceinline__ int tw_role() { return __shfl_sync(0xffffffffu, threadIdx.x >> 7, 0); }

// 384 threads: warpgroup 0's first thread the producer, warpgroups 1 and 2 the consumers.
template <int BR, int ST, bool LO>
__device__ __forceinline__ void tmmw(float* __restrict__ y, const CUtensorMap& tw, const CUtensorMap& th,
                                     const CUtensorMap& tl, int m, int n, int k) {
    using S = TwShape<BR, ST, LO>;
    extern __shared__ __align__(1024) uint8_t tw_smem[];
    uint8_t* smem = tw_smem;
    float* tot = reinterpret_cast<float*>(smem + ST * S::STAGE);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + ST * S::STAGE + S::TOT);
    uint64_t* empty = full + ST;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 256);
        }
        mbar_init_fence();
    }
    __syncthreads();
    const int steps = k >> 5;
    const int L = min(TM_MAXL, max(1, steps / TM_WARPS));
    const int nseg = (steps + L - 1) / L;
    const int nrt = (m + BR - 1) / BR, tiles = nrt * ((n + TW_BC - 1) / TW_BC);
    const int role = tw_role();
    if (role == 0) {
        if (threadIdx.x != 0) return;
        int G = 0;
        for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
            const int rt = tile % nrt, ct = tile / nrt;
            TgSteps gi;
            gi.start(L, nseg, steps);
            for (; !gi.done(); G++, gi.next()) {
                const int st = G % ST;
                if (G >= ST) mbar_wait(&empty[st], ((G / ST) & 1) ^ 1);
                mbar_expect_tx(&full[st], S::STAGE);
                uint8_t* stage = smem + st * S::STAGE;
                const int s = gi.step();
                tma_2d(stage, &tw, s * 32, ct * TW_BC, &full[st]);
                tma_2d(stage + S::W, &th, s * 32, rt * BR, &full[st]);
                if constexpr (LO) tma_2d(stage + S::W + S::X, &tl, s * 32, rt * BR, &full[st]);
            }
        }
        return;
    }
    int G = 0;
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x)
        G = tw_consume<BR, ST, LO>(y, smem, tot, full, empty, role - 1, threadIdx.x - 128, (tile % nrt) * BR,
                                   (tile / nrt) * TW_BC, m, n, steps, L, nseg, G);
}

// Split mode (hi + lo): 128 x 128 tiles, six stages (213,088 bytes of dynamic shared memory).
#define TW_SPLIT_BR 128
#define TW_SPLIT_ST 6
// bf16 activations (hi alone): 128 x 256 tiles, four stages (229,440 bytes).
#define TW_H_BR 256
#define TW_H_ST 4

extern "C" __global__ void __launch_bounds__(384, 1)
    tmmw_bf16(float* __restrict__ y, const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap th,
              const __grid_constant__ CUtensorMap tl, int m, int n, int k) {
    tmmw<TW_SPLIT_BR, TW_SPLIT_ST, true>(y, tw, th, tl, m, n, k);
}

extern "C" __global__ void __launch_bounds__(384, 1)
    tmmw_bf16_h(float* __restrict__ y, const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap th,
                int m, int n, int k) {
    tmmw<TW_H_BR, TW_H_ST, false>(y, tw, th, th, m, n, k);
}
#endif
